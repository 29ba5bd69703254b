"""The EAGLE tree level's glue in one launch (repro/drafters/frontier_kernels.py) against TreeGrowth's torch
ops (repro/drafters/static_eagle.py), under Triton's interpreter (one TRITON_INTERPRET=1 subprocess):

- next_frontier: the float64 scores, the stable descending sort (values and creation order), the next
  rows' tokens, parent rows, masks (parent row's | own slot) and predictions, on the root's level (one
  row, score 0, a mask of the committed columns only) and on cases with tied
  probabilities, a pruned child (p < tau), a pruned parent (score -inf, its children -inf and sorted after
  every finite one in creation order), tau <= 0 (only p = 0 pruned) and more frontier rows than a parent has
  children (kids < beam);
- level_scores: the last level's scores alone;
- select_tree: TreeGrowth's deep parents and final selection (``TreeGrowth.select``) on buffers of random
  scores with ties and -inf, budgets below and above the candidates, one level and six.
Scores are compared to the float64 ulp (the interpreter's log is NumPy's, torch's its own); everything else
exactly. The drafter's whole tree through it: tests/drafters/test_eagle_fast.py.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import run_in_interpreter

CASES = {  # name: (rows, kids, beam, tau, ties, dead parent)
    "ties": (4, 4, 4, 0.05, True, False),
    "dead-parent": (4, 4, 4, 0.05, False, True),
    "no-tau": (3, 2, 3, 0.0, True, True),
    "narrow": (5, 2, 5, 0.1, False, False),
    "root": (1, 6, 4, 0.05, False, False),  # level 1: one row, score 0, the committed columns' mask only
}
ROOT_COLUMNS = 7  # the root's mask: the first 7 of 11 columns (the drafted slots' after them)


def case_inputs(
    rows: int, kids: int, beam: int, ties: bool, dead: bool, seed: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    top_p = torch.rand(rows, kids, generator=gen).sort(dim=1, descending=True).values * 0.5
    if ties:
        top_p[1] = top_p[0]  # two rows with the same children's probabilities
        top_p[0, 1] = top_p[0, 0]
    top_p[-1, -1] = 0.0  # a child with no probability
    score = -torch.rand(rows, generator=gen, dtype=torch.float64) * 3 if rows > 1 else torch.zeros(1).double()
    if ties:
        score[1] = score[0]
    if dead:
        score[2] = float("-inf")
    width, hidden = 11, 6
    return {
        "top_p": top_p,
        "top_ids": torch.randint(0, 1000, (rows, kids), generator=gen),
        "score": score,
        "mask": torch.rand(rows, width if rows > 1 else ROOT_COLUMNS, generator=gen) < 0.3,
        "own": torch.eye(beam, width, dtype=torch.bool).roll(width - beam, dims=1),
        "preds": torch.randn(rows, hidden, generator=gen),
    }


def torch_level(x: dict[str, torch.Tensor], tau: float, beam: int) -> dict[str, torch.Tensor]:
    """TreeGrowth._tree_step's ops for a level after the first (static_eagle.py)."""
    kids = x["top_p"].shape[1]
    confident = x["top_p"] >= tau if tau > 0 else x["top_p"] > 0
    p = torch.where(confident, x["top_p"], torch.zeros(1, dtype=torch.float64))
    scores = x["score"][:, None] + p.log()
    values, order = torch.sort(scores.reshape(-1), descending=True, stable=True)
    first = order[:beam]
    row = torch.div(first, kids, rounding_mode="floor")
    return {
        "scores": scores.reshape(-1), "values": values, "order": order,
        "ids": x["top_ids"].reshape(-1).index_select(0, first), "rows": row,
        "mask": F.pad(x["mask"], (0, x["own"].shape[1] - x["mask"].shape[1])).index_select(0, row) | x["own"],
        "preds": x["preds"].index_select(0, row),
    }  # fmt: skip


def compare(name: str, device: str = "cpu") -> dict[str, object]:
    from repro.drafters.frontier_kernels import level_scores, next_frontier

    rows, kids, beam, tau, ties, dead = CASES[name]
    host = case_inputs(rows, kids, beam, ties, dead, seed=len(name))
    ref = {k: v.to(device) for k, v in torch_level(host, tau, beam).items()}
    x = {k: v.to(device) for k, v in host.items()}
    n = rows * kids
    scores = torch.full((n,), 7.0, dtype=torch.float64, device=device)
    values = torch.zeros(n, dtype=torch.float64, device=device)
    order = torch.zeros(n, dtype=torch.long, device=device)
    ids, parent_rows, mask, preds = next_frontier(
        x["top_p"], x["top_ids"], x["score"], tau, scores.view(rows, kids), values, order, x["mask"],
        x["own"], x["preds"],
    )  # fmt: skip
    last = torch.full((n,), 7.0, dtype=torch.float64, device=device)
    level_scores(x["top_p"], x["score"], tau, last.view(rows, kids))

    def ulps(a: torch.Tensor, b: torch.Tensor) -> bool:  # equal, or within 2 ulp where finite
        same_inf = torch.equal(torch.isinf(a), torch.isinf(b)) and torch.equal(
            a[torch.isinf(a)], b[torch.isinf(b)]
        )
        fin = torch.isfinite(b)
        return same_inf and bool(
            ((a[fin] - b[fin]).abs() <= 2 * torch.finfo(torch.float64).eps * b[fin].abs()).all()
        )

    return {
        "scores": ulps(scores, ref["scores"]),
        "last": ulps(last, ref["scores"]),
        "values": ulps(values, ref["values"]),
        "order": torch.equal(order, ref["order"]),
        "ids": torch.equal(ids, ref["ids"]),
        "rows": torch.equal(parent_rows, ref["rows"]),
        "mask": torch.equal(mask, ref["mask"]),
        "preds": torch.equal(preds, ref["preds"]),
        "pruned": int(torch.isinf(ref["scores"]).sum()),  # the case prunes something (not a vacuous check)
    }


