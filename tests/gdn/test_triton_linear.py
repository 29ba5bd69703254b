"""GEMV kernels with fused norm / SiLU * up / residual / argmax (repro.gdn.triton_linear) vs torch (the
row-tiled verify variant: test_triton_linear_rows.py).

Every case draws x [n, K], the norm scale, the weights and the residual, runs one kernel and the torch
composition it replaces (``rms_norm`` of repro.models.layers, ``F.linear``, ``F.silu``, ``argmax``) in
float64 on the same (upcast) inputs, and reports ||y - ref|| / ||ref|| (inf when the argmax kernel's pick
is not the first largest of its own logits). Arithmetic in the kernels is float32 (float64 for float64
data), so float32 outputs agree to ~1e-6 and float64 ones to ~1e-15; bf16 outputs carry one rounding to
bf16 (an ulp is 2^-8 .. 2^-7 of the value): at most 2^-8 relative per element with the GPU's
round-to-nearest-even, 2^-7 in Triton's interpreter, whose float32 -> bf16 cast truncates (checked: every
interpreted bf16 output equals the truncated float32 result), hence the bound 2^-7 (2^-8 on the GPU).

- interpreter tests (CPU): every kernel and epilogue (norm, norm + bias, gate|up, residual, residual +
  bias, argmax) at N = 37, K = 45 (blocks 8 x 16: masked K, clamped rows past N) without and with split-K
  (3 slices), at N = 40, K = 64 (K a multiple of block_k: the unmasked loads) without and with 2 slices,
  at K = 600 on one warp (the norm reads x's rows after the K loop, not before), and with the default
  configuration; n = 1 and 3 rows; float64, float32 and bf16, run by Triton's
  interpreter in one subprocess (TRITON_INTERPRET=1, this file as a script) that prints every case's
  errors as JSON; split and unsplit float64 results agree to rounding.
- host tests: the configuration lookup (overrides, gemv_configs tables, "legacy", TUNED, the heuristic),
  the legacy rule's numbers, the heuristic's invariants at the model shapes.
- GPU tests (``gpu``): the GDN-1.3B matrices (in_proj [8208, 2048], out_proj [2048, 2048], gate|up
  [11264, 2048], down [2048, 5632], lm_head [32000, 2048]) and the Qwen3.6-27B in_proj [16480, 5120] in
  bf16 with the heuristic, legacy and split-K configurations on CUDA; split-K twice bitwise equal;
  a chain of decode GEMVs in a CUDA graph bitwise equal with and without programmatic dependent launch.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import run_in_interpreter

from repro.errors import ConfigError

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
TOL = {"float64": 1e-12, "float32": 2e-6, "bfloat16": 2**-7}  # bf16: one truncation (interpreter)
# interpreter shapes: (name, N (I for gate|up), K, launch options)
TINY = [
    ("tiny", 37, 45, {"block_n": 8, "block_k": 16}),
    ("split3", 37, 45, {"block_n": 8, "block_k": 16, "split_k": 3}),
    ("even", 40, 64, {"block_n": 8, "block_k": 16}),
    ("late_x", 37, 600, {"block_n": 8, "block_k": 256, "num_warps": 1}),  # x's rows read after the loop
    ("even_split2", 40, 64, {"block_n": 8, "block_k": 16, "split_k": 2}),
    ("default", 37, 45, {}),
]
# GDN-1.3B decode matmuls: (kernel, N (I for gate|up), K)
REAL = [
    ("norm_linear", 8208, 2048),  # input norm + stacked in_proj (q|k|v, z, a, b)
    ("linear_residual", 2048, 2048),  # out_proj + residual
    ("norm_gate_up", 5632, 2048),  # post norm + stacked gate|up + SiLU * up
    ("linear_residual", 2048, 5632),  # down_proj + residual
    ("norm_linear_argmax", 32000, 2048),  # final norm + lm_head + argmax
]
KINDS = (
    "norm_linear", "norm_linear_bias", "norm_gate_up", "linear_residual", "linear_residual_bias",
    "norm_linear_argmax",
)  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def run_case(
    kind: str, n_out: int, k: int, rows: int, dtype: torch.dtype, device: str, seed: int, **blocks
) -> tuple[torch.Tensor, torch.Tensor]:
    """One kernel on random inputs and its torch composition in float64: (output, reference)."""
    from repro.gdn import triton_linear as tlin
    from repro.models.layers import rms_norm

    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, s: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return (shift + s * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    x, scale = rnd(rows, k, s=3.0), rnd(k, s=0.2, shift=1.0)
    h = rms_norm(x.double(), scale.double(), 1e-6)
    if kind == "norm_gate_up":
        w = rnd(2 * n_out, k, s=k**-0.5)
        gu = F.linear(h, w.double())
        return tlin.norm_gate_up(x, scale, 1e-6, w, **blocks), F.silu(gu[:, :n_out]) * gu[:, n_out:]
    w, bias = rnd(n_out, k, s=k**-0.5), rnd(n_out, s=0.1)
    if kind == "norm_linear":
        return tlin.norm_linear(x, scale, 1e-6, w, **blocks), F.linear(h, w.double())
    if kind == "norm_linear_bias":
        return tlin.norm_linear(x, scale, 1e-6, w, bias, **blocks), F.linear(h, w.double(), bias.double())
    if kind == "norm_linear_argmax":
        pick = torch.full((1,), -1, dtype=torch.long, device=device)
        out = tlin.norm_linear_argmax(x[:1], scale, 1e-6, w, bias, pick, **blocks)
        if int(pick[0]) != int(out[0].float().argmax()):  # the first largest of the logits as returned
            out = torch.full_like(out, float("nan"))
        return out, F.linear(h[:1], w.double(), bias.double())
    residual = rnd(rows, n_out)
    if kind == "linear_residual":
        out = tlin.linear_residual(x, w, residual, **blocks)
        return out, residual.double() + F.linear(x.double(), w.double())
    out = tlin.linear_residual(x, w, residual, bias, **blocks)
    return out, residual.double() + F.linear(x.double(), w.double(), bias.double())


def case(
    kind: str, n_out: int, k: int, rows: int, dtype: torch.dtype, device: str, seed: int, **blocks
) -> float:
    """||kernel - torch|| / ||torch|| of one case (inf when not finite or a wrong pick)."""
    return rel(*run_case(kind, n_out, k, rows, dtype, device, seed, **blocks))


def tiny_cases() -> dict[str, object]:
    """Every kind x shape/launch x rows in float64 in the interpreter; float32 and bfloat16 (what changes
    with the dtype: loads, accumulation, rounding of the stores) on the ragged, split-K and late-x
    launches; and the float64 split vs unsplit gap."""
    out: dict[str, object] = {}
    for dt in DTYPES:
        shapes = TINY if dt == "float64" else [t for t in TINY if t[0] in ("tiny", "split3", "late_x")]
        for rows in (1, 3):
            for kind in KINDS:
                if kind == "norm_linear_argmax" and rows > 1:
                    continue
                for name, n_out, k, blocks in shapes:
                    n = n_out // 2 if kind == "norm_gate_up" else n_out
                    out[f"{kind}/{name}/n{rows}/{dt}"] = case(
                        kind, n, k, rows, DTYPES[dt], "cpu", rows, **blocks
                    )
    gaps = {}
    for kind in KINDS:
        one, _ = run_case(kind, 37, 45, 1, torch.float64, "cpu", 4, **TINY[0][3])
        split, _ = run_case(kind, 37, 45, 1, torch.float64, "cpu", 4, **TINY[1][3])
        gaps[kind] = float((one - split).abs().max())
    out["split_vs_unsplit_float64"] = gaps
    return out


def check(results: dict[str, object]) -> list[str]:
    """Every error over its dtype's bound (NaN included): an empty list passes."""
    return [
        f"{c}: {e:.2e}"
        for c, e in results.items()
        if isinstance(e, float) and not e <= TOL[c.rsplit("/", 1)[1]]
    ]


