"""EAGLE drafting on static device buffers, grown on the device, one CUDA graph per proposal.

:class:`StaticEagleDrafter` gives :class:`~repro.drafters.eagle.EagleDrafter`'s proposals (the
eager drafter is the reference it is pinned to) without reading the device on the host:

- Buffers (doubled when the context outgrows them; the graph is captured again): the target
  features of committed tokens [C, F] and, per draft layer, keys/values [1, KV, C + Ds, D] whose
  first C rows are the committed rows' (row t at index t) and last Ds rows the drafted rows of one
  proposal (level by level, fixed slots).
- ``propose``: the accepted path's features are gathered into the buffer (host-known positions;
  the path's node indices go up by a non-blocking copy), one more small non-blocking copy sets the
  step's inputs (first row to compute, committed count, pending token, row tokens), and one call
  runs the rest: the last ``R`` committed rows (a fixed
  block; rows past the committed count are computed, never read: they sit at positions no
  committed row's causal mask and no drafted row's context mask reaches, and are overwritten when
  those positions are committed), then one drafter forward per level with fixed shapes. On CUDA
  the call is a :class:`~repro.models.graphs.GraphedCall` (captured on first use; the call is
  idempotent, so the capture's warm-up leaves nothing behind); eagerly elsewhere, same code.
- Chain mode: ``Proposal(top_ids [k, width], probs [k, V])`` on the device.
- Dynamic tree: every level expands all ``topk`` frontier rows into their ``topk`` children (a
  child is valid when its parent is and its drafter probability is ``>= tau`` and ``> 0``;
  invalid ones score -inf); the next frontier is the level's ``topk`` best children by (-score,
  creation order); after ``depth`` levels the ``budget`` best valid nodes (creation order on ties,
  so ancestors first) in creation order form the tree. EagleDrafter's early stops never change its
  tree (no node created after them can enter the best ``budget``: scores never rise along a path,
  and later nodes lose ties), so growing every level gives the same nodes, parents and order.

**Padding.** The tree has a host-known size, ``min(budget, candidates) + 1`` (the candidates being
``K + (depth - 1) * topk * K`` with ``K = min(topk, vocab)``), whatever tau and the scores leave:
after the real nodes come padding nodes (parent -1, token 0, i.e. root-level siblings of the
pending token). Greedy acceptance walks node 0's subtree only, so they never change what is
accepted; they are verified (as the graphed engine's slot padding is), and a record's tree size
is this fixed size, not the real node count (:func:`real_nodes` recovers the eager tree).

**Fast path** (``fast``; default: with CUDA graphs in half precision, as the graphed target's GEMV
decode): the drafter forwards and distributions inside the call run on the Triton linear kernels of the
static decoder, the glue fused in (:class:`~repro.drafters.eagle_fast.FastEagle`: a tree level's forward
65 -> 19 launches, a chain proposal of k = 6 451 -> 135); the prompt's rows stay on the eager model. The
eager path is the reference it is pinned to (tests/drafters/test_eagle_fast.py). The step's mask and level
positions are made once per call; the slots, a chain's ancestor masks, a tree level's own-slot masks and
the root frontier once per buffer size, on both paths (a tree proposal: 629 -> 576 launches eager).

**Tree glue** (:class:`TreeGrowth`): the levels write their candidates' tokens, parents and float64 scores
into buffers indexed by creation order (no cats), a pruned child's probability becomes 0 (its log -inf) so
one comparison and one ``where`` replace the validity masks (an invalid parent's -inf carries to its
children), the root's children need no sort (topk's order), the parents of all levels are one gather of
the frontier sorts after the last level, the level masks are gathered whole (level 1's: one cat), and the
final selection is two sorts, a scatter and four gathers (a level: 11 launches, the first 6, the last 5).
The same tokens, parents, order and scores as the legacy glue (``legacy_glue=True``, kept for the A/B), bit
for bit (tests/drafters/test_eagle_tree_glue.py). Launches (aten ops that launch work + Triton launches) of a
SpecLA proposal at the tiny family's layout (budget 32, topk 4, depth 6): the glue 157 -> 67, the call
576 -> 486 eager, 289 -> 199 fast with the eager attention glue, 133 with the one-launch attention
(:mod:`repro.drafters.eagle_attention`, the fast path's default on CUDA), 80 with each level in one launch
of glue (:mod:`repro.drafters.frontier_kernels`: scores, the frontier's sort, the next rows'
tokens, masks and predictions) and the deep parents and the final selection in one (the fast path; in the
interpreter its trees equal the eager drafter's, tests/drafters/test_eagle_fast.py).

Proposal tensors are the call's outputs: valid until the next ``propose`` (graph replays rewrite
them in place). The first proposal of a prompt brings the prompt's rows in with one eager forward
(exact shape, outside the graph); capture and buffer growth synchronise once; every other
``propose`` makes no host sync.
"""

