"""Chain verification: the outputs of a draft chain from the committed state (read, never written), by
the fastest exact kernel for the chain's length and the layer's shape.

The candidates (one sequence, repro's layout: q, k [T, H, d_k], v [T, HV, d_v], g, beta [T, HV], state
[HV, d_v, d_k] float32; each returns o [T, HV, d_v] in v's dtype):

- ``chunk``: fla's ``chunk_gated_delta_rule`` from the committed state, no final state (what fla_sd's
  chain verifier runs, :mod:`repro.models.static_chain`); a fixed cost of ~6 launches, then cheap per
  64-token chunk;
- ``tree_split`` / ``tree_fused``: the project's tree kernels (:mod:`repro.gdn.triton_tree`) in chain mode
  (the causal mask built in the kernel): one or two launches, but O(T^2) work per head;
- ``recurrent``: fla's fused recurrence, one dependent step per token;
- ``reference``: :func:`repro.gdn.reference.chunk_gdn` (torch; CPU, or no Triton).

:data:`CHAIN_CHOICE` picks among the GPU ones by length, per head class (few value heads: SpecLA's 8;
many: Weaver's 48). It is written from CUDA-graph medians on an H200 (us per layer call, bf16 q/k/v,
fp32 state; chains measured as chains, every candidate in one run: results/2026-12-04-h200-kernels-side-
by-side, issue 13):

- SpecLA (HV = 8, d = 256): split / fused / fla chunk / recurrent = 7.4 / 9.0 / 26.2 / 12.9 at T = 16,
  10.5 / 14.6 / 31.6 / 29.8 at 32, 14.1 / 23.2 / 43.9 / 63.8 at 64, 20.2 / 51.0 / 47.0 / 132 at 128,
  41.6 / 126 / 51.7 / 271 at 256 -> the split tree kernel up to 256 (0.28-0.80x of fla's chunk time);
- Weaver (HV = 48, d = 128): fused / split / chunk = 8.4 / 8.7 / 25.0 at 16, 11.5 / 12.0 / 28.9 at 32,
  19.1 / 19.1 / 36.9 at 64, 41.8 / 32.9 / 40.5 at 128, 106 / 93.5 / 50.2 at 256 -> the fused tree kernel
  up to 64, the split one at 128, fla's chunk kernel from 256 (the tree kernels' O(T^2) work);
- the recurrence never wins from T = 16 on.

``python scripts/gpu/dev-kernels13.py OUT`` measures every candidate at 16..256 and prints the table its
numbers imply (``measured_choice``), to replace this one with.
"""

from __future__ import annotations

import importlib.util

import torch

from repro.gdn import reference

METHODS = ("chunk", "tree_split", "tree_fused", "recurrent", "reference")
FEW_HEADS = 16  # value heads at most for the "few" class (the split tree kernel's domain)
# head class -> ((longest chain length, method), ...): the first row whose length >= T; None: any length
Table = dict[str, tuple[tuple[int | None, str], ...]]
CHAIN_CHOICE: Table = {
    "few": ((256, "tree_split"), (None, "chunk")),
    "many": ((64, "tree_fused"), (128, "tree_split"), (None, "chunk")),
}


def head_class(value_heads: int) -> str:
    return "few" if value_heads <= FEW_HEADS else "many"


SPLIT_WINDOW = (64, 256)  # tree sizes n with lo < n <= hi where the split form wins at many heads too
# GDN shapes (value heads, d_k, d_v) where small trees verify faster on the fused kernel than on the split
# form's three launches, and the largest such tree. The tiny family (HV = 4, d = 48), its whole verify step
# in bf16 on CUDA graphs (scripts/gpu/verify-kernels.py, results/2026-12-04-h200-derive-rows/callCL): 17 nodes
# (chain DFlash's slot) 186.2 us fused vs 204.2 split; 33 nodes 248.2 vs 221.6. At SpecLA's shape (HV = 8,
# d = 256) the split form wins from T = 16 on (7.4 vs 9.0 us a layer), so it is not listed.
FUSED_UP_TO: dict[tuple[int, int, int], int] = {(4, 48, 48): 17}


