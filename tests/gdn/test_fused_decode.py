"""The fused decode step: its kernels against the paths they replace, and StaticDecoder's ``fuse_decode``.

- :func:`repro.gdn.triton_attention.attention_decode` vs the torch glue in float64 on the same (upcast)
  inputs (q/k RMSNorm, rotary tables of :func:`repro.models.layers.rotary_tables`, softmax over the
  cached rows and the token, output gate): GQA and not, output gate and not, partial and no rotary,
  cache lengths 0 and 37 (several row blocks, the last partial); the key and value row written at the
  length, every other cache row untouched.
- :func:`repro.gdn.triton_decode.gdn_decode_layer` vs :func:`gdn_decode_step` + :func:`gated_norm` with
  the history shift (the unfused kernels, themselves pinned to the reference in test_triton_decode.py):
  output, state, history (exactly); GQA, z and conv bias or neither, d_v in one tile or two.
- :func:`repro.gdn.triton_linear.norm_linear_argmax` vs norm_linear + argmax (the first on exact ties)
  and the length's clamped advance.
- StaticDecoder: ``fuse_decode`` True vs False on a [GDN, ATTENTION, GDN] model (GEMV matmuls and cuBLAS
  ones) over three steps, float64 and float32: logits, greedy picks, GDN states, conv histories and KV
  caches; float64 against HybridLM too; the fused step capture-safe with the same ops on any token; and
  the launches of one decode step of the tiny-qwen35 layout (aten ops that launch work + Triton launches)
  before and after.

Float32 agrees to ~1e-6, float64 to rounding; bf16 outputs carry one rounding to bf16 (the interpreter's
cast truncates: 2^-8 relative), the torch glue one after every op, hence 1e-2. The cases run in Triton's
CPU interpreter in one subprocess (this file as a script); the ``gpu`` tests run the same on CUDA at
larger shapes and compare the fused decode graph with the old one.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import CountedLaunches, run_in_interpreter

from repro.errors import ConfigError

F64 = torch.float64
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
TOL = {"float64": 1e-12, "float32": 3e-6, "bfloat16": 1e-2}
# attention cases: (H, H_kv, hd, rot, output gate)
ATTN = {"gqa_gate": (4, 2, 8, 4, True), "mha_nogate": (2, 2, 12, 12, False), "norot": (2, 1, 8, 0, True)}
# GDN cases: (H, HV, d_k, d_v, width, z and bias, block_v)
GDN_CASES = {"gqa_z_bias": (2, 4, 8, 8, 4, True, None), "plain_tiles": (2, 2, 8, 16, 3, False, 8)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def attention_case(spec: tuple, length: int, dtype: torch.dtype, device: str, seed: int) -> dict[str, float]:
    """attention_decode vs the float64 glue; errors of the output and of the written key/value rows."""
    from repro.gdn.triton_attention import attention_decode, rotary_table
    from repro.models.layers import apply_rotary, rms_norm, rotary_tables
    from repro.models.static_layers import attention_core

    h, hkv, hd, rot, gate = spec
    gen = torch.Generator().manual_seed(seed)
    rows = 48
    q_out = h * hd * (2 if gate else 1)
    qkv = torch.randn(1, q_out + 2 * hkv * hd, generator=gen)
    qs, ks = 1 + 0.2 * torch.randn(hd, generator=gen), 1 + 0.2 * torch.randn(hd, generator=gen)
    keys, values = torch.randn(hkv, rows, hd, generator=gen), torch.randn(hkv, rows, hd, generator=gen)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=F64) / max(rot, 1)))
    dev = [t.to(device=device, dtype=dtype) for t in (qkv, qs, ks, keys, values)]
    qkv_d, qs_d, ks_d, keys_d, values_d = dev
    before = keys_d.clone(), values_d.clone()
    rope = rotary_table(inv_freq, rows, dtype, torch.device(device))
    n = torch.tensor([length], device=device)
    out = attention_decode(qkv_d, qs_d, ks_d, (1e-6, 1e-6), rope, keys_d, values_d, n, h, gate)
    # the float64 glue on the same inputs (upcast)
    x = [t.double().cpu() for t in dev]
    qkv, qs, ks, keys, values = x
    q, k, v = torch.split(qkv, [q_out, hkv * hd, hkv * hd], dim=-1)
    g = q[:, :0]
    if gate:
        q, g = q.reshape(1, h, 2 * hd).chunk(2, dim=-1)
        g = g.reshape(1, -1)
    cos, sin = rotary_tables(torch.tensor([length]), inv_freq, F64)
    q = apply_rotary(rms_norm(q.reshape(1, h, hd), qs, 1e-6), cos, sin)
    k = apply_rotary(rms_norm(k.reshape(1, hkv, hd), ks, 1e-6), cos, sin)
    k = k.to(dtype).double()  # the token's key as the cache holds it
    v = v.reshape(1, hkv, hd)
    blocked = torch.arange(rows) >= length
    ref = attention_core(q, k, v, keys, values, blocked, torch.zeros(h // hkv, 1, dtype=torch.bool))
    if gate:
        ref = ref * torch.sigmoid(g)
    others = torch.ones(rows, dtype=torch.bool)
    others[length] = False
    return {
        "out": rel(out, ref),
        "k_row": rel(keys_d[:, length], k[0]),
        "v_row": rel(values_d[:, length], v[0]),
        "untouched": float(
            (keys_d[:, others] != before[0][:, others]).sum()
            + (values_d[:, others] != before[1][:, others]).sum()
        ),
    }


def gdn_case(spec: tuple, dtype: torch.dtype, device: str, seed: int) -> dict[str, float]:
    """gdn_decode_layer vs gdn_decode_step + gated_norm(shift) on the same inputs."""
    from repro.gdn import reference as gdn
    from repro.gdn import triton_decode as td

    h, hv, dk, dv, width, zb, block_v = spec
    dims = td.GDNDims(h, hv, dk, dv)
    c, vz = dims.conv_dim, hv * dv if zb else 0
    gen = torch.Generator().manual_seed(seed)
    sdt = F64 if dtype == F64 else torch.float32

    def rnd(*shape: int, s: float = 1.0, dt: torch.dtype = dtype) -> torch.Tensor:
        return (s * torch.randn(*shape, generator=gen)).to(device=device, dtype=dt)

    proj, hist = rnd(1, c + vz + 2 * hv), rnd(width - 1, c)
    taps, bias = rnd(c, width, s=0.5), rnd(c, s=0.3) if zb else None
    nd, dtb = -rnd(hv, s=0.5, dt=sdt).exp(), rnd(hv, dt=sdt)
    state, weight = rnd(hv, dv, dk, s=0.3, dt=sdt), 1.0 + rnd(dv, s=0.2)
    index = gdn.conv_gather_index(torch.tensor([-1]), width).to(device)
    args = (taps, bias, index, nd, dtb, 1.5)
    s_ref, h_ref = state.clone(), hist.clone()
    o = td.gdn_decode_step(proj, h_ref, *args, s_ref, dk**-0.5, dims, block_v=block_v)
    z = proj[:, c : c + vz] if zb else None
    y_ref = td.gated_norm(o[None], weight, 1e-5, z, dtype, shift=(h_ref, proj[:, :c]))
    y = td.gdn_decode_layer(
        proj, hist, *args, state, dk**-0.5, dims, weight, 1e-5, zb, dtype, block_v=block_v
    )
    return {"y": rel(y, y_ref), "state": rel(state, s_ref), "history": float((hist != h_ref).sum())}


def argmax_case(dtype: torch.dtype, device: str, seed: int) -> dict[str, object]:
    """norm_linear_argmax vs norm_linear + argmax (planted exact ties across blocks) and the advance."""
    from repro.gdn.triton_linear import norm_linear, norm_linear_argmax

    gen = torch.Generator().manual_seed(seed)
    x, scale = torch.randn(1, 45, generator=gen), 1 + 0.2 * torch.randn(45, generator=gen)
    w = torch.randn(37, 45, generator=gen) * 45**-0.5
    x, scale, w = (t.to(device=device, dtype=dtype) for t in (x, scale, w))
    r = int(norm_linear(x, scale, 1e-6, w, block_n=8, block_k=16)[0].argmax())
    ties = w.clone()
    j = 36 if r < 36 else 0
    ties[j] = w[r]  # an exact tie of the largest logit, in another block (or the same: r in 32..35)
    out: dict[str, object] = {"tie_first": min(r, j)}
    for name, weight in (("random", w), ("ties", ties)):
        pick = torch.zeros(1, dtype=torch.long, device=device)
        length = torch.tensor([5], device=device)
        for _ in range(2):  # 5 -> 6, then clamped at 6
            logits = norm_linear_argmax(
                x, scale, 1e-6, weight, None, pick, (length, 6), block_n=8, block_k=16
            )
        ref = norm_linear(x, scale, 1e-6, weight, block_n=8, block_k=16)
        out[f"{name}_logits_equal"] = bool(torch.equal(logits, ref))
        out[f"{name}_pick"] = int(pick[0]) == int(ref[0].argmax())
        out[f"{name}_length"] = int(length[0])
        if name == "ties":
            out["tie_pick"] = int(pick[0])
    return out


def kernel_cases(device: str, attn: dict, gdn_cases: dict) -> dict[str, dict]:
    res: dict[str, dict] = {}
    for dname, dtype in DTYPES.items():
        if device == "cuda" and dtype == F64:
            continue
        for name, spec in attn.items():
            for length in (0, 37):
                res[f"attention/{name}/L{length}/{dname}"] = attention_case(spec, length, dtype, device, 1)
        for name, spec in gdn_cases.items():
            res[f"gdn/{name}/{dname}"] = gdn_case(spec, dtype, device, 2)
        res[f"argmax/{dname}"] = argmax_case(dtype, device, 3)
    return res


def check_kernels(res: dict[str, dict]) -> list[str]:
    """Errors over their bounds; exact fields (untouched rows, history, argmax) must be exact."""
    bad = []
    for key, errs in res.items():
        tol = TOL[key.rsplit("/", 1)[1]]
        for field, val in errs.items():
            if field in ("untouched", "history"):
                ok = val == 0
            elif key.startswith("argmax/"):
                ok = val is True or field.endswith("_length") and val == 6 or field.startswith("tie_")
            else:
                ok = val <= (tol if field != "v_row" else 0.0)
            if not ok:
                bad.append(f"{key} {field}: {val}")
        if key.startswith("argmax/") and errs["tie_pick"] != errs["tie_first"]:
            bad.append(f"{key}: tie picked {errs['tie_pick']}, the first is {errs['tie_first']}")
    return bad


# ---------------------------------------------------------------------------------- the decoder


def small_model(dtype: torch.dtype, device: str = "cpu", seed: int = 5):  # noqa: ANN201
    from repro.models.config import ATTENTION, GDN, HybridConfig
    from repro.models.default import init_random_weights
    from repro.models.hybrid import HybridLM

    cfg = HybridConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, layer_types=[GDN, ATTENTION, GDN],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), seed).to(device=device, dtype=dtype).eval()


def decode_run(model, state, tokens: list[int], fuse: bool, gemv: bool, graphed: bool = False) -> dict:  # noqa: ANN001
    """Decode ``tokens`` from ``state`` (decode_pick; a CUDA graph of it with ``graphed``)."""
    from repro.models.static import StaticDecoder

    dec = StaticDecoder(model, 32, 4, kernel="triton", gemv=gemv, fuse_decode=fuse)
    dec.load(state)
    call = dec.decode_pick
    if graphed:
        from repro.models.graphs import GraphedCall

        call = GraphedCall(dec.decode_pick, model.device)
        dec.load(state)
    logits, picks = [], []
    for t in tokens:
        dec.set_token(t)
        logits.append(call().clone())
        picks.append(int(dec.pick[0]))
    return {"logits": torch.cat(logits), "picks": picks, "state": dec.export(), "dec": dec}


def state_errs(a, b) -> float:  # noqa: ANN001 - ModelStates
    errs = [abs(a.position - b.position)]
    for x, y in zip(a.layers, b.layers):
        fields = ("recurrent", "conv") if hasattr(x, "recurrent") else ("keys", "values")
        errs += [rel(getattr(x, f), getattr(y, f)) for f in fields]
    return max(errs)


def decoder_cases(device: str) -> dict[str, dict]:
    """fuse_decode True vs False over three steps (GEMV and cuBLAS matmuls; interpreted float32: GEMV);
    float64 also vs HybridLM."""
    from repro.tree import Tree

    out = {}
    for dname in ("float64", "float32") if device == "cpu" else ("float32", "bfloat16"):
        model = small_model(DTYPES[dname], device)
        state, _ = model.prefill([3, 9, 1, 4, 1, 5, 9, 2])
        tokens = [7, 11, 60]
        for gemv in (True, False) if dname != "float32" or device == "cuda" else (True,):
            for graphed in (False, True) if device == "cuda" else (False,):
                old = decode_run(model, state, tokens, False, gemv, graphed)
                new = decode_run(model, state, tokens, True, gemv, graphed)
                errs = {
                    "logits": rel(new["logits"], old["logits"]),
                    "state": state_errs(new["state"], old["state"]),
                    "picks_equal": new["picks"] == old["picks"],
                    "pick_is_argmax": new["picks"] == new["logits"].argmax(-1).tolist(),
                }
                if dname == "float64":
                    ref, logits = state, []
                    for t in tokens:
                        ver = model.verify(ref, Tree.single(t))
                        logits.append(ver.logits)
                        ref = model.commit(ref, ver, [0])
                    errs["logits_vs_hybrid"] = rel(new["logits"], torch.cat(logits))
                    errs["state_vs_hybrid"] = state_errs(new["state"], ref)
                out[f"{dname}/{'gemv' if gemv else 'cublas'}{'/graphed' if graphed else ''}"] = errs
    return out


def check_decoder(res: dict[str, dict]) -> list[str]:
    bad = []
    for key, errs in res.items():
        tol = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 3e-2}[key.split("/")[0]]
        for field, val in errs.items():
            if field in ("picks_equal", "pick_is_argmax"):
                ok = val or (field == "picks_equal" and key.startswith("bfloat16"))
            else:
                ok = val <= tol
            if not ok:
                bad.append(f"{key} {field}: {val}")
    return bad


def launch_counts() -> dict[str, dict[str, int]]:
    """Launches of one decode step of the tiny-qwen35 layout (6 GDN + 2 attention layers; random float32
    weights, smaller widths, GEMV matmuls): old vs fused, aten ops that launch work and Triton launches."""
    from repro.gdn import triton_attention, triton_decode, triton_linear
    from repro.models.default import init_random_weights
    from repro.models.family import resolve_checkpoint
    from repro.models.graphs import count_ops
    from repro.models.hybrid import HybridLM
    from repro.models.loading import read_config
    from repro.models.static import StaticDecoder

    counter = [0]
    for module in (triton_attention, triton_decode, triton_linear):
        for name in dir(module):
            if name.endswith("_kernel"):
                setattr(module, name, CountedLaunches(getattr(module, name), counter))
    cfg = read_config(resolve_checkpoint("tiny-qwen35", "target"))
    cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size = 64, 32, 48  # launches: widths do not count
    cfg.linear_key_head_dim = cfg.linear_value_head_dim = cfg.head_dim = 16
    model = init_random_weights(HybridLM(cfg), 0).float().eval()
    state, _ = model.prefill([5, 6, 7])
    out = {}
    for fuse in (False, True):
        dec = StaticDecoder(model, 16, 4, kernel="triton", gemv=True, fuse_decode=fuse)
        dec.load(state)
        dec.set_token(9)
        counter[0] = 0
        ops = count_ops(dec.decode_pick)
        out["fused" if fuse else "old"] = {"aten": ops, "triton": counter[0], "total": ops + counter[0]}
    return out


def capture_facts() -> dict[str, object]:
    """The fused decode step under CaptureCheck: hazards, and the same trace for two tokens."""
    from repro.models.graphs import check_capture
    from repro.models.static import StaticDecoder

    model = small_model(torch.float32)
    state, _ = model.prefill([1, 2, 3, 4])
    dec = StaticDecoder(model, 32, 4, kernel="triton", gemv=True)
    traces, hazards = [], []
    for tok in (5, 40):
        dec.load(state)
        dec.set_token(tok)
        check = check_capture(dec.decode_pick)
        traces.append(check.trace)
        hazards += check.hazards
    return {"default_fused": dec.fuse_decode, "hazards": hazards, "same_trace": traces[0] == traces[1]}


# ------------------------------------------------------------------------------------ interpreter


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__)


def test_attention_gdn_and_argmax_kernels_in_the_interpreter(interpreted):
    kernels = interpreted["kernels"]
    assert len(kernels) == 3 * (2 * len(ATTN) + len(GDN_CASES) + 1)
    assert check_kernels(kernels) == []
    assert kernels["attention/gqa_gate/L37/bfloat16"]["out"] > 1e-5  # bf16 really rounds: the bound is live


def test_fused_decode_step_matches_the_old_one_in_the_interpreter(interpreted):
    assert len(interpreted["decoder"]) == 3 and check_decoder(interpreted["decoder"]) == []


def test_fused_decode_step_is_capture_safe_and_on_by_default_with_gemv(interpreted):
    facts = interpreted["capture"]
    assert facts == {"default_fused": True, "hazards": [], "same_trace": True}


def test_fused_decode_step_launches_fewer_kernels(interpreted):
    """tiny-qwen35 layout, one decode step: 6 GDN layers x 5, 2 attention layers x 5, the embedding, the
    head and the argmax reduce = 43 launches (the old step: about 126)."""
    counts = interpreted["launches"]
    assert counts["fused"] == {"aten": 1, "triton": 42, "total": 43}, counts
    assert counts["old"]["total"] >= 100, counts


def test_checks_flag_errors_over_their_bounds():
    assert check_kernels({"gdn/x/float32": {"y": 1e-3, "state": 0.0, "history": 1.0}}) == [
        "gdn/x/float32 y: 0.001",
        "gdn/x/float32 history: 1.0",
    ]
    assert check_decoder({"float32/gemv": {"logits": 1e-3, "picks_equal": False}}) == [
        "float32/gemv logits: 0.001",
        "float32/gemv picks_equal: False",
    ]


def test_fuse_decode_needs_the_fused_decoder():
    from repro.models.static import StaticDecoder

    model = small_model(F64)
    with pytest.raises(ConfigError, match="fuse_decode=True runs inside the fused decoder"):
        StaticDecoder(model, 8, fuse_decode=True)
    assert not StaticDecoder(model, 8).fuse_decode


# ---------------------------------------------------------------------------------------------- GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_gpu_fused_kernels_at_larger_shapes():
    """The kernel cases compiled on CUDA, plus the GDN-1.3B layer (H = HV = 8, d = 256; d_v tiles) and
    Qwen3.6-27B's attention (24 heads over 4, hd 256, partial rotary) and GDN layout (16 key, 48 value
    heads of 128)."""
    attn = {**ATTN, "27b": (24, 4, 256, 64, True)}
    gdn_cases = {
        **GDN_CASES,
        "1.3b": (8, 8, 256, 256, 4, True, None),
        "27b": (16, 48, 128, 128, 4, True, None),
    }
    res = kernel_cases("cuda", attn, gdn_cases)
    print(json.dumps(res, indent=1))
    assert check_kernels(res) == []


@pytest.mark.gpu
@needs_cuda
def test_gpu_fused_decode_step_matches_the_old_one_eager_and_graphed():
    """fuse_decode True vs False on CUDA, eager and as CUDA graphs: float32 within 1e-5 with equal picks,
    bf16 within 3e-2."""
    res = decoder_cases("cuda")
    print(json.dumps(res, indent=1))
    assert len(res) == 8 and check_decoder(res) == []


def _interpreter_main() -> None:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    out = {
        "kernels": kernel_cases("cpu", ATTN, GDN_CASES),
        "decoder": decoder_cases("cpu"),
        "capture": capture_facts(),
        "launches": launch_counts(),
    }
    print(json.dumps(out))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
