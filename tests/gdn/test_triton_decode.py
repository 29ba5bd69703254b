"""Fused decode/glue Triton kernels (repro.gdn.triton_decode) vs the torch functions they replace.

Every case draws random inputs, runs one kernel and the torch reference (``gathered_short_conv``,
``l2norm``, ``gdn_gates``, ``recurrent_gdn``, ``GatedRMSNorm``, ``rms_norm``, SiLU(gate) * up) in
float64 on the same (upcast) inputs, and reports ||x - ref|| / ||ref||. Arithmetic in the kernels is
float32, so float32 outputs agree to ~1e-6 whatever the input dtype; outputs stored in bf16 (tree
prologue q/k/v, the gated norm, RMSNorm, SiLU * up) carry one bf16 rounding (< 5e-3).

- interpreter tests (CPU): tiny shapes with GQA (H < HV) and without, with and without z / conv bias,
  several d_v tiles, run by Triton's interpreter in one subprocess (TRITON_INTERPRET=1, this file as a
  script) that prints every case's errors as JSON.
- GPU tests (``gpu``): the same cases at the GDN-1.3B (H = HV = 8, d = 256) and Qwen3.6-27B (H = 16,
  HV = 48, d = 128) layer shapes on CUDA with the compiled kernels.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import random_tree, run_in_interpreter

F64 = torch.float64
TINY = {  # name: (H, HV, d_k, d_v, W, conv bias, output gate z, beta_scale)
    "gqa": (2, 4, 8, 8, 4, True, True, 2.0),
    "mha": (2, 2, 16, 8, 3, False, False, 1.0),
}
REAL = {
    "gdn-1.3b": (8, 8, 256, 256, 4, False, True, 1.0),
    "qwen3.6-27b": (16, 48, 128, 128, 4, False, True, 1.0),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
# bound per case kind and input dtype: float32 outputs (decode o and state, gates) vs outputs stored in bf16
TOL = {"float64": 1e-12, "float32": 2e-6, "bfloat16": 5e-3}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _inputs(spec: tuple, n: int, dtype: torch.dtype, device: str, seed: int) -> dict:
    from repro.gdn import reference as gdn
    from repro.gdn.triton_decode import GDNDims

    h, hv, dk, dv, width, bias, gate, beta_scale = spec
    dims = GDNDims(h, hv, dk, dv)
    c, vz = dims.conv_dim, hv * dv if gate else 0
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, s: float = 1.0) -> torch.Tensor:
        return s * torch.randn(*shape, generator=gen)

    gdt = F64 if dtype == F64 else torch.float32
    parents = torch.tensor([-1]) if n == 1 else random_tree(n, "mixed", gen)
    x = {
        "proj": rnd(n, c + vz + 2 * hv),
        "history": rnd(width - 1, c),
        "taps": rnd(c, width, s=0.5),
        "bias": rnd(c, s=0.3) if bias else None,
        "neg_decay": -rnd(hv, s=0.5).exp(),
        "dt_bias": rnd(hv),
        "state": rnd(hv, dv, dk, s=0.3),
        "norm_weight": 1.0 + rnd(dv, s=0.2),
    }
    out = {k: None if v is None else v.to(device=device, dtype=dtype) for k, v in x.items()}
    for key in ("neg_decay", "dt_bias", "state"):
        out[key] = x[key].to(device=device, dtype=gdt)
    out.update(
        dims=dims, sizes=[c, vz, hv, hv], beta_scale=beta_scale, scale=dk**-0.5,
        index=gdn.conv_gather_index(parents, width).to(device),
    )  # fmt: skip
    return out


def _reference_prologue(x: dict) -> tuple[torch.Tensor, ...]:
    """gdn_prologue's math in float64 on the (upcast) inputs: q, k, v, g, beta, z, conv inputs."""
    from repro.gdn import reference as gdn
    from repro.models.layers import gdn_gates, l2norm

    h, hv, dk, dv = x["dims"]
    d = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in x.items()}
    n = d["proj"].shape[0]
    conv_inputs, z, a, b = torch.split(d["proj"], x["sizes"], dim=-1)
    mixed = gdn.gathered_short_conv(conv_inputs, d["history"], d["taps"], d["index"], d["bias"])
    qk = l2norm(mixed[:, : 2 * h * dk].reshape(n, 2 * h, dk))
    v = mixed[:, 2 * h * dk :].reshape(n, hv, dv)
    g, beta = gdn_gates(a, b, d["neg_decay"], d["dt_bias"], x["beta_scale"])
    return qk[:, :h], qk[:, h:], v, g, beta, (z if z.shape[1] else None), conv_inputs


