"""Which implementation evaluates a GDN layer: the pure-torch reference (any device, the oracle) or the
Triton kernels (CUDA, or CPU under Triton's interpreter): the project's fused tree kernels for draft
trees, flash-linear-attention's chunk kernel for batched chains (prefill, training) and its fused
recurrence for decode steps. Each pair returns the same results. The one place a backend is chosen:
HybridLM's layers and the static decoder both ask here. The Triton tree evaluator comes as the one-launch
kernel ("fused"), the two-phase one ("split", few heads) or the three-launch one with T explicit
("blocked"), each with SpecLA's delayed commit (``pending``) inside its own launches;
:func:`commit_function` is the capturable closed-form commit (path rows only, conv history in the same
launch)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from repro.errors import ConfigError
from repro.gdn import reference
from repro.gdn.reference import PendingCommit, TreeFactors

BACKENDS = ("reference", "triton")
TreeFn = Callable[..., tuple[torch.Tensor, TreeFactors]]
ChainFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
CommitFn = Callable[..., None]


def _reference(
    q, k, v, g, beta, state, parents, ancestors, scale, keep_snapshots, precision=None, pending=None,
    out=None,
):  # fmt: skip
    if pending is not None:
        reference.apply_pending(state, pending)
    o, factors = reference.tree_gdn(q, k, v, g, beta, state, ancestors, scale, keep_snapshots)
    if out is None:
        return o, factors
    for dest, src in zip(out, (o, factors.delta, factors.gate_cum, factors.k)):
        dest.copy_(src)
    factors.delta, factors.gate_cum = out[1], out[2]
    factors.k = out[3] if len(out) > 3 else factors.k
    return out[0], factors


def _triton_tree(
    kernel, q, k, v, g, beta, state, parents, ancestors, scale, keep_snapshots, precision=None, pending=None,
    out=None, **knobs,
):  # fmt: skip
    """The tree evaluator on ``kernel`` (tree_gdn_fused or tree_gdn_split of repro.gdn.triton_tree), with
    its ``knobs``."""
    from repro.gdn import triton_tree

    # HybridLM's layers pass no precision (their q/k/v are float32): the exact "ieee" dots
    fn = getattr(triton_tree, kernel)
    o, factors = fn(
        q, k, v, g, beta, state, ancestors, scale, precision or "ieee", pending=pending, out=out, **knobs
    )
    if keep_snapshots:
        factors.snapshots = triton_tree.tree_states_fused(k, v, g, beta, state, parents)
    return o, factors


_triton = partial(_triton_tree, "tree_gdn_fused")
_triton_split = partial(_triton_tree, "tree_gdn_split")
_triton_split_peel = partial(_triton_tree, "tree_gdn_split", peel=True)
_triton_blocked = partial(_triton_tree, "tree_gdn_blocked")
_TREE_FNS = {
    "fused": _triton,
    "split": _triton_split,
    "split_peel": _triton_split_peel,
    "blocked": _triton_blocked,
}


def _reference_commit(
    state: torch.Tensor,
    delta: torch.Tensor,
    k: torch.Tensor,
    gate_cum: torch.Tensor,
    ancestors: torch.Tensor,
    node: torch.Tensor,
    *,
    conv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    path: torch.Tensor | None = None,
) -> None:
    """The closed-form commit (and the conv-history commit) of the path to ``node``, in place, in torch
    (``path``, the path index of the Triton commit, is not needed here)."""
    reference.apply_pending(state, PendingCommit(delta, k, gate_cum, ancestors, node))
    if conv is not None and conv[0].shape[0]:
        history, inputs, index = conv
        idx = index.index_select(0, node.clamp(min=0))[0, : history.shape[0]].flip(0)
        moved = torch.cat([history, inputs.to(history.dtype)], dim=0)[idx]
        history.copy_(torch.where(node >= 0, moved, history))


def _triton_commit(state, delta, k, gate_cum, ancestors, node, *, conv=None, path=None) -> None:
    from repro.gdn import triton_commit

    if path is None:
        triton_commit.commit_path_fused(state, delta, k, gate_cum, ancestors, node, conv=conv)
    else:  # the path index of the same path (triton_commit.write_path_index): no gather per layer
        conv_ops = None if conv is None else conv[:2]
        triton_commit.commit_path_indexed(state, delta, k, gate_cum, path, conv=conv_ops)


def _fla_recurrent(q, k, v, g, beta, state, scale):
    """fla's fused recurrence over one sequence in repro's layout; returns (o [n, HV, dv], final state)."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    o, final = fused_recurrent_gated_delta_rule(
        q[None], k[None], v[None], g=g[None].float(), beta=beta[None].float(), scale=scale,
        initial_state=state[None], output_final_state=True, state_v_first=True,
    )  # fmt: skip
    return o[0], final[0]


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