SELECT_SPECS = {  # name: (budget, topk, depth)
    "spec-la": (32, 4, 6),
    "all": (200, 3, 3),
    "one-level": (3, 5, 1),
}


def compare_select(name: str, device: str = "cpu") -> dict[str, bool]:
    """select_tree against TreeGrowth's torch ops on the same random buffers."""
    import copy

    from repro.drafters.eagle import DynamicTree
    from repro.drafters.frontier_kernels import select_tree
    from repro.drafters.static_eagle import TreeGrowth

    budget, topk, depth = SELECT_SPECS[name]
    grow = TreeGrowth(
        DynamicTree(budget, topk, 0.0, depth), 50, torch.float32, 8, depth, torch.device(device)
    )
    gen = torch.Generator().manual_seed(len(name))
    n = grow.n
    scores = -torch.rand(n, generator=gen, dtype=torch.float64) * 4
    scores[torch.rand(n, generator=gen) < 0.2] = float("-inf")
    scores[5:9] = scores[4]  # ties
    grow.scores[1 : n + 1] = scores.to(device)
    grow.tokens[1 : n + 1] = torch.randint(1, 50, (n,), generator=gen).to(device)
    for d in range(1, depth):  # a level's frontier order: candidate positions within the level
        values, order = grow.frontier(d)
        order.copy_(torch.randint(0, grow.counts[d - 1], order.shape, generator=gen))
    ref = copy.deepcopy(grow)
    if depth > 1:
        torch.add(ref.orders.index_select(0, ref.parent_at), ref.parent_base, out=ref.deep_parents)
    want = ref.select()
    got = select_tree(grow.scores, grow.tokens, grow.parents, grow.orders, grow.parent_at, grow.parent_base,
                      grow.counts[0], grow.size)  # fmt: skip
    return {
        "tokens": torch.equal(got[0], want[0]),
        "parents": torch.equal(got[1], want[1]),
        "scores": torch.equal(got[2], want[2]),
        "parent buffer": torch.equal(grow.parents, ref.parents),
        "pads": bool((want[1][1:] < 0).any()),  # fewer real candidates than the tree's size
        "truncates": int(torch.isfinite(scores).sum()) > grow.size,  # more than it keeps
    }


def _interpreter_main() -> None:
    import json

    out: dict[str, object] = {name: compare(name) for name in CASES}
    out.update({f"select/{name}": compare_select(name) for name in SELECT_SPECS})
    print(json.dumps(out))


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.parametrize("name", list(CASES))
def test_the_level_kernel_equals_the_torch_glue(interp: dict, name: str) -> None:
    got = interp[name]
    assert got.pop("pruned") > 0, got
    assert all(got.values()), got


@pytest.mark.parametrize("name", list(SELECT_SPECS))
def test_the_selection_kernel_equals_tree_growth_select(interp: dict, name: str) -> None:
    got = dict(interp[f"select/{name}"])
    got.pop("pads"), got.pop("truncates")
    assert all(got.values()), got


def test_the_selection_cases_pad_and_truncate(interp: dict) -> None:
    """Not vacuous: a case keeps fewer real candidates than its tree's size (padding), one more than it."""
    flags = [interp[f"select/{name}"] for name in SELECT_SPECS]
    assert any(f["pads"] for f in flags) and any(f["truncates"] for f in flags), flags


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_level_and_selection_kernels() -> None:
    for name in CASES:
        got = compare(name, "cuda")
        assert got.pop("pruned") > 0 and all(got.values()), (name, got)
    for name in SELECT_SPECS:
        got = compare_select(name, "cuda")
        got.pop("pads"), got.pop("truncates")
        assert all(got.values()), (name, got)


def test_frontier_buffers_that_do_not_fit_are_refused() -> None:
    from repro.drafters.frontier_kernels import next_frontier

    x = case_inputs(2, 2, 2, False, False, 0)
    small = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="frontier buffers"):
        next_frontier(x["top_p"], x["top_ids"], x["score"], 0.0, small, small, small.long(), x["mask"],
                      x["own"], x["preds"])  # fmt: skip


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