def decode_case(spec: tuple, dtype: torch.dtype, device: str, seed: int, block_v: int | None) -> dict:
    """gdn_decode_step (o and the in-place state) and gated_norm with the history shift, one token."""
    from repro.gdn import reference as gdn
    from repro.gdn import triton_decode as td
    from repro.models.layers import GatedRMSNorm

    x = _inputs(spec, 1, dtype, device, seed)
    q, k, v, g, beta, z, conv_inputs = _reference_prologue(x)
    o_ref, s_ref = gdn.recurrent_gdn(q, k, v, g, beta, x["state"].double(), x["scale"])
    state, history = x["state"].clone(), x["history"].clone()
    o = td.gdn_decode_step(
        x["proj"], history, x["taps"], x["bias"], x["index"], x["neg_decay"], x["dt_bias"], x["beta_scale"],
        state, x["scale"], x["dims"], block_v=block_v,
    )  # fmt: skip
    errs = {"o": rel(o, o_ref[0]), "state": rel(state, s_ref)}
    errs["history_read_only"] = rel(history, x["history"])
    c, vz = x["sizes"][0], x["sizes"][1]
    zt = x["proj"][:, c : c + vz] if vz else None
    y = td.gated_norm(o[None], x["norm_weight"], 1e-6, zt, dtype, shift=(history, x["proj"][:, :c]))
    hv, dv = x["dims"].heads_v, x["dims"].d_v
    norm = GatedRMSNorm(dv, 1e-6).double()
    norm.weight.data = x["norm_weight"].double().cpu()
    y_ref = norm(o.double().cpu()[None], None if z is None else z.cpu().reshape(1, hv, dv)).reshape(1, -1)
    errs["gated_norm"] = rel(y, y_ref)
    shifted = torch.cat([x["history"], x["proj"][:, :c]])[1:]
    errs["history_shift"] = float((history.double() - shifted.double()).abs().max())
    return errs


def tree_case(spec: tuple, dtype: torch.dtype, device: str, seed: int, n: int) -> dict:
    """gdn_tree_prologue on an n-node tree (outputs in the input dtype), gated_norm without the shift."""
    from repro.gdn import triton_decode as td
    from repro.models.layers import GatedRMSNorm

    x = _inputs(spec, n, dtype, device, seed)
    ref = _reference_prologue(x)
    got = td.gdn_tree_prologue(
        x["proj"], x["history"], x["taps"], x["bias"], x["index"], x["neg_decay"], x["dt_bias"],
        x["beta_scale"], x["dims"], dtype,
    )  # fmt: skip
    errs = {name: rel(a, b) for name, a, b in zip(("q", "k", "v", "g", "beta"), got, ref)}
    hv, dv = x["dims"].heads_v, x["dims"].d_v
    o = torch.randn(n, hv, dv, generator=torch.Generator().manual_seed(seed + 1)).to(device, dtype)
    c, vz = x["sizes"][0], x["sizes"][1]
    zt = x["proj"][:, c : c + vz] if vz else None
    norm = GatedRMSNorm(dv, 1e-6).double()
    norm.weight.data = x["norm_weight"].double().cpu()
    z = ref[5]
    y_ref = norm(o.double().cpu(), None if z is None else z.cpu().reshape(n, hv, dv)).reshape(n, -1)
    errs["gated_norm"] = rel(td.gated_norm(o, x["norm_weight"], 1e-6, zt, dtype), y_ref)
    return errs


def mlp_case(hidden: int, inter: int, dtype: torch.dtype, device: str, seed: int) -> dict:
    """rms_norm on rows and on a strided [n, heads, d] view; silu_mul on a stacked gate|up row block."""
    from repro.gdn import triton_decode as td
    from repro.models.layers import rms_norm

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, hidden, generator=gen).to(device, dtype)
    scale = (1 + 0.2 * torch.randn(hidden, generator=gen)).to(device, dtype)
    wide = torch.randn(3, 4 * 16 + 5, generator=gen).to(device, dtype)
    heads = wide[:, 5:].view(3, 4, 16)  # a non-contiguous view, rows 69 apart
    hs = (1 + 0.2 * torch.randn(16, generator=gen)).to(device, dtype)
    gu = torch.randn(3, 2 * inter, generator=gen).to(device, dtype)
    g64 = gu.double()
    return {
        "rms_norm": rel(td.rms_norm(x, scale, 1e-6), rms_norm(x.double(), scale.double(), 1e-6)),
        "rms_norm_heads": rel(td.rms_norm(heads, hs, 1e-6), rms_norm(heads.double(), hs.double(), 1e-6)),
        "silu_mul": rel(td.silu_mul(gu), F.silu(g64[:, :inter]) * g64[:, inter:]),
    }


