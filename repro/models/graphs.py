"""CUDA graphs of capture-safe callables (the steps of :class:`repro.models.static.StaticDecoder`).

A :class:`GraphedCall` runs the callable a few times on a side stream (compiles, autotuning and
cuBLAS workspaces happen there), captures one call, and then replays it on the same buffers: every
input is read from, and every output written to, the addresses that the capture saw. The warm-up
calls are real calls, so a callable that mutates state (a decode step, a commit) leaves that state
advanced: load the state again after capturing.

:class:`CaptureCheck` finds what a capture cannot take on any device, CPU included: a torch dispatch
mode that sees every aten op of a call and lists the ones that read a device value on the host
(``.item()``, ``int(t)``, ``bool(t)``, ``t[zero_dim_index]``, ``torch.equal``), whose output shape
depends on the data (``nonzero``, ``masked_select``, boolean-mask indexing, ``unique``,
``repeat_interleave`` with tensor repeats), that copy host data in (``torch.tensor(...)``) or a
device tensor out (``.cpu()``, ``.tolist()`` on CUDA). It also records the op trace (op, output
shapes), so that two calls on different data can be compared: a capturable step runs the same ops
on the same shapes whatever its inputs hold. :func:`count_ops` counts the ops of a call that launch
work (every op but views and allocations): a device-independent proxy for kernels per step.

:func:`busy_recorder` times the replays themselves: while a :class:`ReplayRecorder` is active, every
:class:`GraphedCall` replay is bracketed by two events on the recorder's stream (no sync), handed to the
recorder (the engine's :class:`~repro.decoding.engine.StageClock` sums them per stage: the graphs' busy
time). Without an active recorder a replay costs one list check.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from repro.errors import ConfigError

_HOST_DATA = ("aten::lift_fresh", "aten::lift_fresh_copy")
# ops that launch no kernel: allocations and views whose schema does not say so
_NO_KERNEL = {
    "aten::_unsafe_view", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
}  # fmt: skip


def launches_work(func: Any) -> bool:
    """Whether an aten op launches work (a kernel): every op but views and allocations."""
    return not func.is_view and func._schema.name not in _NO_KERNEL


def _bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _devices(tree: Any) -> set[str]:
    if isinstance(tree, torch.Tensor):
        return {tree.device.type}
    if isinstance(tree, (list, tuple)):
        return set().union(*(_devices(x) for x in tree)) if tree else set()
    if isinstance(tree, dict):
        return _devices(list(tree.values()))
    return set()


def hazard(func: Any, args: tuple, kwargs: dict, out: Any) -> str | None:
    """Why one aten op cannot be captured in a CUDA graph, or None."""
    name = func._schema.name
    tags = func.tags
    if torch.Tag.data_dependent_output in tags:
        return f"{name} (reads a device value on the host)"
    if name in ("aten::index", "aten::index_put", "aten::index_put_"):
        return f"{name} with a boolean mask (data-dependent shape)" if _bool_index(args) else None
    if torch.Tag.dynamic_output_shape in tags:
        return f"{name} (data-dependent output shape)"
    if name in _HOST_DATA:
        return f"{name} (host data copied in: torch.tensor inside the call)"
    if "cuda" in _devices((args, kwargs)) and "cpu" in _devices(out) and "cuda" not in _devices(out):
        return f"{name} (copies a device tensor to the host)"
    return None


def _shapes(out: Any) -> tuple:
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.dtype)
    if isinstance(out, (list, tuple)):
        return tuple(_shapes(x) for x in out)
    return ()


class CaptureCheck(TorchDispatchMode):
    """Dispatch mode: ``hazards`` (what a CUDA graph cannot capture), ``trace`` (op, output shapes) and
    ``launches`` (ops that launch work) of everything run inside it. ``with CaptureCheck() as c: fn()``."""

    def __init__(self) -> None:
        super().__init__()
        self.hazards: list[str] = []
        self.trace: list[tuple[str, tuple]] = []
        self.launches = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        why = hazard(func, args, kwargs, out)
        if why is not None:
            self.hazards.append(why)
        self.trace.append((func._schema.name, _shapes(out)))
        if launches_work(func):
            self.launches += 1
        return out


def check_capture(fn: Callable[[], Any]) -> CaptureCheck:
    """Run ``fn`` once (eagerly, any device) under a :class:`CaptureCheck` and return the check."""
    with CaptureCheck() as check:
        fn()
    return check


_stand_ins = [0]  # EagerCall calls running now (their ops would be a graph's on CUDA)


class EagerCall:
    """:class:`GraphedCall`'s interface without a graph (CPU, or graphs off): calling it runs ``fn``.
    Its ops are the ones a graph would replay: :class:`HostLaunches` does not count them."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __call__(self) -> Any:
        _stand_ins[0] += 1
        try:
            return self.fn()
        finally:
            _stand_ins[0] -= 1

    def replay(self) -> None:
        self()


