"""The tree verify's attention kernel and StaticDecoder's ``fuse_tree_attention``.

- :func:`repro.gdn.triton_attention.attention_tree` vs the torch path it replaces on the same
  projection row: :func:`repro.models.static_layers.attention_prologue` (q|k|v split, q/k RMSNorm, rotary at
  the nodes' positions), :func:`~repro.models.static_layers.attention_core` (the masked cache rows and the
  ancestor mask, per query head of a key head's group) and the output gate of ``attention_epilogue``.
  GQA (2 and 6 query heads a key head) and not, output gate and not, partial, full and no rotary, head
  dims padded to the tile (8, 12) and tiny-qwen35's (48); n = 1, 5, 17, 33 nodes of random trees of every
  kind (forests and fans among them), cache lengths 0 and 37 (several row blocks, the last partial; 33
  nodes at 37 only);
  the returned keys (normed, rotated, in the cache dtype) and values (a view of qkv), the cache
  untouched; larger blocks (the GPU's at tiny-qwen35's shape) and a row-strided qkv. float64 to rounding
  (every case), float32 to ~1e-6 (n = 5, 33), bf16 to its rounding (n = 17; the interpreter's casts
  truncate: 2e-2).
- the kernel (and attention_decode, whose helpers it shares) compiled ahead of time for sm_90 (Triton's
  ptxas, no GPU) at the launch parameters the host picks for the tiny-qwen35 and Qwen3.6-27B shapes (T = 33
  unsplit; T = 1 at a decode step's default cache-row splits, with their combine kernel): it lowers,
  within the H200's shared memory. The splits themselves: tests/gdn/test_tree_attention_split.py.
- StaticDecoder verify with the flag on vs off: logits, the state after a closed-form commit and the
  next decode step's logits; float64 (an attention-only model without the output gate: the GDN tree
  kernel takes float32; a padded slot) also vs HybridLM, float32 with GDN layers; the fused verify
  capture-safe; its launches (aten ops + Triton) per attention layer and per step; the flag's
  resolution and its ConfigErrors.
- GPU (``gpu``): the kernel at tiny-qwen35's and Qwen3.6-27B's attention shapes (T = 16, 33, 64, cache
  length 512) in float32 and bf16; graphed verify + commit with the flag on vs the unfused decoder.

The interpreter cases run in one TRITON_INTERPRET=1 subprocess (this file as a script).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import CountedLaunches, run_in_interpreter

from repro.errors import ConfigError

F64 = torch.float64
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
TOL = {"float64": 1e-12, "float32": 3e-6, "bfloat16": 2e-2}
# (H, H_kv, head_dim, partial rotary factor, output gate)
SPECS = {
    "gqa_gate": (4, 2, 16, 0.5, True),
    "mha_nogate_fullrot": (2, 2, 12, 1.0, False),
    "group6_norot": (6, 1, 8, 0.0, True),
    "tiny_qwen35": (4, 2, 48, 0.25, True),
}
SIZES = (1, 5, 17, 33)
KINDS = ("random", "forest", "mixed", "fan", "chain")
ROWS = 48  # cache rows (length 37: three blocks of 16, the last partial)
NEXT = 7  # the token of the decode step after a commit


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def attention_layer(spec: tuple, hidden: int = 32, seed: int = 0):  # noqa: ANN201 - a DecoderLayer
    """One seeded attention DecoderLayer (float64) of the given head layout."""
    from repro.models.config import ATTENTION, HybridConfig
    from repro.models.default import init_random_weights
    from repro.models.hybrid import HybridLM

    h, hkv, hd, rot, gate = spec
    cfg = HybridConfig(
        vocab_size=8, hidden_size=hidden, intermediate_size=16, layer_types=[ATTENTION],
        num_attention_heads=h, num_key_value_heads=hkv, head_dim=hd, partial_rotary_factor=rot,
        attention_output_gate=gate,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), seed).to(F64).eval().model.layers[0]


def tree_inputs(n: int, kind: str, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(ancestors bool [n, n], depth int64 [n]) of a random tree of ``kind``."""
    from repro.bench.shapes import random_parents
    from repro.tree import ancestor_matrix

    parents = random_parents(n, kind, torch.Generator().manual_seed(seed)).numpy()
    anc, depth = ancestor_matrix(parents)
    return torch.from_numpy(anc).to(device), torch.from_numpy(depth).to(device)


