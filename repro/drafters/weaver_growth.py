"""Weaver's best-first tree growth: the host reference and its device twin.

Both grow the same tree below a root from DFlash rows ``g_d`` [D, hidden], pools (logits and ids
[D, K], best first) and the root's target features, in Weaver steps of ``width`` nodes (the paper's
w: "expanding w frontier nodes per Weaver step"). A step takes the ``width`` best candidates one
after another (decreasing cumulative log q); a candidate is a (parent node, rank) pair, one per
scored parent (a parent's next-ranked child enters when one is taken, as in DDTree); ties go to the
candidate pushed first. Then one Weaver forward scores the step's nodes together and their first
children enter. A node at depth D, or in the step that fills the budget, gets no children. Each
parent ranks its best ``keep = min(K, budget)`` pool tokens. Width 1 is the exact best-first tree
(the ``budget`` best nodes); a wider step takes its later nodes without the children of its earlier
ones, for ``budget / width`` forwards instead of ``budget``. A node's children enter only after its
step, so the tree is at most ``ceil(budget / width)`` deep (budget 32 at width 4: 8 of a 16-block's 15).

- :func:`grow` (the reference) keeps the candidates in a host heap and reads every forward's result
  on the host.
- :func:`grow_on_device` has fixed shapes and never reads the device: ``ceil(budget / width)``
  steps, each ``width`` argmaxes over a candidate table of one entry per node (cumulative log q in
  float64, push order as the tie-break, a validity flag), then one Weaver forward of the step's nodes
  over a static cache of ``budget + 1`` key/value slots (slot = node index) with their ancestor rows
  as the mask (no node of a step is an ancestor of another), then the first-child pushes. The tree
  is the reference's (tokens, parents, order): cumulative scores are float64 sums of the same
  float64 terms in the same order as the host's Python floats, push order is kept exactly. When the
  pools run out (fewer than ``budget`` reachable nodes), the reference leaves the slots it could not
  fill empty; the device tree fills them with root-level padding nodes (parent -1, token 0), after
  the real ones, or within a step whose pops found the table empty before its forward refilled it:
  verification isolates them and acceptance never enters them (:meth:`DeviceGrowth.real` drops
  them). Cost: about 100 small aten ops per step (the Weaver layer and the table bookkeeping).
  :func:`repro.drafters.growth_kernels.grow_fused` grows the same tree from one Triton launch per
  step on one or many programs (CUDA; CPU under Triton's interpreter); this torch version is its
  reference.
- :class:`repro.drafters.weaver.GrowthStep` is the part of Weaver's propose after the DFlash block
  (pool top-K, DFlash marginals, device growth: fused where the kernel fits, see ``fused``) on static
  input buffers: one CUDA graph on CUDA, eager elsewhere.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import torch

from repro.drafters.weaver_model import KV, WeaverModel
from repro.tree import DeviceTree, Sparse, Tree

# ----- the host reference -----


@dataclass
class Growth:
    """A grown tree, its greedy path (first child at every level), per-node cumulative log q and the
    number of nodes each Weaver forward scored. ``tree.proposals[n]`` is q_n over the pool of the
    depth below n (the distribution n's children were ranked by) for every inner node n."""

    tree: Tree
    greedy: list[int]
    scores: list[float]
    batches: list[int]


@dataclass
class _Expanded:
    """A node Weaver has scored: the cache slots of its ancestors and its own (last), its children
    (pool tokens by decreasing log q, with their log q) and q over the whole pool (sparse, float64)."""

    slots: list[int]
    children: list[int]
    log_q: list[float]
    q: Sparse


class _Expander:
    """Batched Weaver forwards for one draft step; keys/values of scored nodes stay cached."""

    def __init__(
        self,
        weaver: WeaverModel,
        embedding: torch.Tensor,
        rows: torch.Tensor,
        pool_logits: torch.Tensor,
        pool_ids: torch.Tensor,
        feature: torch.Tensor,
        keep: int,
    ) -> None:
        self.w, self.embedding, self.keep = weaver, embedding, keep
        self.pool_logits, self.ids = pool_logits, pool_ids.tolist()
        self.pool_ids = pool_ids.cpu()  # [D, K]: each depth's pool, the support of q there
        self.pool_emb = embedding[pool_ids]  # [D, K, target hidden]: the only embedding rows scored
        self.base = weaver.hidden_proj(rows) + weaver.feature_proj(feature)  # [D, d_model]
        self.cache: KV | None = None
        self.batches: list[int] = []

    def __call__(self, items: list[tuple[int, int, list[int]]]) -> list[_Expanded]:
        """Score nodes given as (depth, token, ancestors' slots) in one forward."""
        s, cached = len(items), 0 if self.cache is None else self.cache[0].shape[2]
        device = self.base.device
        at = torch.tensor([d for d, _, _ in items], device=device)
        tokens = torch.tensor([t for _, t, _ in items], device=device)
        x = self.base[at] + self.w.token_proj(self.embedding[tokens])
        mask = torch.zeros(s, cached + s, dtype=torch.bool, device=device)
        for i, (_, _, ancestors) in enumerate(items):
            mask[i, ancestors] = True
            mask[i, cached + i] = True
        u, kv = self.w(x[None], mask[None], self.cache)
        self.cache = kv if self.cache is None else tuple(torch.cat([c, n], 2) for c, n in zip(self.cache, kv))
        log_q = self.w.pool_log_probs(u[0], self.pool_logits[at], self.pool_emb[at])
        top_q, top_rank = torch.topk(log_q, self.keep, dim=-1)
        q = log_q.to("cpu", torch.float64).exp()  # [s, K]: each node's proposal over its pool
        self.batches.append(s)
        return [
            _Expanded(anc + [cached + i], [self.ids[d][r] for r in ranks], lq, (self.pool_ids[d], q[i]))
            for i, ((d, _, anc), lq, ranks) in enumerate(zip(items, top_q.tolist(), top_rank.tolist()))
        ]


def greedy_path(tree: Tree) -> list[int]:
    """Tokens of the first child at every level below node 0 (the drafter's first choices)."""
    greedy, node = [], 0
    while tree.children_of(node):
        node = tree.children_of(node)[0]
        greedy.append(int(tree.tokens[node]))
    return greedy


@torch.no_grad()
def grow(
    weaver: WeaverModel,
    embedding: torch.Tensor,
    budget: int,
    width: int,
    root: int,
    rows: torch.Tensor,
    pool_logits: torch.Tensor,
    pool_ids: torch.Tensor,
    feature: torch.Tensor,
) -> Growth:
    """The tree of ``budget`` draft nodes below ``root`` grown in Weaver steps of ``width`` nodes (the
    reference; module docstring).

    Step s owns the node slots ``1 + s * width`` .. ``min(budget, (s + 1) * width)``. Each slot pops the
    best candidate from a heap (decreasing cumulative log q, ties in push order) and pushes its
    parent's next rank; a slot whose pop finds the heap empty stays empty (the device pads it). Then,
    unless the step filled the budget, one forward scores the step's nodes above depth D together and
    pushes their first children in slot order. Width 1 is the exact best-first tree.
    """
    max_depth, k = pool_ids.shape
    keep = min(k, budget)  # children worth ranking per node
    expand = _Expander(weaver, embedding, rows, pool_logits, pool_ids, feature, keep)
    tokens, parents, depth, score = [root], [-1], [0], [0.0]
    scored = {0: expand([(0, root, [])])[0]}  # tree node -> its scoring
    order = itertools.count()
    heap = [(-scored[0].log_q[0], next(order), 0, 0)]  # (-score, push order, parent node, rank)
    for first in range(1, budget + 1, width):
        step: list[int] = []
        for _ in range(min(width, budget + 1 - first)):
            if not heap:
                break
            neg, _, p, r = heapq.heappop(heap)
            step.append(len(tokens))
            tokens.append(scored[p].children[r])
            parents.append(p)
            depth.append(depth[p] + 1)
            score.append(-neg)
            if r + 1 < keep:
                heapq.heappush(heap, (-(score[p] + scored[p].log_q[r + 1]), next(order), p, r + 1))
        if first + width > budget:
            break  # the last step: its nodes get no children
        inner = [n for n in step if depth[n] < max_depth]
        if inner:
            items = [(depth[n], tokens[n], scored[parents[n]].slots) for n in inner]
            for n, expanded in zip(inner, expand(items)):
                scored[n] = expanded
                heapq.heappush(heap, (-(score[n] + expanded.log_q[0]), next(order), n, 0))
        if not heap:
            break
    inner_nodes = set(parents)
    props = tuple(scored[n].q if n in inner_nodes else None for n in range(len(tokens)))
    tree = Tree(tokens, parents, props)
    return Growth(tree, greedy_path(tree), score, expand.batches)


# ----- on the device -----


@dataclass
class DeviceGrowth:
    """A tree grown on the device: ``budget + 1`` nodes (tokens, parents; padding after the real
    nodes: parent -1, token 0) and each node's cumulative log q (float64; padding -inf)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor

    @property
    def tree(self) -> DeviceTree:
        return DeviceTree(self.tokens, self.parents)

    def real(self) -> tuple[list[int], list[int], list[float]]:
        """The real nodes (root, then every node with a parent) as host lists: tokens, parents
        renumbered over the real nodes, scores; the host reference's tree (a sync)."""
        parents = self.parents.tolist()
        keep = [i for i, p in enumerate(parents) if i == 0 or p >= 0]
        index = {node: i for i, node in enumerate(keep)}
        tokens, scores = self.tokens.tolist(), self.scores.tolist()
        return [tokens[i] for i in keep], [index.get(parents[i], -1) for i in keep], [scores[i] for i in keep]


class _DeviceGrower:
    """The state of one device growth (every tensor of a fixed shape; see :func:`grow_on_device`)."""

    def __init__(
        self,
        weaver: WeaverModel,
        embedding: torch.Tensor,
        budget: int,
        rows: torch.Tensor,
        pool_logits: torch.Tensor,
        pool_ids: torch.Tensor,
        feature: torch.Tensor,
    ) -> None:
        self.w, self.embedding, self.pool_logits, self.pool_ids = weaver, embedding, pool_logits, pool_ids
        self.max_depth, k = pool_ids.shape
        self.keep, n = min(k, budget), budget + 1
        dev, cfg = rows.device, weaver.config
        self.pool_emb = embedding[pool_ids]  # [D, K, target hidden]
        self.base = weaver.hidden_proj(rows) + weaver.feature_proj(feature)  # [D, d_model]
        self.cache = torch.zeros(2, 1, cfg.num_heads, n, cfg.head_dim, dtype=self.base.dtype, device=dev)
        self.anc = torch.zeros(n, n, dtype=torch.bool, device=dev)  # ancestors, the node itself included
        self.child_tok = torch.zeros(n, self.keep, dtype=torch.long, device=dev)
        self.child_lq = torch.zeros(n, self.keep, dtype=torch.float64, device=dev)
        # the candidate table: node n's next child (rank[n]) with its cumulative log q (key[n])
        self.key = torch.zeros(n, dtype=torch.float64, device=dev)
        self.rank = torch.zeros(n, dtype=torch.long, device=dev)
        self.order = torch.zeros(n, dtype=torch.long, device=dev)  # push order: the tie-break
        self.valid = torch.zeros(n, dtype=torch.bool, device=dev)
        self.tokens = torch.zeros(n, dtype=torch.long, device=dev)
        self.parents = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.depth = torch.zeros(n, dtype=torch.long, device=dev)
        self.scores = torch.zeros(n, dtype=torch.float64, device=dev)
        self.real = torch.ones(n, dtype=torch.bool, device=dev)  # False: padding (the pools ran out)
        self.own = torch.ones(1, 1, dtype=torch.bool, device=dev)

    def score(
        self, n: int, token: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor, live: torch.Tensor
    ) -> None:
        """One Weaver forward of the m nodes ``n`` .. ``n + m - 1`` (tokens [m] at ``depth`` [m],
        ``ancestors`` [m, N] bool: none of them an ancestor of another): their ranked children and
        first-child candidate entries (valid when ``live`` [m] and the node is above the last depth)."""
        m = token.shape[0]
        d = depth.clamp(max=self.max_depth - 1)
        x = self.base.index_select(0, d) + self.w.token_proj(self.embedding.index_select(0, token))
        own = torch.eye(m, dtype=torch.bool, device=x.device)
        mask = torch.cat([ancestors, own], dim=1)[None]  # the cached ancestors, then each node itself
        u, (k, v) = self.w(x[None], mask, (self.cache[0], self.cache[1]))
        self.cache[0, :, :, n : n + m].copy_(k)
        self.cache[1, :, :, n : n + m].copy_(v)
        pool_logits, pool_emb = self.pool_logits.index_select(0, d), self.pool_emb.index_select(0, d)
        log_q = self.w.pool_log_probs(u[0], pool_logits, pool_emb)
        top_q, top_rank = torch.topk(log_q, self.keep, dim=-1)
        self.child_lq[n : n + m].copy_(top_q)
        self.child_tok[n : n + m].copy_(self.pool_ids.index_select(0, d).gather(1, top_rank))
        self.key[n : n + m].copy_(self.scores[n : n + m] + self.child_lq[n : n + m, 0])
        self.valid[n : n + m].copy_(live & (depth < self.max_depth))

    def pop(self, n: int, push: int) -> tuple[torch.Tensor, ...]:
        """Take the best candidate as node ``n`` (padding when none is left) and push its parent's next
        rank with push order ``push``. Returns the node's token, depth, ancestors (a [1, N] mask) and
        whether it is real. A padding node's fields are whatever the exhausted table gives (it is never
        a valid parent); ``run`` overwrites its token, parent and score."""
        keep = self.keep
        masked = self.key.masked_fill(~self.valid, float("-inf"))
        hits = self.valid & (masked == masked.max())
        live = hits.any(0, keepdim=True)  # [1]: False once the pools are exhausted
        p = torch.where(hits, self.order, 1 << 62).argmin(0, keepdim=True)  # the first pushed of the best
        r = self.rank.index_select(0, p)
        token = self.child_tok.view(-1).index_select(0, p * keep + r)
        depth = self.depth.index_select(0, p) + 1
        self.real[n : n + 1].copy_(live)
        self.tokens[n : n + 1].copy_(token)
        self.parents[n : n + 1].copy_(p)
        self.depth[n : n + 1].copy_(depth)
        self.scores[n : n + 1].copy_(self.key.index_select(0, p))
        ancestors = self.anc.index_select(0, p)  # [1, N]: the node's, itself excluded
        self.anc[n : n + 1].copy_(ancestors)
        self.anc[n, n : n + 1].fill_(True)
        nxt = r + 1
        lq = self.child_lq.view(-1).index_select(0, p * keep + nxt.clamp(max=keep - 1))
        self.key.index_copy_(0, p, self.scores.index_select(0, p) + lq)
        self.rank.index_copy_(0, p, nxt)
        self.order.index_fill_(0, p, push)
        self.valid.index_copy_(0, p, live & (nxt < keep))
        return token, depth, ancestors, live

    def run(self, root: torch.Tensor, budget: int, width: int) -> DeviceGrowth:
        """:func:`grow`'s steps: the step from slot ``first`` pushes parents' next ranks with orders
        ``2 first - 1 + j`` and its nodes' first children with ``2 first - 1 + width + j`` (slot j of
        the step), after every push of earlier steps and in the host's order."""
        self.tokens[:1].copy_(root)
        self.anc[0, :1].fill_(True)
        live = torch.ones(1, dtype=torch.bool, device=root.device)
        self.score(0, root, self.depth[:1], torch.zeros_like(self.anc[:1]), live)
        for first in range(1, budget + 1, width):
            popped = [self.pop(first + j, 2 * first - 1 + j) for j in range(min(width, budget + 1 - first))]
            if first + width <= budget:  # the last step's nodes get no children
                token, depth, ancestors, live = (torch.cat(t) for t in zip(*popped))
                self.score(first, token, depth, ancestors, live)
                m = len(popped)
                self.order[first : first + m].copy_(
                    torch.arange(m, device=root.device) + 2 * first - 1 + width
                )
        real = self.real
        return DeviceGrowth(
            torch.where(real, self.tokens, 0),
            torch.where(real, self.parents, -1),
            torch.where(real, self.scores, float("-inf")),
        )


@torch.no_grad()
def grow_on_device(
    weaver: WeaverModel,
    embedding: torch.Tensor,
    budget: int,
    root: torch.Tensor,
    rows: torch.Tensor,
    pool_logits: torch.Tensor,
    pool_ids: torch.Tensor,
    feature: torch.Tensor,
    width: int = 1,
) -> DeviceGrowth:
    """:func:`grow`'s tree (Weaver steps of ``width`` nodes) with fixed shapes and no host read (module
    docstring); ``root`` is a [1] long tensor on the device. Capture-safe: one CUDA graph can hold the
    whole growth."""
    grower = _DeviceGrower(weaver, embedding, budget, rows, pool_logits, pool_ids, feature)
    return grower.run(root, budget, width)