@pytest.fixture(scope="module")
def interpreted() -> dict[str, object]:
    return run_in_interpreter(__file__)


def test_kernels_match_torch_in_the_interpreter(interpreted):
    """Every kind and epilogue, unsplit and split-K (masked and unmasked K), default blocks, n = 1 and 3,
    in float64, and in float32 / bf16 on three launches: within the dtype's bound; bf16 visibly rounded
    (the check can fail)."""
    errs = {c: e for c, e in interpreted.items() if isinstance(e, float)}
    assert len(errs) == (len(TINY) + 2 * 3) * (2 * len(KINDS) - 1)
    assert check(errs) == []
    assert max(e for c, e in errs.items() if c.endswith("float64")) < 1e-14
    assert max(e for c, e in errs.items() if c.endswith("float32")) < 1e-6
    assert min(e for c, e in errs.items() if c.endswith("bfloat16")) > 1e-4  # rounded to bf16


def test_split_k_agrees_with_one_slice_in_float64(interpreted):
    """Split-K adds the same products in another order: float64 outputs agree to rounding."""
    gaps = interpreted["split_vs_unsplit_float64"]
    assert set(gaps) == set(KINDS)
    assert max(gaps.values()) < 1e-13, gaps


def test_check_flags_errors_over_their_bounds():
    assert check(
        {"a/n1/float32": 3e-6, "b/n1/bfloat16": 4e-3, "c/n3/float32": float("nan"), "d/n1/float64": 2e-12}
    ) == [
        "a/n1/float32: 3.00e-06",
        "c/n3/float32: nan",
        "d/n1/float64: 2.00e-12",
    ]