def torch_path(layer, x, keys, values, length, anc, depth) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
    """(gated out [n, H hd], k, v) of the static decoder's torch glue for a verify."""
    from repro.models.layers import rotary_tables
    from repro.models.static_layers import AttentionWeights, attention_core, attention_prologue

    a = layer.self_attn
    cos, sin = rotary_tables(length + depth - 1, a.inv_freq, x.dtype)
    q, gate, k, v = attention_prologue(layer, AttentionWeights.of(layer), x, cos, sin)
    prefix_blocked = torch.arange(keys.shape[1], device=x.device) >= length
    tree_blocked = ~anc.repeat(a.num_heads // a.num_kv_heads, 1)
    out = attention_core(q, k, v, keys, values, prefix_blocked, tree_blocked)
    return (out * torch.sigmoid(gate) if a.output_gate else out), k, v


@torch.no_grad()
def case_inputs(
    spec: tuple, n: int, length: int, dtype: torch.dtype, device: str, seed: int, rows: int = ROWS,
    strided: bool = False,
) -> dict:  # fmt: skip
    """A layer's projection row (in ``dtype``), cache and tree: ``args`` of attention_tree, the float64
    torch path's (out, k) on the kernel's (rounded) inputs as ``want``, the values' columns of qkv and the
    cache as it was."""
    from repro.gdn.triton_attention import rotary_table
    from repro.models.layers import rms_norm
    from repro.models.static_layers import AttentionWeights

    layer = attention_layer(spec, seed=seed)
    a, w = layer.self_attn, AttentionWeights.of(layer)
    gen = torch.Generator().manual_seed(seed)
    hkv, hd = a.num_kv_heads, a.head_dim
    x = torch.randn(n, 32, generator=gen, dtype=F64)
    keys, values = (torch.randn(hkv, rows, hd, generator=gen, dtype=F64) for _ in "kv")
    anc, depth = tree_inputs(n, KINDS[seed % len(KINDS)], seed)
    qkv = torch.nn.functional.linear(rms_norm(x, w.input_norm, layer.input_layernorm.eps), w.qkv)
    if strided:  # rows of a wider buffer
        qkv = torch.cat([qkv, torch.zeros(n, 7, dtype=F64)], dim=1)[:, : qkv.shape[1]]
    qkv_d = qkv.to(device=device, dtype=dtype)
    scales = [s.to(device=device, dtype=dtype) for s in (w.q_norm, w.k_norm)]
    keys_d, values_d = keys.to(device=device, dtype=dtype), values.to(device=device, dtype=dtype)
    rope = rotary_table(a.inv_freq, rows + n, dtype, torch.device(device))
    length_d = torch.tensor([length], device=device)
    args = (
        qkv_d, *scales, (a.q_norm.eps, a.k_norm.eps), rope, keys_d, values_d, length_d, depth.to(device),
        anc.to(device), a.num_heads, a.output_gate,
    )  # fmt: skip
    # the float64 path on the kernel's (rounded) inputs (float64: the same inputs)
    want, want_k, _ = torch_path(layer, x, keys_d.double().cpu(), values_d.double().cpu(), length, anc, depth)
    q_out = qkv.shape[1] - 2 * hkv * hd
    v_cols = qkv_d[:, q_out + hkv * hd :]
    return {
        "args": args,
        "want": (want, want_k),
        "v_cols": v_cols,
        "before": (keys_d.clone(), values_d.clone()),
    }


@torch.no_grad()
def kernel_case(
    spec: tuple,
    n: int,
    length: int,
    dtype: torch.dtype,
    device: str,
    seed: int,
    rows: int = ROWS,
    blocks: tuple[int | None, int | None] = (None, None),
    strided: bool = False,
    splits: int | None = None,
) -> dict[str, float]:
    """attention_tree on the layer's projection row (in ``dtype``) vs the float64 torch path."""
    from repro.gdn.triton_attention import attention_tree

    case = case_inputs(spec, n, length, dtype, device, seed, rows, strided)
    args, (want, want_k), v_cols = case["args"], case["want"], case["v_cols"]
    keys_d, values_d = args[5], args[6]
    out, k, v = attention_tree(*args, block_m=blocks[0], block_rows=blocks[1], splits=splits)
    hkv, hd = keys_d.shape[0], keys_d.shape[2]
    return {
        "out": rel(out, want),
        "k": rel(k, want_k),
        "v": rel(v, v_cols.reshape(n, hkv, hd)) + (k.dtype != keys_d.dtype),
        "v_is_view": float(v.data_ptr() != v_cols.data_ptr()),
        "untouched": float((keys_d != case["before"][0]).sum() + (values_d != case["before"][1]).sum()),
    }


def kernel_cases(device: str) -> dict[str, dict[str, float]]:
    res = {}
    seed = 0
    for dname, dtype in DTYPES.items():
        for name, spec in SPECS.items():
            for n in {"float64": SIZES, "float32": (5, 33), "bfloat16": (17,)}[dname]:
                for length in (0, 37) if n < 33 else (37,):  # 33 nodes: three row blocks over the cache
                    seed += 1
                    res[f"{name}/n{n}/L{length}/{dname}"] = kernel_case(spec, n, length, dtype, device, seed)
    for dname in ("float64", "float32"):
        dtype = DTYPES[dname]
        spec = SPECS["gqa_gate"]
        res[f"blocks32/{dname}"] = kernel_case(spec, 33, 37, dtype, device, 90, blocks=(32, 32))
        res[f"blocks64_16/{dname}"] = kernel_case(spec, 33, 37, dtype, device, 91, blocks=(64, 16))
        res[f"strided/{dname}"] = kernel_case(spec, 17, 37, dtype, device, 92, strided=True)
        tiny = SPECS["tiny_qwen35"]  # the GPU's default blocks at T = 33
        res[f"tiny_blocks64/{dname}"] = kernel_case(tiny, 33, 37, dtype, device, 93, blocks=(64, 64))
    return res


def check_kernels(res: dict[str, dict[str, float]]) -> list[str]:
    """Errors over their bounds; v (a view), v_is_view and untouched must be exact."""
    bad = []
    for key, errs in res.items():
        tol = TOL[key.rsplit("/", 1)[1]]
        for field, val in errs.items():
            ok = val == 0 if field in ("v", "v_is_view", "untouched") else val <= tol
            if not ok:
                bad.append(f"{key} {field}: {val}")
    return bad


# ---------------------------------------------------------------------------------- the decoder


def small_model(layers: list[str], dtype: torch.dtype, gate: bool = True, device: str = "cpu"):  # noqa: ANN201
    from repro.models.config import HybridConfig
    from repro.models.default import init_random_weights
    from repro.models.hybrid import HybridLM

    cfg = HybridConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, layer_types=layers,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5,
        attention_output_gate=gate,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), 21).to(device=device, dtype=dtype).eval()


