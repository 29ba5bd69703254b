"""GEMV kernels with fused norm / SiLU * up / residual (repro.gdn.triton_linear) vs torch.

Every case draws x [n, K], the norm scale, the weights and the residual, runs one kernel and the torch
composition it replaces (``rms_norm`` of repro.models.layers, ``F.linear``, ``F.silu``) in float64 on
the same (upcast) inputs, and reports ||y - ref|| / ||ref||. Arithmetic in the kernels is float32, so
float32 outputs agree to ~1e-6; bf16 outputs carry one rounding to bf16: at most 2^-9 relative per
element with the GPU's round-to-nearest-even, 2^-8 in Triton's interpreter, whose float32 -> bf16 cast
truncates (checked: every interpreted bf16 output equals the truncated float32 result), hence 5e-3.

- interpreter tests (CPU): N and K that are not multiples of the blocks (N = 37, K = 45, blocks 8 x 16
  and the defaults), n = 1 and 3 rows, float32 and bf16, run by Triton's interpreter in one subprocess
  (TRITON_INTERPRET=1, this file as a script) that prints every case's errors as JSON.
- GPU tests (``gpu``): the GDN-1.3B matrices (in_proj [12304, 2048], out_proj [2048, 2048], gate|up
  [11264, 2048], down [2048, 5632], lm_head [32000, 2048]) in bf16 with the default blocks on CUDA.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import run_in_interpreter

from repro.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOL = {"float32": 2e-6, "bfloat16": 5e-3}
TINY = {"n": 37, "k": 45, "inter": 19, "blocks": {"block_n": 8, "block_k": 16}}
# GDN-1.3B decode matmuls: (kernel, N (I for gate|up), K)
REAL = [
    ("norm_linear", 12304, 2048),  # input norm + stacked in_proj
    ("linear_residual", 2048, 2048),  # out_proj + residual
    ("norm_gate_up", 5632, 2048),  # post norm + stacked gate|up + SiLU * up
    ("linear_residual", 2048, 5632),  # down_proj + residual
    ("norm_linear", 32000, 2048),  # final norm + lm_head
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def case(
    kind: str, n_out: int, k: int, rows: int, dtype: torch.dtype, device: str, seed: int, **blocks
) -> float:
    """One kernel on random inputs vs its torch composition in float64."""
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
        return rel(tlin.norm_gate_up(x, scale, 1e-6, w, **blocks), F.silu(gu[:, :n_out]) * gu[:, n_out:])
    w, bias = rnd(n_out, k, s=k**-0.5), rnd(n_out, s=0.1)
    if kind == "norm_linear":
        return rel(tlin.norm_linear(x, scale, 1e-6, w, **blocks), F.linear(h, w.double()))
    if kind == "norm_linear_bias":
        return rel(
            tlin.norm_linear(x, scale, 1e-6, w, bias, **blocks), F.linear(h, w.double(), bias.double())
        )
    residual = rnd(rows, n_out)
    if kind == "linear_residual":
        out = tlin.linear_residual(x, w, residual, **blocks)
        return rel(out, residual.double() + F.linear(x.double(), w.double()))
    out = tlin.linear_residual(x, w, residual, bias, **blocks)
    return rel(out, residual.double() + F.linear(x.double(), w.double(), bias.double()))


KINDS = ("norm_linear", "norm_linear_bias", "norm_gate_up", "linear_residual", "linear_residual_bias")


def tiny_cases() -> dict[str, float]:
    out = {}
    for dt in DTYPES:
        for rows in (1, 3):
            for kind in KINDS:
                n_out = TINY["inter"] if kind == "norm_gate_up" else TINY["n"]
                out[f"{kind}/n{rows}/{dt}"] = case(
                    kind, n_out, TINY["k"], rows, DTYPES[dt], "cpu", rows, **TINY["blocks"]
                )
            out[f"norm_gate_up/n{rows}/default_blocks/{dt}"] = case(
                "norm_gate_up", TINY["inter"], TINY["k"], rows, DTYPES[dt], "cpu", 7
            )
    return out


def check(results: dict[str, float]) -> list[str]:
    """Every error over its dtype's bound (NaN included): an empty list passes."""
    return [f"{c}: {e:.2e}" for c, e in results.items() if not e <= TOL[c.rsplit("/", 1)[1]]]


@pytest.fixture(scope="module")
def interpreted() -> dict[str, float]:
    return run_in_interpreter(__file__)


def test_kernels_match_torch_in_the_interpreter(interpreted):
    """norm_linear (with and without bias), norm_gate_up, linear_residual (with and without bias) at
    N = 37, K = 45 with 8 x 16 blocks (masked edges, 5 programs, 3 K chunks), n = 1 and 3."""
    assert len(interpreted) == 2 * 2 * (len(KINDS) + 1)
    assert check(interpreted) == []
    f32 = [e for c, e in interpreted.items() if c.endswith("float32")]
    assert max(f32) < 1e-6
    assert min(e for c, e in interpreted.items() if c.endswith("bfloat16")) > 1e-4  # rounded to bf16


def test_check_flags_errors_over_their_bounds():
    assert check({"a/n1/float32": 3e-6, "b/n1/bfloat16": 4e-3, "c/n3/float32": float("nan")}) == [
        "a/n1/float32: 3.00e-06",
        "c/n3/float32: nan",
    ]


def test_bad_shapes_are_config_errors():
    pytest.importorskip("triton")
    from repro.gdn import triton_linear as tlin

    w, s = torch.zeros(6, 4), torch.ones(4)
    with pytest.raises(ConfigError, match="1..4 rows"):
        tlin.norm_linear(torch.zeros(5, 4), s, 1e-6, w)
    with pytest.raises(ConfigError, match=r"is not \[N, 4\]"):
        tlin.linear_residual(torch.zeros(1, 4), torch.zeros(6, 5), torch.zeros(1, 6))
    with pytest.raises(ConfigError, match="row-major"):
        tlin.norm_linear(torch.zeros(1, 4), s, 1e-6, torch.zeros(4, 6).t())
    with pytest.raises(ConfigError, match=r"residual must be a row-major \[1, 6\]"):
        tlin.linear_residual(torch.zeros(1, 4), w, torch.zeros(1, 5))
    with pytest.raises(ConfigError, match="stack gate and up"):
        tlin.norm_gate_up(torch.zeros(1, 4), s, 1e-6, torch.zeros(5, 4))


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 3])
def test_gpu_kernels_at_the_1p3b_shapes(rows):
    """The five decode matmuls of GDN-1.3B in bf16 (default blocks) vs torch in float64."""
    results = {
        f"{kind}/{n}x{k}/n{rows}/bfloat16": case(kind, n, k, rows, torch.bfloat16, "cuda", i)
        for i, (kind, n, k) in enumerate(REAL)
    }
    print(json.dumps(results, indent=1))
    assert check(results) == []


if __name__ == "__main__" and "--interpret" in sys.argv:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    print(json.dumps(tiny_cases()))
