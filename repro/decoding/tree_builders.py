"""Tree builders: turn a drafter's proposal into the tree the target verifies.

Every tree is rooted at node 0, the pending token; draft nodes hang below it. Builders that read
per-depth marginals (``Chain``, ``Backbone``, ``BestFirst``) record each node's proposal (its
children's depth marginal, shared by the nodes of one depth) in ``Tree.proposals``. With
``sample=True`` they draw the tokens from the marginals instead of taking the top ones, keeping
the tree's shape a function of the marginals alone: the exactness of the sampling acceptance
rules needs children drawn from the recorded proposal whatever happens elsewhere in the tree
(docs/metrics.md). Sampling needs marginals that do not depend on earlier draft tokens (DFlash's).

``build_device`` is the greedy graphed engine's entry: the same tree, built where the drafter's
proposal lives without reading the device on the host (a :class:`~repro.tree.DeviceTree`), or a host
:class:`~repro.tree.Tree` where the proposal is on the host anyway (synthetic drafters, AR's one node).
"""

from __future__ import annotations

import functools
import heapq
import importlib.util
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from repro.drafters.base import Proposal
from repro.errors import ConfigError
from repro.models.graphs import EagerCall, tensor_address
from repro.tree import MAX_TREE_NODES, DeviceTree, Sparse, Tree

Rng = np.random.Generator | None


class TreeBuilder(Protocol):
    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree: ...

    def build_device(self, root_token: int | torch.Tensor, proposal: Proposal | None) -> Tree | DeviceTree:
        """The greedy (non-sampling) tree of :meth:`build` without a host read of the device; the root may
        be a [1] device tensor (a pipelined step's bonus) where the tree is built on the device."""
        ...


def _host_root(root_token: int | torch.Tensor) -> int:
    """The root token on the host: a device root (a pipelined step's bonus) is for device trees only."""
    if isinstance(root_token, torch.Tensor):
        raise ValueError("a host tree needs the root token on the host, not a device tensor")
    return root_token


