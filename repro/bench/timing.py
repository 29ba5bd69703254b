"""Median timing of a callable, CUDA-graph replay timing, and the device's measured ceilings.

On CUDA: :func:`triton.testing.do_bench` (device events around every call, L2 flushed before
each, median) and replays of a captured CUDA graph that calls the function over several input
sets in turn (so that the replays do not just re-read L2). On CPU a perf_counter loop stands in
so that the plumbing can be tested; its numbers mean nothing for the GPU. Each median comes with what
it is the median of (:class:`Timed`: n samples of ``calls`` calls each), which the bench records keep.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from repro.errors import ConfigError

Fn = Callable[[], object]


@dataclass(frozen=True)
class TimerConfig:
    """Milliseconds of warm-up and of timed repetitions (do_bench's units), graph replays."""

    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    graph_replays: int = 5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.warmup_ms) and self.warmup_ms >= 0):
            raise ConfigError(f"warm-up must be a finite number of ms >= 0, got {self.warmup_ms}")
        if not (math.isfinite(self.rep_ms) and self.rep_ms > 0):
            raise ConfigError(f"repetitions must be a finite number of ms > 0, got {self.rep_ms}")


@dataclass(frozen=True)
class Timed:
    """A median time per call (``us``) over ``n`` timed samples, each of ``calls`` calls (do_bench and the
    CPU loop: one call a sample; a graph replay: the calls it unrolls)."""

    us: float
    n: int
    calls: int = 1


def timer_name(device: torch.device) -> str:
    return "do_bench" if device.type == "cuda" else "perf_counter"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_us(fn: Fn, device: torch.device, cfg: TimerConfig) -> float:
    """Median microseconds per call (:func:`time_calls`'s)."""
    return time_calls(fn, device, cfg).us


def graph_us(fns: Sequence[Fn], device: torch.device, cfg: TimerConfig, estimate_us: float) -> float:
    """Median microseconds per call over replays of one CUDA graph (:func:`time_graph`'s)."""
    return time_graph(fns, device, cfg, estimate_us).us


def time_calls(fn: Fn, device: torch.device, cfg: TimerConfig) -> Timed:
    """Median microseconds per call and the number of calls timed: do_bench on CUDA, a synchronised
    perf_counter loop elsewhere."""
    if device.type == "cuda":
        import triton.testing

        ms = triton.testing.do_bench(fn, warmup=cfg.warmup_ms, rep=cfg.rep_ms, return_mode="all")
        return Timed(1e3 * statistics.median(ms), len(ms))
    fn()
    deadline = time.perf_counter() + cfg.warmup_ms / 1e3
    while time.perf_counter() < deadline:
        fn()
    times: list[float] = []
    stop = time.perf_counter() + cfg.rep_ms / 1e3
    while len(times) < 3 or (time.perf_counter() < stop and len(times) < 10_000):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return Timed(1e6 * statistics.median(times), len(times))


def time_graph(fns: Sequence[Fn], device: torch.device, cfg: TimerConfig, estimate_us: float) -> Timed:
    """Median microseconds per call over replays of one CUDA graph that calls ``fns`` in turn (n = the
    replays, ``calls`` = the calls a replay unrolls).

    The graph unrolls about ``cfg.rep_ms`` worth of calls (from ``estimate_us``), cycling through
    the functions (each bound to its own input set); each replay is timed with device events and
    divided by the number of calls. Raises on CPU or when the calls cannot be captured.
    """
    if device.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    calls = max(len(fns), min(2000, int(1e3 * cfg.rep_ms / max(estimate_us, 1.0))))
    calls -= calls % len(fns)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture requires
        for fn in fns:
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(cfg.graph_replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / calls)
    del graph
    return Timed(statistics.median(times), len(times), calls)


def measure_ceilings(
    device: torch.device, cfg: TimerConfig, quick: bool = False
) -> dict[str, float | int | str]:
    """Measured copy bandwidth (bytes read + written per second) and bf16 / fp32 matmul rates.

    Random data (never zeros); fp32 matmuls with TF32 off. CUDA: a 1 GiB device-to-device copy
    and 8192^3 products; CPU (or ``quick``): small sizes, for the plumbing only.
    """
    cuda = device.type == "cuda" and not quick
    copy_bytes = (1 << 30) if cuda else (1 << 24)
    mm_n = 8192 if cuda else 256
    gen = torch.Generator(device=device).manual_seed(0)
    src = torch.rand(copy_bytes // 4, device=device, generator=gen)
    copy_us = median_us(lambda s=src, d=torch.empty_like(src): d.copy_(s), device, cfg)
    del src
    out: dict[str, float | int | str] = {
        "timer": timer_name(device),
        "copy_bytes": copy_bytes,
        "copy_GBps": 2 * copy_bytes / copy_us / 1e3,
        "matmul_n": mm_n,
    }
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for key, dtype in (("bf16_TFLOPs", torch.bfloat16), ("fp32_TFLOPs", torch.float32)):
            a = torch.randn(mm_n, mm_n, device=device, generator=gen).to(dtype)
            b = torch.randn(mm_n, mm_n, device=device, generator=gen).to(dtype)
            us = median_us(lambda a=a, b=b: a @ b, device, cfg)
            out[key] = 2 * mm_n**3 / us / 1e6
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def counts_line(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """What a table's medians are medians of, from its rows' ``n_timed`` (us: timed calls) and
    ``graph_replays`` / ``graph_calls`` (us_graph); None where no row recorded them (runs of older code)."""

    def ints(key: str) -> list[int]:
        out = []
        for r in rows:
            v = r.get(key)
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                out.append(int(v))
        return out

    rows = list(rows)
    timed, replays, calls = ints("n_timed"), ints("graph_replays"), ints("graph_calls")
    if not timed:
        return None
    line = f"n: each us is the median of {_span(timed)} timed calls"
    if replays:
        line += f"; each us_graph of {_span(replays)} graph replays of {_span(calls)} calls each"
    return line + "."
