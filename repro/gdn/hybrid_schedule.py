"""SpecLA's chain-decomposed hybrid schedule for GDN tree verification (one layer, one sequence).

Source: SpecLA (arXiv 2607.16673; /work/shared/papers.md, Paper B, mechanism (i)) lists "a
chain-decomposed hybrid schedule" beside its state-resident chain verifier and its tree-masked
factorized verifier, with no further detail. This module is the project's reading of it:

1. decompose the tree (:func:`plan_hybrid`, host side, once per tree shape): the *longest* root-to-leaf
   path (most nodes; ties: the lowest leaf index) is the main chain, every other node the remainder.
   Longest rather than heaviest (most descendants): the remainder's cost is the masked tree kernel's,
   which grows with its node count, so the chain should take as many nodes as one path can;
2. verify the main chain from the committed state S0 with a chain method that also returns the chain's
   factors (delta, G): the tree kernel in chain mode (mask from indices) on the GPU,
   :func:`repro.gdn.reference.tree_gdn` with the causal mask in torch. fla's chunk kernel
   (:func:`repro.gdn.chain.verify_chain`) returns outputs only, so it cannot feed step 3;
3. verify the remainder as ONE masked forest with the tree kernel. Each remainder subtree starts from the
   state S_b after its branch point b on the chain (S0 for a subtree under the committed prefix). The
   kernel takes one initial state, so the forest runs from the zero state and the branch states enter
   through the inputs (the trick; exact, by linearity of the tree form in S0): with G'_i the gates summed
   over i's remainder ancestors, node i needs only S_b k_i and S_b q_i, and
       v'_i = v_i - e^{G'_i} S_b k_i,   o_i = o'_i + e^{G'_i} S_b (scale q_i)
   where o'_i is the zero-state output of the forest on v' (delta solves T beta (v - e^{G'} S_b k): zero
   state gives T beta v'). The branch states are never materialized: by the closed form along the chain,
   e^{G'_i} S_b x = e^{G_i} S0 x + sum_{j <= b on the chain} e^{G_i - G_j} (k_j . x) delta_j (G_i = G'_i +
   G_b, the gates from S0), an [r, m] masked product per head (torch), i.e. the chain -> remainder
   off-diagonal block of the tree's blocked forward substitution;
4. scatter o, delta, G (from S0: G'_i + G_b) and the expanded keys back into node order.

Results: (o [n, HV, d_v], :class:`repro.gdn.reference.TreeFactors`) with the reference's semantics
(delta rows are per node, beta_i (v_i - e^{g_i} S_parent k_i), so they do not depend on where the
verification started; no snapshots). The torch path (``kernel="reference"``) is exact in float64 (tests:
vs :func:`repro.gdn.reference.tree_gdn` and the token-by-token recurrence); the Triton paths
(``tree_fused`` / ``tree_split`` for both pieces) match in float32 under the interpreter. With bf16
inputs the remainder's o is rounded twice (the kernel's o', then o' + the branch term): ~2^-9 more.

Measured on one H200 (results/2026-12-01-h200-kernels-4: scripts/dev-hybrid and the bench-kernels run;
CUDA-graph medians per layer call, bf16, draft trees): it loses everywhere, by 10-20x. SpecLA shape
(HV = 8, d = 256): 179 / 195 / 205 / 226 us at T = 16 / 32 / 64 / 128 (main chain m = 7 / 13 / 13 / 16)
against tree_split's 10.1 / 13.0 / 18.3 / 27.8 and per-branch recurrence's 12-70; Weaver shape, T = 16:
195 vs tree_fused 8.8, T = 128: 266 vs 42.7. The cost is nearly flat in T: a fixed ~170 us of
launch latency, ~40 small torch ops in a dependent chain inside the graph (the inputs gathered per piece,
the cross term's matmuls and exps, the scatters back; ~4 us each) around the two tree launches, where the
single tree kernel is itself latency-bound at these sizes. To win it would need the gathers and the
cross term fused into the two kernels' prologues and trees far above 128 nodes (the masked kernel's
O(n^2) work dominating); neither is built.
``repro bench kernels --methods hybrid`` keeps the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from repro.gdn import reference
from repro.gdn.reference import TreeFactors, expand_key_heads

KERNELS = ("reference", "tree_fused", "tree_split")


@dataclass(frozen=True)
class HybridPlan:
    """A tree split into its main chain and a masked remainder, as device index tensors.

    ``chain`` [m] node ids, root first; ``rest`` [r] the other nodes in node (topological) order;
    ``rest_ancestors`` [r, r] bool, the remainder forest's ancestor-or-self mask; ``branch`` [r] the chain
    position each remainder node's subtree hangs off (-1: under the committed prefix, state S0);
    ``cross`` [r, m] bool, chain position j <= branch[i] (the chain nodes on i's path).
    """

    n: int
    chain: torch.Tensor
    rest: torch.Tensor
    rest_ancestors: torch.Tensor
    branch: torch.Tensor
    cross: torch.Tensor


def main_chain(parents: Sequence[int]) -> list[int]:
    """The longest root-to-leaf path (most nodes; ties: the lowest node index at its end), root first."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    node = max(range(len(parents)), key=lambda i: (depth[i], -i))
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def plan_hybrid(parents: Sequence[int] | torch.Tensor, device: torch.device | str = "cpu") -> HybridPlan:
    """Decompose the tree ``parents`` (parents[i] < i, -1: root level; at least one node)."""
    par = [int(p) for p in (parents.tolist() if isinstance(parents, torch.Tensor) else parents)]
    if not par:
        raise ValueError("empty tree")
    if any(not -1 <= p < i for i, p in enumerate(par)):
        raise ValueError("parents must satisfy -1 <= parents[i] < i (topological order)")
    chain = main_chain(par)
    pos = {node: j for j, node in enumerate(chain)}
    rest = [i for i in range(len(par)) if i not in pos]
    rpos = {node: j for j, node in enumerate(rest)}
    r, m = len(rest), len(chain)
    anc = torch.zeros(r, r, dtype=torch.bool)
    branch = torch.full((r,), -1, dtype=torch.long)
    for i, node in enumerate(rest):
        while node >= 0 and node in rpos:
            anc[i, rpos[node]] = True
            node = par[node]
        branch[i] = pos[node] if node >= 0 else -1
    cross = torch.arange(m)[None, :] <= branch[:, None]
    return HybridPlan(
        n=len(par),
        chain=torch.tensor(chain, dtype=torch.long, device=device),
        rest=torch.tensor(rest, dtype=torch.long, device=device),
        rest_ancestors=anc.to(device),
        branch=branch.to(device),
        cross=cross.to(device),
    )


def default_kernel(value_heads: int, device: torch.device, dtype: torch.dtype) -> str:
    """The tree kernel both pieces use: torch off CUDA; the split kernel for few value heads and 16-bit
    inputs (the chain verifier's rule, :func:`repro.gdn.chain.chain_method`), the fused one otherwise."""
    if device.type != "cuda":
        return "reference"
    from repro.gdn.chain import select_tree_kernel

    return "tree_" + select_tree_kernel(dtype, value_heads)


def _verify(
    kernel: str,
    x: tuple[torch.Tensor, ...],
    state: torch.Tensor,
    anc: torch.Tensor | None,
    scale: float,
    prec: str,
) -> tuple[torch.Tensor, TreeFactors]:
    """One tree verification (``anc`` None: a chain) by ``kernel``."""
    if kernel == "reference":
        n = x[0].shape[0]
        if anc is None:
            anc = torch.ones(n, n, dtype=torch.bool, device=state.device).tril()
        return reference.tree_gdn(*x, state, anc, scale)
    from repro.gdn import triton_tree

    fn = triton_tree.tree_gdn_split if kernel == "tree_split" else triton_tree.tree_gdn_fused
    return fn(*x, state, anc, scale, prec, chain=anc is None)


def hybrid_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    plan: HybridPlan,
    scale: float,
    *,
    kernel: str | None = None,
    precision: str | None = None,
) -> tuple[torch.Tensor, TreeFactors]:
    """Verify the tree of ``plan`` by the hybrid schedule (module docstring); the reference's shapes.

    ``kernel``: one of :data:`KERNELS` for both pieces (default :func:`default_kernel`); ``precision``:
    the Triton kernels' float32 dot mode (default "tf32" for bf16/fp16 inputs, else "ieee"). Reads
    shapes only (no host syncs), so capturable on CUDA with a prebuilt plan.
    """
    kernel = kernel or default_kernel(v.shape[1], v.device, v.dtype)
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {', '.join(KERNELS)}")
    if v.shape[0] != plan.n:
        raise ValueError(f"the plan is for {plan.n} nodes, the inputs have {v.shape[0]}")
    prec = precision or ("tf32" if v.dtype in (torch.bfloat16, torch.float16) else "ieee")
    inputs = (q, k, v, g, beta)
    c_in = tuple(t.index_select(0, plan.chain) for t in inputs)
    o_c, f_c = _verify(kernel, c_in, state, None, scale, prec)
    n, hv = plan.n, v.shape[1]
    o = o_c.new_empty(n, hv, v.shape[2]).index_copy_(0, plan.chain, o_c)
    delta = f_c.delta.new_empty(n, *f_c.delta.shape[1:]).index_copy_(0, plan.chain, f_c.delta)
    gate_cum = f_c.gate_cum.new_empty(n, hv).index_copy_(0, plan.chain, f_c.gate_cum)
    keys = f_c.k.new_empty(n, *f_c.k.shape[1:]).index_copy_(0, plan.chain, f_c.k)
    if plan.rest.numel():
        qr, kr, vr, gr, br = (t.index_select(0, plan.rest) for t in inputs)
        cd = f_c.delta.dtype  # the factors' dtype: float32 from the kernels, the inputs' in torch
        g_b = torch.where(
            plan.branch[:, None] >= 0, f_c.gate_cum.index_select(0, plan.branch.clamp(min=0)), 0.0
        )
        g_full = plan.rest_ancestors.to(cd) @ gr.to(cd) + g_b  # [r, HV], gates summed from S0
        weights = (g_full.T[:, :, None] - f_c.gate_cum.T[:, None, :]).masked_fill(~plan.cross, float("-inf"))
        weights = weights.exp()  # [HV, r, m]: e^(G_i - G_j) on the chain part of i's path
        kc = f_c.k.to(cd).transpose(0, 1)  # [HV, m, dk]
        dc = f_c.delta.transpose(0, 1)  # [HV, m, dv]
        s0t = state.to(cd).transpose(1, 2)  # [HV, dk, dv]
        eg = g_full.T.exp()[:, :, None]  # [HV, r, 1]

        def branch_term(x: torch.Tensor) -> torch.Tensor:  # e^(G'_i) S_b x_i, [r, HV, dv]
            xh = expand_key_heads(x, hv).to(cd).transpose(0, 1)  # [HV, r, dk]
            return (eg * (xh @ s0t) + (weights * (xh @ kc.transpose(1, 2))) @ dc).transpose(0, 1)

        v_shift = vr.to(cd) - branch_term(kr)
        zero = torch.zeros_like(state)
        o_r, f_r = _verify(kernel, (qr, kr, v_shift, gr, br), zero, plan.rest_ancestors, scale, prec)
        o_r = (o_r.to(cd) + branch_term(qr) * scale).to(o.dtype)
        o.index_copy_(0, plan.rest, o_r)
        delta.index_copy_(0, plan.rest, f_r.delta)
        gate_cum.index_copy_(0, plan.rest, f_r.gate_cum + g_b)
        keys.index_copy_(0, plan.rest, f_r.k.to(keys.dtype))
    return o, TreeFactors(delta=delta, gate_cum=gate_cum, k=keys, v=v, g=g, beta=beta)
