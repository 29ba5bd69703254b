"""Which implementation evaluates a GDN layer: the pure-torch reference (any device, the oracle) or
the Triton kernels (CUDA): the project's fused tree kernels for draft trees and
flash-linear-attention's chunk kernel for batched chains (prefill, training). Each pair returns
the same results."""

from __future__ import annotations

from collections.abc import Callable

import torch

from repro.errors import ConfigError
from repro.gdn import reference
from repro.gdn.reference import TreeFactors

BACKENDS = ("reference", "triton")
TreeFn = Callable[..., tuple[torch.Tensor, TreeFactors]]
ChainFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _reference(q, k, v, g, beta, state, parents, ancestors, scale, keep_snapshots):
    return reference.tree_gdn(q, k, v, g, beta, state, ancestors, scale, keep_snapshots)


def _triton(q, k, v, g, beta, state, parents, ancestors, scale, keep_snapshots):
    from repro.gdn import triton_tree

    o, factors = triton_tree.tree_gdn_fused(q, k, v, g, beta, state, ancestors, scale)
    if keep_snapshots:
        factors.snapshots = triton_tree.tree_states_fused(k, v, g, beta, state, parents)
    return o, factors


def _reference_chain(q, k, v, g, beta, state, scale):
    # long chunks on CUDA: fewer launches; the masked exponent form stays stable at any length
    return reference.chunk_gdn(q, k, v, g, beta, state, scale, chunk=256 if v.is_cuda else 64)


def _fla_chunk(q, k, v, g, beta, state, scale):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    dtype = v.dtype if v.dtype in (torch.bfloat16, torch.float16) else torch.float32
    o, final = chunk_gated_delta_rule(
        q.to(dtype), k.to(dtype), v.to(dtype), g.float(), beta.to(dtype), scale=scale,
        initial_state=None if state is None else state.float(), output_final_state=True, state_v_first=True,
    )  # fmt: skip
    return o.to(v.dtype), final


def _check(name: str, device: torch.device) -> None:
    if name not in BACKENDS:
        raise ConfigError(f"unknown GDN backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "triton" and device.type != "cuda":
        raise ConfigError("the triton GDN backend needs a CUDA device (use --device cuda)")


def tree_function(name: str, device: torch.device) -> TreeFn:
    """The tree evaluator for ``name``; the Triton one needs a CUDA device."""
    _check(name, device)
    return _reference if name == "reference" else _triton


def chain_function(name: str, device: torch.device, differentiable: bool = False) -> ChainFn:
    """The batched-chain evaluator ``(q, k, v, g, beta, state | None, scale) -> (o, final state)``.

    ``differentiable`` (autograd on) always gets the torch form: fla 0.6's gated chunk backward is
    refused on Hopper with Triton 3.4-3.7.0 (it computes wrong gradients there, fla issue #640),
    so training backpropagates through :func:`reference.chunk_gdn`; fla's forward serves prefill
    and distillation.
    """
    _check(name, device)
    return _reference_chain if name == "reference" or differentiable else _fla_chunk