def random_token_tree(n: int, kind: str, seed: int):  # noqa: ANN201 - a Tree
    from repro.bench.shapes import random_parents
    from repro.tree import Tree

    gen = torch.Generator().manual_seed(seed)
    return Tree(torch.randint(0, 61, (n,), generator=gen), random_parents(n, kind, gen))


def state_errs(a, b) -> float:  # noqa: ANN001 - ModelStates
    errs = [float(abs(a.position - b.position))]
    for x, y in zip(a.layers, b.layers):
        errs += [rel(u, v) for u, v in zip(vars(x).values(), vars(y).values())]
    return max(errs)


def verify_commit(model, state, tree, size: int, fuse: bool, graphed: bool = False) -> dict:  # noqa: ANN001
    """verify (graphed: a CUDA graph of it, and of the commit), the closed-form commit of the tree's
    deepest path, one decode step, on a decoder with ``fuse_tree_attention=fuse`` (None: the unfused
    decoder)."""
    from repro.models.static import StaticDecoder, TreeSlot

    fused = fuse is not None
    dec = StaticDecoder(model, 40, 40, kernel="triton", fused=fused, fuse_tree_attention=fuse)
    dec.load(state)
    slot = TreeSlot(dec, size)
    slot.set_tree(tree, pad=True)
    path = tree.path_to(int(tree.depth.argmax()))  # the deepest path: many rows move
    slot.set_accepted(path)

    def verify() -> torch.Tensor:
        return dec.verify(slot)

    def commit() -> None:
        dec.commit(slot, "closed_form")

    if graphed:
        from repro.models.graphs import GraphedCall

        run_verify, run_commit = GraphedCall(verify, model.device), None
        run_verify()
        run_commit = GraphedCall(commit, model.device)
        dec.load(state)
        logits = run_verify().clone()
        run_commit()
    else:
        logits = verify().clone()
        commit()
    after = dec.export()
    dec.set_token(NEXT)
    out = {"logits": logits, "path": path, "state": after, "dec": dec, "next": dec.decode_step().clone()}
    if fuse and not graphed:  # the same decode step with its attention on the tree kernel
        out["after_next"] = dec.export()
        dec.load(after)
        dec.tree_attention_decode = True
        dec.set_token(NEXT)
        out["next_tree"] = dec.decode_step().clone()
        out["after_next_tree"] = dec.export()
    return out