def interpreting() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1): the Triton kernels then run on CPU tensors."""
    try:
        from repro.gdn.triton_common import interpreting as on
    except ImportError:  # no triton: no interpreter
        return False
    return on()


def default_backend(device: torch.device, dtype: torch.dtype | None = None) -> str:
    """The fastest exact backend on ``device``: the Triton kernels on CUDA, the reference elsewhere and
    for float64 (the Triton kernels accumulate in float32 and do not compile for float64)."""
    return "triton" if device.type == "cuda" and dtype != torch.float64 else "reference"


def _known(name: str) -> None:
    if name not in BACKENDS:
        raise ConfigError(f"unknown GDN backend {name!r}: choose one of {', '.join(BACKENDS)}")


def check_backend(
    name: str, device: torch.device, interpreter: bool = False, dtype: torch.dtype | None = None
) -> str:
    """``name`` if it is a backend that runs on ``device`` with weights of ``dtype`` (``interpreter``:
    Triton's CPU interpreter counts as a device for the Triton kernels), else a one-line ConfigError."""
    _known(name)
    if name == "triton" and device.type != "cuda" and not (interpreter and interpreting()):
        raise ConfigError("the triton GDN backend needs a CUDA device (use --device cuda)")
    if name == "triton" and device.type == "cuda" and dtype == torch.float64:
        raise ConfigError(
            "the triton GDN kernels compute in float32 and do not compile for float64: "
            "use gdn_backend reference (the default in float64)"
        )
    return name


# the Triton tree kernels: one launch, two phases (few heads; node 0 before the row blocks), or three with T
# explicit
TREE_KERNELS = ("fused", "split", "split_peel", "blocked")


def tree_function(
    name: str, device: torch.device, interpreter: bool = False, kernel: str = "fused"
) -> TreeFn:
    """The tree evaluator ``(q, k, v, g, beta, state, parents, ancestors, scale, keep_snapshots,
    precision=None, pending=None, out=None) -> (o, TreeFactors)`` for ``name``; the Triton one needs a
    CUDA device. ``pending`` (a :class:`repro.gdn.reference.PendingCommit`): SpecLA's delayed commit,
    applied to ``state`` in place first (by the verification's own launch for ``triton``); ``out`` =
    (o, delta, gate_cum[, k]): where the outputs and factors go (the delayed commit's double buffers).
    ``kernel`` (``triton``): "fused" (:func:`repro.gdn.triton_tree.tree_gdn_fused`) or "split"
    (``tree_gdn_split``: the key-only work once per head in a first launch; meant for few value heads,
    e.g. GDN-1.3B's 8), "split_peel" (the same with node 0 solved before the row blocks: ``peel``) or
    "blocked" (``tree_gdn_blocked``: T = (I + A)^-1 explicit, the value work in
    independent programs)."""
    check_backend(name, device, interpreter)
    if kernel not in TREE_KERNELS:
        raise ConfigError(f"unknown tree kernel {kernel!r}: choose one of {', '.join(TREE_KERNELS)}")
    if name == "reference":
        return _reference
    return _TREE_FNS[kernel]


def commit_function(name: str, device: torch.device, interpreter: bool = False) -> CommitFn:
    """The capturable closed-form commit ``(state, delta, k, gate_cum, ancestors, node, *, conv=None,
    path=None)``: folds the root-to-``node`` path (1-element device tensor; < 0: nothing) into ``state`` in
    place and, with ``conv`` = (history, conv_inputs, conv_index), the conv history too. ``triton``: one
    launch of :func:`repro.gdn.triton_commit.commit_path_fused` (the path's rows only, float32 state), or
    with ``path`` (that path's index, :func:`repro.gdn.triton_commit.write_path_index`) of
    :func:`~repro.gdn.triton_commit.commit_path_indexed`; else torch."""
    check_backend(name, device, interpreter)
    return _reference_commit if name == "reference" else _triton_commit


def recurrent_function(name: str) -> ChainFn:
    """The token-by-token recurrence ``(q, k, v, g, beta, state, scale) -> (o, final state)`` of one
    sequence (decode steps, replay commits): fla's fused kernel for ``triton``, else the reference."""
    _known(name)
    return _fla_recurrent if name == "triton" else reference.recurrent_gdn


def chain_function(name: str, device: torch.device, differentiable: bool = False) -> ChainFn:
    """The batched-chain evaluator ``(q, k, v, g, beta, state | None, scale) -> (o, final state)``.

    ``differentiable`` (autograd on) always gets the torch form: fla 0.6's gated chunk backward is
    refused on Hopper with Triton 3.4-3.7.0 (it computes wrong gradients there, fla issue #640),
    so training backpropagates through :func:`reference.chunk_gdn`; fla's forward serves prefill
    and distillation.
    """
    check_backend(name, device)
    return _reference_chain if name == "reference" or differentiable else _fla_chunk