def _device_root(root_token: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The pending token as a [1] int64 tensor on ``device`` (a [1] device tensor, e.g. a pipelined step's
    bonus, as it is)."""
    if isinstance(root_token, torch.Tensor):
        return root_token.long()
    return torch.full((1,), root_token, dtype=torch.long, device=device)


def _root_and(root_token: int | torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> DeviceTree:
    """A device tree: the root (the pending token, parent -1; an int, or a [1] tensor on the device)
    followed by ``tokens``/``parents``."""
    root = _device_root(root_token, tokens.device)
    minus = torch.full((1,), -1, dtype=torch.long, device=tokens.device)
    return DeviceTree(torch.cat([root, tokens.long()]), torch.cat([minus, parents.long()]))


def depth_marginals(proposal: Proposal | None) -> list[Sparse]:
    """Per depth (depth 1 first), the drafter's marginal as a sparse (ids, probs) float64 pair."""
    if proposal is None or proposal.probs is None:
        return []
    rows = proposal.probs.detach().to("cpu", torch.float64)
    ids = torch.arange(rows.shape[-1])
    return [(ids, row) for row in rows]


def draw_rows_without_replacement(
    probs: list[torch.Tensor], counts: list[int], rng: np.random.Generator
) -> list[list[int]]:
    """``counts[i]`` distinct tokens drawn one after another from the CPU float64 row ``probs[i]`` (earlier
    ones removed; fewer if the support is smaller), in draw order, for rows of one length, independently:
    Gumbel top-m (the same law as successive sampling), one Gumbel draw [n, V], one partial sort."""
    with np.errstate(divide="ignore"):
        logp = np.log(np.stack([p.numpy() for p in probs]))
    n, vocab = logp.shape
    keys = logp + rng.gumbel(size=(n, vocab))
    m = max(counts)
    if m < vocab:
        top = np.argpartition(-keys, m - 1, axis=1)[:, :m]
        ranked = np.take_along_axis(
            top, np.argsort(-np.take_along_axis(keys, top, 1), axis=1, kind="stable"), 1
        )
    else:
        ranked = np.argsort(-keys, axis=1, kind="stable")
    support = np.isfinite(logp).sum(1)
    return [ranked[i, : min(c, int(support[i]))].tolist() for i, c in enumerate(counts)]


def _need_rng(rng: Rng) -> np.random.Generator:
    if rng is None:
        raise ValueError("a sampling tree builder needs the step's random generator")
    return rng


def _need_marginals(proposal: Proposal) -> list[Sparse]:
    marg = depth_marginals(proposal)
    if len(marg) < proposal.depth:
        raise ConfigError("sampled draft trees need the drafter's per-depth marginals (proposal.probs)")
    return marg


class SingleNode:
    """Autoregressive decoding: the pending token alone."""

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        return Tree.single(root_token)

    def build_device(self, root_token: int, proposal: Proposal | None) -> Tree:
        return _single(root_token)  # the graphed target's decode step takes the host token


@functools.lru_cache(maxsize=4096)
def _single(token: int) -> Tree:
    """``Tree.single(token)``, made once per token (its validation costs more host time than a
    graphed AR step can spare; trees are not modified after they are made)."""
    return Tree.single(token)


class Chain:
    """The first choice at every depth, as a chain below the root; ``sample``: one token drawn
    from each depth's marginal."""

    def __init__(self, sample: bool = False) -> None:
        self.sample = sample

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        if proposal is None or proposal.depth == 0:
            return Tree.single(root_token)
        if not self.sample:
            marg = depth_marginals(proposal)
            tokens = [root_token] + [c[0] for c in proposal.candidates]
            return Tree.chain(tokens, (tuple(marg) + (None,)) if marg else None)
        marg = _need_marginals(proposal)
        gen = _need_rng(rng)
        tokens = [root_token] + [
            row[0] for row in draw_rows_without_replacement([q for _, q in marg], [1] * len(marg), gen)
        ]
        return Tree.chain(tokens, tuple(marg) + (None,), "iid")

    def build_device(self, root_token: int | torch.Tensor, proposal: Proposal | None) -> Tree | DeviceTree:
        """The first choices straight from ``proposal.top_ids`` (device); a host tree otherwise."""
        if self.sample or proposal is None or proposal.top_ids is None or proposal.depth == 0:
            return self.build(_host_root(root_token), proposal)
        return self.device_tree(_device_root(root_token, proposal.top_ids.device), None, proposal.top_ids)

    def device_tree(
        self, root: torch.Tensor, probs: torch.Tensor | None, top_ids: torch.Tensor
    ) -> DeviceTree:
        """The chain of the first choices ``top_ids[:, 0]`` below a [1] device ``root`` (``probs`` unused;
        the parents made once a length): :meth:`build_device`'s tree, and what a drafter runs inside its
        own step graph (``engine.FUSE_TREE``)."""
        first = top_ids[:, 0].long()
        parents = _chain_parents(first.numel() + 1, first.device)
        return DeviceTree(torch.cat([root.long(), first]), parents, constant_parents=True)


@functools.lru_cache(maxsize=64)
def _chain_parents(nodes: int, device: torch.device) -> torch.Tensor:
    """A chain's parents on ``device`` (-1, 0, ..., nodes - 2), made once per length and never written
    (``DeviceTree.constant_parents``): a pipelined chain step then launches its tokens' concatenation and
    their copy into the verify slot from the host, and no parents (a slot keeps the last ones it took)."""
    return torch.arange(-1, nodes - 1, device=device)


class DrafterTree:
    """The tree the drafter grew itself (``proposal.tree``); its root must be the pending token."""

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        if proposal is None or proposal.tree is None:
            return Tree.single(root_token)
        tree = proposal.tree
        if isinstance(tree, DeviceTree):
            tree = tree.to_tree()
        if int(tree.tokens[0]) != root_token or int(tree.parents[0]) != -1:
            raise ValueError("the drafter's tree must be rooted at the pending token (node 0)")
        return tree

    def build_device(self, root_token: int | torch.Tensor, proposal: Proposal | None) -> Tree | DeviceTree:
        """The drafter's tree as it is (a device tree's root is not checked: that would read it)."""
        if proposal is not None and isinstance(proposal.tree, DeviceTree):
            return proposal.tree
        root = _host_root(root_token)
        if proposal is None or proposal.tree is None:
            return Tree.single(root)
        return self.build(root, proposal)


class Backbone:
    """Siblings at every depth under the first choice of the depth above (a 'caterpillar').

    At depth d the top-``width`` candidates become children of the previous depth's first
    choice, so a hit on a later sibling ends the walk one level deeper. ``sample``: the ``width``
    siblings of depth d are drawn without replacement from depth d's marginal instead.
    """

    def __init__(self, width: int, sample: bool = False) -> None:
        if width < 1:
            raise ConfigError(f"tree width must be >= 1, got {width}")
        self.width, self.sample = width, sample

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        levels = proposal.candidates if proposal else []
        marg = _need_marginals(proposal) if self.sample and proposal else depth_marginals(proposal)
        if self.sample and proposal and levels:
            rows = [q for _, q in marg[: len(levels)]]
            levels = draw_rows_without_replacement(rows, [self.width] * len(rows), _need_rng(rng))
        tokens, parents = [root_token], [-1]
        props: list[Sparse | None] = [marg[0] if marg else None]
        spine = 0
        for d, level in enumerate(levels):
            first = len(tokens)
            for tok in level[: self.width]:
                tokens.append(tok)
                parents.append(spine)
                props.append(None)
            if first < len(tokens) and d + 1 < len(marg) and d + 1 < len(levels):
                props[first] = marg[d + 1]
            spine = first
        draw = "without_replacement" if self.sample and proposal else "given"
        return Tree(tokens, parents, tuple(props) if marg else None, draw)

    def build_device(self, root_token: int, proposal: Proposal | None) -> Tree:
        return self.build(root_token, proposal)  # synthetic drafters' candidates are on the host


class BestFirst:
    """DDTree: the ``budget`` most probable draft nodes under the drafter's per-depth marginals.

    A node's score is the summed log-probability of its path, each depth's marginal
    (``proposal.probs[d]``) taken independently; only the top-``budget`` tokens of each depth
    can appear. A max-heap starts with the best token at depth 1; each pop adds that node, then
    pushes its next sibling (next rank, same parent) and its first child (rank 0, next depth).
    ``budget`` counts draft nodes, not the root: the tree has at most ``budget + 1`` nodes (fewer
    only when the top-k tokens of every depth run out). Nodes come out in pop order, so parents
    precede children, siblings are in decreasing probability and scores never increase with the
    node index. Exact score ties pop by (depth, parent's rank among the nodes of its depth, rank):
    the order of :func:`best_first_device` and :func:`best_first_triton`, which build the same tree on
    the device (:meth:`build_device`: on CUDA one graph per marginals shape of the Triton kernel where
    Triton is installed, else of the torch ops; probabilities above 1 count as 1, so a child never
    outscores its parent).

    ``sample``: the shape stays the best-first tree's (a function of the marginals alone) over the tokens
    of positive probability only (a node never has more children than its depth's marginal has tokens to
    draw: the greedy tree may hold zero-probability tokens, their log-probabilities clamped to ``tiny``),
    so it may be smaller than ``budget + 1``; each node's children are then drawn without replacement
    from their depth's marginal, afresh per parent, in child order.
    """

    def __init__(self, budget: int, sample: bool = False) -> None:
        if not 1 <= budget < MAX_TREE_NODES:
            raise ConfigError(f"tree budget must lie in [1, {MAX_TREE_NODES - 1}] draft nodes, got {budget}")
        self.budget, self.sample = budget, sample
        self._graphs: dict[tuple, GraphedBestFirst] = {}  # CUDA: per marginals buffer or shape (graph_for)
        self.device_build: DeviceBuilder | None = None  # CUDA graphs' builder (None: device_builder's)

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        tree = self.shape(root_token, proposal)
        if not self.sample or tree.size == 1:
            return tree
        return self.draw(tree, _need_rng(rng))

    def shape(self, root_token: int, proposal: Proposal | None) -> Tree:
        """The greedy best-first tree, each inner node's proposal its children's depth marginal: what
        :meth:`build` returns without ``sample``, and with it the shape it samples into (no randomness),
        built over each depth's positive-probability tokens only (the class docstring)."""
        tree = self._top(root_token, proposal, positive=self.sample)
        if tree.size == 1:
            return tree
        marg = depth_marginals(proposal)
        depth = tree.depth.tolist()  # the root is depth 1
        props = tuple(marg[depth[i] - 1] if tree.children_of(i) else None for i in range(tree.size))
        return Tree(tree.tokens, tree.parents, props)

    @staticmethod
    def draw(shape: Tree, rng: np.random.Generator) -> Tree:
        """``shape`` with every inner node's children drawn without replacement from its proposal,
        afresh per parent (in node order), in child order: :meth:`build`'s sampled tree."""
        assert shape.proposals is not None
        inner = [i for i in range(shape.size) if shape.children_of(i)]
        pairs = [shape.proposals[i] for i in inner]
        counts = [len(shape.children_of(i)) for i in inner]
        drawn = draw_rows_without_replacement([p[1] for p in pairs], counts, rng)
        vocab = {id(ids): ids.numpy() for ids, _ in pairs}  # the token ids (depths share one tensor)
        tokens = shape.tokens.numpy().copy()
        for i, (ids, _), picks, count in zip(inner, pairs, drawn, counts):
            if len(picks) != count:  # a support smaller than the children: duplicates, or no token at all
                raise ValueError(
                    f"node {i} has {count} children but its proposal only {len(picks)} tokens of positive "
                    "probability: the shape must come from BestFirst.shape with sample=True"
                )
            tokens[shape.children_of(i)] = vocab[id(ids)][picks]
        return Tree(torch.from_numpy(tokens), shape.parents, shape.proposals, "without_replacement")

    def build_device(self, root_token: int | torch.Tensor, proposal: Proposal | None) -> Tree | DeviceTree:
        """The tree of :meth:`build` (greedy) on the marginals' device, without a host read (on CUDA
        through the graphs of :meth:`graph_for`); ``root_token`` may be a [1] device tensor."""
        if self.sample or proposal is None or proposal.depth == 0:
            return self.build(_host_root(root_token), proposal)
        probs = _need_probs(proposal)
        if not probs.is_cuda:  # the graph's stand-in (HostLaunches does not count its ops)
            return EagerCall(lambda: best_first_device(root_token, probs, self.budget))()
        return self.graph_for(probs)(root_token, probs)

    def device_tree(self, root: torch.Tensor, probs: torch.Tensor, top_ids: torch.Tensor) -> DeviceTree:
        """The greedy tree of the marginals ``probs`` below a [1] device ``root``, by capture-safe ops (the
        device builder :meth:`graph_for`'s graphs run; ``top_ids`` unused): what a drafter runs inside its
        own step graph (``engine.FUSE_TREE``)."""
        return self._builder(probs.device)(root, probs, self.budget)

    def _builder(self, device: torch.device) -> DeviceBuilder:
        return self.device_build or device_builder(device)

    def graph_for(self, probs: torch.Tensor) -> GraphedBestFirst:
        """The graph that builds the tree of ``probs``, made on first use with :attr:`device_build`
        (default :func:`device_builder`'s): one per marginals buffer that reads it where it lies (a static
        drafter's step outputs, refreshed in place: no copy a step; one buffer per drafter graph), for
        the first :data:`ALIASED_GRAPHS` buffers; then one per marginals shape that copies them in."""
        aliased = ("alias", *tensor_address(probs))
        copying = ("copy", tuple(probs.shape), probs.dtype, probs.device)
        graphed = self._graphs.get(aliased) or self._graphs.get(copying)
        if graphed is None:
            alias = sum(key[0] == "alias" for key in self._graphs) < ALIASED_GRAPHS
            graphed = self._graphs[aliased if alias else copying] = GraphedBestFirst(
                probs, self.budget, self._builder(probs.device), alias
            )
        return graphed

    def _top(self, root_token: int, proposal: Proposal | None, positive: bool = False) -> Tree:
        """The heap's tree; ``positive``: over each depth's tokens of positive probability only (the top-k
        ranks below that depth's support), ending at the first depth without one."""
        if proposal is None or proposal.depth == 0:
            return Tree.single(root_token)
        probs = _need_probs(proposal)
        logp_t, ids_t = top_log_probs(probs, self.budget)
        depth, k = logp_t.shape
        logp, ids = logp_t.cpu().tolist(), ids_t.cpu().tolist()
        ranks = (probs > 0).sum(-1).clamp(max=k).cpu().tolist() if positive else [k] * depth
        if 0 in ranks:
            depth = ranks.index(0)
        if depth == 0:
            return Tree.single(root_token)
        tokens, parents = [root_token], [-1]
        seen = [0] * depth  # nodes popped per depth so far: the next one's rank within its depth
        pushes = 0
        # entries: (-score, depth index, parent's rank within its depth, rank, push order, parent node,
        # parent's score); the push order never decides (the first four differ between entries)
        heap: list[tuple[float, int, int, int, int, int, float]] = [(-logp[0][0], 0, 0, 0, 0, 0, 0.0)]
        while heap and len(tokens) <= self.budget:
            neg, d, up, r, _, parent, base = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(ids[d][r])
            parents.append(parent)
            mine, seen[d] = seen[d], seen[d] + 1
            if r + 1 < ranks[d]:
                pushes += 1
                entry = (-(base + logp[d][r + 1]), d, up, r + 1, pushes, parent, base)
                heapq.heappush(heap, entry)
            if d + 1 < depth:
                pushes += 1
                heapq.heappush(heap, (-(-neg + logp[d + 1][0]), d + 1, mine, 0, pushes, node, -neg))
        return Tree(tokens, parents)


def tree_in_drafter(builder: object, drafter: object) -> bool:
    """Whether a pipelined step can build ``builder``'s trees inside ``drafter``'s step graph
    (``propose_after``'s ``tree``, ``engine.FUSE_TREE``): a greedy chain or best-first tree (their
    ``device_tree``), and a drafter that takes one (DFlash on static buffers: ``builds_trees_after``)."""
    greedy = isinstance(builder, (Chain, BestFirst)) and not builder.sample
    return greedy and getattr(drafter, "builds_trees_after", False)


def _need_probs(proposal: Proposal) -> torch.Tensor:
    if proposal.probs is None:
        raise ConfigError("best-first (DDTree) trees need the drafter's marginals (proposal.probs)")
    return proposal.probs.detach()


def top_log_probs(probs: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per depth the top-min(budget, V) log-probabilities (float64, in (log tiny, 0]) and token ids,
    on the marginals' device: what both best-first builders read (on CUDA one top-k launch,
    :func:`~repro.models.topk_kernels.row_topk`)."""
    from repro.models.topk_kernels import row_topk

    return row_topk(probs, min(budget, probs.shape[-1]), log=True)


def best_first_size(depth: int, vocab: int, budget: int) -> int:
    """Nodes (root included) of the best-first tree: every path of the top-k tokens, at most budget."""
    k, total, level = min(budget, vocab), 0, 1
    for _ in range(depth):
        level = min(level * k, budget)
        total = min(total + level, budget)
    return 1 + total


DeviceBuilder = Callable[[int | torch.Tensor, torch.Tensor, int], DeviceTree]
ALIASED_GRAPHS = 8  # BestFirst's graphs that read a marginals buffer in place (one per static drafter graph)
# per GraphedBestFirst: graphs that read a device root in place (one per slot result). 0 (off): with the
# slots' kernel copy (static.KERNEL_TREE_COPY) it made no route faster (results/2026-12-04-h200-derive-rows
# /callCK)
ALIASED_ROOTS = 0


def triton_available() -> bool:
    """Whether Triton imports here (the best-first kernel's condition, beside a CUDA device)."""
    return importlib.util.find_spec("triton") is not None


def device_builder(device: torch.device) -> DeviceBuilder:
    """The best-first device builder for ``device``: the one-program Triton kernel
    (:func:`best_first_triton`) on CUDA where Triton is installed, else :func:`best_first_device`."""
    return best_first_triton if device.type == "cuda" and triton_available() else best_first_device


class GraphedBestFirst:
    """A best-first device builder (``build``, by default :func:`best_first_device`) as one CUDA graph for
    marginals of one shape: the marginals and the root are copied into static inputs, and the tree is
    the graph's output (valid until the next call).

    ``alias``: the graph reads ``probs`` itself where it lies (held here, so its memory stays that
    buffer) instead of a copy: it takes that very buffer only (:meth:`reads`), refreshed in place by its
    owner (a static drafter's output), and copies nothing a call.

    A device root (a pipelined step's bonus, in its slot's result) can be read where it lies too: one more
    graph per root buffer, for the first :data:`ALIASED_ROOTS` (default none); other roots are copied into
    the static one."""

    def __init__(
        self, probs: torch.Tensor, budget: int, build: DeviceBuilder | None = None, alias: bool = False
    ) -> None:
        from repro.models.graphs import GraphedCall

        self.build, self.budget = build or best_first_device, budget
        self.alias = alias
        self.probs = probs if alias else torch.zeros_like(probs)
        self.root = torch.zeros(1, dtype=torch.long, device=probs.device)
        self.call = GraphedCall(lambda: self.build(self.root, self.probs, budget), probs.device)
        self._rooted: dict[tuple, tuple[torch.Tensor, Any]] = {}  # root address -> (root, its graph)

    def _rooted_call(self, root: torch.Tensor) -> Any:
        """The graph that reads ``root`` where it lies (made on first use), or None past the limit."""
        from repro.models.graphs import GraphedCall, tensor_address

        key = tensor_address(root)
        held = self._rooted.get(key)
        if held is None:
            if len(self._rooted) >= ALIASED_ROOTS:
                return None
            call = GraphedCall(lambda: self.build(root, self.probs, self.budget), root.device)
            held = self._rooted[key] = (root, call)  # the root held: its memory stays that buffer
        return held[1]

    def reads(self, probs: torch.Tensor) -> bool:
        """Whether ``probs`` is the very buffer this aliasing graph reads (same memory, shape, strides)."""
        mine = self.probs
        return (
            self.alias
            and probs.data_ptr() == mine.data_ptr()
            and probs.shape == mine.shape
            and probs.stride() == mine.stride()
            and probs.dtype == mine.dtype
        )

    def __call__(self, root_token: int | torch.Tensor, probs: torch.Tensor) -> DeviceTree:
        if not self.alias:
            self.probs.copy_(probs)
        elif not self.reads(probs):
            raise ValueError(
                "an aliasing best-first graph takes only the marginals buffer it was captured on"
            )
        if isinstance(root_token, torch.Tensor):  # on the device (a pipelined step's bonus)
            aliased = ALIASED_ROOTS and root_token.dtype == torch.long  # off: no lookup on the hot path
            rooted = self._rooted_call(root_token) if aliased else None
            if rooted is not None:
                return rooted()
            self.root.copy_(root_token)
        else:
            self.root.fill_(root_token)
        return self.call()


def best_first_device(root_token: int | torch.Tensor, probs: torch.Tensor, budget: int) -> DeviceTree:
    """:class:`BestFirst`'s tree built with fixed-shape ops on ``probs``' device (no host read).

    Per depth d the frontier is the best min(budget, k^d) nodes of depth d, ordered by (score, parent's
    position in the frontier above, rank), from one stable sort of the frontier-above x k extensions
    (a node outside it has ``budget`` better nodes of its depth, so it and its subtree never make the
    tree). Then one stable sort of every depth's frontier, depth-major, ranks all nodes by (score,
    depth, position in the frontier): the first ``budget`` are the tree, in that order, which is the
    heap's pop order of :meth:`BestFirst._top` (ties included) and topological (a parent scores at least
    its child and lies at a smaller depth). Scores are the same float64 sums as the heap's.
    """
    logp, ids = top_log_probs(probs, budget)
    depth, k = logp.shape
    n = best_first_size(depth, probs.shape[-1], budget) - 1
    width = min(budget, k**depth)
    frontier = logp.new_zeros(1)  # the root's score
    scores, uppers, tokens = [], [], []
    for d in range(depth):
        cand = (frontier[:, None] + logp[d][None, :]).reshape(-1)  # index: parent position * k + rank
        size = min(budget, cand.numel())
        frontier, order = torch.sort(cand, descending=True, stable=True)
        frontier, order = frontier[:size], order[:size]
        pad = width - size
        scores.append(torch.nn.functional.pad(frontier, (0, pad), value=-torch.inf))
        uppers.append(torch.nn.functional.pad(order // k, (0, pad)))
        tokens.append(torch.nn.functional.pad(ids[d][order % k], (0, pad)))
    _, chosen = torch.sort(torch.cat(scores), descending=True, stable=True)
    chosen = chosen[:n]  # flat index: depth * width + position in the frontier
    node = torch.zeros(depth * width, dtype=torch.long, device=probs.device)
    node.scatter_(0, chosen, torch.arange(1, n + 1, device=probs.device))
    level = torch.arange(depth * width, device=probs.device) // width
    upper = torch.cat(uppers) + (level - 1).clamp(min=0) * width  # the parent's flat index
    parent = torch.where(level == 0, 0, node.index_select(0, upper))
    return _root_and(root_token, torch.cat(tokens).index_select(0, chosen), parent.index_select(0, chosen))


def best_first_triton(
    root_token: int | torch.Tensor,
    probs: torch.Tensor,
    budget: int,
    *,
    fused: bool = True,
    num_warps: int | None = None,
) -> DeviceTree:
    """:func:`best_first_device`'s tree (node for node) from one Triton program that runs the heap of
    :meth:`BestFirst._top` on the device (:mod:`repro.decoding.best_first_kernel`, whose ``launch``
    takes ``fused`` and ``num_warps``): the top-k and the float64 log-probabilities of
    :func:`top_log_probs`, then one launch; no host read. CUDA, or CPU tensors under Triton's
    interpreter (TRITON_INTERPRET=1)."""
    from repro.decoding.best_first_kernel import launch

    logp, ids = top_log_probs(probs, budget)
    n = best_first_size(logp.shape[0], probs.shape[-1], budget) - 1
    if isinstance(root_token, torch.Tensor):
        root = root_token.long().reshape(1)
    else:
        root = torch.full((1,), root_token, dtype=torch.long, device=probs.device)
    return DeviceTree(*launch(root, logp, ids, n, num_warps, fused))