def select_tree_kernel(
    kernel_dtype: torch.dtype,
    value_heads: int,
    nodes: int | None = None,
    head_dims: tuple[int, int] | None = None,
) -> str:
    """The Triton tree kernel for a tree's verification: "split" for bf16/fp16 kernel inputs and few
    value heads (:func:`head_class`), or for bf16/fp16 trees of ``nodes`` in :data:`SPLIT_WINDOW` at any
    head count; else "fused". Trees of at most :data:`FUSED_UP_TO` nodes at their shape (``head_dims`` =
    (d_k, d_v)) take the fused kernel too.

    From CUDA-graph medians on an H200 (us per layer call, bf16 inputs): SpecLA's shape (HV = 8, d = 256)
    split 17.8 vs fused 22.9 at T = 64 and 27.4 vs 50.0 at T = 128; float32 inputs: split loses badly
    (47-110 us). The threshold (:data:`FEW_HEADS`) sits between the measured 8 and 48 heads. At Weaver's
    shape (HV = 48, d = 128), since the split form walks 64-row blocks with 4 warps at 64 < T <= 256:
    split 32.8 vs fused 41.5 at T = 128 (`repro bench kernels`), 16.5-17.5 vs 16.6 at T = 64 (a tie) and,
    on four 64-row blocks walked in registers, 92.1 vs 99.6 at T = 256 (results/2026-12-03-h200-persistent-
    decode, callAF; on 32-row blocks it lost there, 116.2): the split form for 64 < n <= 256.
    """
    low = kernel_dtype in (torch.bfloat16, torch.float16)
    window = nodes is not None and SPLIT_WINDOW[0] < nodes <= SPLIT_WINDOW[1]
    fused_up_to = FUSED_UP_TO.get((value_heads, *head_dims), 0) if head_dims is not None else 0
    small = nodes is not None and nodes <= fused_up_to
    return "split" if low and not small and (head_class(value_heads) == "few" or window) else "fused"


def choose(length: int, value_heads: int, table: Table | None = None) -> str:
    """The method of ``table`` (default :data:`CHAIN_CHOICE`) for a chain of ``length`` tokens at
    ``value_heads`` value heads."""
    for longest, method in (table or CHAIN_CHOICE)[head_class(value_heads)]:
        if longest is None or length <= longest:
            return method
    raise ValueError(f"the chain table has no row for length {length}")


def _has_fla() -> bool:
    return importlib.util.find_spec("fla") is not None


def chain_method(length: int, value_heads: int, device: torch.device, dtype: torch.dtype) -> str:
    """The method :func:`verify_chain` runs here: the table's on CUDA, the reference elsewhere. The table is
    written for bf16/fp16 inputs: for float32 ones, where the split kernel loses badly and the fused one
    runs "ieee" dots (4-5x its bf16 time at 64-128 tokens), the split kernel's lengths take fla's chunk
    kernel; without fla, fla's kernels are replaced by the tree kernel of :func:`select_tree_kernel`."""
    if device.type != "cuda":
        return "reference"
    method = choose(length, value_heads)
    if method == "tree_split" and dtype not in (torch.bfloat16, torch.float16) and _has_fla():
        return "chunk"
    if (method in ("chunk", "recurrent") and not _has_fla()) or method == "tree_split":
        method = "tree_" + select_tree_kernel(dtype, value_heads, length)
    return method


def verify_chain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    *,
    method: str | None = None,
    precision: str | None = None,
) -> torch.Tensor:
    """The outputs o [T, HV, d_v] (v's dtype) of the chain q, k, v, g, beta from ``state`` (untouched).

    ``method`` (one of :data:`METHODS`; default :func:`chain_method`) picks the kernel; ``precision``:
    the tree kernels' float32 dot mode (default "tf32" for bf16/fp16 inputs, else "ieee"). Capture-safe
    on CUDA: the choice reads shapes only.
    """
    if method is None:
        method = chain_method(v.shape[0], v.shape[1], v.device, v.dtype)
    if method not in METHODS:
        raise ValueError(f"unknown chain method {method!r}: choose one of {', '.join(METHODS)}")
    if method == "reference":  # in the state's precision (float64 state: the float64 oracle)
        dt = torch.float64 if state.dtype == torch.float64 else torch.float32
        x = (t[None].to(dt) for t in (q, k, v, g, beta))
        return reference.chunk_gdn(*x, state[None].to(dt), scale)[0][0].to(v.dtype)
    if method.startswith("tree_"):
        from repro.gdn import triton_tree

        low = v.dtype in (torch.bfloat16, torch.float16)
        prec = precision or ("tf32" if low else "ieee")
        fn = triton_tree.tree_gdn_split if method == "tree_split" else triton_tree.tree_gdn_fused
        return fn(q, k, v, g, beta, state, None, scale, prec, chain=True)[0]
    from fla.ops import gated_delta_rule as fla

    kw = dict(scale=scale, initial_state=state[None].float(), output_final_state=False, state_v_first=True)
    x = (q[None], k[None], v[None])
    if method == "chunk":
        o = fla.chunk_gated_delta_rule(*x, g[None].float(), beta[None].float(), **kw)[0]
    else:
        o = fla.fused_recurrent_gated_delta_rule(*x, g=g[None].float(), beta=beta[None].float(), **kw)[0]
    return o[0].to(v.dtype)