def test_bad_shapes_are_config_errors():
    pytest.importorskip("triton")
    from repro.gdn import triton_linear as tlin

    w, s = torch.zeros(6, 4), torch.ones(4)
    with pytest.raises(ConfigError, match="1..256 rows"):
        tlin.norm_linear(torch.zeros(257, 4), s, 1e-6, w)
    with pytest.raises(ConfigError, match="unknown row-tiled launch options"):
        tlin.norm_linear(torch.zeros(5, 4), s, 1e-6, w, split_k=2)
    with pytest.raises(ConfigError, match=r"is not \[N, 4\]"):
        tlin.linear_residual(torch.zeros(1, 4), torch.zeros(6, 5), torch.zeros(1, 6))
    with pytest.raises(ConfigError, match="row-major"):
        tlin.norm_linear(torch.zeros(1, 4), s, 1e-6, torch.zeros(4, 6).t())
    with pytest.raises(ConfigError, match=r"residual must be a row-major \[1, 6\]"):
        tlin.linear_residual(torch.zeros(1, 4), w, torch.zeros(1, 5))
    with pytest.raises(ConfigError, match="stack gate and up"):
        tlin.norm_gate_up(torch.zeros(1, 4), s, 1e-6, torch.zeros(5, 4))
    with pytest.raises(ConfigError, match="unknown GEMV launch options"):
        tlin.norm_linear(torch.zeros(1, 4), s, 1e-6, w, block_m=4)
    with pytest.raises(ConfigError, match="power of two"):
        tlin.GemvConfig(12, 64)
    with pytest.raises(ConfigError, match="RowsConfig.block_m must be a power of two"):
        tlin.RowsConfig(48, 16, 64)
    with pytest.raises(ConfigError, match="split_k >= 1"):
        tlin.GemvConfig(8, 64, split_k=0)


# ------------------------------------------------------------------------------ launch configurations


def test_config_lookup_order():
    """Overrides > the active gemv_configs table > TUNED > the heuristic; 'legacy' and 'heuristic' force a
    rule; tables nest; block_k is capped at pow2(K) and split_k at the slices K has."""
    pytest.importorskip("triton")
    from repro.gdn import triton_linear as tlin

    key = ("norm_linear", 4096, 2048)
    heur = tlin.heuristic_config("norm_linear", 4096, 2048)
    assert tlin.select_config(*key) == heur
    mine = tlin.GemvConfig(2, 1024, 8, 2, 2)
    tuned = tlin.GemvConfig(4, 256)
    tlin.TUNED[key] = tuned
    try:
        assert tlin.select_config(*key) == tuned
        with tlin.gemv_configs({key: mine}):
            assert tlin.select_config(*key) == mine
            assert tlin.select_config("norm_gate_up", 4096, 2048) == tlin.heuristic_config(
                "norm_gate_up", 4096, 2048
            )
            with tlin.gemv_configs("legacy"):
                assert tlin.select_config(*key) == tlin.legacy_config(4096, 2048)
            with tlin.gemv_configs("heuristic"):
                assert tlin.select_config(*key) == heur
            assert tlin.select_config(*key, num_warps=4) == tlin.GemvConfig(2, 1024, 4, 2, 2)
            assert tlin.select_config(*key, block_n=16) == tlin.GemvConfig(16, 256, 8, 2, 2)
        assert tlin.select_config(*key) == tuned
    finally:
        del tlin.TUNED[key]
    assert tlin.select_config("linear_residual", 64, 45, block_k=512, split_k=4).block_k == 64
    assert tlin.select_config("linear_residual", 64, 45, block_k=16, split_k=8).split_k == 3  # 16 + 16 + 13
    assert tlin.select_config("linear_residual", 64, 4096, block_k=512, split_k=3).split_k == 3
    with pytest.raises(ConfigError, match="unknown GEMV kind"):
        tlin.select_config("linear", 64, 64)
    with pytest.raises(ConfigError, match="gemv_configs takes"), tlin.gemv_configs("fast"):
        pass