class HostLaunches(TorchDispatchMode):
    """Dispatch mode: the ops that launch work *outside* graphed calls (an :class:`EagerCall` standing in
    for a :class:`GraphedCall` on the CPU), by name: on CUDA each is a launch of its own from the host,
    between the graphs (``with HostLaunches() as h: ...``; ``h.total``, ``h.ops``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        out = func(*args, **(kwargs or {}))
        if _stand_ins[0] == 0 and launches_work(func):
            self.ops[func._schema.name] += 1
        return out


def graph_call(fn: Callable[[], Any], device: torch.device, graphs: bool) -> GraphedCall | EagerCall:
    """A :class:`GraphedCall` of ``fn`` with ``graphs``, else its :class:`EagerCall` stand-in."""
    return GraphedCall(fn, device) if graphs else EagerCall(fn)


def count_ops(fn: Callable[[], Any]) -> int:
    """Aten ops of one call of ``fn`` that launch work (views and allocations excluded)."""
    return check_capture(fn).launches


def tensor_address(t: torch.Tensor) -> tuple[Any, ...]:
    """What a graph that reads ``t`` in place depends on: a graph captured on a tensor with the same
    address reads this one."""
    return t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device


def generation_stream(device: torch.device) -> Any:
    """The CUDA stream current on ``device`` now (None off CUDA), for what records events on it or waits
    for it every step: resolved once, since ``Event.record()`` and ``current_stream()`` look it up
    through torch's Python on every call (~10 us of host time each, a dozen times a decode step). The
    holder assumes what the engine does: a generation runs on one stream, the one current when it was
    made."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


class ReplayRecorder(Protocol):
    """What :func:`busy_recorder` hands the replays to. ``stream``: the stream its events are recorded
    on, the one the replays run on (:func:`generation_stream`)."""

    stream: Any
    recording: bool  # whether replays now get events (a sampling recorder's unsampled steps: no)

    def event(self) -> Any:
        """A timing event to record (``record()``, later ``query()``/``synchronize()``/``elapsed_time``)."""

    def replayed(self, start: Any, end: Any) -> None:
        """One replay ran between ``start`` and ``end`` (both recorded, maybe not yet done)."""


_recorders: list[ReplayRecorder] = []  # the active recorders; the innermost (last) gets the replays


@contextlib.contextmanager
def busy_recorder(recorder: ReplayRecorder) -> Iterator[ReplayRecorder]:
    """Hand every :class:`GraphedCall` replay inside the block to ``recorder`` (the innermost one when
    nested): an event recorded on its stream just before the replay and one just after."""
    _recorders.append(recorder)
    try:
        yield recorder
    finally:
        _recorders.remove(recorder)


def replay_graph(graph: Any) -> None:
    """``graph.replay()``, bracketed by a recorder's events when one is active (:func:`busy_recorder`)."""
    recorder = _recorders[-1] if _recorders else None
    if recorder is None or not recorder.recording:
        graph.replay()
        return
    start, end = recorder.event(), recorder.event()
    start.record(recorder.stream)
    graph.replay()
    end.record(recorder.stream)
    recorder.replayed(start, end)