from __future__ import annotations

from typing import Any

import torch

from repro.drafters.base import DraftContext, Proposal
from repro.drafters.eagle import DynamicTree, EagleDrafter, EagleDraftModel, _greedy_path
from repro.drafters.eagle_fast import FastEagle
from repro.drafters.fast_rules import check_fast_device
from repro.drafters.features import ingest_start
from repro.errors import ConfigError
from repro.models.graphed import GraphedTarget, LaunchedStep
from repro.models.graphs import EagerCall, HostUploads, tensor_address
from repro.models.hybrid import HybridLM, Verification
from repro.models.topk_kernels import row_topk
from repro.tree import DeviceTree, Tree

DEFAULT_CAPACITY = 256  # committed positions the buffers hold before they first double


def real_nodes(tree: Tree) -> Tree:
    """``tree`` without the padding after its real nodes (root-level nodes other than node 0)."""
    n = 1 + int((tree.parents[1:] >= 0).sum())
    return Tree(tree.tokens[:n], tree.parents[:n])


def tree_proposal(tree: DeviceTree, scores: torch.Tensor) -> Proposal:
    """A proposal whose tree was grown on the device; its ``candidates`` (the greedy path per depth, as
    EagleDrafter's) are read from the tree and the kept nodes' ``scores`` ([size - 1] cumulative
    log-probabilities of the non-root nodes) on first use (a sync)."""

    def read() -> list[list[int]]:
        host = real_nodes(tree.to_tree())
        return _greedy_path(host, scores[: host.size - 1].tolist())

    return Proposal(tree=tree, read=read)