def decoder_cases(device: str) -> dict[str, dict[str, object]]:
    """The flag on vs off (same decoder otherwise); float64 also vs HybridLM's verify and commit."""
    from repro.models.config import ATTENTION, GDN
    from repro.tree import Tree

    cases = {
        "float64/attention_only_nogate": (torch.float64, [ATTENTION, ATTENTION], False, 13, 17),
        "float32/hybrid": (torch.float32, [GDN, ATTENTION, GDN, ATTENTION], True, 9, 9),
    }
    if device == "cuda":
        cases = {
            "float32/hybrid": (torch.float32, [GDN, ATTENTION, GDN, ATTENTION], True, 24, 33),
            "bfloat16/hybrid": (torch.bfloat16, [GDN, ATTENTION, GDN, ATTENTION], True, 33, 33),
        }
    out = {}
    for key, (dtype, layers, gate, n, size) in cases.items():
        model = small_model(layers, dtype, gate, device)
        state, _ = model.prefill(list(range(3, 14)))
        tree = random_token_tree(n, "mixed", n)
        graphed = device == "cuda"
        off = verify_commit(model, state, tree, size, False if device == "cpu" else None)
        on = verify_commit(model, state, tree, size, True, graphed)
        assert on["dec"].fuse_tree_attention and not off["dec"].fuse_tree_attention
        errs: dict[str, object] = {
            "logits": rel(on["logits"][:n], off["logits"][:n]),
            "same_picks": bool(torch.equal(on["logits"][:n].argmax(-1), off["logits"][:n].argmax(-1))),
            "path_len": len(on["path"]),
            "state": state_errs(on["state"], off["state"]),
            "next": rel(on["next"], off["next"]),
        }
        if "next_tree" in on:  # tree_attention_decode: the decode step's logits and state (cache included)
            errs["next_tree_decode"] = rel(on["next_tree"], on["next"])
            errs["state_tree_decode"] = state_errs(on["after_next_tree"], on["after_next"])
        if dtype == F64:
            ver = model.verify(state, tree)
            ref = model.commit(state, ver, on["path"])
            errs["logits_vs_hybrid"] = rel(on["logits"][:n], ver.logits)
            errs["state_vs_hybrid"] = state_errs(on["state"], ref)
            errs["next_vs_hybrid"] = rel(on["next"], model.verify(ref, Tree.single(NEXT)).logits)
        out[key] = errs
    return out


def check_decoder(res: dict[str, dict[str, object]], float32_tol: float = 1e-5) -> list[str]:
    """Errors over their bounds (float32: ``float32_tol``), argmax picks that differ (but in bf16)."""
    bad = []
    for key, errs in res.items():
        tol = {"float64": 1e-12, "float32": float32_tol, "bfloat16": 3e-2}[key.split("/")[0]]
        for field, val in errs.items():
            if field == "same_picks":
                ok = val or key.startswith("bfloat16")
            elif field == "path_len":
                ok = True
            else:
                assert isinstance(val, float)
                ok = val <= tol
            if not ok:
                bad.append(f"{key} {field}: {val}")
    return bad


def capture_facts() -> dict[str, object]:
    """The fused verify (float32) under CaptureCheck: hazards, and the same trace for two trees."""
    from repro.models.config import ATTENTION, GDN
    from repro.models.graphs import check_capture
    from repro.models.static import StaticDecoder, TreeSlot

    model = small_model([GDN, ATTENTION], torch.float32)
    state, _ = model.prefill([1, 2, 3, 4])
    dec = StaticDecoder(model, 32, 8, kernel="triton")
    slot = TreeSlot(dec, 6)
    traces, hazards = [], []
    for seed in (1, 2):
        dec.load(state)
        slot.set_tree(random_token_tree(6, "random", seed))
        check = check_capture(lambda: dec.verify(slot))
        traces.append(check.trace)
        hazards += check.hazards
    return {"default_on": dec.fuse_tree_attention, "hazards": hazards, "same_trace": traces[0] == traces[1]}


