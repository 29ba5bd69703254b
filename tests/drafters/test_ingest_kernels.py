"""The static DFlash drafter's ingest-input kernels (repro/drafters/ingest_kernels.py) equal the torch ops
they replace, under Triton's interpreter (one TRITON_INTERPRET=1 subprocess; this file as a script):

- gather_features: the fc rows, the feature buffer's rows at ``start + j`` (the rows before and after the
  path untouched), the positions and the length, for two feature layers of different widths (one wider than
  a column block), a padded path with repeated nodes, float32 sources into bf16 features;
- launched_inputs: ``[bonus, start, path length, path + zeros]`` for widths 0, a part and all of the pad;
- last_feature: ``feat[max(length - 1, 0)]`` at lengths 0, 1 and 9, over more than one column block;
- block_rows: ``embed_block`` of ``[root, mask x (T - 1)]`` (the embedding times the scale, rounded once
  as torch rounds) in float32, float64 and bf16 with a scale, float16 without.
The drafter's whole fast step through them: tests/drafters/test_dflash_fast.py.
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import run_in_interpreter

WIDTHS = (24, 1100)  # the second spans two column blocks


def gather_case(dtype: torch.dtype, device: str = "cpu") -> dict[str, object]:
    """The kernel's outputs and the torch ops' on the same inputs: whether each pair is equal."""
    from repro.drafters.ingest_kernels import gather_features

    gen = torch.Generator().manual_seed(3)
    sources = tuple(torch.randn(9, w, generator=gen).to(device) for w in WIDTHS)
    path = torch.tensor([4, 0, 7, 7, 0, 0], device=device)  # an accepted path of 4, padded with node 0
    start, count = torch.tensor(5, device=device), torch.tensor(4, device=device)
    feat = torch.randn(16, sum(WIDTHS), generator=gen).to(device, dtype)
    length = torch.tensor(0, device=device)
    ref_feat = feat.clone()
    ref_rows = torch.cat([h.index_select(0, path) for h in sources], dim=-1).to(dtype)
    ref_positions = start + torch.arange(path.shape[0], device=device)
    ref_feat.index_copy_(0, ref_positions, ref_rows)
    rows, positions = gather_features(sources, path, start, count, feat, length)
    return {
        "rows": torch.equal(rows, ref_rows),
        "positions": torch.equal(positions, ref_positions),
        "feat": torch.equal(feat, ref_feat),
        "length": int(length),
        "dtype": str(rows.dtype),
    }


def launched_case(width: int, device: str = "cpu") -> bool:
    from repro.drafters.ingest_kernels import launched_inputs

    result = torch.tensor([3, 42, 5, 9, 11, 13, 17, 19], device=device)  # [path length, bonus, path ...]
    length = torch.tensor(27, device=device)
    inp = torch.full((3 + 4,), -1, dtype=torch.long, device=device)
    ref = inp.clone()
    ref[0], ref[1], ref[2] = result[1], length, result[0]
    ref[3 : 3 + width] = result[2 : 2 + width]
    ref[3 + width :] = 0
    launched_inputs(result, length, inp, width)
    return torch.equal(inp, ref)


def last_case(length: int, device: str = "cpu") -> bool:
    from repro.drafters.ingest_kernels import last_feature

    feat = torch.randn(12, 1100, generator=torch.Generator().manual_seed(length)).to(device)
    tail = torch.zeros(1, 1100, device=device)
    n = torch.tensor(length, device=device)
    last_feature(feat, n, tail)
    return torch.equal(tail, feat.index_select(0, (n - 1).clamp(min=0).view(1)))


BLOCK_CASES = {"float32": 1.5, "float64": 0.75, "bfloat16": 1.3, "float16": 1.0}  # dtype: embedding scale


def block_case(dtype: str, scale: float, device: str = "cpu") -> bool:
    import torch.nn.functional as F

    from repro.drafters.ingest_kernels import block_rows

    emb = torch.randn(40, 1100, generator=torch.Generator().manual_seed(1)).to(device, getattr(torch, dtype))
    root = torch.tensor([7], device=device)
    ids = torch.tensor([7] + [39] * 5, device=device)
    want = F.embedding(ids, emb)
    want = want * scale if scale != 1.0 else want
    return torch.equal(block_rows(emb, root, 39, 6, scale), want)


def _interpreter_main() -> None:
    import json

    out = {f"gather/{d}": gather_case(getattr(torch, d)) for d in ("float32", "bfloat16")}
    out.update({f"launched/{w}": launched_case(w) for w in (0, 2, 4)})
    out.update({f"last/{n}": last_case(n) for n in (0, 1, 9)})
    out.update({f"block/{d}": block_case(d, scale) for d, scale in BLOCK_CASES.items()})
    print(json.dumps(out))


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gather_features_equals_the_torch_ops(interp: dict, dtype: str) -> None:
    case = interp[f"gather/{dtype}"]
    assert case == {"rows": True, "positions": True, "feat": True, "length": 9, "dtype": f"torch.{dtype}"}


@pytest.mark.parametrize("width", [0, 2, 4])
def test_launched_inputs_equal_the_torch_copies(interp: dict, width: int) -> None:
    assert interp[f"launched/{width}"] is True


@pytest.mark.parametrize("length", [0, 1, 9])
def test_last_feature_equals_the_torch_ops(interp: dict, length: int) -> None:
    assert interp[f"last/{length}"] is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_ingest_kernels() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        case = gather_case(dtype, "cuda")
        assert case["rows"] and case["positions"] and case["feat"] and case["length"] == 9, (dtype, case)
    assert all(launched_case(w, "cuda") for w in (0, 2, 4))
    assert all(last_case(n, "cuda") for n in (0, 1, 9))
    assert all(block_case(d, s, "cuda") for d, s in BLOCK_CASES.items())


@pytest.mark.parametrize("dtype", list(BLOCK_CASES))
def test_block_rows_equal_the_embedding(interp: dict, dtype: str) -> None:
    assert interp[f"block/{dtype}"] is True


def test_bad_shapes_are_refused() -> None:
    from repro.drafters.ingest_kernels import gather_features, last_feature, launched_inputs

    feat, scalar = torch.zeros(8, 10), torch.tensor(0)
    with pytest.raises(ValueError, match="feature width"):
        gather_features((torch.zeros(4, 6),), torch.zeros(2, dtype=torch.long), scalar, scalar, feat, scalar)
    with pytest.raises(ValueError, match="width at most"):
        launched_inputs(torch.zeros(8, dtype=torch.long), scalar, torch.zeros(5, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="tail must be"):
        last_feature(feat, scalar, torch.zeros(1, 9))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