class StaticEagleDrafter(EagleDrafter):
    """EagleDrafter on static buffers: see the module docstring. ``graphs``: capture the proposal's
    call as a CUDA graph (default: on CUDA); ``capacity``: committed positions held at first; ``fast``:
    the call's forwards on :class:`~repro.drafters.eagle_fast.FastEagle` (default: with graphs in half
    precision; needs CUDA or Triton's interpreter).

    It keeps EagleDrafter's settings, checks, ``observe_prefill`` and distributions (``_probs``) and
    replaces its state (``begin``, ``_ingest``), its prompt rows (``_prompt_rows``) and ``propose``."""

    def __init__(
        self,
        model: EagleDraftModel,
        target: HybridLM | GraphedTarget,
        k: int = 4,
        width: int = 1,
        tree: DynamicTree | None = None,
        capacity: int = DEFAULT_CAPACITY,
        graphs: bool | None = None,
        fast: bool | None = None,
        legacy_glue: bool = False,
    ) -> None:
        self.legacy_glue = legacy_glue  # the tree's glue as it was (the A/B of scripts/gpu/eagle-fast.py)
        self.graphs = target.device.type == "cuda" if graphs is None else graphs
        if self.graphs and target.device.type != "cuda":
            raise ConfigError("CUDA graphs need a CUDA device (the static EAGLE drafter is eager elsewhere)")
        half = target.dtype in (torch.bfloat16, torch.float16)
        self.fast = self.graphs and half if fast is None else fast
        check_fast_device(self.fast, target.device, "the static EAGLE drafter")
        self.capacity = max(1, capacity)
        self._buffers_for = -1  # the capacity the buffers were made for
        self._fast: FastEagle | None = None
        super().__init__(model, target, k, width, tree)  # calls begin
        if self.fast:
            self._fast = FastEagle(self.model, target, self.capacity + self.block)

    # ------------------------------------------------------------------ shapes and buffers

    @property
    def block(self) -> int:
        """Committed rows the graphed call computes: the longest accepted path (root included)."""
        return (self.k if self.tree is None else self.tree.depth) + 1

    @property
    def level_rows(self) -> int:
        """Drafted rows per level: 1 (chain) or the frontier (``topk``)."""
        return 1 if self.tree is None else self.tree.topk

    @property
    def draft_slots(self) -> int:
        levels = self.k - 1 if self.tree is None else self.tree.depth - 1
        return levels * self.level_rows

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        self.count = 0  # committed positions whose features are in the buffer
        self.rows = 0  # committed drafter rows whose keys/values are in the buffers
        self._prompt = list(prompt_ids)
        self._pending = -1  # the token the last committed row read
        self._last: Verification | None = None
        self._unsettled = 0  # propose_after calls whose path length settle has not given yet
        if self._buffers_for != self.capacity:
            self._allocate(self.capacity)

    def _allocate(self, capacity: int) -> None:
        """Buffers for ``capacity`` committed positions, keeping what the old ones hold."""
        m, cfg = self.model, self.model.config
        dev, dtype = m.device, m.dtype
        features = torch.zeros(capacity, cfg.feature_size, dtype=dtype, device=dev)
        size = (1, cfg.num_key_value_heads, capacity + self.draft_slots, cfg.head_dim)
        kv = [
            (torch.zeros(size, dtype=dtype, device=dev), torch.zeros(size, dtype=dtype, device=dev))
            for _ in range(cfg.num_hidden_layers)
        ]
        old_committed = None
        if self._buffers_for > 0:
            old, old_committed = self._buffers_for, self._committed
            features[:old].copy_(self.features)
            for (k, v), (ok, ov) in zip(kv, self.kv):
                k[:, :, :old].copy_(ok[:, :, :old])
                v[:, :, :old].copy_(ov[:, :, :old])
        self.features, self.kv = features, kv
        self.inputs = torch.zeros(3 + self.block, dtype=torch.long, device=dev)  # r, c, root, row tokens
        levels = self.draft_slots // self.level_rows
        self._cols = torch.arange(capacity, device=dev)  # constants of the device call
        self._level_index = torch.arange(levels, device=dev)
        self._slots = capacity + torch.arange(self.draft_slots, device=dev).view(levels, self.level_rows)
        # a chain's level d row sees the drafted rows above it and itself: draft slots < d
        self._chain_ancestors = torch.arange(self.draft_slots, device=dev) < self._level_index[:, None] + 1
        # a tree level's rows: each its own slot; the root frontier (score, valid, node -1, no ancestors)
        own = torch.eye(self.draft_slots, dtype=torch.bool, device=dev)
        self._own = own.view(levels, self.level_rows, self.draft_slots)
        self._tree_start = (
            torch.zeros(1, dtype=torch.float64, device=dev), torch.ones(1, dtype=torch.bool, device=dev),
            torch.full((1,), -1, dtype=torch.long, device=dev),
            torch.zeros(1, self.draft_slots, dtype=torch.bool, device=dev),
        )  # fmt: skip
        if self.tree is not None:
            self._growth = TreeGrowth(self.tree, cfg.vocab_size, _prob_dtype(dtype), capacity, levels, dev)
        self._uploads = HostUploads(dev)
        self.capacity = self._buffers_for = capacity
        self._call: Any = None
        self._calls_after: dict[tuple[Any, ...], Any] = {}  # propose_after's graphs, per launched result
        # the committed count on the device (every call writes its c): where propose_after's step starts;
        # buffers that grow keep the old one's (paths ingested on the device may not be settled yet)
        self._committed = torch.full((1,), self.count, dtype=torch.long, device=dev)
        if old_committed is not None:
            self._committed.copy_(old_committed)
        self._block_index = torch.arange(self.block, device=dev)
        if self._fast is not None:
            self._fast.set_rope_rows(capacity + self.block)

    def _ensure(self, need: int) -> None:
        """Double the buffers until ``need`` committed positions fit."""
        capacity = self.capacity
        while capacity < need:
            capacity *= 2
        if capacity != self._buffers_for:
            self._allocate(capacity)

    # ------------------------------------------------------------------------- host side

    def _ingest(self, ver: Verification, path: list[int]) -> None:
        """Write the accepted ``path``'s features at positions ver.position + i (FeatureCache's rules)."""
        if ver is self._last or not path:
            return
        start = ingest_start("EAGLE", self.capture_layers, ver, self.count)
        end = start + len(path)
        self._ensure(end + self.block)
        idx = self._uploads.put(path)
        new = torch.cat([ver.hidden[i].index_select(0, idx) for i in self.capture_layers], dim=-1)
        self.features[start:end].copy_(new)
        self.count, self._last = end, ver
        self.rows = min(self.rows, start)  # rows from `start` on read replaced features

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.verification is not None:
            self._ingest(ctx.verification, list(ctx.accepted_path))
        tokens = list(ctx.prompt_ids) + list(ctx.output_ids)
        c = len(tokens) - 1
        if self.count != c:
            raise ConfigError(f"EAGLE drafter holds hidden states of {self.count} tokens, {c} are committed")
        if self.rows == c and tokens[c] != self._pending:
            self.rows = c - 1  # the last row read another pending token
        self._ensure(c + self.block)
        r = self._catch_up(tokens, c)
        ids = tokens[r + 1 : c + 1]
        self._uploads.put([r, c, tokens[c]] + ids + [0] * (self.block - len(ids)), self.inputs)
        out = self._run()
        self.rows, self._pending = c, tokens[c]
        if self.tree is None:
            top_ids, probs = out
            return Proposal(probs=probs, top_ids=top_ids)
        tree_tokens, tree_parents, scores = out
        return tree_proposal(DeviceTree(tree_tokens, tree_parents), scores)

    def _catch_up(self, tokens: list[int], c: int) -> int:
        """The rows the device call leaves out, computed eagerly in one forward of exact shape: those
        before c - block when more than a block of the c committed rows are missing (the prompt's,
        or replaced ones). Returns the first row the device call computes (at least the last row:
        recomputed when cached, the same result)."""
        r = min(self.rows, c - 1)
        if c - r > self.block:
            stop = c - self.block
            self._context_rows(self._uploads.put(tokens[r + 1 : stop + 1]), self._uploads.put([r]), False)
            self.rows = r = stop
        return r

    @torch.no_grad()
    def _prompt_rows(self) -> None:
        """Once every prompt feature is cached: :meth:`_catch_up` over the prompt (the rows the first
        step's device call does not compute)."""
        if self.count == len(self._prompt):
            self._catch_up(self._prompt, self.count)

    def _run(self) -> Any:
        if not self.graphs:
            return EagerCall(self._step)()
        if self._call is None:
            from repro.models.graphs import GraphedCall

            self._call = GraphedCall(self._step, self.model.device)
        return self._call()

    # ------------------------------------------------------------ after a launched step

    def pipelines(self) -> bool:
        """Whether :meth:`propose_after` can run: the drafter serves a graphed target."""
        return isinstance(self.target, GraphedTarget)

    @torch.no_grad()
    def propose_after(self, step: LaunchedStep) -> Proposal:
        """:meth:`propose` after a launched, unread ``step`` (the engine's pipelined loop): its accepted
        path's features are gathered, and the step's inputs made, on the device from the launched result
        (path length n, bonus, path nodes, their tokens) and the committed count of the last call, in the
        same call as the drafting; the host's count is behind by n until :meth:`settle`. Its buffers grow
        for the most the unsettled paths may be (a block each; a pipelined loop leaves
        ``engine.PIPELINE_DEPTH`` unsettled)."""
        if step.verification is self._last:
            raise ValueError("propose_after: this step is ingested already")
        ver = step.verification
        ingest_start("EAGLE", self.capture_layers, ver, ver.position)  # checks only that the layers are there
        self._ensure(self.count + (self._unsettled + 2) * self.block)
        sources = tuple(ver.hidden[i] for i in self.capture_layers)
        self._last = ver
        self._unsettled += 1
        out = self._run_after(sources, step.result, step.depth)
        if self.tree is None:
            top_ids, probs = out
            return Proposal(probs=probs, top_ids=top_ids)
        tree_tokens, tree_parents, scores = out
        return tree_proposal(DeviceTree(tree_tokens, tree_parents), scores)

    def settle(self, accepted: int) -> None:
        """The read length of the oldest path :meth:`propose_after` ingested: the host's counts catch up
        (the pending token, the bonus, stays on the device: a later host ``propose`` recomputes the last
        row)."""
        if not self._unsettled:
            raise ValueError("no ingested step waits to be settled")
        self.count += accepted
        self.rows, self._pending = self.count, -1
        self._unsettled -= 1

    def _run_after(self, sources: tuple[torch.Tensor, ...], result: torch.Tensor, depth: int) -> Any:
        """The graph of :meth:`_step_after` for these source and result buffers (captured on first use;
        the committed count its warm-ups advanced is restored), or the step itself without graphs."""
        if not self.graphs:
            return EagerCall(lambda: self._step_after(sources, result, depth))()
        key = (tuple(tensor_address(h) for h in sources), tensor_address(result), depth)
        call = self._calls_after.get(key)
        if call is None:
            from repro.models.graphs import GraphedCall

            committed = self._committed.clone()
            call = GraphedCall(lambda: self._step_after(sources, result, depth), self.model.device)
            self._committed.copy_(committed)
            self._calls_after[key] = call
        return call()

    @torch.no_grad()
    def _step_after(self, sources: tuple[torch.Tensor, ...], result: torch.Tensor, depth: int) -> Any:
        """Ingest the launched path (``result``: [n, bonus, path nodes by depth (``depth``), tokens]) at the
        committed count c0 and set the inputs: r = c0, c = c0 + n, the bonus as root, the rows' tokens
        (the path's after its root, then the bonus); then :meth:`_step` (capture-safe)."""
        b, j = self.block, self._block_index
        n, bonus, c0 = result[0:1], result[1:2], self._committed
        width = min(b, depth)
        nodes = torch.zeros(b, dtype=torch.long, device=result.device)
        nodes[:width] = result[2 : 2 + width]  # padded with node 0 (as the result pads)
        rows = torch.cat([h.index_select(0, nodes) for h in sources], dim=-1).to(self.features.dtype)
        self.features.index_copy_(0, c0 + j, rows)  # rows past the path: never read, overwritten later
        tokens = result[2 + depth :].index_select(0, (j + 1).clamp(max=depth - 1))
        ids = torch.where(j < n - 1, tokens, torch.where(j == n - 1, bonus, torch.zeros_like(tokens)))
        self.inputs[0:1].copy_(c0)
        self.inputs[1:2].copy_(c0 + n)
        self.inputs[2:3].copy_(bonus)
        self.inputs[3:].copy_(ids)
        return self._step()

    # ---------------------------------------------------------------- the device call

    def _rows(
        self, ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
        mask: torch.Tensor, fast: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        """Predictions [T, hidden] of T rows written into the buffers at ``slots`` (on the fast forward
        when the drafter has it and ``fast``)."""
        if fast and self._fast is not None:
            return self._fast.forward(ids, features, positions, self.kv, mask, slots)
        m = self.model
        return m(ids[None], features[None], positions[None], self._embedding, self.kv, mask, slots)[0][0]

    def _probs(self, preds: torch.Tensor) -> torch.Tensor:
        if self._fast is not None:
            return self._fast.probs(preds)
        return super()._probs(preds)

    def _context_rows(self, ids: torch.Tensor, start: torch.Tensor, fast: bool = True) -> torch.Tensor:
        """Committed rows start.. (row t reads ``ids[t - start]`` and feature t), causal over the
        committed rows; their predictions [T, hidden]. ``fast``: as :meth:`_rows`."""
        positions = start + torch.arange(ids.shape[0], device=ids.device)
        cols = torch.arange(self.kv[0][0].shape[2], device=ids.device)
        mask = (cols[None] <= positions[:, None]) & (cols[None] < self.capacity)
        return self._rows(ids, self.features.index_select(0, positions), positions, positions, mask, fast)

    def _draft_context(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Once per step: the committed columns every drafted row sees [C] (bool) and the position of each
        level's rows [levels] (level d: c - 1 + d)."""
        return self._cols < c, c + self._level_index

    def _level(
        self, depth: int, ids: torch.Tensor, preds: torch.Tensor, ancestors: torch.Tensor,
        context: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        """Drafted rows of level ``depth`` (their parents' predictions ``preds``, their drafted ancestors
        ``ancestors`` [n, Ds], the step's :meth:`_draft_context`); their predictions."""
        seen = context[0]
        mask = torch.cat([seen[None].expand(ids.shape[0], -1), ancestors], dim=1)  # [n, C + Ds]
        return self._level_rows(depth, ids, preds, mask, context[1])

    def _level_rows(
        self, depth: int, ids: torch.Tensor, preds: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The forward of :meth:`_level` given the rows' whole ``mask`` [n, C + Ds] and the levels'
        ``positions``."""
        n = ids.shape[0]
        one = self._fast is not None and len(self.capture_layers) == 1  # the features are the prediction
        features = preds if one else self.model.draft_features(preds)
        return self._rows(
            ids, features, positions[depth - 1 : depth].expand(n), self._slots[depth - 1, :n], mask
        )

    @torch.no_grad()
    def _step(self) -> tuple[torch.Tensor, ...]:
        """The committed block and the drafting, from ``self.inputs`` (capture-safe)."""
        r, c, root = self.inputs[0:1], self.inputs[1:2], self.inputs[2:3]
        self._committed.copy_(c)
        preds = self._context_rows(self.inputs[3:], r)
        root_pred = preds.index_select(0, c - r - 1)
        context = self._draft_context(c)
        if self.tree is None:
            return self._chain_step(root_pred, context)
        if self.legacy_glue:
            return self._tree_step_legacy(root, root_pred, context, self.tree)
        return self._tree_step(root, root_pred, context, self._growth)

    def _chain_step(
        self, pred: torch.Tensor, context: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        probs, tops = [], []
        for depth in range(1, self.k + 1):
            p = self._probs(pred)
            top = row_topk(p, self.width)[1]
            probs.append(p)
            tops.append(top)
            if depth < self.k:
                pred = self._level(depth, top[:, 0], pred, self._chain_ancestors[depth - 1 : depth], context)
        return torch.cat(tops), torch.cat(probs)

    def _tree_step(
        self,
        root: torch.Tensor,
        root_pred: torch.Tensor,
        context: tuple[torch.Tensor, torch.Tensor],
        grow: TreeGrowth,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dynamic tree grown into ``grow``'s buffers (the legacy glue's tree, in fewer launches)."""
        seen, positions = context
        grow.tokens[:1].copy_(root)
        preds, mask = root_pred, seen  # the frontier's predictions and mask (the root's: no drafted row)
        score = None  # the frontier's scores [rows] (the root's: 0, added by nothing)
        fused = self._fast is not None  # a level's glue in one launch, the selection in one
        if fused:
            from repro.drafters import frontier_kernels as fk
        for depth in range(1, grow.depth + 1):
            rows = preds.shape[0]
            level = grow.level(depth)
            top_p, top_ids = grow.level_top(depth, rows)
            row_topk(self._probs(preds), grow.kids, out=(top_p, top_ids))
            if fused and (depth > 1 or not grow.pad[0]):  # level 1 padded: the torch glue below
                scores = grow.level_scores(depth, rows)
                parent_score = grow.zero if depth == 1 else score  # the root's: 0 (0 + log p = log p)
                if depth == grow.depth:
                    fk.level_scores(top_p, parent_score, grow.tau, scores)
                    break
                values, order = grow.frontier(depth)  # level 1: the identity, as TreeGrowth made it
                own = grow.own[depth - 1]
                rows_mask = seen[None] if depth == 1 else mask  # the root's: the committed columns
                ids, _, mask, parent_preds = fk.next_frontier(
                    top_p, top_ids, parent_score, grow.tau, scores, values, order, rows_mask, own, preds
                )
                score = values[: grow.beam]
                preds = self._level_rows(depth, ids, parent_preds, mask, positions)
                continue
            p = torch.where(grow.confident(top_p), top_p, grow.zero)  # float64; 0 where pruned
            if score is None:
                torch.log(p, out=grow.level_scores(depth, rows))
            else:
                torch.add(score[:, None], p.log(), out=grow.level_scores(depth, rows))
            if depth == grow.depth:
                break
            if depth == 1 and not grow.pad[0]:  # the root's children are in order already (see TreeGrowth)
                score, ids = grow.scores[level][: grow.beam], top_ids.view(-1)[: grow.beam]
            else:
                values, order = grow.frontier(depth)  # the level's candidates by (-score, creation order)
                scores = grow.scores[level]
                if grow.pad[depth - 1]:  # fewer children than frontier rows: pad with invalid ones
                    scores = torch.cat([scores, grow.neg_pad[depth - 1]])
                torch.sort(scores, descending=True, stable=True, out=(values, order))
                score, order = values[: grow.beam], order[: grow.beam]
                child = order.clamp(max=rows * grow.kids - 1) if grow.pad[depth - 1] else order
                ids = top_ids.view(-1).index_select(0, child)
            if depth == 1:  # every frontier row is the root's child
                own = grow.own[0, :, seen.shape[0] :]  # [beam, Ds]
                row, mask = grow.root_rows, torch.cat([seen[None].expand(grow.beam, -1), own], dim=1)
            else:
                row = torch.div(order, grow.kids, rounding_mode="floor")
                mask = mask.index_select(0, row) | grow.own[depth - 1]
            preds = self._level_rows(depth, ids, preds.index_select(0, row), mask, positions)
        if fused:  # the deep parents and the selection in one launch
            return fk.select_tree(
                grow.scores, grow.tokens, grow.parents, grow.orders, grow.parent_at, grow.parent_base,
                grow.counts[0], grow.size,
            )  # fmt: skip
        if grow.depth > 1:  # the parents of levels 2..: the frontier rows' candidate ids
            torch.add(grow.orders.index_select(0, grow.parent_at), grow.parent_base, out=grow.deep_parents)
        return grow.select()

    def _tree_step_legacy(
        self,
        root: torch.Tensor,
        root_pred: torch.Tensor,
        context: tuple[torch.Tensor, torch.Tensor],
        spec: DynamicTree,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tree step before :class:`TreeGrowth` (``legacy_glue``): the reference it is pinned to."""
        vocab = self.model.config.vocab_size
        kids, beam = min(spec.topk, vocab), spec.topk
        # the frontier: predictions, scores, validity, candidate index (-1: the root), drafted ancestors
        preds, (score, valid, node, ancestors) = root_pred, self._tree_start  # constants, never written
        tokens, parents, scores = [], [], []
        made = 0  # candidates created so far (creation order = index)
        for depth in range(1, spec.depth + 1):
            top_p, top_ids = torch.topk(self._probs(preds), kids, dim=-1)
            p = top_p.to(torch.float64)
            ok = valid[:, None] & (p >= spec.tau) & (p > 0)
            level_scores = torch.where(ok, score[:, None] + p.log(), float("-inf")).reshape(-1)
            n = level_scores.shape[0]
            tokens.append(top_ids.reshape(-1))
            parents.append(node[:, None].expand(-1, kids).reshape(-1))
            scores.append(level_scores)
            made += n
            if depth == spec.depth:
                break
            if n < beam:  # fewer children than frontier rows: pad with invalid ones
                level_scores = torch.cat([level_scores, level_scores.new_full((beam - n,), float("-inf"))])
            order = torch.sort(level_scores, descending=True, stable=True).indices[:beam]
            row = (order // kids).clamp(max=preds.shape[0] - 1)  # the frontier row of each child
            score = level_scores.index_select(0, order)
            valid = score > float("-inf")
            child = order.clamp(max=n - 1)
            ids = top_ids.reshape(-1).index_select(0, child)
            node = child + (made - n)  # the children's candidate indices
            ancestors = ancestors.index_select(0, row) | self._own[depth - 1]  # and their own slots
            preds = self._level(depth, ids, preds.index_select(0, row), ancestors, context)
        return _select(root, torch.cat(tokens), torch.cat(parents), torch.cat(scores), spec.budget)


def _prob_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the drafter distributions (``EagleDrafter._probs``) of a model in ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _at_least(tau: float, dtype: torch.dtype) -> float:
    """The smallest value of ``dtype`` that is ``>= tau`` (so ``p >= it`` iff ``float(p) >= tau``)."""
    t = torch.tensor(tau, dtype=dtype)
    if t.item() < tau:
        t = torch.nextafter(t, torch.tensor(float("inf"), dtype=dtype))
    return t.item()


class TreeGrowth:
    """The device buffers and constants of :meth:`StaticEagleDrafter._tree_step` (one per buffer size).

    Candidates are numbered by creation order; their *id* is that index + 1, id 0 is the root and id
    ``N + 1`` (``N`` candidates) an invalid sentinel. ``tokens``, ``parents`` (parent ids; ``N + 2``: none)
    and ``scores`` (float64; the root +inf, the sentinel -inf) [N + 2] are indexed by id; the levels write
    their candidates into them in place (``out=``) and each non-last level's frontier sort into ``orders``,
    so no cat gathers them, and a level's parents are one gather of ``orders`` after the last level.
    Validity is folded into the scores: a pruned child's probability becomes 0 (log: -inf), and an invalid
    parent's -inf score makes every child -inf, as the legacy glue's masks do. The root's children need no
    sort: topk gives them by non-increasing probability, so their scores (log p, or -inf for a pruned
    suffix) never rise along creation order and the stable sort would be the identity.
    """

    def __init__(
        self, spec: DynamicTree, vocab: int, prob_dtype: torch.dtype, capacity: int, levels: int,
        device: torch.device,
    ) -> None:  # fmt: skip
        self.kids, self.beam, self.depth = min(spec.topk, vocab), spec.topk, spec.depth
        rows = [1] + [self.beam] * (self.depth - 1)
        self.counts = [r * self.kids for r in rows]  # candidates per level
        self.bases = [sum(self.counts[:d]) for d in range(self.depth)]
        self.n = n = sum(self.counts)
        self.size = min(spec.budget, n)
        self.pad = [c < self.beam for c in self.counts[:-1]]  # levels with fewer children than frontier rows
        sorted_len = [max(c, self.beam) for c in self.counts[:-1]]
        self.offsets = [sum(sorted_len[:d]) for d in range(len(sorted_len))]
        self.tau = spec.tau if spec.tau <= 0 else _at_least(spec.tau, prob_dtype)

        def full(size: int, value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((size,), value, dtype=dtype, device=device)

        long, f64 = torch.long, torch.float64
        self.tokens = full(n + 2, 0, long)
        self.scores = full(n + 2, float("-inf"), f64)
        self.scores[0] = float("inf")  # the root sorts first
        self.parents = full(n + 2, n + 2, long)
        self.parents[1 : 1 + self.counts[0]] = 0  # level 1: the root's children
        self.deep_parents = self.parents[1 + self.counts[0] : 1 + n]
        self.top_p = full(n, 0, prob_dtype)
        self.orders = full(sum(sorted_len), 0, long)
        if self.depth > 1:  # level 1's order when it is not sorted: the identity
            self.orders[: sorted_len[0]] = torch.arange(sorted_len[0], device=device)
        self.sorted = full(sum(sorted_len), 0, f64)
        self.neg_pad = [full(m - c, float("-inf"), f64) for m, c in zip(sorted_len, self.counts)]
        # level d >= 2's candidate j: the parent is frontier row j // kids of level d - 1
        at, base = [], []
        for d in range(1, self.depth):
            j = torch.arange(self.counts[d], device=device)
            at.append(self.offsets[d - 1] + j // self.kids)
            base.append(torch.full_like(j, self.bases[d - 1] + 1))
        self.parent_at = torch.cat(at) if at else None
        self.parent_base = torch.cat(base) if base else None
        self.zero = full(1, 0.0, f64)
        self.root_rows = full(self.beam, 0, long)
        drafts = levels * self.beam
        own = torch.zeros(levels, self.beam, capacity + drafts, dtype=torch.bool, device=device)
        own[:, :, capacity:] = torch.eye(drafts, dtype=torch.bool, device=device).view(
            levels, self.beam, drafts
        )
        self.own = own
        self.sentinel = full(1, n + 1, long)
        self.slots = torch.arange(self.size + 1, device=device)
        self.unmapped = full(n + 3, 0, long)  # id -> tree node (0 unless kept); none -> -1
        self.unmapped[n + 2] = -1

    def level(self, depth: int) -> slice:
        """Level ``depth``'s ids."""
        return slice(1 + self.bases[depth - 1], 1 + self.bases[depth - 1] + self.counts[depth - 1])

    def level_top(self, depth: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where level ``depth``'s top-k probabilities and tokens go: [rows, kids] views."""
        base, count = self.bases[depth - 1], self.counts[depth - 1]
        return self.top_p[base : base + count].view(rows, -1), self.tokens[self.level(depth)].view(rows, -1)

    def level_scores(self, depth: int, rows: int) -> torch.Tensor:
        return self.scores[self.level(depth)].view(rows, -1)

    def frontier(self, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where level ``depth``'s sorted scores and their candidate order go."""
        start = self.offsets[depth - 1]
        stop = start + max(self.counts[depth - 1], self.beam)
        return self.sorted[start:stop], self.orders[start:stop]

    def confident(self, top_p: torch.Tensor) -> torch.Tensor:
        """The legacy ``(p >= tau) & (p > 0)`` (in float64) in one comparison."""
        return top_p >= self.tau if self.tau > 0 else top_p > 0

    def select(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`_select` on the buffers: the root, the ``size`` best candidates by (-score, id) in id order,
        padding (token 0, parent -1, score -inf) in place of invalid ones."""
        values, ids = torch.sort(self.scores[: self.n + 1], descending=True, stable=True)
        top = self.size + 1  # the root first (+inf)
        ordered = torch.sort(torch.where(values[:top] > float("-inf"), ids[:top], self.sentinel)).values
        node_of = self.unmapped.scatter(0, ordered, self.slots)  # the sentinel's writes land on id n + 1
        parents = node_of.index_select(0, self.parents.index_select(0, ordered))
        return self.tokens.index_select(0, ordered), parents, self.scores.index_select(0, ordered[1:])


def _select(
    root: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, budget: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree of the ``budget`` best candidates by (-score, index) in index order, root first, padding
    (parent -1, token 0) after the real nodes: (tokens, parents, kept scores) of ``min(budget, N) + 1``
    nodes. ``parents`` index candidates (-1: the root); invalid candidates score -inf."""
    n = scores.shape[0]
    size = min(budget, n)
    keep = torch.sort(scores, descending=True, stable=True).indices[:size]
    real = scores.index_select(0, keep) > float("-inf")
    ordered = torch.sort(torch.where(real, keep, keep + n)).values  # real nodes by index, padding last
    real = ordered < n
    keep = torch.where(real, ordered, ordered - n)
    index_of = torch.zeros(n, dtype=torch.long, device=scores.device)  # candidate -> tree node
    index_of.scatter_(0, keep, torch.arange(1, size + 1, device=scores.device))
    parent = parents.index_select(0, keep)
    parent = torch.where(parent < 0, 0, index_of.index_select(0, parent.clamp(min=0)))
    minus = torch.full((1,), -1, dtype=torch.long, device=scores.device)
    out_tokens = torch.cat([root, torch.where(real, tokens.index_select(0, keep), 0)])
    out_parents = torch.cat([minus, torch.where(real, parent, -1)])
    return out_tokens, out_parents, torch.where(real, scores.index_select(0, keep), float("-inf"))


def eagle_drafter_for(
    model: EagleDraftModel,
    target: HybridLM | GraphedTarget,
    k: int = 4,
    width: int = 1,
    tree: DynamicTree | None = None,
) -> EagleDrafter:
    """The static drafter for a :class:`~repro.models.graphed.GraphedTarget` (CUDA graphs when it
    has them; the fast forward when its decoder takes the GEMV kernels; buffers as long as the target's,
    so that they grow, and their graphs are captured again, only when the target's do), the eager
    reference for a HybridLM."""
    if isinstance(target, GraphedTarget):
        return StaticEagleDrafter(
            model, target, k, width, tree, capacity=target.max_len, graphs=target.graphs, fast=target.gemv
        )
    return EagleDrafter(model, target, k, width, tree)