# outputs that stay float32 whatever the inputs (bf16 inputs: no bf16 rounding after the load)
FP32_OUTPUTS = {"o", "state", "g", "beta"}


def bound(name: str, dtype: str) -> float:
    return TOL["float32"] if dtype == "bfloat16" and name in FP32_OUTPUTS else TOL[dtype]


def all_cases(shapes: dict, device: str, tree_nodes: int, block_v: int | None) -> dict:
    out = {}
    for i, (name, spec) in enumerate(shapes.items()):
        dtypes = ["float32", "bfloat16"] + (["float64"] if device == "cpu" and i == 0 else [])
        for dt in dtypes:
            out[f"decode/{name}/{dt}"] = decode_case(spec, DTYPES[dt], device, 10 + i, block_v)
            out[f"tree/{name}/{dt}"] = tree_case(spec, DTYPES[dt], device, 20 + i, tree_nodes)
    for dt in ("float32", "bfloat16"):
        hidden, inter = (24, 40) if device == "cpu" else (5120, 17408)
        out[f"mlp/{hidden}/{dt}"] = mlp_case(hidden, inter, DTYPES[dt], device, 30)
    return out


def check(results: dict) -> list[str]:
    """Every error over its bound (and shifts / read-only history not exact): an empty list passes."""
    bad = []
    for case, errs in results.items():
        dt = case.rsplit("/", 1)[1]
        for name, err in errs.items():
            limit = 0.0 if name.startswith("history") else bound(name, dt)
            if not err <= limit:
                bad.append(f"{case} {name}: {err:.2e} > {limit:.0e}")
    return bad


# ------------------------------------------------------------------------------------ interpreter


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__)


def test_decode_core_matches_the_recurrence_in_the_interpreter(interpreted):
    """o and the in-place state vs conv/L2 norm/gates + recurrent_gdn (GQA and not, bias, beta_scale 2,
    d_v in 2 tiles), history left alone by the core and shifted by the gated norm."""
    decode = {k: v for k, v in interpreted.items() if k.startswith("decode/")}
    assert len(decode) == 5 and check(decode) == []
    assert max(v["state"] for k, v in decode.items() if k.endswith("float32")) < 1e-6


def test_tree_prologue_and_gated_norm_in_the_interpreter(interpreted):
    tree = {k: v for k, v in interpreted.items() if k.startswith("tree/")}
    assert len(tree) == 5 and check(tree) == []
    assert tree["tree/gqa/bfloat16"]["q"] > 1e-5  # bf16 outputs really are rounded (the bound is not idle)


def test_rms_norm_and_silu_mul_in_the_interpreter(interpreted):
    mlp = {k: v for k, v in interpreted.items() if k.startswith("mlp/")}
    assert len(mlp) == 2 and check(mlp) == []


def test_check_flags_errors_over_their_bounds():
    results = {"decode/x/bfloat16": {"o": 1e-4, "v": 1e-3, "history_shift": 0.0}}
    assert check(results) == ["decode/x/bfloat16 o: 1.00e-04 > 2e-06"]
    assert check({"tree/x/float32": {"history_shift": 1.0, "q": float("nan")}}) == [
        "tree/x/float32 history_shift: 1.00e+00 > 0e+00",
        "tree/x/float32 q: nan > 2e-06",
    ]


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kernels_at_the_paper_shapes():
    """The same cases on CUDA (compiled kernels) at the GDN-1.3B and Qwen3.6-27B layer shapes, a
    64-node tree, default tiles."""
    results = all_cases(REAL, "cuda", 64, None)
    print(json.dumps(results, indent=1))
    assert check(results) == []


def _interpreter_main() -> None:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    print(json.dumps(all_cases(TINY, "cpu", 7, 4)))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
