"""HybridLM's decoding API (prefill, verify, commit) on the static decoder and its CUDA graphs.

:class:`GraphedTarget` wraps a :class:`~repro.models.hybrid.HybridLM` and a
:class:`~repro.models.static.StaticDecoder` so that the route-agnostic loop
(:func:`repro.decoding.engine.generate`) and the drafters run on it unchanged:

- ``prefill`` is HybridLM's (eager; excluded from tokens/s), then the state is loaded into the
  decoder's buffers; the eager verification goes back to the caller (drafters' ``observe_prefill``).
- ``verify`` pads the tree to the next slot size of :data:`SLOT_SIZES` with extra root-level nodes
  (parent -1, token 0: the ancestor mask isolates them, the acceptance never reaches them) and runs
  that slot's verify: one CUDA graph per (size, per-node states) on CUDA, captured on first use
  (:meth:`GraphedTarget.prepare` captures them ahead), eagerly elsewhere. The logits of the real nodes
  and the outputs of the ``capture`` layers are views of the slot's static outputs, valid until the
  slot's next verify (the engine and the drafters read them before that).
- A one-node tree without captured layers (AR) runs the decode step's graph instead: one graph that
  folds the node in at once (faster than the size-1 slot's verify + commit). That verification has
  already advanced the buffers: its state handle is consumed (using it again raises), and ``commit``
  of the path ``[0]`` returns the next handle.
- ``commit`` sets the accepted path's end on the device and replays the slot's commit graph for the
  verification's strategy (``snapshot`` verifies on slots with per-node states).
- ``strategy="delayed"`` (SpecLA's delayed commit, :mod:`repro.models.static`): verifications alternate
  between slots of parity 0 and 1 (their own graphs); each folds the previous step's accepted path
  into the GDN states inside its tree kernel before it verifies, and the commit (or ``commit_greedy``)
  records the path instead of updating the states (conv histories, attention rows and the length are
  committed as always). The target tracks on the host whether a commit is pending (no device read) and
  flushes it (:meth:`GraphedTarget.flush`, one graph) before every other reader of the states: a decode
  step, a verification by another strategy or verifier, an export (prefill continuing a state, growing
  the buffers), a graph capture; the engine flushes at the end of a generation. Loading a state drops it.
- ``verifier="chain"`` (fla_sd: a chain, commit ``replay``) verifies on chain slots
  (:mod:`repro.models.static_chain`): the chain padded at its end, GDN layers by fla's chunk kernel
  from the committed state, the commit a replay through fla's fused recurrence.

- ``verify`` also takes a :class:`~repro.tree.DeviceTree` (built on the device by the greedy engine's
  tree builders): its tokens and parents are copied into the slot on the device; every slot derives
  depths, ancestor mask, conv gather index and first-sibling flags from them inside its verify graph,
  so a host tree uploads its tokens and parents alone.
- ``commit_greedy`` is the greedy step's end on the device: the slot's accept (greedy longest match),
  the path gathered by depth and the commit in one graph, then :func:`read_back` of one small int64
  buffer (path length, bonus, path nodes, their tokens): the one device-to-host read of the step. AR's
  decode graph writes its argmax, which ``commit_greedy`` reads the same way. ``commit_accepted`` is the
  same step with another device acceptance (the sampling rules, :mod:`repro.decoding.device_acceptance`).

The state is a :class:`GraphedState` handle: the decoder holds the one sequence's state, the handle
its host-side position and an epoch; a handle that is not the decoder's current one is refused, so a
stale state can never be verified silently. No step but :func:`read_back` reads the device on the
host: the other host syncs of a decode step are the caller's (a host acceptance rule reading the
logits) and the drafters'.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from repro.errors import ConfigError
from repro.models.graphs import generation_stream, graph_call
from repro.models.hybrid import HybridLM, Verification
from repro.models.hybrid import check_verifier as check_chain_verifier
from repro.models.state import ModelState
from repro.models.static import DELAYED, StaticDecoder, TreeSlot, check_static_strategy
from repro.models.static_chain import ChainSlot
from repro.models.static_layers import GDNBuffers
from repro.tree import MAX_TREE_NODES, DeviceTree, Tree

# powers of two, and one more: a draft tree is a root plus a budget that is usually a power of two (DDTree /
# Weaver / SpecLA b32 hold 33 nodes), and padding those to the next power of two nearly doubled the verify
# (at the 27B shape a 65-node tree ran as 128 rows: cuBLAS at 128 rows, the tree kernel at T = 128)
SLOT_SIZES = tuple(sorted({2**k for k in range(11)} | {2**k + 1 for k in range(1, 10)}))
SMALL_WIDTH = 1024  # <= this: fused decode layer, row-tiled verify; above: tree-kernel decode attention
# greedy AR's decode steps per graph at small widths (greedy_decode, :meth:`GraphedTarget.ar_group`): one
# host read per group, so that the host's loop (~100 us a step in Python) does not pace a decode step (~45 us
# at the tiny width on an H200). Wider models take one step a graph: their steps outlast the host's loop,
# and a stop token then wastes at most one step launched past it (a group: up to 2 AR_GROUP - 1 steps).
AR_GROUP = 8
# a device acceptance: (slot, the committed length [1] before its root); writes slot.node, slot.bonus
DeviceAccept = Callable[[TreeSlot, torch.Tensor], None]
# a verification told the device acceptance that follows it (``verify(then=...)``, the pipelined loop) runs
# verify, acceptance, accepted path and commit as one graph, on slots of its own (:meth:`GraphedTarget.
# _fused_call`): one graph boundary a step fewer. Routes A/B on the H200 (results/2026-12-04-h200-step-graphs,
# callCM): wall a step chain DFlash 0.272 -> 0.267 ms, DDTree 0.343 -> 0.341, SpecLA 0.578 -> 0.574,
# DFlash-TfM 0.632 -> 0.626, same tokens. The acceptance's and commit's device time is in the verify stage's.
FUSE_ACCEPT = True
# on CUDA a step's result reaches pinned host memory by the stores of the last kernel of the step's graph
# (slot_kernels.tagged_to_host, the tag from a device counter, the host polling the tags), not by a stream
# copy with an event behind it: on an H200 a copy + event behind a graph cost 11.4 us of device time against
# 1.7 for the stores (scripts/gpu/result-copy.py, results/2026-12-05-h200-step-graph/callCW). The stores
# launched from Python on every read (Triton's launcher) won 2-4% on an H200 (results/2026-12-05-h200-host-
# writes, callCZ) but cost an H100's host-paced routes up to 68% (chain DFlash 0.267 -> 0.449 ms a step,
# results/2026-12-05-h100-host-writes-off, callDA). Inside the graphs, on an H100 (results/2026-12-05-h100-
# stores-in-graphs, callDE: stream copies -> stores): wall a step chain DFlash 0.262 -> 0.254 ms (wall / busy
# 1.121 -> 1.103), DDTree 0.330 -> 0.322 (1.125 -> 1.108), DFlash-TfM 0.607 -> 0.597, AR 0.118 -> 0.117,
# SpecLA 0.557 -> 0.556, same tokens.
HOST_WRITES = True
READ_WAIT_S = 10.0  # read_back polls a HostWrite this long before it synchronizes the device once


class DevicePicker(Protocol):
    """A sampled AR pick on the device: ``pick(logits, length)`` (a decode step's logits [1, V], the
    committed length [1] after it) -> the token [1]; ``graph_key`` names the graphs that call it."""

    @property
    def graph_key(self) -> tuple: ...

    def pick(self, logits: torch.Tensor, length: torch.Tensor) -> torch.Tensor: ...


DEFAULT_MAX_LEN = 4096
ENGINES = ("auto", "eager", "graphed")


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
    return name


def resolve_engine(name: str, device: str | torch.device) -> str:
    """``auto``: graphed on CUDA, eager elsewhere; ``graphed`` also runs on CPU (eagerly, no graphs)."""
    check_engine(name)
    if name != "auto":
        return name
    return "graphed" if str(device).startswith("cuda") else "eager"


def slot_size(n: int, max_nodes: int) -> int:
    """The smallest slot size that holds ``n`` nodes."""
    for size in SLOT_SIZES:
        if n <= size <= max_nodes:
            return size
    raise ConfigError(f"a tree of {n} nodes exceeds the graphed engine's {max_nodes} nodes; lower the budget")


@dataclass(frozen=True)
class HostWrite:
    """A result stored into pinned host memory by :func:`~repro.models.slot_kernels.tagged_to_host` with
    ``tag``: landed when every element carries it."""

    tag: int


_read_wait = [0.0]  # seconds read_back has waited for results still on their way, in this process


def read_wait_s() -> float:
    """The seconds :func:`read_back` has waited so far in this process for results not yet on the host
    (the engine subtracts two readings: a generation's wait, the host ahead of the device; near zero, the
    host paces the loop)."""
    return _read_wait[0]


def read_back(host: torch.Tensor, copied: Any, wait_s: float = READ_WAIT_S) -> list[int]:
    """``host`` listed once ``copied`` has completed: the CUDA event recorded after its copy from the device
    was queued, or the :class:`HostWrite` whose tagged elements are polled until all have landed (after
    ``wait_s`` the device is synchronized once; still missing: RuntimeError); None on CPU. The only
    device-to-host read of a greedy step on the graphed target. The time from the first look at a result
    not there yet to its arrival counts in :func:`read_wait_s`."""
    if isinstance(copied, HostWrite):
        from repro.models.slot_kernels import untagged

        words = host.numpy()
        if (got := untagged(words, copied.tag)) is not None:
            return got
        start = time.perf_counter()
        deadline = start + wait_s
        while (got := untagged(words, copied.tag)) is None:
            if time.perf_counter() > deadline:
                torch.cuda.synchronize()
                if (got := untagged(words, copied.tag)) is None:
                    raise RuntimeError("a step's result never reached the host (tagged stores missing)")
                break
        _read_wait[0] += time.perf_counter() - start
        return got
    if copied is not None and not copied.query():
        start = time.perf_counter()
        copied.synchronize()
        _read_wait[0] += time.perf_counter() - start
    return host.tolist()


@dataclass
class GraphedState:
    """A handle on the decoder's one sequence: ``position`` committed tokens, the decoder's ``epoch``
    when it was made; ``eager`` is the HybridLM state a prefill made (later prompt chunks continue it)."""

    position: int
    committed_tokens: list[int]
    epoch: int
    eager: ModelState | None = field(default=None, repr=False)


@dataclass
class GraphedVerification(Verification):
    """A :class:`Verification` of the real nodes, plus the slot that holds what commit needs (None
    for a one-node tree folded in by the decode step) and the epoch it was made at."""

    slot: TreeSlot | None = None
    epoch: int = 0
    ticket: int = 0  # a delayed verification's number: only the latest one may be committed
    accepted: tuple | None = None  # (accept, key) already run with the verification (FUSE_ACCEPT)


@dataclass
class LaunchedStep:
    """A device acceptance and commit launched but not yet read (:meth:`GraphedTarget.launch_accepted`).

    ``result`` is the slot's device result ``[path length, bonus, path nodes by depth (``depth``), their
    tokens]``, valid until the slot's next commit: a pipelined step's drafter and tree builder read it
    there (:attr:`root`: the bonus, the next tree's root). ``host`` receives its copy, queued behind the
    commit; ``copied`` (a CUDA event; None on CPU) completes with that copy."""

    verification: GraphedVerification
    result: torch.Tensor
    depth: int
    host: torch.Tensor
    copied: Any

    @property
    def root(self) -> torch.Tensor:
        """The bonus token on the device, [1]: the root of the next tree."""
        return self.result[1:2]


def slot_key(
    size: int, snapshots: bool, verifier: str, parity: int | None = None, fused: bool = False
) -> tuple[int, bool | str]:
    """A slot's key (its graphs': ``("verify", *key)``, ``("commit", *key, strategy)``): (size, per-node
    states) for tree slots, (size, "chain") for the chain slots of fla_sd's verifier, (size, "delayed0")
    or (size, "delayed1") for the delayed commit's slots of parity 0 and 1; ``fused``: the slots of the
    fused verify + acceptance graphs (FUSE_ACCEPT), their kind with "+accept" added."""
    kind: bool | str = snapshots if verifier == "tree" else verifier
    if parity is not None:
        kind = f"{DELAYED}{parity}"
    return (size, f"{kind}+accept") if fused else (size, kind)


def graph_slot_key(slot: TreeSlot) -> tuple[int, bool | str]:
    """:func:`slot_key` of a slot the graphed target made."""
    return slot_key(slot.size, slot.snapshots, slot.verifier, slot.parity, slot.accept_fused)


# the graphs of a slot: keys (name, *slot_key, ...)
SLOT_GRAPHS = ("verify", "commit", "greedy", "accept", "fused_greedy", "fused_accept")


def reads_stash(key: tuple[Any, ...]) -> bool:
    """Whether the graph of ``key`` reads or writes the delayed commit's stashes (a delayed slot's
    graphs and the flushes)."""
    return key[0] == "flush" or (len(key) > 2 and str(key[2]).startswith(DELAYED))


class GraphedTarget:
    """A HybridLM behind the static decoder: ``prefill``, ``verify``, ``commit`` as HybridLM's, plus the
    attributes drafters read (``config``, ``device``, ``dtype``, ``model``, ``lm_head``)."""

    def __init__(
        self,
        hybrid: HybridLM,
        max_len: int | None = None,
        max_nodes: int = MAX_TREE_NODES,
        graphs: bool | None = None,
        gemv: bool | None = None,
        stacked_commit: bool = False,
    ) -> None:
        """``stacked_commit``: the decoder's GDN states, factors and conv histories in stacked buffers, its
        closed-form commit of all GDN layers in one launch (:class:`~repro.models.static.StaticDecoder`)."""
        self.hybrid = hybrid
        self.stacked_commit = stacked_commit
        self.config = hybrid.config
        self.model = hybrid.model
        self.lm_head = hybrid.lm_head
        context = hybrid.config.max_position_embeddings or DEFAULT_MAX_LEN
        self.max_len = max_len or min(context, DEFAULT_MAX_LEN)
        self.max_nodes = max_nodes
        self.graphs = hybrid.device.type == "cuda" if graphs is None else graphs
        if self.graphs and hybrid.device.type != "cuda":
            raise ConfigError("CUDA graphs need a CUDA device: the graphed engine runs eagerly elsewhere")
        gdn = [layer.linear_attn for layer in hybrid.model.layers if layer.layer_type == "linear_attention"]
        self.kernel = gdn[0].backend if gdn else None
        # decode matmuls on the tuned GEMV kernels (repro.gdn.triton_linear) in half precision, where greedy
        # speculation is not exact anyway (float32 keeps cuBLAS: the GPU tests' float32 routes match AR):
        # faster than cuBLAS at every width measured on the H200 (results/2026-12-01-h200-verify-glue,
        # bench-model: GDN-1.3B 1159 vs 1465 us a decode step, Qwen3.6-27B 14.7 vs 15.7 ms). The fused decode
        # layer kernel and the row-tiled verify linears only at small widths (<= 1024: the tiny family's
        # decode 140 us, verify(33) 279 vs 324 us), where launches dominate; at 2048 they lose to the
        # separate decode core (2465 vs 1159 us) and to cuBLAS (verify(64) 4654 vs 2206 us).
        half = hybrid.dtype in (torch.bfloat16, torch.float16)
        self.gemv = (self.graphs and self.kernel == "triton" and half) if gemv is None else gemv
        self.capture: tuple[int, ...] = ()
        self.epoch = 0
        self.captures = 0  # graphs captured so far
        self.tickets = 0  # delayed verifications so far
        self.stream = generation_stream(self.device)  # the stream the graphs replay on (read_back waits)
        self._build(self.max_len)

    @property
    def device(self) -> torch.device:
        return self.hybrid.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hybrid.dtype

    def _build(self, max_len: int) -> None:
        self.max_len = max_len
        fuse = self.gemv and self.config.hidden_size <= SMALL_WIDTH
        self.decoder = StaticDecoder(
            self.hybrid, max_len, self.max_nodes, kernel=self.kernel, gemv=self.gemv, fuse_decode=fuse,
            fuse_verify=fuse, stacked_commit=self.stacked_commit,
        )  # fmt: skip
        # wider models: decode attention on the tree kernel (27B shape: 14884 -> 13940 us/token,
        # results/2026-12-01-h200-kernels-5)
        self.decoder.tree_attention_decode = self.gemv and not fuse and self.decoder.fuse_tree_attention
        self._slots: dict[tuple[int, bool | str], TreeSlot] = {}
        self._calls: dict[tuple[Any, ...], Any] = {}
        self._picks = torch.zeros(AR_GROUP, dtype=torch.long, device=self.device)  # greedy AR's picks
        self._pending: int | None = None  # the stash holding a pending delayed commit (host-side)
        self._result_hosts: dict[int, deque[torch.Tensor]] = {}  # per result length: host buffers in turn
        # HOST_WRITES: the stores' tag counter on the device and its mirror on the host (the last tag stored),
        # their host rows per result length (slot_kernels.TAG_ROWS), a capture's warm-up calls' stand-ins on
        # the device, and the last stored result (its address, length, host row, HostWrite) until _copy_out
        # takes it
        self._tags = torch.zeros(1, dtype=torch.long, device=self.device)
        self._tag = 0
        self._store_rows: dict[int, torch.Tensor] = {}
        self._warm_rows: dict[int, torch.Tensor] = {}
        self._warm_tags = torch.zeros(1, dtype=torch.long, device=self.device)
        self._warming = False
        self._landed: tuple[int, int, torch.Tensor, HostWrite] | None = None
        self._parity = 0  # the parity of the next delayed verification

    # ------------------------------------------------------------------------------ graphs

    def _call(
        self, key: tuple[Any, ...], fn: Callable[[], Any], mutates: bool, result: torch.Tensor | None = None
    ) -> Any:
        """The graph of ``fn`` (captured on first use; ``mutates``: the warm-up calls' writes to the
        state are undone), or ``fn`` itself without graphs. ``result``: the step's result the host reads,
        stored by the graph itself with :data:`HOST_WRITES` (:meth:`_store`; each call notes its tag)."""
        call = self._calls.get(key)
        if call is None:
            if self.graphs and key[0] != "flush":
                self.flush()  # warm-ups may write the stashes: nothing may be pending in them
            stores = result is not None and self._host_writes
            body = self._storing(fn, result) if stores else fn
            self._warming = self.graphs
            try:
                with self._preserved() if mutates and self.graphs else contextlib.nullcontext():
                    call = graph_call(body, self.device, self.graphs)
            finally:
                self._warming = False
            self.captures += int(self.graphs)
            call = self._calls[key] = self._noting(call, result) if stores else call
        return call

    def _storing(self, fn: Callable[[], Any], result: torch.Tensor) -> Callable[[], Any]:
        """``fn``, then ``result`` into its pinned host rows by the tagged stores (:meth:`_store`)."""

        def body() -> Any:
            out = fn()
            self._store(result)
            return out

        return body

    def _noting(self, call: Callable[[], Any], result: torch.Tensor) -> Callable[[], Any]:
        """``call`` (a graph storing ``result``), then the host's mirror of the device's tag moved on in step
        and the store noted for :meth:`_copy_out`."""
        from repro.models.slot_kernels import TAG_ROWS, next_tag

        n = result.numel()

        def noted() -> Any:
            out = call()
            self._tag = next_tag(self._tag)
            self._landed = (result.data_ptr(), n, self._rows(n)[self._tag % TAG_ROWS], HostWrite(self._tag))
            return out

        return noted

    def _rows(self, n: int) -> torch.Tensor:
        """The pinned host rows [TAG_ROWS, n] the stores of results of ``n`` elements take in turn."""
        from repro.models.slot_kernels import TAG_ROWS

        rows = self._store_rows.get(n)
        if rows is None:
            pinned = self.device.type == "cuda"
            rows = self._store_rows[n] = torch.zeros(TAG_ROWS, n, dtype=torch.long, pin_memory=pinned)
        return rows

    def _store(self, result: torch.Tensor) -> None:
        """``result`` into its host rows by :func:`~repro.models.slot_kernels.tagged_to_host` (the tag from
        the device counter): the last launch of a storing graph. A capture's warm-up calls (real calls, on
        a side stream, while a launched step's result may still be unread on the host) store into device
        stand-ins with a counter of their own, so that neither the rows nor the tags move."""
        from repro.models.slot_kernels import TAG_ROWS, tagged_to_host

        n = result.numel()
        if self._warming and not torch.cuda.is_current_stream_capturing():
            rows = self._warm_rows.get(n)
            if rows is None:
                rows = self._warm_rows[n] = torch.zeros(TAG_ROWS, n, dtype=torch.long, device=self.device)
            tagged_to_host(result, rows, self._warm_tags)
        else:
            tagged_to_host(result, self._rows(n), self._tags)

    @contextlib.contextmanager
    def _preserved(self) -> Iterator[None]:
        """Restore every state buffer of the decoder on exit."""
        dec = self.decoder
        # greedy AR's graphs read the token or the last pick and write both (the warm-ups must not leave
        # theirs behind for the first replay)
        tensors = [dec.length, dec.token, dec.pick, self._picks] + [stash.node for stash in dec.pending_sets]
        for buf in dec.buffers:
            tensors += [buf.recurrent, buf.conv] if isinstance(buf, GDNBuffers) else [buf.keys, buf.values]
        saved = [t.clone() for t in tensors]
        try:
            yield
        finally:
            for t, s in zip(tensors, saved):
                t.copy_(s)

    def _slot(
        self,
        size: int,
        snapshots: bool,
        capture: tuple[int, ...],
        verifier: str = "tree",
        parity: int | None = None,
        fused: bool = False,
    ) -> TreeSlot:
        """The slot of ``size`` nodes for ``verifier`` (``parity``: a delayed-commit slot; ``fused``: one of
        the fused verify + acceptance graphs, never shared with the separate graphs, whose acceptance reads
        what its own verify graph wrote); slots keep the union of the layers ever asked for, and one made
        for fewer is made again (its graphs with it)."""
        self.capture = tuple(sorted(set(self.capture) | set(capture)))
        key = slot_key(size, snapshots, verifier, parity, fused)
        if parity is not None:
            self._stashes(size)
        slot = self._slots.get(key)
        if slot is None or slot.capture != self.capture:
            if verifier == "chain":
                slot = ChainSlot(self.decoder, size, capture=self.capture, derive=True)
            else:
                slot = TreeSlot(
                    self.decoder, size, snapshots=snapshots, capture=self.capture, derive=True, parity=parity
                )
            slot.accept_fused = fused
            self._slots[key] = slot
            # its graphs go with it (not greedy AR's, whose keys ("ar", size, first) look alike)
            self._calls = {
                k: v for k, v in self._calls.items() if not (k[0] in SLOT_GRAPHS and k[1:3] == key)
            }
        return slot

    def _stashes(self, size: int) -> None:
        """The delayed commit's stashes for slots of ``size`` nodes (at least 64 rows: few regrowths);
        made again larger when needed (a pending commit flushed first), their graphs with them."""
        if self.decoder.ensure_pending(min(self.max_nodes, max(size, 64))):
            self._pending = None  # ensure_pending flushed it
            self._calls = {k: v for k, v in self._calls.items() if not reads_stash(k)}

    def _verify_call(self, slot: TreeSlot) -> Any:
        key = ("verify", *graph_slot_key(slot))
        # a delayed verification folds the pending commit into the states: it mutates them
        return self._call(key, lambda: self.decoder.verify(slot), slot.parity is not None)

    def _commit_call(self, slot: TreeSlot, strategy: str) -> Any:
        key = ("commit", *graph_slot_key(slot), strategy)
        return self._call(key, lambda: self.decoder.commit(slot, strategy), True)

    def _flush_call(self, parity: int) -> Any:
        return self._call(("flush", parity), lambda: self.decoder.flush(parity), True)

    def flush(self) -> None:
        """Fold a pending delayed commit into the GDN states now (one graph); nothing to do without one.
        Every reader of the states but a delayed verification needs it first (the module docstring)."""
        if self._pending is not None:
            parity, self._pending = self._pending, None
            self._flush_call(parity)()

    def _accept_and_commit(self, slot: TreeSlot, strategy: str, accept: DeviceAccept | None) -> None:
        """``accept(slot, length)`` (a device acceptance writing ``slot.node`` and ``slot.bonus``, given the
        decoder's committed length before the root; None: the greedy one), the accepted path into
        ``slot.result`` and the commit: the body of the acceptance graphs."""
        if accept is None:
            self.decoder.accept(slot)
        else:
            accept(slot, self.decoder.length)
        self.decoder.accepted_path(slot)
        self.decoder.commit(slot, strategy)

    def _accept_call(
        self, slot: TreeSlot, strategy: str, accept: DeviceAccept | None = None, key: tuple = ()
    ) -> Any:
        """:meth:`_accept_and_commit` as one graph per (slot, strategy, ``key``)."""

        def step() -> None:
            self._accept_and_commit(slot, strategy, accept)

        name = "greedy" if accept is None else "accept"
        return self._call((name, *graph_slot_key(slot), strategy, *key), step, True, slot.result)

    def _fused_call(
        self, slot: TreeSlot, strategy: str, accept: DeviceAccept | None = None, key: tuple = ()
    ) -> Any:
        """The slot's verify, then :meth:`_accept_and_commit`, as one graph per (fused slot, strategy,
        ``key``); it returns the verify's logits."""

        def step() -> torch.Tensor:
            logits = self.decoder.verify(slot)
            self._accept_and_commit(slot, strategy, accept)
            return logits

        name = "fused_greedy" if accept is None else "fused_accept"
        return self._call((name, *graph_slot_key(slot), strategy, *key), step, True, slot.result)

    def _decode_call(self) -> Any:
        return self._call(("decode",), self.decoder.decode_pick, True)

    @property
    def ar_group(self) -> int:
        """Greedy AR's decode steps a graph: :data:`AR_GROUP` up to :data:`SMALL_WIDTH`, else 1."""
        return AR_GROUP if self.config.hidden_size <= SMALL_WIDTH else 1

    def _ar_call(self, size: int, first: bool, picker: DevicePicker | None = None) -> Any:
        """``size`` AR decode steps in one graph, their picks into ``self._picks[:size]``: the first on
        ``decoder.token`` (``first``: the host set it) or on the previous step's pick, each later one on its
        predecessor's pick (device to device). A pick is the argmax, or ``picker.pick(logits, length)`` (a
        sampled pick from the step's logits and the committed length after it: sample_match's device twin,
        :meth:`repro.decoding.device_acceptance.DeviceRule.pick`)."""
        dec = self.decoder
        assert size <= AR_GROUP

        def ar_steps() -> torch.Tensor:
            for i in range(size):
                if i > 0 or not first:
                    dec.token.copy_(dec.pick)
                logits = dec.decode_pick()
                if picker is not None:
                    dec.pick.copy_(picker.pick(logits, dec.length))
                self._picks[i : i + 1].copy_(dec.pick)
            return self._picks

        key = picker.graph_key if picker is not None else ()
        return self._call(("ar", size, first, *key), ar_steps, True, self._picks[:size])

    def prepare(
        self,
        strategies: tuple[str, ...] = ("closed_form",),
        capture: tuple[int, ...] = (),
        max_size: int = 256,
        chain: bool = False,
        loop: str | None = None,
    ) -> None:
        """Capture ahead the decode graphs (greedy AR's too) and every slot's step graphs up to ``max_size``
        nodes for ``strategies`` (tree slots) and, with ``chain``, the chain slots of fla_sd's chain verifier
        (commit ``replay``), so that no capture or compile lands in a timed decode; nothing to do without
        graphs. ``loop``: the step graphs of that decode loop only (:meth:`_prepare_steps`)."""
        if not self.graphs:
            return
        self._decode_call()
        for size in dict.fromkeys((self.ar_group, 1)):
            self._ar_call(size, True)
            self._ar_call(size, False)
        self._prepare_steps(strategies, capture, max_size, chain, loop, commits=True)
        if DELAYED in strategies:
            self._flush_call(0)
            self._flush_call(1)

    def _prepare_steps(
        self,
        strategies: tuple[str, ...],
        capture: tuple[int, ...],
        max_size: int,
        chain: bool,
        loop: str | None,
        accept: DeviceAccept | None = None,
        key: tuple = (),
        commits: bool = False,
    ) -> None:
        """The slots' step graphs of a decode ``loop`` (:func:`repro.decoding.engine.decode_loop`; None:
        every loop's), the acceptance's with ``accept`` and ``key`` (:meth:`_accept_call`): ``"host"`` (a
        host acceptance) replays verify and, with ``commits``, commit graphs; ``"stepwise"`` (a device
        acceptance) verify and acceptance + commit graphs; ``"pipelined"`` with :data:`FUSE_ACCEPT` the
        fused verify + acceptance + commit graphs, without it the stepwise loop's."""
        if loop not in (None, "host", "stepwise", "pipelined"):
            raise ValueError(f"no step graphs for the decode loop {loop!r}")
        if loop != "pipelined" or not FUSE_ACCEPT:
            for slot, strategy in self._prepared_slots(strategies, capture, max_size, chain):
                if commits and loop in (None, "host"):
                    self._commit_call(slot, strategy)
                if loop != "host":
                    self._accept_call(slot, strategy, accept, key)
        if FUSE_ACCEPT and loop in (None, "pipelined"):
            for slot, strategy in self._prepared_slots(strategies, capture, max_size, chain, fused=True):
                self._fused_call(slot, strategy, accept, key)

    def _prepared_slots(
        self,
        strategies: tuple[str, ...],
        capture: tuple[int, ...],
        max_size: int,
        chain: bool,
        fused: bool = False,
    ) -> Iterator[tuple[TreeSlot, str]]:
        """Every slot (both parities of a delayed one) up to ``max_size`` nodes for ``strategies`` and,
        with ``chain``, the chain slots, each after its verify graph ran once (``fused``: the fused
        graphs' slots, which have no verify graph of their own); pending commits flushed."""
        self.flush()  # the delayed slots' verifications below would write a pending commit's stash
        slots = [(strategy, "tree") for strategy in dict.fromkeys(strategies)]
        largest = min(max_size, self.max_nodes)
        for strategy, verifier in slots + ([("replay", "chain")] if chain else []):
            check_static_strategy(strategy)
            parities: tuple[int | None, ...] = (0, 1) if strategy == DELAYED else (None,)
            if strategy == DELAYED:
                self._stashes(largest)  # before any of their graphs: the stashes stay
            for size in SLOT_SIZES:
                if size > largest:
                    break
                for parity in parities:
                    slot = self._slot(size, strategy == "snapshot", capture, verifier, parity, fused)
                    if not fused:
                        self._verify_call(slot)()
                    yield slot, strategy

    def prepare_picker(self, picker: DevicePicker) -> None:
        """:meth:`prepare` for sampled AR with ``picker``: its group graphs, captured ahead."""
        if not self.graphs:
            return
        for size in dict.fromkeys((self.ar_group, 1)):
            self._ar_call(size, True, picker)
            self._ar_call(size, False, picker)

    def prepare_accept(
        self,
        accept: DeviceAccept,
        key: tuple,
        strategies: tuple[str, ...] = ("closed_form",),
        max_size: int = 256,
        chain: bool = False,
        loop: str | None = None,
    ) -> None:
        """:meth:`prepare` for the graphs of :meth:`commit_accepted` with ``accept`` and ``key``, on the
        slots :meth:`prepare` made (call it first, with the same strategies and captured layers)."""
        if self.graphs:
            self._prepare_steps(strategies, (), max_size, chain, loop, accept, key)

    # --------------------------------------------------------------------------- the API

    def empty_state(self) -> GraphedState:
        self._loaded(self.hybrid.empty_state())
        return GraphedState(0, [], self.epoch, self.hybrid.empty_state())

    def _loaded(self, state: ModelState, need: int = 0, new_epoch: bool = True) -> None:
        """Load ``state`` into the decoder, first growing its buffers (doubling ``max_len``; graphs are
        captured again on first use) when it or ``need`` positions do not fit; ``new_epoch``: earlier
        handles become stale (not when the same state is moved into larger buffers)."""
        size = self.max_len
        while size < max(state.position, need):
            size *= 2
        if size != self.max_len:
            self._build(size)
        self.decoder.load(state)  # drops a pending delayed commit (of the state it replaces)
        self._pending = None
        self.epoch += new_epoch

    def _check(self, state: GraphedState) -> None:
        if not isinstance(state, GraphedState) or state.epoch != self.epoch:
            raise ValueError(
                "stale state: the graphed target holds one sequence; use the state the last prefill or "
                "commit returned"
            )

    @torch.no_grad()
    def prefill(
        self,
        token_ids: list[int] | torch.Tensor,
        state: GraphedState | None = None,
        capture: tuple[int, ...] = (),
        strategy: str = "closed_form",
    ) -> tuple[GraphedState, Verification]:
        """HybridLM's prefill (eager), continuing ``state`` (None: a fresh sequence), then the state
        loaded into the decoder. Returns the new handle and the eager verification of the last chunk."""
        eager = None
        if state is not None:
            self._check(state)
            eager = state.eager if state.eager is not None else self._exported(state)
        eager_strategy = "closed_form" if strategy == DELAYED else strategy  # HybridLM's equivalent
        new, ver = self.hybrid.prefill(token_ids, eager, capture, eager_strategy)
        self._loaded(new)
        return GraphedState(new.position, list(new.committed_tokens), self.epoch, new), ver

    def _exported(self, state: GraphedState) -> ModelState:
        self.flush()
        out = self.decoder.export()
        out.committed_tokens = list(state.committed_tokens)
        return out

    @torch.no_grad()
    def verify(
        self,
        state: GraphedState,
        tree: Tree | DeviceTree,
        capture: tuple[int, ...] = (),
        strategy: str = "closed_form",
        verifier: str = "tree",
        then: tuple[DeviceAccept | None, tuple] | None = None,
    ) -> GraphedVerification:
        """Logits of every tree node given the committed state (see the module docstring for the
        one-node tree that the decode step folds in at once); ``verifier="chain"``: a chain on a chain
        slot, committed by ``replay``. A device tree's depth is unknown on the host: its size bounds the
        positions it may take. ``then`` = (accept, key): the device acceptance :meth:`launch_accepted` will
        run next; with :data:`FUSE_ACCEPT` a device tree's verification runs it (and the commit) in the same
        graph, and ``launch_accepted`` only reads."""
        check_static_strategy(strategy)
        check_chain_verifier(verifier, strategy, tree)
        self._check(state)
        on_device = isinstance(tree, DeviceTree)
        deepest = tree.size if on_device or tree.size == 1 else int(tree.depth.max())
        need = state.position + deepest
        if need > self.max_len:
            self._loaded(self._exported(state), need, new_epoch=False)
        delayed = strategy == DELAYED and verifier == "tree"
        if tree.size == 1 and not capture and not on_device:
            self.flush()
            self.decoder.set_token(int(tree.tokens[0]))
            logits = self._decode_call()()
            self.epoch += 1  # the node is folded in: the state handle is consumed
            return GraphedVerification(
                tree, logits, {}, [], state.position, strategy, slot=None, epoch=self.epoch
            )
        if not delayed:
            self.flush()
        size = slot_size(tree.size, self.max_nodes)
        fused = FUSE_ACCEPT and then is not None and on_device
        parity = self._parity if delayed else None
        slot = self._slot(size, strategy == "snapshot", capture, verifier, parity, fused)
        if on_device:
            slot.set_device_tree(tree)
        else:
            slot.set_tree(tree, pad=True)
        call = (
            self._fused_call(slot, strategy, *then) if fused and then is not None else self._verify_call(slot)
        )
        ticket = 0
        if delayed:  # the call folds the pending commit in (or finds none: flushed at its capture)
            self._pending = None
            self.tickets += 1
            ticket = self.tickets
        logits = call()
        n = tree.size
        hidden = {i: slot.hidden[i][:n] for i in capture}
        return GraphedVerification(
            tree, logits[:n], hidden, [], state.position, strategy,
            slot=slot, epoch=self.epoch, ticket=ticket, accepted=then if fused else None,
        )  # fmt: skip

    def _delayed_commit(self, verification: GraphedVerification) -> bool:
        """Whether ``verification`` commits by ``delayed`` (then it must be the latest delayed one: its
        factors are in its stash until the next verification of its parity)."""
        if verification.strategy != DELAYED or verification.slot is None:
            return False
        if verification.ticket != self.tickets:
            raise ValueError("a delayed verification is committed before the next one: commit the latest")
        return True

    def _delayed_done(self, slot: TreeSlot) -> None:
        """After a delayed commit on ``slot``: its stash is pending; the next verification takes the other
        parity."""
        assert slot.parity is not None
        self._pending, self._parity = slot.parity, 1 - slot.parity

    @torch.no_grad()
    def commit(self, state: GraphedState, verification: Verification, path: list[int]) -> GraphedState:
        """The handle of the state with the accepted path (root-level node first) folded in."""
        if not isinstance(verification, GraphedVerification) or verification.position != state.position:
            raise ValueError("verification was computed against a different state")
        tree, path = verification.tree, list(path)
        if verification.slot is None:  # the decode step folded the one node in at verify
            if path != [0] or verification.epoch != self.epoch:
                raise ValueError(
                    "a one-node verification of the graphed target is folded in at verify: commit it once, "
                    f"with the path [0] (got {path})"
                )
        else:
            self._check(state)
            if verification.epoch != self.epoch:
                raise ValueError("verification was computed against a different state")
            if not path:
                return state
            slot = verification.slot
            if isinstance(tree, DeviceTree):
                raise ValueError("a device tree's verification is committed on the device: commit_greedy")
            delayed = self._delayed_commit(verification)
            slot.set_accepted(path)
            self._commit_call(slot, verification.strategy)()
            if delayed:
                self._delayed_done(slot)
            self.epoch += 1
        tokens = tree.tokens[path].tolist()
        return GraphedState(state.position + len(path), state.committed_tokens + tokens, self.epoch)

    @torch.no_grad()
    def greedy_decode(
        self,
        state: GraphedState,
        token: int,
        steps: int,
        done: Callable[[int], bool],
        mark: Callable[[], None] = lambda: None,
        picker: DevicePicker | None = None,
    ) -> tuple[GraphedState, list[int]]:
        """Greedy AR (``picker``: sampled AR, its picks on the device, :meth:`_ar_call`) from ``token`` (not
        yet folded in) for at most ``steps`` decode steps, in groups of
        :attr:`ar_group` steps a graph (single steps for the tail) and one group ahead: group j + 1 (its
        first token the argmax group j's last step wrote on the device) is launched before group j's
        tokens are read, one read a group, so the device waits for the host neither between the steps of
        a group nor between groups. Stops after the first token for which ``done`` holds. Returns the
        handle and the picked tokens (as ``commit_greedy``'s bonus tokens one step at a time would give
        them). At a stop the groups launched past it have folded in more tokens (at most 2 ar_group - 1):
        the handle's ``position`` and ``committed_tokens`` count them, the sequence must end there.
        ``mark`` is called at every stage boundary of a group (the engine's
        :class:`~repro.decoding.engine.StageClock`; 5 per group, the group's graph between the third and
        the fourth, the picks' copy between the fourth and fifth)."""
        self._check(state)
        if steps < 1:
            return state, []
        self.flush()  # a decode step reads the states
        need = state.position + steps + 1
        if need > self.max_len:
            self._loaded(self._exported(state), need, new_epoch=False)
        dec = self.decoder
        # the groups launched and not read: (where its picks reach the host, what read_back waits for)
        groups: list[tuple[torch.Tensor, Any]] = []
        dec.set_token(token)
        group = self.ar_group
        picks: list[int] = []  # the picks of the groups read
        picked: list[int] = []  # those up to a stop
        folded = 0
        stopped = False
        while not stopped and (folded < steps or groups):
            if folded < steps:  # launch the next group
                size = group if steps - folded >= group else 1
                mark(), mark(), mark()
                self._ar_call(size, folded == 0, picker)()
                mark()
                groups.append(self._copy_out(self._picks[:size]))
                mark()
                folded += size
                if len(groups) < 2 and folded < steps:
                    continue  # one group ahead before the first read
            read = read_back(*groups.pop(0))  # the oldest group, which the next one runs behind
            picks += read
            for tok in read:
                picked.append(tok)
                if done(tok):
                    stopped = True
                    break
        for launched in groups:  # launched past a stop: folded in, their tokens committed
            picks += read_back(*launched)
        self.epoch += 1
        tokens = [token, *picks[: folded - 1]]
        return GraphedState(state.position + folded, state.committed_tokens + tokens, self.epoch), picked

    @torch.no_grad()
    def commit_greedy(
        self, state: GraphedState, verification: Verification
    ) -> tuple[GraphedState, list[int], list[int], int]:
        """Greedy acceptance and commit on the device, then one read (:func:`read_back`): the handle of
        the new state, the accepted path (root first), its tokens and the bonus token; the path and
        bonus are :class:`repro.decoding.acceptance.TargetMatch`'s at temperature 0."""
        if not isinstance(verification, GraphedVerification) or verification.position != state.position:
            raise ValueError("verification was computed against a different state")
        if verification.slot is not None:
            return self.commit_accepted(state, verification)
        if verification.epoch != self.epoch:
            raise ValueError("verification was computed against a different state")
        tree = verification.tree  # the decode step folded the root in and wrote its argmax
        assert isinstance(tree, Tree)
        path, tokens = [0], tree.tokens.tolist()
        bonus = read_back(*self._copy_out(self.decoder.pick))[0]
        new = GraphedState(state.position + 1, state.committed_tokens + tokens, self.epoch)
        return new, path, tokens, bonus

    @torch.no_grad()
    def commit_accepted(
        self,
        state: GraphedState,
        verification: Verification,
        accept: DeviceAccept | None = None,
        key: tuple = (),
    ) -> tuple[GraphedState, list[int], list[int], int]:
        """Acceptance on the device (``accept(slot, length)`` writes ``slot.node`` and ``slot.bonus`` from the
        slot's verify and the committed length without a host read, e.g. the sampling rules of
        :mod:`repro.decoding.device_acceptance`; None: greedy), the accepted path and the commit (a delayed
        one recorded as pending) as one graph named by ``key``, then one :func:`read_back`. Returns the new
        handle, the accepted path (root first), its tokens and the bonus."""
        step = self.launch_accepted(state, verification, accept, key)
        path, tokens, bonus = self.read_launched(step)
        new = GraphedState(state.position + len(path), state.committed_tokens + tokens, self.epoch)
        return new, path, tokens, bonus

    @torch.no_grad()
    def launch_accepted(
        self,
        state: GraphedState,
        verification: Verification,
        accept: DeviceAccept | None = None,
        key: tuple = (),
    ) -> LaunchedStep:
        """:meth:`commit_accepted` without its read: the graph is launched and the result's copy to the
        host queued behind it; :meth:`read_launched` waits for it. Until then the device result is what a
        pipelined step reads (the next drafter's inputs, the next tree's root: :class:`LaunchedStep`), and
        ``state`` stays the caller's: the step's length is known on the host only after the read."""
        if not isinstance(verification, GraphedVerification) or verification.position != state.position:
            raise ValueError("verification was computed against a different state")
        slot = verification.slot
        if slot is None or verification.epoch != self.epoch:
            raise ValueError("a device acceptance needs a slot verification of the current state")
        self._check(state)
        delayed = self._delayed_commit(verification)
        if verification.accepted is None:
            self._accept_call(slot, verification.strategy, accept, key)()
        elif verification.accepted != (accept, key):
            raise ValueError("this verification ran another device acceptance with it (verify's then=)")
        if delayed:
            self._delayed_done(slot)
        self.epoch += 1
        host, copied = self._copy_out(slot.result)
        return LaunchedStep(verification, slot.result, slot.max_depth, host, copied)

    def _copy_out(self, device: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Where ``device`` reaches the host and what :func:`read_back` waits for: the host row the last
        graph stored it into and its :class:`HostWrite` (:data:`HOST_WRITES`: :meth:`_store`), else the
        next host buffer of its length (:meth:`_result_host`), a copy queued on the stream (not waited for)
        and the CUDA event recorded behind it (None on CPU)."""
        landed, self._landed = self._landed, None
        if landed is not None and landed[:2] == (device.data_ptr(), device.numel()):
            return landed[2], landed[3]
        host = self._result_host(device)
        host.copy_(device, non_blocking=True)
        if self.device.type != "cuda":
            return host, None
        copied = torch.cuda.Event()
        copied.record(self.stream)
        return host, copied

    @property
    def _host_writes(self) -> bool:
        """Whether the step graphs captured now store their results into pinned host memory themselves
        (:data:`HOST_WRITES`, CUDA)."""
        return HOST_WRITES and self.device.type == "cuda"

    def _result_host(self, result: torch.Tensor) -> torch.Tensor:
        """The next of the host buffers (pinned on CUDA; as many as the stores' rows) for results of
        ``result``'s length, taken in turn: the copies of the steps launched after a step (an AR group) may
        land while the host still reads it."""
        from repro.models.slot_kernels import TAG_ROWS

        n = result.numel()
        ring = self._result_hosts.get(n)
        if ring is None:
            pinned = self.device.type == "cuda"
            ring = self._result_hosts[n] = deque(
                torch.zeros(n, dtype=torch.long, pin_memory=pinned) for _ in range(TAG_ROWS)
            )
        ring.rotate(-1)
        return ring[0]

    def read_launched(self, step: LaunchedStep) -> tuple[list[int], list[int], int]:
        """The launched step's accepted path (root first), its tokens and the bonus: one wait, one read."""
        got = read_back(step.host, step.copied)
        n, bonus, depth = got[0], got[1], step.depth
        return got[2 : 2 + n], got[2 + depth : 2 + depth + n], bonus

    def handle(self, position: int) -> GraphedState:
        """A handle on the current state at host ``position`` (a pipelined loop's bound on it: a launched
        step's length is not read yet; the buffers grow for what the bound says may come)."""
        return GraphedState(position, [], self.epoch)