def launch_counts() -> dict[str, dict[str, int]]:
    """Launches (aten ops that launch work + Triton launches) of a verify of 5 nodes, flag off and on: per
    attention layer (2 attention layers minus 1) and per step beside the layers (2 layers minus twice
    one). The tiny-qwen35 layout's whole verify (6 GDN + 2 attention layers): 437 launches off, 369 on."""
    from repro.gdn import triton_attention, triton_decode
    from repro.models.config import ATTENTION
    from repro.models.graphs import count_ops
    from repro.models.static import StaticDecoder, TreeSlot

    counter = [0]
    for module in (triton_attention, triton_decode):
        for name in dir(module):
            if name.endswith("_kernel"):
                setattr(module, name, CountedLaunches(getattr(module, name), counter))

    def verify_launches(model, fuse: bool) -> int:  # noqa: ANN001
        dec = StaticDecoder(model, 16, 8, kernel="triton", fuse_tree_attention=fuse)
        dec.load(model.prefill([5, 6, 7])[0])
        slot = TreeSlot(dec, 5)
        slot.set_tree(random_token_tree(5, "random", 3))
        counter[0] = 0
        return count_ops(lambda: dec.verify(slot)) + counter[0]

    one, two = (small_model([ATTENTION] * k, torch.float32) for k in (1, 2))
    out = {}
    for fuse in (False, True):
        counts = [verify_launches(one, fuse), verify_launches(two, fuse)]
        layer = counts[1] - counts[0]
        out["on" if fuse else "off"] = {"per_attention_layer": layer, "per_step": counts[1] - 2 * layer}
    return out


# ------------------------------------------------------------------------------------ interpreter


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__)


def test_tree_attention_kernel_matches_the_torch_path(interpreted):
    kernels = interpreted["kernels"]
    assert len(kernels) == len(SPECS) * (2 * (len(SIZES) + 2 + 1) - 2) + 8
    assert check_kernels(kernels) == []
    assert kernels["gqa_gate/n17/L37/bfloat16"]["out"] > 1e-5  # bf16 really rounds: the bound is live


def test_fused_verify_matches_the_unfused_one(interpreted):
    res = interpreted["decoder"]
    assert len(res) == 2 and check_decoder(res) == []
    assert all("next_tree_decode" in errs for errs in res.values())  # the decode step on the tree kernel
    assert all(errs["path_len"] > 1 for errs in res.values()), res  # the commits move several rows


def test_fused_verify_is_capture_safe_and_on_by_default(interpreted):
    assert interpreted["capture"] == {"default_on": True, "hazards": [], "same_trace": True}


def test_fused_verify_launches_fewer_kernels(interpreted):
    """An attention layer's verify: 8 launches (RMSNorm, q|k|v, the tree kernel, o_proj + residual, the
    MLP's four), 37 before; the per-step masks and rotary tables (10 launches a step) are gone too."""
    counts = interpreted["launches"]
    assert counts["on"]["per_attention_layer"] == 8, counts
    assert counts["off"]["per_attention_layer"] >= 30, counts
    assert counts["off"]["per_step"] >= counts["on"]["per_step"] + 8, counts


def test_checks_flag_errors_over_their_bounds():
    assert check_kernels({"x/float32": {"out": 1e-3, "k": 0.0, "v": 0.0, "untouched": 1.0}}) == [
        "x/float32 out: 0.001",
        "x/float32 untouched: 1.0",
    ]
    assert check_decoder({"float32/x": {"logits": 1e-3, "same_picks": False, "path_len": 1}}) == [
        "float32/x logits: 0.001",
        "float32/x same_picks: False",
    ]


def flag_facts() -> dict[str, object]:
    """``fuse_tree_attention`` as the fused decoder resolves it: None, forced off, unfused, a head dim
    past the kernel's (None: off; forced on: the ConfigError's message)."""
    from repro.models.config import ATTENTION, GDN
    from repro.models.static import StaticDecoder

    model = small_model([GDN, ATTENTION], torch.float32)
    out: dict[str, object] = {
        "default": StaticDecoder(model, 8, kernel="triton").fuse_tree_attention,
        "forced_off": StaticDecoder(model, 8, kernel="triton", fuse_tree_attention=False).fuse_tree_attention,
        "unfused": StaticDecoder(model, 8, kernel="triton", fused=False).fuse_tree_attention,
    }
    try:
        StaticDecoder(model, 8, kernel="triton", fuse_tree_attention=False, tree_attention_decode=True)
    except ConfigError as exc:
        out["decode_without_kernel"] = str(exc)
    model.config.head_dim = 512  # what the flag reads (the layers are not rebuilt)
    out["wide_default"] = StaticDecoder(model, 8, kernel="triton").fuse_tree_attention
    try:
        StaticDecoder(model, 8, kernel="triton", fuse_tree_attention=True)
    except ConfigError as exc:
        out["wide_forced"] = str(exc)
    return out


