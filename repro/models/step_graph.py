"""One launch a decode step: a step's graph replays, copies and event records joined into one CUDA graph.

A pipelined decode step replays several captured graphs (the drafter's, the tree builder's, the verify
slot's) with a few copies and timing events between them. Each launch of its own costs the device a gap
of several microseconds (measured: 6-8 us a graph boundary, results/2026-12-04-h200-derive-rows). Inside
:func:`step_chain` that work is not launched as it is issued: :func:`repro.models.graphs.replay_graph`,
:func:`~repro.models.graphs.copy_into` and :func:`~repro.models.graphs.record_event` append it to the
open :class:`StepChain`, and closing the chain launches it as one CUDA graph, made (once per sequence) of

- a child graph node per replayed graph (a clone of the captured graph: the same kernels on the same
  buffers; :class:`~repro.models.graphs.GraphedCall` keeps its ``cudaGraph_t`` for this);
- a child graph node per copy (a captured copy, one per pair of addresses);
- an event record node per event (its event set at each launch, so the caller's timing events, e.g.
  :class:`~repro.decoding.engine.StageClock`'s marks and busy brackets, time the step as before),

in a line, each node after the one before: the order of issue. The graph is built with the CUDA driver
API (``libcuda``, through ctypes: torch exposes the captured graphs but not graph composition).

The chain is correct only if nothing else reaches the device while it is open: an eager op issued inside
it would run before the work the chain holds. Code that runs inside a step therefore either joins the
chain or calls :func:`~repro.models.graphs.flush_chain` first (a capture's warm-up calls, host uploads,
buffer growth do). :class:`ChainBreaks` counts the ops that do neither: the CPU tests run every pipelined
route under it and find none. Off CUDA, or with :data:`CHAIN` off, a chain launches everything at once as
it is issued (copies are the graphs' :class:`~repro.models.graphs.EagerCall` stand-ins).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from repro.models import graphs
from repro.models.graphs import EagerCall, GraphedCall, launches_work, tensor_address

# a pipelined step's graphs, copies and events launched as one CUDA graph (on CUDA; off: each as issued)
CHAIN = True
CACHED = 64  # step graphs kept (least recently used dropped): a route's steady state uses a few


class _Driver:
    """The CUDA driver API's graph calls (``libcuda.so.1``, ctypes). Handles are the runtime's (a
    ``cudaGraph_t`` is a ``CUgraph``)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        p, n = ctypes.c_void_p, ctypes.c_size_t
        signatures = {
            "cuGraphCreate": [ctypes.POINTER(p), ctypes.c_uint],
            "cuGraphAddChildGraphNode": [ctypes.POINTER(p), p, ctypes.POINTER(p), n, p],
            "cuGraphAddEventRecordNode": [ctypes.POINTER(p), p, ctypes.POINTER(p), n, p],
            "cuGraphInstantiateWithFlags": [ctypes.POINTER(p), p, ctypes.c_ulonglong],
            "cuGraphExecEventRecordNodeSetEvent": [p, p, p],
            "cuGraphLaunch": [p, p],
            "cuGraphExecDestroy": [p],
            "cuGraphDestroy": [p],
        }
        for name, args in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
            setattr(self, name, functools.partial(self._checked, name, fn))

    @staticmethod
    def _checked(name: str, fn: Any, *args: Any) -> None:
        rc = fn(*args)
        if rc != 0:
            raise RuntimeError(f"{name} failed: CUresult {rc}")


@functools.lru_cache(maxsize=1)
def driver() -> _Driver:
    return _Driver()


@dataclass
class _StepGraph:
    """One sequence's graph: its executable, its event record nodes (in order) and the graphs it cloned
    (held, so that their buffers outlive it)."""

    graph: ctypes.c_void_p
    exec: ctypes.c_void_p
    event_nodes: list[ctypes.c_void_p]
    held: tuple[Any, ...]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the driver may be gone
            driver().cuGraphExecDestroy(self.exec)
            driver().cuGraphDestroy(self.graph)


