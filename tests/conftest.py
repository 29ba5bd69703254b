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

from repro.bench.shapes import RANDOM_TREE_KINDS as TREE_KINDS  # noqa: E402,F401
from repro.bench.shapes import random_parents as random_tree  # noqa: E402,F401


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