def test_fuse_tree_attention_flag(interpreted):
    """None: on exactly in the fused decoder (for head dims the kernel takes); forced on without the fused
    decoder or past the kernel's head dim: a ConfigError; forced off: off."""
    from repro.models.config import ATTENTION, GDN
    from repro.models.static import StaticDecoder

    model = small_model([GDN, ATTENTION], F64)
    assert not StaticDecoder(model, 8).fuse_tree_attention  # the reference kernel: unfused
    with pytest.raises(ConfigError, match="fuse_tree_attention=True runs inside the fused decoder"):
        StaticDecoder(model, 8, fuse_tree_attention=True)
    flags = interpreted["flags"]
    assert flags["default"] and not (flags["forced_off"] or flags["unfused"] or flags["wide_default"]), flags
    assert "head_dim 512 exceeds the tree attention kernel's 256" in str(flags.get("wide_forced")), flags
    assert "needs the tree attention kernel" in str(flags.get("decode_without_kernel")), flags


# ------------------------------------------------------------------------------ compiled for sm_90

H200_SHARED_BYTES = 232448  # the most shared memory one program may take on sm_90 (227 KB)


def sm90_launches(monkeypatch) -> list[dict[str, object]]:  # noqa: ANN001
    """attention_tree's kernels (the tree kernel, unsplit and split, and the splits' combine) and
    attention_decode's (whose helpers they share) compiled ahead of time for sm_90 (no GPU needed:
    Triton's bundled ptxas) with the launch parameters the host picks, at tiny-qwen35's and Qwen3.6-27B's
    attention shapes (bf16 and float32; T = 33 unsplit, T = 1 at a decode step's default splits) and a
    padded head dim without rotary: shared memory per launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from repro.gdn import triton_attention as ta

    names = ("_attention_tree_kernel", "_attention_tree_combine_kernel", "_attention_decode_kernel")
    kernels = {name: getattr(ta, name) for name in names}
    launches: list[tuple] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: tuple):  # noqa: ANN204
            return lambda *args, **kwargs: launches.append((self.name, args, kwargs))

    for name in names:
        monkeypatch.setattr(ta, name, Recorder(name))
    monkeypatch.setattr(ta, "interpreting", lambda: False)  # the GPU's blocks and splits
    types = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.int64: "i64", torch.uint8: "u8"}

    def compiled(name: str, args: tuple, kwargs: dict) -> dict[str, object]:
        kernel = kernels[name]
        launch = ("num_warps", "launch_pdl")  # launch options, not kernel arguments
        sig = {name: "constexpr" for name in kwargs if name not in launch}
        for arg_name, a in zip(kernel.arg_names, args):
            sig[arg_name] = f"*{types[a.dtype]}" if isinstance(a, torch.Tensor) else "i32"
            sig[arg_name] = "fp32" if isinstance(a, float) else sig[arg_name]
        constexprs = {k: v for k, v in kwargs.items() if k not in launch}
        source = ASTSource(fn=kernel, signature=sig, constexprs=constexprs)
        out = triton.compile(
            source, target=GPUTarget("cuda", 90, 32), options={"num_warps": kwargs["num_warps"]}
        )
        return {"shared": out.metadata.shared, "warps": kwargs["num_warps"], "split": kwargs.get("SPLIT")}

    out = []
    shapes = ((4, 2, 48, 12), (24, 4, 256, 64))
    cases = [(dt, spec, n) for dt in (torch.bfloat16, torch.float32) for spec in shapes for n in (33, 1)]
    for dtype, (h, hkv, hd, rot), n in cases + [(torch.float32, (6, 1, 8, 0), 33)]:
        rows = 600
        qkv = torch.zeros(n, 2 * h * hd + 2 * hkv * hd, dtype=dtype)
        keys, ones = torch.zeros(hkv, rows, hd, dtype=dtype), torch.ones(hd, dtype=dtype)
        rope, length = torch.zeros(rows, 2, rot, dtype=dtype), torch.tensor([512])
        depth, anc = torch.ones(n, dtype=torch.long), torch.eye(n, dtype=torch.bool)
        splits = 1 if n > 1 else None  # the unsplit kernel, and a decode step's default splits
        ta.attention_tree(
            qkv, ones, ones, (1e-6, 1e-6), rope, keys, keys, length, depth, anc, h, True, splits=splits
        )
        ta.attention_decode(qkv[:1].contiguous(), ones, ones, (1e-6, 1e-6), rope, keys, keys, length, h, True)
        while launches:
            name, args, kwargs = launches.pop(0)
            out.append(
                {"kernel": name, "case": (types[dtype], h, hkv, hd, n), **compiled(name, args, kwargs)}
            )
    return out


def sm90_compiler() -> bool:
    """Triton's CUDA backend and its bundled ptxas are here (compiling needs no GPU)."""
    try:
        from triton.backends import backends
        from triton.backends.nvidia.compiler import get_ptxas

        return "nvidia" in backends and Path(get_ptxas(90).path).exists()
    except Exception:  # noqa: BLE001 - no triton, or a build without the CUDA backend
        return False