class StepChain:
    """The work of one step, launched at :meth:`flush` as one CUDA graph (see the module docstring).
    ``launches``: graphs launched (a single replayed graph is replayed as it is)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._work: list[tuple[str, Any]] = []  # ("graph", torch CUDAGraph) or ("event", torch Event)
        self._stream: Any = None
        self._made: OrderedDict[tuple, _StepGraph] = OrderedDict()
        self._copies: dict[tuple, GraphedCall] = {}
        self.launches = 0
        self.pending = False  # work held (off CUDA: work that CUDA would hold; run already)

    def graph(self, graph: Any) -> None:
        self.pending = True
        self._work.append(("graph", graph))

    def event(self, event: Any, stream: Any) -> None:
        self.pending = True
        if not self.cuda:
            event.record(stream)
            return
        if not event.cuda_event:  # created on its first record; the node's record follows in stream order
            event.record(stream)
        self._stream = stream
        self._work.append(("event", event))

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.pending = True
        if not self.cuda:
            EagerCall(lambda: dst.copy_(src))()
            return
        key = (tensor_address(dst), tensor_address(src))
        call = self._copies.get(key)
        if call is None:
            call = self._copies[key] = GraphedCall(lambda: dst.copy_(src, non_blocking=True), self.device, 0)
        self._work.append(("graph", call.graph))

    def flush(self) -> None:
        """Launch the held work on the current stream: one graph, made on first use of its sequence."""
        work, self._work = self._work, []
        self.pending = False
        if not work:
            return
        self.launches += 1
        if len(work) == 1 and work[0][0] == "graph":
            work[0][1].replay()
            return
        key = tuple(id(x) if kind == "graph" else kind for kind, x in work)
        made = self._made.pop(key, None) or self._make(work)
        self._made[key] = made  # most recently used last
        while len(self._made) > CACHED:
            self._made.popitem(last=False)
        cu = driver()
        events = [x for kind, x in work if kind == "event"]
        for node, event in zip(made.event_nodes, events):
            cu.cuGraphExecEventRecordNodeSetEvent(made.exec, node, ctypes.c_void_p(event.cuda_event))
        stream = self._stream if self._stream is not None else torch.cuda.current_stream(self.device)
        cu.cuGraphLaunch(made.exec, ctypes.c_void_p(stream.cuda_stream))

    def _make(self, work: list[tuple[str, Any]]) -> _StepGraph:
        cu = driver()
        graph = ctypes.c_void_p()
        cu.cuGraphCreate(ctypes.byref(graph), 0)
        last: ctypes.c_void_p | None = None
        event_nodes = []
        for kind, x in work:
            node = ctypes.c_void_p()
            deps, count = (ctypes.byref(last), 1) if last is not None else (None, 0)
            if kind == "graph":
                cu.cuGraphAddChildGraphNode(
                    ctypes.byref(node), graph, deps, count, ctypes.c_void_p(x.raw_cuda_graph())
                )
            else:
                event = ctypes.c_void_p(x.cuda_event)
                cu.cuGraphAddEventRecordNode(ctypes.byref(node), graph, deps, count, event)
                event_nodes.append(node)
            last = node
        exec_ = ctypes.c_void_p()
        cu.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, 0)
        held = tuple(x for kind, x in work if kind == "graph")
        return _StepGraph(graph, exec_, event_nodes, held)


_CHAINS: dict[torch.device, StepChain] = {}


def chain_of(device: torch.device) -> StepChain:
    """The device's step chain (one a device: its step graphs are kept across generations)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    chain = _CHAINS.get(device)
    if chain is None:
        chain = _CHAINS[device] = StepChain(device)
    return chain


@contextlib.contextmanager
def step_chain(device: torch.device) -> Iterator[StepChain | None]:
    """Join the graph replays, copies and events issued inside the block and launch them as one graph at
    its end (:data:`CHAIN` off: nothing changes; yields None)."""
    if not CHAIN:
        yield None
        return
    chain = chain_of(device)
    graphs._chains.append(chain)
    try:
        yield chain
    finally:
        graphs._chains.pop()
        chain.flush()


class ChainBreaks(TorchDispatchMode):
    """Dispatch mode: the ops that launch work while an open step chain holds work (on the CPU: would hold
    it on CUDA), outside graphed calls' stand-ins and the chain's copies, by name in ``ops``: on CUDA each
    would run before that work. ``with ChainBreaks() as b: ...``; the pipelined routes have none."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        out = func(*args, **(kwargs or {}))
        chain = graphs._chains[-1] if graphs._chains else None
        if chain is not None and chain.pending and graphs._stand_ins[0] == 0 and launches_work(func):
            name = func._schema.name
            self.ops[name] = self.ops.get(name, 0) + 1
        return out
