"""Which implementation evaluates a GDN layer on a tree: the pure-torch reference (any device,
the oracle) or the fused Triton kernels (CUDA). Both return the same (outputs, TreeFactors)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from repro.errors import ConfigError
from repro.gdn import reference
from repro.gdn.reference import TreeFactors

BACKENDS = ("reference", "triton")
TreeFn = Callable[..., tuple[torch.Tensor, TreeFactors]]


def _reference(q, k, v, g, beta, state, parents, ancestors, scale, keep_snapshots):
    return reference.tree_gdn(q, k, v, g, beta, state, ancestors, scale, keep_snapshots)


def _triton(q, k, v, g, beta, state, parents, ancestors, scale, keep_snapshots):
    from repro.gdn import triton_tree

    o, factors = triton_tree.tree_gdn_fused(q, k, v, g, beta, state, ancestors, scale)
    if keep_snapshots:
        factors.snapshots = triton_tree.tree_states_fused(k, v, g, beta, state, parents)
    return o, factors


def tree_function(name: str, device: torch.device) -> TreeFn:
    """The tree evaluator for ``name``; the Triton one needs a CUDA device."""
    if name == "reference":
        return _reference
    if name == "triton":
        if device.type != "cuda":
            raise ConfigError("the triton GDN backend needs a CUDA device (use --device cuda)")
        return _triton
    raise ConfigError(f"unknown GDN backend {name!r}: choose one of {', '.join(BACKENDS)}")
