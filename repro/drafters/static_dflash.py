"""DFlash drafting on static device buffers: one CUDA graph per step, no host sync.

:class:`StaticDFlash` is what :class:`repro.drafters.dflash.DFlashDrafter` runs on when the target is
a :class:`repro.models.graphed.GraphedTarget` (the same math as the eager drafter, pinned to it by
tests/drafters/test_dflash_static.py). It holds, sized to ``max_len`` positions (doubled, with the
graphs captured again, when a step would not fit):

- ``feat`` [max_len, F]: the target features of committed positions (rows >= ``count`` are stale);
- ``keys``/``values``, per draft layer [1, KV heads, max_len, head_dim]: the context keys/values of
  those positions (fc, hidden_norm, k/v proj, k_norm, rotary at the absolute positions);
- ``length``: the committed length as a device scalar (the host knows it too: ``count``);
- ``inputs``: the step's host values on the device, ``[root token, start, count, path (padded)]``,
  uploaded by one non-blocking copy from a pinned host buffer.

One step (:meth:`StaticDFlash.step`) gathers the previous verification's accepted rows from its
hidden outputs (the verify slot's static buffers, so the graph reads them in place), writes their
features and keys/values at positions ``start..``, sets ``length``, then runs the block
``[root, MASK x (T-1)]`` at positions ``length..length+T-1``: its keys/values are written into the
buffers right after the context (rows that the next ingest overwrites) and each query sees buffer
rows ``< length + T`` (a length mask over static shapes), then the final norm, the target's LM head
and, for ``propose``, the marginals and their top-k. On CUDA that is one CUDA graph per (sources,
path padding, marginals) captured on first use; elsewhere the same function runs eagerly. Rows past
the accepted path are gathered too (padding) and written past ``length``: harmless, they are never
visible and are overwritten before they could be. Prefill chunks are written eagerly.
:meth:`StaticDFlash.step_after` (the engine's pipelined loop) takes the step's inputs from a launched, unread
greedy step's device result instead of the host (root = its bonus, start = ``length``), the host's
``count`` catching up at ``settle``.

``fast`` (default: on with graphs, i.e. on CUDA, unless float64; on CPU only under Triton's interpreter)
runs the ingest and the block forward on the Triton kernels (:class:`~repro.drafters.dflash_fast.FastDFlash`:
about a quarter of the launches; the block's keys and values are then not written into the buffers). The
keys and values of all layers live in one stacked buffer each (``keys`` / ``values`` are its per-layer
views), so that the fast ingest writes every layer at once. With ``probs`` a step returns (logits, marginals,
top-k ids); without, (final-normed rows, logits): what ``propose`` and Weaver's ``block_rows`` read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from repro.drafters.attention import marginals
from repro.drafters.base import DraftContext
from repro.drafters.dflash_model import DFlashDraftModel
from repro.drafters.fast_rules import check_fast_device
from repro.drafters.features import ingest_start
from repro.errors import ConfigError
from repro.models.graphed import GraphedVerification
from repro.models.graphs import EagerCall, HostUploads, tensor_address
from repro.models.hybrid import Verification
from repro.models.topk_kernels import row_topk
from repro.tree import DeviceTree

if TYPE_CHECKING:
    from repro.drafters.dflash_fast import FastDFlash

DEFAULT_MAX_LEN = 4096

Outputs = tuple[Any, ...]  # tensors; a step with a tree builder ends with its DeviceTree
Launched = tuple[
    torch.Tensor, int
]  # a launched step's device result and its path depth (StaticDFlash.step_after)
# a device tree builder run inside the step: (root [1] on the device, marginals, top-k ids) -> tree
TreeAfter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], DeviceTree]


class StaticDFlash:
    """Static buffers and step graphs of one DFlash drafter (see the module docstring).

    ``embedding`` and ``lm_head`` are the target's; ``graphs`` defaults to "on CUDA", ``fast`` to
    ``graphs`` (float64: off).
    """

    def __init__(
        self,
        model: DFlashDraftModel,
        embedding: torch.Tensor,
        lm_head: torch.nn.Module,
        block_size: int,
        top_k: int,
        max_len: int = DEFAULT_MAX_LEN,
        graphs: bool | None = None,
        fast: bool | None = None,
    ) -> None:
        self.model, self.embedding, self.lm_head = model, embedding, lm_head
        self.block_size, self.top_k = block_size, top_k
        self.device = model.device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ConfigError(
                "CUDA graphs need a CUDA device: the static DFlash drafter runs eagerly elsewhere"
            )
        # float64 (CPU's exact runs) keeps torch by default: the kernels' float64 dots are for the interpreter
        self.fast = (self.graphs and model.dtype != torch.float64) if fast is None else fast
        check_fast_device(self.fast, self.device, "the static DFlash drafter")
        self._fast: FastDFlash | None = None
        if self.fast:
            from repro.drafters.dflash_fast import FastDFlash

            self._fast = FastDFlash(model, block_size, lm_head=lm_head)  # rotary tables: sized by _allocate
        self.layers = tuple(model.config.target_layer_ids)
        self.captures = 0  # graphs captured so far
        self.length = torch.zeros((), dtype=torch.long, device=self.device)
        self._block = torch.arange(block_size, device=self.device)
        self._pad = 0
        self._resize_inputs(block_size)
        self.max_len = 0
        self._allocate(max(max_len, 2 * block_size))
        self.reset()

    # ------------------------------------------------------------------ buffers

    def reset(self) -> None:
        """A new sequence: nothing committed (stale rows stay, never visible)."""
        self.count = 0
        self.length.zero_()
        self._last: Verification | None = None
        self._unsettled = 0  # step_after calls whose path length settle has not given yet

    @property
    def features(self) -> torch.Tensor:
        """Target features of the committed tokens, [count, F] (a view of the buffer)."""
        return self.feat[: self.count]

    def _allocate(self, max_len: int) -> None:
        """Buffers of ``max_len`` positions, the old ones' rows copied over (all of them: the rows of paths
        ingested on the device and not yet settled lie past the host's count); graphs are dropped."""
        cfg, m = self.model.config, self.model
        feat = torch.zeros(max_len, cfg.feature_size, dtype=m.dtype, device=self.device)
        shape = (len(m.layers), cfg.num_key_value_heads, max_len, cfg.head_dim)
        stacks = [torch.zeros(shape, dtype=m.dtype, device=self.device) for _ in range(2)]
        if self.max_len:
            n = self.max_len
            feat[:n] = self.feat[:n]
            for new, old in zip(stacks, self.stacks):
                new[:, :, :n] = old[:, :, :n]
        self.feat, self.stacks, self.max_len = feat, stacks, max_len
        # feat[length - 1], written by the steps without probs (Weaver's root feature, on the device)
        self.tail = torch.zeros(1, cfg.feature_size, dtype=m.dtype, device=self.device)
        self.keys = [stacks[0][i : i + 1] for i in range(len(m.layers))]  # [1, KV, max_len, hd] views
        self.values = [stacks[1][i : i + 1] for i in range(len(m.layers))]
        if self._fast is not None:
            self._fast.set_rope_rows(max_len)
        self._positions = torch.arange(max_len, device=self.device)
        self._calls: dict[tuple[Any, ...], Callable[[], Outputs]] = {}

    def _fit(self, need: int) -> None:
        """Grow (doubling) until ``need`` positions fit."""
        size = self.max_len
        while size < need:
            size *= 2
        if size != self.max_len:
            self._allocate(size)

    def _resize_inputs(self, pad: int) -> None:
        """The device inputs for accepted paths of up to ``pad`` nodes (their graphs are made again)."""
        self._pad = pad
        self.inputs = torch.zeros(3 + pad, dtype=torch.long, device=self.device)
        self._uploads = HostUploads(self.device)
        self._calls = {}

    def _upload(self, root: int, start: int, path: list[int]) -> None:
        """[root, start, count, path + zeros] to ``inputs`` (pinned buffers, non-blocking copy)."""
        self._uploads.put([root, start, len(path), *path] + [0] * (self._pad - len(path)), self.inputs)

    @torch.no_grad()
    def _write(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """Features rows [n, F] and their context keys/values at ``positions`` [n] (device)."""
        self.feat.index_copy_(0, positions, rows)
        if self._fast is not None:
            self._fast.ingest(rows, positions, *self.stacks)
            return
        for (k, v), kb, vb in zip(self.model.context_kv(rows[None], positions[None]), self.keys, self.values):
            kb.index_copy_(2, positions, k)
            vb.index_copy_(2, positions, v)

    def _start(self, ver: Verification) -> int:
        return ingest_start("DFlash", self.layers, ver, self.count)

    def _gather(self, ver: Verification, idx: torch.Tensor) -> torch.Tensor:
        return torch.cat([ver.hidden[i].index_select(0, idx) for i in self.layers], dim=-1).to(
            self.model.dtype
        )

    @torch.no_grad()
    def ingest(self, ver: Verification, path: list[int]) -> None:
        """Write the accepted ``path``'s rows of ``ver`` eagerly (prefill chunks; an already ingested
        verification or an empty path does nothing)."""
        if ver is self._last or not path:
            return
        start = self._start(ver)
        self.load(self._gather(ver, torch.as_tensor(path, device=self.device)), start)
        self._last = ver

    @torch.no_grad()
    def load(self, rows: torch.Tensor, start: int = 0) -> None:
        """Commit feature ``rows`` [n, F] at positions start..start+n-1 (eagerly); ``count`` = start + n."""
        n = rows.shape[0]
        self._fit(start + n)
        self._write(rows, self._positions[start : start + n])
        self.count = start + n
        self.length.fill_(self.count)

    @torch.no_grad()
    def adopt(self, rows: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Take over an eager drafter's cache: feature ``rows`` [n, F] and per layer keys/values
        [1, KV, n, D] of positions 0..n-1 (copied, not recomputed)."""
        self.reset()
        n = rows.shape[0]
        self._fit(n)
        self.feat[:n] = rows
        for (k, v), kb, vb in zip(kv, self.keys, self.values):
            kb[:, :, :n] = k
            vb[:, :, :n] = v
        self.count = n
        self.length.fill_(n)

    # ------------------------------------------------------------------ the step

    def _run(
        self,
        sources: tuple[torch.Tensor, ...] | None,
        probs: bool,
        after: Launched | None = None,
        tree: TreeAfter | None = None,
    ) -> Outputs:
        """Ingest (when ``sources``, the hidden outputs per feature layer) and the block forward; ``after``
        (a launched step's device result and its depth): the inputs are taken from it on the device;
        ``tree`` (with ``after`` and ``probs``): the next tree built from the marginals and top-k ids in the
        same call, its root the launched step's bonus, appended to the outputs."""
        step = self._fast_step if self._fast is not None else self._torch_step
        rows, logits = step(sources, probs, after)
        if not probs:
            return rows, logits
        p = marginals(logits)
        out = (logits, p, row_topk(p, self.top_k)[1])
        if tree is None or after is None:
            return out
        return (*out, tree(after[0][1:2], p, out[2]))

    def _torch_step(
        self, sources: tuple[torch.Tensor, ...] | None, probs: bool, after: Launched | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_run`'s block rows and logits on torch ops (the reference of :meth:`_fast_step`)."""
        m, inp, t = self.model, self.inputs, self.block_size
        if after is not None:  # [bonus, start = the committed length, path length, path by depth + zeros]
            result, depth = after
            width = min(self._pad, depth)
            inp[0].copy_(result[1])
            inp[1].copy_(self.length)
            inp[2].copy_(result[0])
            inp[3 : 3 + width].copy_(result[2 : 2 + width])
            inp[3 + width :].zero_()
        if sources is not None:
            start, count = inp[1], inp[2]
            rows = torch.cat([h.index_select(0, inp[3:]) for h in sources], dim=-1).to(m.dtype)
            self._write(rows, start + self._positions[: self._pad])
            self.length.copy_(start + count)
        if not probs:  # Weaver's root feature
            self.tail.copy_(self.feat.index_select(0, (self.length - 1).clamp(min=0).view(1)))
        ids = torch.where(self._block == 0, inp[0], m.config.mask_token_id)
        slots = self.length + self._block
        visible = (self._positions < self.length + t)[None, None, None]
        context = list(zip(self.keys, self.values))
        hidden = m.forward_block(
            m.embed_block(ids[None], self.embedding), slots[None], context, visible, slots
        )
        rows = hidden[0, 1:]
        return rows, m.compute_logits(rows, self.lm_head)

    def _fast_step(
        self, sources: tuple[torch.Tensor, ...] | None, probs: bool, after: Launched | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_torch_step` on the fast path: its glue in one launch each
        (:mod:`repro.drafters.ingest_kernels`), the ingest and block on :class:`FastDFlash`."""
        from repro.drafters import ingest_kernels as ik

        m, inp, fast = self.model, self.inputs, self._fast
        assert fast is not None
        if after is not None:
            result, depth = after
            ik.launched_inputs(result, self.length, inp, min(self._pad, depth))
        if sources is not None:
            rows, positions = ik.gather_features(sources, inp[3:], inp[1], inp[2], self.feat, self.length)
            fast.ingest(rows, positions, *self.stacks)
        if not probs:
            ik.last_feature(self.feat, self.length, self.tail)
        x = ik.block_rows(
            self.embedding, inp[0:1], m.config.mask_token_id, self.block_size, m.config.input_embedding_scale
        )
        h = fast.block(x, self.length, self.keys, self.values)[1:]
        if probs:  # the final norm rides on the LM head; the rows are not needed
            return h, fast.logits(h, self.lm_head)
        rows = fast.final_norm(h)
        return rows, m.compute_logits(rows, self.lm_head)

    def _call(
        self,
        sources: tuple[torch.Tensor, ...] | None,
        probs: bool,
        after: Launched | None = None,
        tree: TreeAfter | None = None,
    ) -> Outputs:
        """The step's outputs: the graph of ``_run`` (captured on first use per sources, padding, launched
        result and tree builder), or ``_run`` itself without graphs."""
        if not self.graphs:
            return EagerCall(torch.no_grad()(lambda: self._run(sources, probs, after, tree)))()
        key = (
            probs,
            self._pad,
            None if sources is None else tuple(tensor_address(h) for h in sources),
            None if after is None else (tensor_address(after[0]), after[1]),
            tree,
        )
        call = self._calls.get(key)
        if call is None:
            from repro.models.graphs import GraphedCall

            fn = torch.no_grad()(lambda: self._run(sources, probs, after, tree))
            # its warm-up calls are real steps: writes are idempotent, but for the committed length when
            # the start is read from it (``after``): it is restored, and the replay makes the step
            length = self.length.clone()
            call = GraphedCall(fn, self.device)
            self.length.copy_(length)
            self.captures += 1
            self._calls[key] = call
        return call()

    def step_after(
        self, ver: Verification, result: torch.Tensor, depth: int, probs: bool, tree: TreeAfter | None = None
    ) -> Outputs:
        """:meth:`step` after a launched, unread step (a pipelined loop): its accepted path is ingested from
        ``result`` on the device (the graphed target's ``[path length, bonus, path nodes by depth
        (``depth``), tokens]`` of ``ver``'s slot), the block's root is its bonus, and the host's ``count``
        is behind by the paths' lengths until :meth:`settle` gives them (the buffers grow for the most the
        unsettled paths may be: a padded path each; a pipelined loop leaves ``engine.PIPELINE_DEPTH``
        unsettled). Returns :meth:`step`'s outputs; with ``tree`` (and ``probs``) also
        ``tree(bonus, marginals, top-k ids)``, built in the same graph."""
        if ver is self._last:
            raise ValueError("step_after: the verification is ingested already")
        pad = 1 << (self.block_size - 1).bit_length()  # a path holds at most the block: root + T - 1 drafts
        if pad != self._pad:
            self._resize_inputs(pad)
        self._fit(self.count + (self._unsettled + 1) * pad + self.block_size)
        self._last = ver
        self._unsettled += 1
        return self._call(tuple(ver.hidden[i] for i in self.layers), probs, (result, depth), tree)

    def settle(self, accepted: int) -> None:
        """The read length of the oldest path :meth:`step_after` ingested unread: the host's count
        catches up."""
        if not self._unsettled:
            raise ValueError("no ingested step waits to be settled")
        self.count += accepted
        self._unsettled -= 1

    def step(self, ctx: DraftContext, probs: bool) -> Outputs:
        """Ingest the previous step's accepted rows and draft the next block: (final-normed hidden rows
        [T-1, H], logits [T-1, V]), or with ``probs`` (logits, marginals [T-1, V], top-k ids [T-1, k]).
        The tensors are the graph's static outputs: valid until the next step."""
        ver, path = ctx.verification, list(ctx.accepted_path)
        sources = None
        if ver is not None and ver is not self._last and path:
            if self.graphs and not isinstance(ver, GraphedVerification):
                self.ingest(ver, path)  # not a verify slot's static outputs: no graph reads them
            else:
                start = self._start(ver)
                self.count, self._last = start + len(path), ver
                if len(path) > self._pad:
                    self._resize_inputs(1 << (len(path) - 1).bit_length())
                self._fit(start + self._pad)
                sources = tuple(ver.hidden[i] for i in self.layers)
                self._upload(ctx.output_ids[-1], start, path)
        expected = len(ctx.prompt_ids) + len(ctx.output_ids) - 1
        if self.count != expected:
            raise ConfigError(
                f"DFlash drafter holds hidden states of {self.count} tokens but {expected} are committed"
            )
        self._fit(self.count + self.block_size)
        if sources is None:
            self._upload(ctx.output_ids[-1], self.count, [])
        return self._call(sources, probs)