def test_legacy_rule_keeps_the_first_defaults():
    """The untuned defaults the kernels shipped with: ~512 programs within 4..64 rows, tiles of <= 4096."""
    pytest.importorskip("triton")
    from repro.gdn import triton_linear as tlin

    got = {
        shape: tlin.legacy_config(*shape)
        for shape in ((12304, 2048), (2048, 2048), (2048, 5632), (32000, 2048))
    }
    assert {s: (c.block_n, c.block_k, c.num_warps, c.split_k) for s, c in got.items()} == {
        (12304, 2048): (16, 256, 4, 1),
        (2048, 2048): (4, 1024, 4, 1),
        (2048, 5632): (4, 1024, 4, 1),
        (32000, 2048): (32, 128, 4, 1),
    }


@pytest.mark.parametrize(
    "kind,n,k",
    [(kind, n, k) for kind, n, k in REAL]
    + [("linear_residual", 512, 8192), ("linear_residual", 256, 16384), ("norm_gate_up", 256, 8192)],
)
def test_heuristic_invariants(kind, n, k):
    """Powers of two; tiles of <= 8192 weights (gate|up: both tiles) and K steps <= K; >= 4 programs per
    SM unless one row per program; split-K exactly where fewer than 2 per SM would run (and K has room),
    every slice a whole K step."""
    pytest.importorskip("triton")
    import triton

    from repro.gdn import triton_linear as tlin

    cfg = tlin.heuristic_config(kind, n, k, sms=132)
    width = 2 if kind == "norm_gate_up" else 1
    assert cfg.block_n * cfg.block_k * width <= 8192 and cfg.block_k <= k
    programs = triton.cdiv(n, cfg.block_n)
    assert programs >= 4 * 132 or cfg.block_n == 1
    assert (cfg.split_k > 1) == (programs < 2 * 132 and k >= 512 and n * k * width >= tlin.SPLIT_WEIGHTS)
    assert k >= cfg.split_k * cfg.block_k
    assert (cfg.split_k > 1) == (n <= 256)  # of these shapes, the two narrowest split


def test_heuristic_keeps_the_legacy_rule_for_small_matrices():
    """Under 1M weights (the tiny widths, where the legacy blocks measured faster than cuBLAS) the
    heuristic is the legacy rule; no split-K under 4M weights however narrow the output."""
    pytest.importorskip("triton")
    from repro.gdn import triton_linear as tlin

    for kind, n, k in (("norm_linear", 1024, 1023), ("norm_gate_up", 256, 2047), ("linear_residual", 64, 64)):
        assert tlin.heuristic_config(kind, n, k) == tlin.legacy_config(n, k)
    assert tlin.heuristic_config("linear_residual", 128, 16384).split_k == 1  # 2M weights: too few to split
    assert tlin.heuristic_config("linear_residual", 256, 16384).split_k == 2  # 4M weights


