"""The context keys/values kernel (repro.gdn.triton_attention.write_context_kv: DFlash's ingest in one
launch) against the torch arithmetic it replaces: every layer's k RMSNorm times its scale, rotary over the
whole head in rotate_half style at each row's position, keys and values written at those positions.

- interpreter (TRITON_INTERPRET=1, one subprocess): float64 to 1e-12 relative, bf16 within bf16 rounding
  of the float64 result; rows not named in ``positions`` untouched;
- CPU: shapes that do not match are refused in one line before any launch;
- GPU (``gpu``): the same checks on CUDA in bf16 and float32.
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import rel, run_in_interpreter

from repro.drafters.layers import apply_rope
from repro.gdn.triton_attention import rotary_table, write_context_kv

LAYERS, KV, HD, ROWS = 2, 3, 16, 12
EPS = 1e-6


def inputs(n: int, dtype: torch.dtype, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(n, 2 * LAYERS * KV * HD, generator=gen, dtype=torch.float64)
    scale = 1 + 0.1 * torch.randn(LAYERS, HD, generator=gen, dtype=torch.float64)
    positions = torch.randperm(ROWS, generator=gen)[:n]
    inv_freq = 1.0 / 10000 ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    rope = rotary_table(inv_freq, ROWS, torch.float64, torch.device("cpu"))
    x = {"kv": kv, "scale": scale, "positions": positions, "rope": rope}
    return {k: v.to(device, dtype if v.is_floating_point() else v.dtype) for k, v in x.items()}


def reference(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [L, KV, ROWS, HD] in float64 (zeros where no row is written)."""
    kv, n = x["kv"].double().cpu(), x["kv"].shape[0]
    pos = x["positions"].cpu()
    k = kv[:, : LAYERS * KV * HD].view(n, LAYERS, KV, HD)
    k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + EPS) * x["scale"].double().cpu()[None, :, None]
    cos, sin = (x["rope"].double().cpu()[pos, i][:, None, None] for i in (0, 1))
    keys = torch.zeros(LAYERS, KV, ROWS, HD, dtype=torch.float64)
    values = torch.zeros_like(keys)
    keys[:, :, pos] = apply_rope(k, cos, sin).permute(1, 2, 0, 3)
    values[:, :, pos] = kv[:, LAYERS * KV * HD :].view(n, LAYERS, KV, HD).permute(1, 2, 0, 3)
    return keys, values


def errors(dtype: torch.dtype, device: str) -> dict[str, float]:
    """Relative errors of the kernel's keys and values against float64, and whether unnamed rows stayed
    as they were (a sentinel)."""
    x = inputs(7, dtype, device)
    keys = torch.full((LAYERS, KV, ROWS, HD), 7.0, dtype=dtype, device=device)
    values = keys.clone()
    write_context_kv(x["kv"], x["positions"], x["scale"], EPS, x["rope"], keys, values)
    ref_k, ref_v = reference(x)
    pos = x["positions"].cpu()
    rest = [r for r in range(ROWS) if r not in pos.tolist()]
    k, v = keys.double().cpu(), values.double().cpu()
    return {
        "keys": rel(k[:, :, pos], ref_k[:, :, pos]),
        "values": rel(v[:, :, pos], ref_v[:, :, pos]),
        "untouched": bool((k[:, :, rest] == 7).all() and (v[:, :, rest] == 7).all()),
    }


BOUND = {"float64": 1e-12, "bfloat16": 8e-3, "float32": 1e-6}


def check(errs: dict[str, float], dtype: str) -> None:
    assert errs["untouched"], errs
    assert 0 < errs["keys"] <= BOUND[dtype], errs  # > 0: its own arithmetic, not a copy of the reference
    assert errs["values"] <= BOUND[dtype], errs


def _interpreter_main() -> None:
    import json

    print(json.dumps({name: errors(getattr(torch, name), "cpu") for name in ("float64", "bfloat16")}))


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_keys_and_values_in_the_interpreter(interp: dict, dtype: str) -> None:
    check(interp[dtype], dtype)


def test_shapes_that_do_not_match_are_refused() -> None:
    x = inputs(3, torch.float64, "cpu")
    keys = torch.zeros(LAYERS, KV, ROWS, HD, dtype=torch.float64)
    args = (x["kv"], x["positions"], x["scale"], EPS, x["rope"])
    with pytest.raises(ValueError, match="kv must be"):
        write_context_kv(x["kv"][:, 1:], *args[1:], keys, keys.clone())
    with pytest.raises(ValueError, match="contiguous"):
        write_context_kv(*args, keys.transpose(2, 3), keys.clone())
    with pytest.raises(ValueError, match="k_scale must be"):
        write_context_kv(x["kv"], x["positions"], x["scale"][:1], EPS, x["rope"], keys, keys.clone())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_keys_and_values(dtype: str) -> None:
    check(errors(getattr(torch, dtype), "cuda"), dtype)


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
