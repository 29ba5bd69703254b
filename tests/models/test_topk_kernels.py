"""The row-wise top-k kernels (repro.models.topk_kernels) against a stable descending sort: values, indices
(ties to the smaller index), float64 log values, ``out=``, rows of one chunk and of several.

- interpreter (CPU, TRITON_INTERPRET=1, one subprocess): float32 / bf16 / float16 rows with negatives,
  ties and zeros, masked edges (lengths that are not powers of two), k = 1, odd k, k = n, several chunks
  (rows longer than ``CHUNK``), the log form at DDTree's shape, ``out=`` into row views;
- every interpreter case's row argmax (the kernels at k = 1) against ``torch.argmax`` (the first maximum);
- CPU: :func:`row_topk` is ``torch.topk`` there and :func:`row_argmax` ``torch.argmax`` (the reference
  path unchanged), the log form the reference formula; the kernels refuse what they cannot rank;
- GPU (``gpu``): the drafters' and DDTree's shapes, the 27B vocabulary (two launches), inside a CUDA graph;
  the row argmax with several maxima a row.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from conftest import run_in_interpreter

from repro.models.topk_kernels import (
    CHUNK,
    MAX_K,
    MAX_ROW,
    launch_topk,
    row_argmax,
    row_topk,
    triton_topk_applies,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TINY = torch.finfo(torch.float64).tiny


def reference(x: torch.Tensor, k: int, log: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Value descending, ties to the smaller index: a stable descending sort's first k."""
    values, index = torch.sort(x.float(), dim=-1, descending=True, stable=True)
    values, index = values[..., :k].to(x.dtype), index[..., :k]
    if log:
        values = values.to(torch.float64).clamp(TINY, 1.0).log()
    return values, index


def cases(gen: torch.Generator, long_rows: bool) -> list[tuple[str, torch.Tensor, int, bool]]:
    """(name, rows, k, log): ties (a value repeated every 7th entry), zeros, negatives, odd lengths."""
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(3, 300, generator=gen).to(dtype)
        x[:, ::7] = x[:, 5:6]  # ties, some of them inside the top k
        x[:, 1::11] = 0.0
        out += [
            (f"{dtype} k1", x, 1, False),
            (f"{dtype} k5", x, 5, False),
            (f"{dtype} k=n", x[:, :37], 37, False),
        ]
    probs = torch.softmax(torch.randn(2, 4096, generator=gen) * 3, -1)
    probs[:, ::5] = probs[:, 9:10]  # tied probabilities
    probs[:, 1::3] = 0.0
    out += [("ddtree log", probs, 32, True), ("ddtree plain", probs, 32, False)]
    out += [("3-d rows", torch.randn(2, 3, 65, generator=gen), 6, False)]
    if long_rows:  # two launches: the chunks' winners, then their merge
        x = torch.randn(1, CHUNK * 2 + 100, generator=gen).to(torch.bfloat16)
        x[:, -50:] = 9.0  # ties in the last, partial chunk
        out += [("two chunks", x, 7, False), ("two chunks k64", x, 64, False)]
    return out


def compare(device: str, long_rows: bool = True) -> dict:
    gen = torch.Generator().manual_seed(3)
    bad, done = [], 0
    for name, x, k, log in cases(gen, long_rows):
        x = x.to(device)
        want = tuple(t.cpu() for t in reference(x, k, log))  # on the device (its float64 log)
        got = launch_topk(x, k, log)
        lead = x.shape[:-1]
        out = (
            torch.empty(*lead, k, dtype=got[0].dtype, device=device),
            torch.empty(*lead, k, dtype=torch.long, device=device),
        )
        into = launch_topk(x, k, log, out=out)
        for result in (got, into):
            if not (torch.equal(result[0].cpu(), want[0]) and torch.equal(result[1].cpu(), want[1])):
                bad.append(name)
        if not log and not torch.equal(launch_topk(x, 1)[1][..., 0].cpu(), x.cpu().argmax(-1)):
            bad.append(f"{name}: argmax")  # row_argmax's kernel path against torch's first maximum
        done += 1
    return {"cases": done, "mismatches": bad}


def _interpreter_main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    print(json.dumps(compare("cpu")))


def test_interpreter_kernels_equal_a_stable_sort() -> None:
    res = run_in_interpreter(__file__)
    assert res["cases"] == len(cases(torch.Generator().manual_seed(3), True))
    assert res["mismatches"] == [], res


