"""The static EAGLE drafter's dynamic-tree glue on few launches (the fast path of
:meth:`~repro.drafters.static_eagle.StaticEagleDrafter._tree_step`): one per level, one for the final
selection. :func:`next_frontier` is what
:class:`~repro.drafters.static_eagle.TreeGrowth`'s torch glue does between a level's top-k and the next
level's forward, equal to it (tests/drafters/test_frontier_kernels.py, under Triton's interpreter):

- the level's float64 scores, ``parent score + log p`` with a pruned child's ``p`` (``p < tau``, or 0)
  taken as 0, into the tree's score buffer (``where``, ``log``, ``add``);
- the frontier: the level's candidates sorted by (-score, creation order), a stable descending sort done
  by ranks (candidate i's rank: how many score higher, or the same and come first), into the level's sort
  buffers (``sort``);
- per frontier row b: the candidate's token, its parent row, the parent row's slot mask OR the row's own
  slot, and the parent row's prediction (``index_select`` x 3, ``div``, ``|``).

A level was 9 aten launches of glue (the first 5, the last, scores only, 3); now 1 (the first too, when
the root has at least as many children as the frontier has rows). The log is float64 on both sides
(the tree's scores are float64); ties keep creation order as torch's stable sort does.

:func:`select_tree` is :meth:`~repro.drafters.static_eagle.TreeGrowth.select` and the deep levels' parents
before it (two sorts, a scatter, five gathers and an add: 10 launches) in one program: ranks by (-score,
id) counted over blocks of candidates, the kept ones' tree positions by a prefix sum, the parents' positions
read back through a scratch map after a block barrier.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

COPY_BLOCK = 1024  # mask / prediction columns a program copies per step


@triton.jit
def _frontier_kernel(
    top_p, top_ids, score, tau, scores_out, values, order, ids, rows_out, mask, own, mask_out, preds,
    preds_out, n, kids, MIN: tl.constexpr, MW: tl.constexpr, W: tl.constexpr, NP: tl.constexpr,
    POSITIVE_TAU: tl.constexpr, FRONTIER: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Frontier row ``pid``: the level's scores and sort (program 0 writes them), then row pid's token,
    parent row, mask (the parent row's MIN columns, zeros after them, | the row's own) and prediction."""
    b = tl.program_id(0)
    i = tl.arange(0, NP)
    valid = i < n
    p = tl.load(top_p + i, mask=valid, other=0.0).to(tl.float64)
    if POSITIVE_TAU:
        p = tl.where(p >= tau, p, 0.0)
    else:
        p = tl.where(p > 0.0, p, 0.0)
    s = tl.load(score + i // kids, mask=valid, other=0.0) + tl.log(p)
    if b == 0:
        tl.store(scores_out + i, s, mask=valid)
    if FRONTIER:
        s_i = s[:, None]
        s_j = s[None, :]
        ahead = (s_j > s_i) | ((s_j == s_i) & (i[None, :] < i[:, None]))
        rank = tl.sum((ahead & valid[None, :]).to(tl.int32), axis=1)
        if b == 0:
            tl.store(values + rank, s, mask=valid)
            tl.store(order + rank, i.to(tl.int64), mask=valid)
        child = tl.sum(tl.where((rank == b) & valid, i, 0), axis=0)
        row = child // kids
        tl.store(ids + b, tl.load(top_ids + child))
        tl.store(rows_out + b, row.to(tl.int64))
        c = tl.arange(0, BC)
        for c0 in range(0, MW, BC):  # constexpr bounds (the interpreter's run-time bounds need a patch)
            m = c0 + c < MW
            seen = tl.load(mask + row * MIN + c0 + c, mask=m & (c0 + c < MIN), other=0)
            mine = tl.load(own + b * MW + c0 + c, mask=m, other=0)
            tl.store(mask_out + b * MW + c0 + c, seen | mine, mask=m)
        for c0 in range(0, W, BC):
            m = c0 + c < W
            x = tl.load(preds + row * W + c0 + c, mask=m, other=0.0)
            tl.store(preds_out + b * W + c0 + c, x, mask=m)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bool data as uint8 (the same bytes), others as they are."""
    if not t.is_contiguous():
        raise ValueError("the frontier kernel's tensors must be contiguous")
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def level_scores(top_p: torch.Tensor, score: torch.Tensor, tau: float, scores_out: torch.Tensor) -> None:
    """The last level: ``scores_out`` [rows, kids] (float64) = ``score[:, None] + log(p)``, ``p`` =
    ``top_p`` [rows, kids] where confident (``>= tau``; ``> 0`` for tau <= 0), else 0."""
    rows, kids = top_p.shape
    n = rows * kids
    np_ = triton.next_power_of_2(n)
    _frontier_kernel[(1,)](
        _flat(top_p), top_p, _flat(score), float(tau), _flat(scores_out), score, score, score, score, score,
        score, score, score, score, n, kids, MIN=0, MW=0, W=0, NP=np_, POSITIVE_TAU=tau > 0,
        FRONTIER=False, BC=16, num_warps=4,
    )  # fmt: skip


def next_frontier(
    top_p: torch.Tensor,
    top_ids: torch.Tensor,
    score: torch.Tensor,
    tau: float,
    scores_out: torch.Tensor,
    values: torch.Tensor,
    order: torch.Tensor,
    mask: torch.Tensor,
    own: torch.Tensor,
    preds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A non-last level: its scores (as :func:`level_scores`) and the next frontier.

    ``top_p`` / ``top_ids`` [rows, kids]: the level's top-k per frontier row; ``score`` [rows] float64:
    the rows' scores; ``values`` / ``order`` [rows kids]: the level's candidates sorted by (-score,
    creation order) and their indices (written); ``mask`` [rows, M'] bool: the rows' slot masks (M' <= M:
    the first M' columns, False after them; the root's committed columns at level 1); ``own`` [beam, M]
    bool: each next row's own slot; ``preds`` [rows, H]: the rows' predictions. Returns the next
    frontier's (tokens [beam], parent rows [beam], masks [beam, M], predictions [beam, H]), ``beam`` =
    ``own``'s rows."""
    rows, kids = top_p.shape
    n, beam = rows * kids, own.shape[0]
    if values.shape != (n,) or order.shape != (n,) or beam > n or mask.shape[1] > own.shape[1]:
        raise ValueError(f"frontier buffers of {n} candidates, beam <= {n}, masks no wider than own expected")
    ids = torch.empty(beam, dtype=top_ids.dtype, device=top_ids.device)
    parent_rows = torch.empty(beam, dtype=torch.long, device=top_ids.device)
    mask_out = torch.empty(beam, own.shape[1], dtype=mask.dtype, device=mask.device)
    preds_out = torch.empty(beam, preds.shape[1], dtype=preds.dtype, device=preds.device)
    np_ = triton.next_power_of_2(n)
    _frontier_kernel[(beam,)](
        _flat(top_p), _flat(top_ids), _flat(score), float(tau), _flat(scores_out), _flat(values),
        _flat(order), ids, parent_rows, _flat(mask), _flat(own), _flat(mask_out), _flat(preds), preds_out,
        n, kids, MIN=mask.shape[1], MW=own.shape[1], W=preds.shape[1], NP=np_, POSITIVE_TAU=tau > 0,
        FRONTIER=True, BC=COPY_BLOCK, num_warps=4,
    )  # fmt: skip
    return ids, parent_rows, mask_out, preds_out


@triton.jit
def _select_kernel(
    scores, tokens, parents, orders, parent_at, parent_base, node_of, out_tokens, out_parents, out_scores,
    first, size, N: tl.constexpr, NP: tl.constexpr, BJ: tl.constexpr,
):  # fmt: skip
    """One program: the deep levels' parents, the ``size`` best candidates by (-score, id) and the root
    as a tree in id order, padding after (see :func:`select_tree`)."""
    i = tl.arange(0, NP)
    valid = i <= N  # ids 0 (the root) .. N
    s = tl.load(scores + i, mask=valid, other=float("-inf"))
    deep = valid & (i > first)  # levels 2..: the parent is a frontier row's candidate id
    at = tl.load(parent_at + (i - first - 1), mask=deep, other=0)
    par = tl.where(
        deep,
        tl.load(orders + at, mask=deep, other=0) + tl.load(parent_base + (i - first - 1), mask=deep, other=0),
        tl.load(parents + i, mask=valid, other=0),
    )
    tl.store(parents + i, par, mask=deep)
    rank = tl.zeros([NP], dtype=tl.int32)
    for j0 in range(0, N + 1, BJ):  # constexpr bounds, as in _frontier_kernel
        j = j0 + tl.arange(0, BJ)
        s_j = tl.load(scores + j, mask=j <= N, other=float("-inf"))
        ahead = (s_j[None, :] > s[:, None]) | ((s_j[None, :] == s[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & (j[None, :] <= N)).to(tl.int32), axis=1)
    chosen = valid & (rank <= size) & (s > float("-inf"))
    pos = tl.cumsum(chosen.to(tl.int32), axis=0) - 1
    kept = tl.sum(chosen.to(tl.int32), axis=0)
    tl.store(node_of + i, tl.zeros([NP], dtype=tl.int64), mask=i <= N + 1)  # as TreeGrowth.unmapped: 0 ..
    tl.store(node_of + N + 2, -1)  # .. and -1 for "none" (the root's parent)
    tl.debug_barrier()
    tl.store(node_of + i, pos.to(tl.int64), mask=chosen)
    tl.debug_barrier()
    parent_node = tl.load(node_of + par, mask=chosen, other=-1)
    tl.store(out_tokens + pos, tl.load(tokens + i, mask=chosen, other=0), mask=chosen)
    tl.store(out_parents + pos, parent_node, mask=chosen)
    tl.store(out_scores + pos - 1, s, mask=chosen & (pos > 0))
    pad = (i >= kept) & (i <= size)  # positions after the real nodes
    tl.store(out_tokens + i, tl.zeros([NP], dtype=tl.int64), mask=pad)
    tl.store(out_parents + i, tl.full([NP], -1, dtype=tl.int64), mask=pad)
    tl.store(out_scores + i - 1, tl.full([NP], float("-inf"), dtype=tl.float64), mask=pad & (i > 0))


def select_tree(
    scores: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    orders: torch.Tensor,
    parent_at: torch.Tensor,
    parent_base: torch.Tensor,
    first: int,
    size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:meth:`~repro.drafters.static_eagle.TreeGrowth.select` after the deep levels' parents, in one launch.

    Over candidate ids 0 (the root) .. n (``scores`` float64, ``tokens``, ``parents`` [n + 2], the
    sentinel id n + 1 and "none" n + 2 as TreeGrowth numbers them): the parents of ids past ``first`` (the
    root's children) are written first, ``orders[parent_at] + parent_base``; then the root and the
    ``size`` best candidates by (-score, id) that score above -inf, in id order, with padding (token 0,
    parent -1, score -inf) after them: (tokens, parents as tree nodes [size + 1], the kept candidates'
    scores [size])."""
    n = scores.shape[0] - 2
    np_ = triton.next_power_of_2(n + 1)
    dev = scores.device
    node_of = torch.empty(n + 3, dtype=torch.long, device=dev)
    out_tokens = torch.empty(size + 1, dtype=tokens.dtype, device=dev)
    out_parents = torch.empty(size + 1, dtype=torch.long, device=dev)
    out_scores = torch.empty(size, dtype=scores.dtype, device=dev)
    at = parent_at if parent_at is not None else parents  # no deep level: never read
    base = parent_base if parent_base is not None else parents
    _select_kernel[(1,)](
        scores, tokens, parents, orders, at, base, node_of, out_tokens, out_parents, out_scores, first, size,
        N=n, NP=np_, BJ=max(1, min(np_, 4096 // np_)), num_warps=4 if np_ <= 256 else 8,
    )  # fmt: skip
    return out_tokens, out_parents, out_scores