_captured = [0]  # CUDA graphs captured in this process so far
# the side stream of the captures' warm-up calls, one per device: cuBLAS keeps a workspace (32 MiB on Hopper)
# for every stream it has run on until the process ends, so a new stream a capture (torch's pool hands out 32
# in turn) could leave up to 1 GiB allocated. The probe of results/2026-12-05-h100-scale-rows saw 32-96 MiB
# more after each tiny scale shape, in 32 MiB steps; scripts/gpu/memory-probe.py tells whether that was all
_WARMUP_STREAMS: dict[torch.device, Any] = {}


def graphs_captured() -> int:
    """How many :class:`GraphedCall` graphs this process has captured so far (the engine subtracts two
    readings to count the captures inside a timed decode: their warm-ups and capture are in its time)."""
    return _captured[0]


class GraphedCall:
    """One CUDA graph of ``fn``; calling the object replays it and returns what the capture returned.

    A failed capture is re-raised with what :class:`CaptureCheck` finds in an eager call of ``fn``.
    """

    def __init__(self, fn: Callable[[], Any], device: torch.device, warmup: int = 2) -> None:
        self.graph, self.output = self._capture(fn, device, warmup)
        _captured[0] += 1

    @staticmethod
    def _capture(fn: Callable[[], Any], device: torch.device, warmup: int) -> tuple[Any, Any]:
        """``warmup`` calls of ``fn`` on the device's warm-up stream, then its capture: (the graph, its
        output)."""
        if device.type != "cuda":
            raise ConfigError("CUDA graphs need a CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        stream = _WARMUP_STREAMS.get(device)
        if stream is None:
            stream = _WARMUP_STREAMS[device] = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                output = fn()
        except Exception as exc:
            raise RuntimeError(f"CUDA graph capture failed: {diagnose(fn)}") from exc
        torch.cuda.synchronize(device)
        return graph, output

    def replay(self) -> None:
        replay_graph(self.graph)

    def __call__(self) -> Any:
        replay_graph(self.graph)
        return self.output


def diagnose(fn: Callable[[], Any]) -> str:
    """What an eager call of ``fn`` does that a capture cannot (best effort: the device may be broken)."""
    try:
        found = check_capture(fn).hazards
    except Exception as exc:  # noqa: BLE001 - the diagnosis is a hint; the capture error is chained
        return f"(the eager re-run for a diagnosis failed too: {type(exc).__name__})"
    if not found:
        return "no host read or data-dependent shape found in an eager call"
    return "not capture-safe: " + ", ".join(dict.fromkeys(found))


class HostUploads:
    """Host ints to the device without a blocking copy: non-blocking copies from a ring of pinned host
    buffers used in turn, one rewritten only after its last copy ran (CUDA events; a wait happens only
    when ``ring`` uploads are still queued). On CPU: plain copies from ordinary buffers."""

    def __init__(self, device: torch.device, ring: int = 4) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = generation_stream(device)
        self._host: list[torch.Tensor | None] = [None] * ring
        self._copied: list[Any] = [None] * ring  # a CUDA event per host buffer, once it has been copied
        self._turn = 0

    def put(self, values: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """``values`` as int64 on the device: into ``out[:len(values)]`` when given, else a new tensor."""
        n = len(values)
        i, self._turn = self._turn, (self._turn + 1) % len(self._host)
        done = self._copied[i]
        if done is not None and not done.query():
            done.synchronize()  # the copy of `ring` uploads ago has not run yet
        host = self._host[i]
        if host is None or host.numel() < n:
            host = self._host[i] = torch.zeros(max(n, 16), dtype=torch.long, pin_memory=self.cuda)
        host.numpy()[:n] = values
        dst = torch.empty(n, dtype=torch.long, device=self.device) if out is None else out[:n]
        dst.copy_(host[:n], non_blocking=self.cuda)
        if self.cuda:
            if done is None:
                done = self._copied[i] = torch.cuda.Event()
            done.record(self.stream)
        return dst if out is None else out
