"""Shared test helpers: the repository on sys.path and random draft-tree generators."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (unlike `python -m pytest`) does not put the repo root on the path
    sys.path.insert(0, str(ROOT))

TREE_KINDS = ("random", "chain", "fan", "mixed", "forest")


def random_tree(n: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Parent pointers [n] (int64, parents[i] < i, -1 for root-level nodes) of a random tree.

    - ``random``: each node hangs under a uniformly chosen earlier node (ancestors interact:
      branches share prefixes and interleave in node order);
    - ``chain``: one path, parents[i] = i - 1;
    - ``fan``: one root-level node with n - 1 children;
    - ``mixed``: mostly continues the previous node, sometimes branches off an earlier one, so
      it has both deep paths and siblings interleaved in node order;
    - ``forest``: like ``random`` but several nodes hang directly under the committed prefix.
    """
    if kind == "chain":
        return torch.arange(n) - 1
    parents = torch.full((n,), -1, dtype=torch.long)
    for i in range(1, n):
        u = float(torch.rand((), generator=gen))
        if kind == "fan":
            parents[i] = 0
        elif kind == "random":
            parents[i] = int(torch.randint(0, i, (), generator=gen))
        elif kind == "mixed":
            parents[i] = i - 1 if u < 0.6 else int(torch.randint(-1, i - 1, (), generator=gen))
        elif kind == "forest":
            parents[i] = -1 if u < 0.15 else int(torch.randint(0, i, (), generator=gen))
        else:
            raise ValueError(f"unknown tree kind {kind!r}")
    return parents


def tree_depths(parents: torch.Tensor) -> list[int]:
    depth: list[int] = []
    for p in parents.tolist():
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def leaves(parents: torch.Tensor) -> list[int]:
    has_child = set(p for p in parents.tolist() if p >= 0)
    return [i for i in range(parents.numel()) if i not in has_child]


def seed_of(*parts: object) -> int:
    """A deterministic seed from test parameters (``hash`` of a str is salted per process)."""
    return zlib.crc32(repr(parts).encode())


@pytest.fixture
def single_thread():
    """Tiny float64 ops: one intra-op thread is faster and immune to a busy neighbour core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_configure(config: pytest.Config) -> None:
    """Toy shapes: extra threads only add overhead (and stall when another process is busy)."""
    torch.set_num_threads(1)
