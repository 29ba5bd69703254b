"""CUDA graphs of capture-safe callables (the steps of :class:`repro.models.static.StaticDecoder`).

A :class:`GraphedCall` runs the callable a few times on a side stream (compiles, autotuning and
cuBLAS workspaces happen there), captures one call, and then replays it on the same buffers: every
input is read from, and every output written to, the addresses that the capture saw. The warm-up
calls are real calls, so a callable that mutates state (a decode step, a commit) leaves that state
advanced: load the state again after capturing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from repro.errors import ConfigError


class GraphedCall:
    """One CUDA graph of ``fn``; calling the object replays it and returns what the capture returned."""

    def __init__(self, fn: Callable[[], Any], device: torch.device, warmup: int = 2) -> None:
        if device.type != "cuda":
            raise ConfigError("CUDA graphs need a CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = fn()
        torch.cuda.synchronize(device)

    def replay(self) -> None:
        self.graph.replay()

    def __call__(self) -> Any:
        self.graph.replay()
        return self.output
