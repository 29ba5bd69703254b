"""DDTree's best-first tree as one Triton program: :class:`~repro.decoding.tree_builders.BestFirst`'s
heap run on the device over the per-depth top-k log-probabilities, the same tree node for node
(tokens, parents, order) as the host heap and :func:`~repro.decoding.tree_builders.best_first_device`.

The heap holds at most one entry per node: the next child of that node to pop (node 0 is the root). So
the program keeps one slot per node in registers (score, depth, rank, the node's own score) and runs
``n`` pops, each one tuple reduction over the slots: the best score wins, exact ties go to the smaller
(depth, node). That is the heap's tie order (depth, parent's rank among its depth's nodes, rank): the
nodes of one depth pop in node order, and one node has one live entry. A pop writes the node's token
and parent, moves its slot to the next sibling (same parent, next rank) and opens the new node's slot
at its first child. Scores are the heap's float64 sums (parent score + log-probability), added in the
same order, so ties and near-ties resolve alike.

One launch, no host read, fixed shapes: capture-safe. ``n`` (the tree's draft nodes) is known on the
host from the shapes (:func:`~repro.decoding.tree_builders.best_first_size`).

The pop's selection runs one of two ways (``fused``): one tuple reduction with the heap's order as its
combine (the fewest dependent steps, the GPU default), or the builtin reductions (max score, least key
among the best, then the winner's rank and base: three dependent reductions). Both pick the same slot;
the second is there because Triton's interpreter runs a custom combine element by element (seconds
per tree at budget 256), so the CPU tests cover many more trees with it, and the GPU script times both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _better(s1, k1, r1, b1, s2, k2, r2, b2):
    """The heap's order on slots: higher score first, then smaller key (depth * slots + node)."""
    one = (s1 > s2) | ((s1 == s2) & (k1 < k2))
    return tl.where(one, s1, s2), tl.where(one, k1, k2), tl.where(one, r1, r2), tl.where(one, b1, b2)


@triton.jit
def best_first_kernel(
    logp, ids, root, tokens, parents,
    depth, k, N: tl.constexpr, C: tl.constexpr, FUSED: tl.constexpr,
):  # fmt: skip
    """``tokens``/``parents`` [N + 1] (int64) of the best-first tree over ``logp`` (float64 [depth, k],
    each row descending) and ``ids`` (int64 [depth, k]); the root token is read from ``root`` [1]. N and
    C are compile-time (the loop's trip count and the slots), depth and k run-time (fewer compiles).

    Slot j (C >= N slots) is node j's next child to pop: ``score`` (-inf: none), ``key`` = depth index
    * C + j (unique), ``rank`` within the depth's top-k, ``base`` = node j's own score. Every pop finds
    a live slot: N is at most the number of paths (best_first_size), and live scores are finite.
    """
    BIG: tl.constexpr = 2**31 - 1
    slot = tl.arange(0, C)
    first = tl.load(logp)
    score = tl.where(slot == 0, first, float("-inf")).to(tl.float64)
    key = slot
    rank = tl.zeros([C], dtype=tl.int32)
    base = tl.zeros([C], dtype=tl.float64)
    tl.store(tokens, tl.load(root))
    tl.store(parents, -1)
    for i in range(N):
        if FUSED:  # one tuple reduction
            best, kk, r, b = tl.reduce((score, key, rank, base), 0, _better)
        else:  # the builtin reductions: max, then min key among the best, then the winner's payload
            best = tl.max(score, 0)
            kk = tl.min(tl.where(score == best, key, BIG), 0)
            win = key == kk
            r = tl.sum(tl.where(win, rank, 0), 0)
            b = tl.sum(tl.where(win, base, 0.0), 0)
        j = kk % C  # the parent node
        d = kk // C  # the new node's depth index
        node = i + 1
        # every load first, the stores last: a store may alias the loads, so a load after it would wait
        # for the token's load (two memory latencies a pop instead of one)
        more = r + 1 < k
        deeper = d + 1 < depth
        sib = b + tl.load(logp + d * k + r + 1, mask=more, other=0.0)
        child = best + tl.load(logp + (d + 1) * k, mask=deeper, other=0.0)
        token = tl.load(ids + d * k + r)
        # the parent's slot moves on to the next sibling
        here = slot == j
        score = tl.where(here, tl.where(more, sib, float("-inf")), score)
        rank = tl.where(here, r + 1, rank)
        # the new node's slot opens at its first child
        new = slot == node
        score = tl.where(new, tl.where(deeper, child, float("-inf")), score)
        key = tl.where(new, (d + 1) * C + node, key)
        rank = tl.where(new, 0, rank)
        base = tl.where(new, best, base)
        tl.store(tokens + node, token)
        tl.store(parents + node, j.to(tl.int64))


def launch(
    root: torch.Tensor,
    logp: torch.Tensor,
    ids: torch.Tensor,
    n: int,
    num_warps: int | None = None,
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and parents [n + 1] (int64, on ``logp``'s device) of the best-first tree of ``n`` draft
    nodes over ``logp``/``ids`` (:func:`~repro.decoding.tree_builders.top_log_probs`' output) below
    the root ``root`` ([1] int64 on the device). One launch; ``fused``: the selection's one tuple
    reduction (else the builtin reductions); ``num_warps`` by default one warp per 256 slots."""
    depth, k = logp.shape
    if n < 1:
        raise ValueError(f"a best-first tree needs at least one draft node, got {n}")
    slots = triton.next_power_of_2(n)
    warps = num_warps or max(1, min(8, slots // 256))
    tokens = torch.empty(n + 1, dtype=torch.long, device=logp.device)
    parents = torch.empty(n + 1, dtype=torch.long, device=logp.device)
    best_first_kernel[(1,)](
        logp.contiguous(), ids.long().contiguous(), root, tokens, parents,
        depth, k, N=n, C=slots, FUSED=fused, num_warps=warps,
    )  # fmt: skip
    return tokens, parents