@pytest.mark.parametrize("early, pdl", [(True, 1), (False, 1), (True, 2)])
@pytest.mark.parametrize("key", [("norm_linear", 8208, 2048), ("norm_gate_up", 5632, 2048)])
def test_dependent_gemv_loads_weights_before_the_wait(key, early, pdl):
    """The GEMV kernel as a programmatic dependent (PDL), compiled for sm_90 with the tuned configuration
    of a GDN-1.3B matrix (Triton's own ptxas, no GPU): with EARLY_W its first weight tile is loaded before
    ``griddepcontrol.wait``, without it no load is; PDL 1 releases the next launch before the wait, PDL 2
    never explicitly; nothing spills."""
    import re
    import subprocess
    import tempfile

    pytest.importorskip("triton.backends.nvidia.compiler")
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from repro.gdn.triton_linear import TUNED, _gemv_kernel

    kind, n, k = key
    cfg = TUNED[key]
    ints = ("x_stride", "res_stride", "N", "K", "k_slice", "n_rows")
    sig = {a: "i32" if a in ints else "fp32" if a == "eps" else "*bf16" for a in _gemv_kernel.arg_names}
    sig.update(best_ptr="*fp32", best_idx_ptr="*i64", ws_ptr="*fp32")
    consts = dict(
        N_ROWS=1, RB=1, BN=cfg.block_n, BK=cfg.block_k, KP=k, EARLY_X=True, SPLIT=1, EVEN_K=True,
        NORM=True, GATE_UP=kind == "norm_gate_up", HAS_BIAS=False, RESIDUAL=False, ARGMAX=False,
        ACC=tl.float32, PDL=pdl, EARLY_W=early, GROUPED=False,
    )  # fmt: skip
    sig.update(dict.fromkeys(consts, "constexpr"))
    names = _gemv_kernel.arg_names
    # as a launch specializes them: 16-byte aligned pointers, sizes and strides divisible by 16
    aligned = [a for a in names if sig[a].startswith("*") or a in ("N", "K", "k_slice", "x_stride")]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    const_at = {(names.index(a),): v for a, v in consts.items()}
    src = ASTSource(_gemv_kernel, {a: sig[a] for a in names}, const_at, attrs)
    options = {"num_warps": cfg.num_warps}
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    if pdl == 1:  # the next launch released at the start
        assert ptx.index("griddepcontrol.launch_dependents") < wait
    else:  # at the exit: no explicit release
        assert "griddepcontrol.launch_dependents" not in ptx
    assert bool(re.search(r"ld\.global[^\n]*\.v4", ptx[:wait])) == early
    assert "ld.global" in ptx[:wait] if early else "ld.global" not in ptx[:wait]
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(90).path, "-arch=sm_90a", "-v", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    assert sum(int(b) for b in re.findall(r"(\d+) bytes spill stores", log)) == 0


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 3])
def test_gpu_kernels_at_the_1p3b_shapes(rows):
    """The five decode matmuls of GDN-1.3B and the 27B in_proj (x's rows read after the K loop) in bf16
    (heuristic, legacy, split-K by 4) vs torch in float64; split-K twice bitwise equal."""
    from repro.gdn import triton_linear as tlin

    results: dict[str, object] = {}
    for i, (kind, n, k) in enumerate([*REAL, ("norm_linear", 16480, 5120)]):
        if kind == "norm_linear_argmax" and rows > 1:
            kind = "norm_linear"
        for name, blocks in (
            ("heuristic", {}),
            ("legacy", None),
            ("split4", {"block_n": 16, "block_k": 256, "split_k": 4}),
        ):
            if blocks is None:
                with tlin.gemv_configs("legacy"):
                    results[f"{kind}/{n}x{k}/{name}/n{rows}/bfloat16"] = case(
                        kind, n, k, rows, torch.bfloat16, "cuda", i
                    )
            else:
                results[f"{kind}/{n}x{k}/{name}/n{rows}/bfloat16"] = case(
                    kind, n, k, rows, torch.bfloat16, "cuda", i, **blocks
                )
        a, _ = run_case(kind, n, k, rows, torch.bfloat16, "cuda", i, block_n=16, block_k=256, split_k=4)
        b, _ = run_case(kind, n, k, rows, torch.bfloat16, "cuda", i, block_n=16, block_k=256, split_k=4)
        results[f"{kind}/{n}x{k}/split4_repeat_equal"] = bool(torch.equal(a, b))
    print(json.dumps(results, indent=1))
    assert check(results) == []
    assert max(e for e in results.values() if isinstance(e, float)) < 2**-8  # rounded to nearest
    assert all(v for c, v in results.items() if c.endswith("repeat_equal"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_dependent_launch_is_bitwise_equal():
    """A decode layer's chain of GEMVs (each reading the previous output), 20 times over in one CUDA graph,
    gives bitwise the same result with programmatic dependent launch as without (bf16, 1.3B matrices)."""
    from repro.gdn import triton_linear as tlin
    from repro.gdn.triton_common import dependent_launch, use_pdl

    gen = torch.Generator(device="cuda").manual_seed(0)
    d, inner, qkv = 2048, 5632, 8208

    def rnd(*shape: int, s: float = 0.02) -> torch.Tensor:
        return (s * torch.randn(*shape, generator=gen, device="cuda")).to(torch.bfloat16)

    w_in, w_out, w_gu, w_down = rnd(qkv, d), rnd(d, qkv), rnd(2 * inner, d), rnd(d, inner)
    scale = 1.0 + rnd(d, s=0.1)
    x0 = rnd(1, d, s=1.0)

    def layers(x: torch.Tensor) -> torch.Tensor:
        for _ in range(20):
            h = tlin.norm_linear(x, scale, 1e-6, w_in)
            x = tlin.linear_residual(h, w_out, x)
            h = tlin.norm_gate_up(x, scale, 1e-6, w_gu)
            x = tlin.linear_residual(h, w_down, x)
        return x

    outs = []
    for on in (False, True):
        with dependent_launch(on):
            assert use_pdl(x0.device) == (on and torch.cuda.get_device_capability() >= (9, 0))
            layers(x0)  # compile and warm up outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = layers(x0)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        outs.append(out.clone())
    assert torch.isfinite(outs[0].float()).all()
    assert torch.equal(outs[0], outs[1])


if __name__ == "__main__" and "--interpret" in sys.argv:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    print(json.dumps(tiny_cases()))
