"""Kernels that have not yet run on the H200 (or that change between device calls: Weaver's growth step)
compile for it on the CPU: Triton lowers each to PTX and the
wheel's ptxas assembles it for sm_90 (no GPU needed), so a compile error that the interpreter cannot see
(types, layouts, PDL instructions) fails CI instead of the next device call. Each case names the kernel,
a signature like the launches' and its constexprs; the cubin must come out non-empty."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")


def _ptxas() -> bool:
    nvidia = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return nvidia.exists() or shutil.which("ptxas") is not None


pytestmark = pytest.mark.skipif(not _ptxas(), reason="needs the triton wheel's ptxas")


def ptr(t: str) -> str:
    return "*" + t


FRONTIER = dict(
    top_p=ptr("fp32"), top_ids=ptr("i64"), score=ptr("fp64"), tau="fp64", scores_out=ptr("fp64"),
    values=ptr("fp64"), order=ptr("i64"), ids=ptr("i64"), rows_out=ptr("i64"), mask=ptr("u8"), own=ptr("u8"),
    mask_out=ptr("u8"), preds=ptr("bf16"), preds_out=ptr("bf16"), n="i32", kids="i32", MIN="constexpr",
    MW="constexpr", W="constexpr", NP="constexpr", POSITIVE_TAU="constexpr", FRONTIER="constexpr",
    BC="constexpr",
)  # fmt: skip
GROWTH_POINTERS = (  # _step_kernel's pointer arguments, in order, as name:dtype
    "key_ptr:fp64 rank_ptr:i32 order_ptr:i32 valid_ptr:i32 tok_ptr:i64 par_ptr:i64 dep_ptr:i32 "
    "score_ptr:fp64 anc_ptr:i8 ctok_ptr:i64 clq_ptr:fp64 cache_ptr:bf16 sw_ptr:bf16 sa_ptr:fp32 "
    "sync_ptr:i32 root_ptr:i64 base_ptr:bf16 emb_ptr:bf16 pemb_ptr:bf16 pl_ptr:bf16 pid_ptr:i64 "
    "we_ptr:bf16 n1_ptr:bf16 wq_ptr:bf16 wk_ptr:bf16 wv_ptr:bf16 wo_ptr:bf16 n2_ptr:bf16 wg_ptr:bf16 "
    "wu_ptr:bf16 wd_ptr:bf16 n3_ptr:bf16 wout_ptr:bf16"
)
GROWTH_CONSTS = (
    "N NP KEEP D K KP H HP DM DMP NH HD I IP TILE CHUNK CK BO BP BR W WP ROOT SCORE ACC DT UNROLL PC STAGE "
    "HEADWISE CH SPIN"
)
GROWTH = {
    **{name: ptr(t) for name, t in (item.split(":") for item in GROWTH_POINTERS.split())},
    "n0": "i32", "m": "i32", "nprog": "i32", "eps": "fp32",
    **{name: "constexpr" for name in GROWTH_CONSTS.split()},
}  # fmt: skip


def growth_constants(shape: str, width: int, programs: int) -> dict:
    """The growth step kernel's constexprs as grow_fused launches it at a named shape (bf16), a scoring
    step past the root on ``programs`` programs (0: the runtime count, grid barriers)."""
    import torch

    from repro.drafters.growth_kernels import step_constants
    from repro.drafters.shapes import growth_shape

    cfg, budget = growth_shape(shape)
    consts = step_constants(cfg, budget, cfg.pool_size, cfg.block_size - 1, torch.bfloat16, width)
    return {**consts, "ROOT": False, "SCORE": True, "PC": programs, "STAGE": -1}


GEMV_CONSTS = (
    "N_ROWS RB BN BK KP EARLY_X SPLIT EVEN_K NORM GATE_UP HAS_BIAS RESIDUAL ARGMAX ACC PDL EARLY_W GROUPED"
)
GEMV = dict(
    x_ptr=ptr("bf16"), x_stride="i32", scale_ptr=ptr("bf16"), w_ptr=ptr("bf16"), bias_ptr=ptr("bf16"),
    res_ptr=ptr("bf16"), res_stride="i32", out_ptr=ptr("bf16"), best_ptr=ptr("fp32"), best_idx_ptr=ptr("i64"),
    ws_ptr=ptr("fp32"), eps="fp32", N="i32", K="i32", k_slice="i32", n_rows="i32",
    **dict.fromkeys(GEMV_CONSTS.split(), "constexpr"),
)  # fmt: skip
GROUPED_GATE_UP = {  # tiny-qwen35's gate|up over a verify's rows in groups of 4 (the "gemv" verify form)
    "N_ROWS": 4, "RB": 4, "BN": 4, "BK": 256, "KP": 256, "EARLY_X": True, "SPLIT": 1, "EVEN_K": False,
    "NORM": True, "GATE_UP": True, "HAS_BIAS": False, "RESIDUAL": False, "ARGMAX": False, "ACC": "float32",
    "PDL": 2, "EARLY_W": False, "GROUPED": True,
}  # fmt: skip
TOPK_CHUNKS = dict(
    x=ptr("fp32"), stride_x="i32", n="i32", parts=ptr("i64"), vals=ptr("fp64"), stride_v="i32",
    ids=ptr("i64"), stride_i="i32", k="i32", CHUNK="constexpr", KP="constexpr", CHUNKS="constexpr",
    LOG="constexpr",
)  # fmt: skip
TOPK_MERGE = dict(
    parts=ptr("i64"), vals=ptr("bf16"), stride_v="i32", ids=ptr("i64"), stride_i="i32", k="i32",
    KP="constexpr", CHUNKS="constexpr", MP="constexpr", LOG="constexpr",
)  # fmt: skip
CASES = {  # name: (module, kernel, signature, constexprs)
    "topk-log": ("repro.models.topk_kernels", "_topk_chunks_kernel", TOPK_CHUNKS,
                 {"CHUNK": 4096, "KP": 32, "CHUNKS": 1, "LOG": True}),  # DDTree's tree stage
    "topk-k2": ("repro.models.topk_kernels", "_topk_chunks_kernel", {**TOPK_CHUNKS, "vals": ptr("fp32")},
                {"CHUNK": 4096, "KP": 2, "CHUNKS": 1, "LOG": False}),  # k = 1 (KP 2)
    "topk-parts": ("repro.models.topk_kernels", "_topk_chunks_kernel", {**TOPK_CHUNKS, "x": ptr("bf16")},
                   {"CHUNK": 4096, "KP": 512, "CHUNKS": 8, "LOG": False}),
    "topk-merge": ("repro.models.topk_kernels", "_topk_merge_kernel", TOPK_MERGE,
                   {"KP": 512, "CHUNKS": 8, "MP": 4096, "LOG": False}),
    "copy-tree": ("repro.models.slot_kernels", "_copy_tree_kernel", dict(
        tokens=ptr("i64"), parents=ptr("i64"), src_tokens=ptr("i64"), src_parents=ptr("i64"), n="i32",
        size="i32", s_t="i32", s_p="i32", PARENTS="constexpr", BN="constexpr",
    ), {"PARENTS": True, "BN": 64}),  # a budget-32 tree into its 33-node slot
    "growth-step-1": ("repro.drafters.growth_kernels", "_step_kernel", GROWTH,
                      growth_constants("tiny", 1, 1)),  # one node a step, one program
    "growth-step-4": ("repro.drafters.growth_kernels", "_step_kernel", GROWTH,
                      growth_constants("tiny", 4, 0)),  # four nodes a step, grid barriers
    "gemv-grouped": ("repro.gdn.triton_linear", "_gemv_kernel", GEMV, GROUPED_GATE_UP),
    "frontier": ("repro.drafters.frontier_kernels", "_frontier_kernel", FRONTIER,
                 {"MIN": 280, "MW": 300, "W": 1024, "NP": 16, "POSITIVE_TAU": True, "FRONTIER": True,
                  "BC": 1024}),
    "level-scores": ("repro.drafters.frontier_kernels", "_frontier_kernel", FRONTIER,
                     {"MIN": 0, "MW": 0, "W": 0, "NP": 16, "POSITIVE_TAU": False, "FRONTIER": False,
                      "BC": 16}),
    "select": ("repro.drafters.frontier_kernels", "_select_kernel", dict(
        scores=ptr("fp64"), tokens=ptr("i64"), parents=ptr("i64"), orders=ptr("i64"), parent_at=ptr("i64"),
        parent_base=ptr("i64"), node_of=ptr("i64"), out_tokens=ptr("i64"), out_parents=ptr("i64"),
        out_scores=ptr("fp64"), first="i32", size="i32", N="constexpr", NP="constexpr", BJ="constexpr",
    ), {"N": 84, "NP": 128, "BJ": 32}),
    "gather-features": ("repro.drafters.ingest_kernels", "_gather_features_kernel", dict(
        src=ptr("bf16"), src_stride="i32", path=ptr("i64"), start_ptr=ptr("i64"), count_ptr=ptr("i64"),
        rows=ptr("bf16"), rows_stride="i32", feat=ptr("bf16"), feat_stride="i32", positions=ptr("i64"),
        length=ptr("i64"), col0="i32", width="i32", BH="constexpr", FIRST="constexpr",
    ), {"BH": 1024, "FIRST": True}),
    "launched-inputs": ("repro.drafters.ingest_kernels", "_launched_inputs_kernel", dict(
        result=ptr("i64"), length=ptr("i64"), inp=ptr("i64"), width="i32", n="i32", BN="constexpr",
    ), {"BN": 32}),
    "last-feature": ("repro.drafters.ingest_kernels", "_last_feature_kernel", dict(
        feat=ptr("bf16"), feat_stride="i32", length=ptr("i64"), tail=ptr("bf16"), width="i32", BH="constexpr",
    ), {"BH": 1024}),
    "block-rows": ("repro.drafters.ingest_kernels", "_block_rows_kernel", dict(
        embedding=ptr("bf16"), emb_stride="i32", root_ptr=ptr("i64"), mask_id="i32", out=ptr("bf16"),
        width="i32", scale="fp32", BH="constexpr", SCALE="constexpr", ACC="constexpr", DT="constexpr",
    ), {"BH": 1024, "SCALE": True, "ACC": "float32", "DT": "bfloat16"}),
    "context-kv": ("repro.gdn.triton_attention", "_context_kv_kernel", dict(
        kv_ptr=ptr("bf16"), pos_ptr=ptr("i64"), k_scale_ptr=ptr("bf16"), rope_ptr=ptr("bf16"),
        keys_ptr=ptr("bf16"), values_ptr=ptr("bf16"), eps="fp32", kv_stride="i32", rows="i32", KV="constexpr",
        LKV="constexpr", HD="constexpr", BD="constexpr", ACC="constexpr", PDL="constexpr",
    ), {"KV": 2, "LKV": 4, "HD": 64, "BD": 64, "ACC": "float32", "PDL": 1}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_compiles_for_sm90(name: str) -> None:
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, kernel, signature, constexprs = CASES[name]
    consts = {
        k: getattr(tl, v) if k in ("ACC", "DT") and isinstance(v, str) else v for k, v in constexprs.items()
    }
    fn = getattr(importlib.import_module(module), kernel)
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=consts), target=GPUTarget("cuda", 90, 32)
    )
    assert len(compiled.asm["cubin"]) > 1000  # an assembled sm_90 binary
    assert "sm_90" in compiled.asm["ptx"]


def ptxas_registers(ptx: str) -> int:
    """Registers a thread of the kernel in ``ptx`` uses on sm_90a (the wheel's ptxas -v)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        out = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(src), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return int(re.findall(r"Used (\d+) registers", out.stderr)[-1])


@pytest.mark.parametrize("width", [1, 2, 4])
def test_the_27b_growth_step_fits_two_programs_a_sm(width: int) -> None:
    """Weaver's growth at the Qwen3.6-27B shape runs on every program the SMs hold at once (grid barriers),
    and 79 us a one-node step against 103 at one program a SM: a step of 1, 2 or 4 nodes at 8 warps (256
    threads) must stay within 128 registers a thread, two programs a SM (65536 registers). At 4 nodes that
    takes the chunked W_e and down_proj (whole rows: 177 registers, one program a SM;
    results/2026-12-04-h200-weaver-tile/NOTES.md)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from repro.drafters.growth_kernels import _step_kernel

    consts = growth_constants("qwen3.6-27b", width, 0)
    src = ASTSource(fn=_step_kernel, signature=GROWTH, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
    assert ptxas_registers(ptx) <= 128


def _sm90_resources():  # noqa: ANN202 - the script scripts/sm90_resources.py as a module
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "sm90_resources.py"
    spec = importlib.util.spec_from_file_location("sm90_resources", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("form", ["split", "split_peel"])
def test_phase_one_at_129_nodes_keeps_its_registers_on_the_aligned_mask(monkeypatch, form: str) -> None:
    """The split form's phase 1 at 129 nodes (Weaver's shape, an engine slot of a budget of 128) reads the
    ancestor mask in rows of a multiple of 16 bytes (triton_tree.mask_rows): no spills and at most 212
    registers a thread. At the mask's own row stride (129: Triton cannot specialise it) the same launch took
    229 (split) or 255 with spills (peeled), and ran 1.4-1.7x slower on an H100
    (results/2026-12-06-h100-aligned-mask)."""
    from repro.gdn import triton_tree as tt

    tool = _sm90_resources()

    def phase_one() -> dict:
        (launch,) = [c for c in tool.launches("weaver", 129, form) if c[0].__name__ == "_tree_keys_kernel"]
        return tool.resources(launch[0], launch[1], dict(launch[2]))

    aligned = phase_one()
    monkeypatch.setattr(tt, "MASK_PAD_ABOVE", 1 << 30)  # the mask read at its own stride
    unaligned = phase_one()
    assert aligned["spill_stores"] == 0 and aligned["regs"] <= 212, aligned
    assert unaligned["regs"] >= aligned["regs"] + 40, (aligned, unaligned)