def test_reference_breaks_ties_by_index_and_the_cases_hold_ties() -> None:
    """The reference's tie order is the one the kernels claim, and the cases do test it: a reversed tie
    order gives other indices on them."""
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    assert reference(x, 3)[1].tolist() == [[1, 2, 4]]
    gen = torch.Generator().manual_seed(3)
    flipped = 0
    for _, rows, k, _ in cases(gen, True):
        rev = rows.flip(-1)
        _, idx = torch.sort(rev.float(), dim=-1, descending=True, stable=True)
        later_first = rows.shape[-1] - 1 - idx[..., :k]
        flipped += not torch.equal(later_first, reference(rows, k)[1])
    assert flipped >= 5


def test_cpu_row_topk_is_torch_topk() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4096, generator=gen)
    probs = torch.softmax(x, -1)
    v, i = row_topk(x, 9)
    ref = torch.topk(x, 9, dim=-1)
    assert torch.equal(v, ref.values) and torch.equal(i, ref.indices)
    lv, li = row_topk(probs, 32, log=True)
    top = torch.topk(probs, 32, dim=-1)
    assert lv.dtype == torch.float64
    assert torch.equal(lv, top.values.double().clamp(TINY, 1.0).log()) and torch.equal(li, top.indices)
    out = (torch.empty(4, 9), torch.empty(4, 9, dtype=torch.long))
    assert row_topk(x, 9, out=out) is out and torch.equal(out[0], ref.values)


def test_cpu_row_argmax_is_torch_argmax() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 0.0, 5.0, 5.0]])  # ties: the first maximum
    assert row_argmax(x).tolist() == [1, 0] == x.argmax(-1).tolist()
    assert row_argmax(torch.zeros(2, 3, 5, dtype=torch.float64)).shape == (2, 3)


def test_kernels_refuse_what_they_cannot_rank() -> None:
    assert not triton_topk_applies(torch.zeros(2, 10, dtype=torch.float64), 3)  # float64 has no room
    assert not triton_topk_applies(torch.zeros(2, 10), 11)
    assert not triton_topk_applies(torch.zeros(2, 10), 0)
    assert not triton_topk_applies(torch.zeros(2, 4096), MAX_K + 1)
    assert not triton_topk_applies(torch.zeros(2, MAX_ROW + 1), 4)
    assert triton_topk_applies(torch.zeros(2, MAX_ROW, dtype=torch.bfloat16), MAX_K)
    assert triton_topk_applies(torch.zeros(2, 4096, dtype=torch.float16), 1)
    with pytest.raises(ValueError, match="do not rank"):
        launch_topk(torch.zeros(2, 10, dtype=torch.float64), 3)


@pytest.mark.gpu
@needs_cuda
def test_gpu_kernels_equal_a_stable_sort() -> None:
    res = compare("cuda")
    assert res["mismatches"] == [], res
    gen = torch.Generator().manual_seed(5)
    for rows, n, k, dtype in ((15, 4096, 32, torch.float32), (64, 4096, 128, torch.bfloat16),
                              (4, 32000, 8, torch.bfloat16), (33, 4096, 4, torch.float32)):  # fmt: skip
        x = torch.randn(rows, n, generator=gen).to(dtype).cuda()
        for log in (False, True):
            src = torch.softmax(x.float(), -1) if log else x
            got = row_topk(src, k, log)
            want = reference(src, k, log)  # on the device: the float64 log of torch's CUDA kernels
            assert torch.equal(got[1], want[1]), (rows, n, k, log)
            assert torch.equal(got[0], want[0]), (rows, n, k, log, (got[0] - want[0]).abs().max().item())
        ties = x.clone()
        ties[:, 7::13] = ties.max()  # several maxima a row: the first wins, as in argmax
        assert torch.equal(row_argmax(ties), ties.argmax(-1)), (rows, n, dtype)


@pytest.mark.gpu
@needs_cuda
def test_gpu_kernels_in_a_cuda_graph() -> None:
    gen = torch.Generator().manual_seed(6)
    x = torch.softmax(torch.randn(15, 4096, generator=gen), -1).cuda()
    out = (
        torch.empty(15, 32, dtype=torch.float64, device="cuda"),
        torch.empty(15, 32, dtype=torch.long, device="cuda"),
    )
    row_topk(x, 32, log=True, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        row_topk(x, 32, log=True, out=out)
    for _ in range(3):
        x.copy_(torch.softmax(torch.randn(15, 4096, generator=gen), -1))
        graph.replay()
        want = reference(x, 32, True)
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