@pytest.mark.skipif(not sm90_compiler(), reason="needs Triton's CUDA backend (ptxas)")
def test_kernel_compiles_for_sm90_within_shared_memory(monkeypatch):
    """The compiled kernels at the GPU's default blocks (what the interpreter cannot check: the lowering
    and the shared memory of the dots' staging), within the H200's 227 KB a program; a decode step at
    these shapes splits its cache rows (and adds the combine), T = 33 forced unsplit."""
    launches = sm90_launches(monkeypatch)
    tree = [launch for launch in launches if launch["kernel"] == "_attention_tree_kernel"]
    combines = sum(launch["kernel"] == "_attention_tree_combine_kernel" for launch in launches)
    assert [launch["split"] for launch in tree] == [False, True] * 4 + [False], launches
    assert combines == 4, launches
    for launch in launches:  # the combine may reduce in registers alone
        assert launch["kernel"].endswith("combine_kernel") or launch["shared"] > 0, launch
        assert launch["shared"] <= H200_SHARED_BYTES, launch


# ---------------------------------------------------------------------------------------------- GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_gpu_tree_attention_kernel_at_model_shapes():
    """The kernel compiled on CUDA at tiny-qwen35's (4 heads over 2, hd 48) and Qwen3.6-27B's (24 over 4,
    hd 256, rotary 64) attention shapes, T = 16, 33, 64, cache length 512, float32 and bf16; and the
    interpreter's small head layouts at T = 17."""
    shapes = {"tiny_qwen35": SPECS["tiny_qwen35"], "qwen3.6_27b": (24, 4, 256, 0.25, True)}
    res = {}
    for dname in ("float32", "bfloat16"):
        for name, spec in shapes.items():
            for n in (16, 33, 64):
                res[f"{name}/n{n}/L512/{dname}"] = kernel_case(
                    spec, n, 512, DTYPES[dname], "cuda", n, rows=600
                )
        for name, spec in SPECS.items():  # padded head dims, no rotary, GQA 6, no gate: compiled
            res[f"{name}/n17/L37/{dname}"] = kernel_case(spec, 17, 37, DTYPES[dname], "cuda", 17)
    print(json.dumps(res, indent=1))
    assert check_kernels(res) == []


@pytest.mark.gpu
@needs_cuda
def test_gpu_graphed_fused_verify_matches_the_unfused_decoder():
    """The flag on, verify and commit as CUDA graphs, vs the unfused decoder (torch glue, the GDN prologue
    too) eager: float32 within 1e-4 (as the other float32 GPU decoder tests; the same argmax picks), bf16
    within 3e-2."""
    res = decoder_cases("cuda")
    print(json.dumps(res, indent=1))
    assert len(res) == 2 and check_decoder(res, float32_tol=1e-4) == []


def _interpreter_main() -> None:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    out = {
        "kernels": kernel_cases("cpu"),
        "decoder": decoder_cases("cpu"),
        "capture": capture_facts(),
        "launches": launch_counts(),
        "flags": flag_facts(),
    }
    print(json.dumps(out))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
