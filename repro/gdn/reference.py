"""Pure-torch reference for Gated DeltaNet on draft trees (see shared gdn-tree-math).

Conventions (flash-linear-attention's, value-first state):
- per layer, one sequence: q, k are [n, H, d_k]; v is [n, HV, d_v]; g (log decay, <= 0) and
  beta are [n, HV]; HV % H == 0 and value head h reads key head h // (HV // H);
- the recurrent state S is [HV, d_v, d_k]:
  ``S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t (scale * q_t)``.

Everything here is differentiable-free plain torch in the dtype of the inputs (float32 or
float64); the GPU kernels are pinned to these functions in tests, and these functions are
pinned to :func:`recurrent_gdn`, a token-by-token loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def expand_key_heads(x: torch.Tensor, num_value_heads: int) -> torch.Tensor:
    """Repeat key heads [n, H, d] so that value head h sees key head h // (HV // H)."""
    groups = num_value_heads // x.shape[1]
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def recurrent_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token recurrence along one sequence. Returns (o [n, HV, d_v], final state)."""
    hv = v.shape[1]
    q = expand_key_heads(q, hv) * scale
    k = expand_key_heads(k, hv)
    s = state.clone()
    out = []
    for t in range(v.shape[0]):
        decay = g[t].exp()[:, None, None]
        s = decay * s
        pred = torch.einsum("hvk,hk->hv", s, k[t])
        s = s + torch.einsum("hv,hk->hvk", beta[t][:, None] * (v[t] - pred), k[t])
        out.append(torch.einsum("hvk,hk->hv", s, q[t]))
    return torch.stack(out), s


@dataclass
class TreeFactors:
    """What one tree verification of one GDN layer leaves for the commit.

    ``delta`` [n, HV, d_v] are the per-node delta rows, ``gate_cum`` [n, HV] the gates summed
    along ancestors (G), ``k`` [n, HV, d_k] the keys (expanded to value heads), ``v``, ``g`` and
    ``beta`` the raw per-node inputs (for replay), and ``snapshots`` [n, HV, d_v, d_k] the state
    after every node when asked for.
    """

    delta: torch.Tensor
    gate_cum: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    snapshots: torch.Tensor | None = None


def ancestor_gates(g: torch.Tensor, ancestors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """G = Mbar g per head and Gamma[h, i, j] = exp(G_i - G_j) on ancestors (0 elsewhere).

    ``ancestors`` is the bool [n, n] mask with the diagonal set. Non-ancestor entries are
    masked before exponentiating: G_i - G_j can be large and positive there.
    """
    gate_cum = ancestors.to(g.dtype) @ g  # [n, HV]
    diff = gate_cum.T[:, :, None] - gate_cum.T[:, None, :]  # [HV, n, n]
    gamma = diff.masked_fill(~ancestors, float("-inf")).exp()
    return gate_cum, gamma


def tree_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    ancestors: torch.Tensor,
    scale: float,
    keep_snapshots: bool = False,
) -> tuple[torch.Tensor, TreeFactors]:
    """Verify a whole tree in one pass (masked WY form) without writing the state.

    Returns per-node outputs o [n, HV, d_v] (each equal to running the recurrence along the
    node's root-to-node path) and the factors a commit strategy needs.
    """
    n, hv = v.shape[0], v.shape[1]
    qh = expand_key_heads(q, hv).transpose(0, 1) * scale  # [HV, n, dk]
    kh = expand_key_heads(k, hv).transpose(0, 1)  # [HV, n, dk]
    vh = v.transpose(0, 1)  # [HV, n, dv]
    bh = beta.T[:, :, None]  # [HV, n, 1]
    gate_cum, gamma = ancestor_gates(g, ancestors)
    strict = ancestors & ~torch.eye(n, dtype=torch.bool, device=ancestors.device)
    eye = torch.eye(n, dtype=v.dtype, device=v.device)
    a = bh * (kh @ kh.transpose(1, 2) * gamma * strict)  # strictly lower triangular
    t = torch.linalg.solve_triangular(eye + a, eye.expand(hv, n, n), upper=False)
    u = t @ (bh * vh)
    w = t @ (bh * gate_cum.T.exp()[:, :, None] * kh)
    delta = u - w @ state.transpose(1, 2)  # [HV, n, dv]
    p = qh @ kh.transpose(1, 2) * gamma
    out = gate_cum.T.exp()[:, :, None] * (qh @ state.transpose(1, 2)) + p @ delta
    snapshots = None
    if keep_snapshots:
        snapshots = gate_cum.exp()[:, :, None, None] * state[None] + torch.einsum(
            "hij,hjv,hjk->ihvk", gamma, delta, kh
        )
    factors = TreeFactors(
        delta=delta.transpose(0, 1),
        gate_cum=gate_cum,
        k=kh.transpose(0, 1),
        v=v,
        g=g,
        beta=beta,
        snapshots=snapshots,
    )
    return out.transpose(0, 1), factors


def commit_closed_form(state: torch.Tensor, f: TreeFactors, path: list[int]) -> torch.Tensor:
    """S_new = exp(G_a) S0 + sum_{j on path} exp(G_a - G_j) delta_j k_j^T (a = path end)."""
    if not path:
        return state.clone()
    idx = torch.tensor(path, device=state.device)
    g_end = f.gate_cum[path[-1]]  # [HV]
    weights = (g_end[None] - f.gate_cum[idx]).exp()  # [m, HV]
    update = torch.einsum("mh,mhv,mhk->hvk", weights, f.delta[idx], f.k[idx])
    return g_end.exp()[:, None, None] * state + update


@dataclass
class PendingCommit:
    """A closed-form commit not yet applied (SpecLA's delayed commit): the previous verification's
    factors (delta [n, HV, d_v], k [n, HV, d_k], gate_cum [n, HV]), its ancestor mask (bool [n, n]) and
    the accepted path's last node as a 1-element int64 tensor (< 0: nothing accepted), all on the device.
    The verification that applies it must not write these factors (double-buffer them). ``path``
    (optional): the same path as a path index (int32, :func:`repro.gdn.triton_commit.write_path_index`),
    which the Triton tree kernels then read instead of gathering the path from the mask; ignored here."""

    delta: torch.Tensor
    k: torch.Tensor
    gate_cum: torch.Tensor
    ancestors: torch.Tensor
    node: torch.Tensor
    path: torch.Tensor | None = None


def apply_pending(state: torch.Tensor, p: PendingCommit) -> None:
    """:func:`commit_closed_form` of the path to ``p.node``, in place, with no host reads (capturable)."""
    live = p.node >= 0  # [1]
    a = p.node.clamp(min=0)
    on_path = p.ancestors.index_select(0, a)[0] & live  # [n]
    g_end = torch.where(live, p.gate_cum.index_select(0, a)[0], 0.0)  # [HV]
    weights = (g_end[None] - p.gate_cum).masked_fill(~on_path[:, None], float("-inf")).exp()  # [n, HV]
    update = torch.einsum(
        "mh,mhv,mhk->hvk", weights.to(state.dtype), p.delta.to(state.dtype), p.k.to(state.dtype)
    )
    state.copy_(g_end.exp().to(state.dtype)[:, None, None] * state + update)


def commit_replay(state: torch.Tensor, f: TreeFactors, path: list[int]) -> torch.Tensor:
    """Run the recurrence again over the accepted path's (k, v, g, beta)."""
    s = state.clone()
    for j in path:
        s = f.g[j].exp()[:, None, None] * s
        pred = torch.einsum("hvk,hk->hv", s, f.k[j])
        s = s + torch.einsum("hv,hk->hvk", f.beta[j][:, None] * (f.v[j] - pred), f.k[j])
    return s


def commit_snapshot(state: torch.Tensor, f: TreeFactors, path: list[int]) -> torch.Tensor:
    """Copy the state kept for the accepted path's last node."""
    if not path:
        return state.clone()
    if f.snapshots is None:
        raise ValueError("snapshot commit needs a verification run with keep_snapshots=True")
    return f.snapshots[path[-1]].clone()


def chunk_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched chains in chunks of ``chunk`` tokens (WY form per chunk), differentiable.

    q, k [B, L, H, d_k]; v [B, L, HV, d_v]; g, beta [B, L, HV]; state [B, HV, d_v, d_k] or None
    (zeros). Returns (o [B, L, HV, d_v], final state). Within a chunk with gates summed to G,
    delta solves (I + A) delta = beta (v - e^G S0 k) with A_ij = beta_i e^(G_i - G_j) k_i.k_j
    (j < i); o_i = e^(G_i) S0 q_i + sum_(j <= i) e^(G_i - G_j) (k_j.q_i) delta_j.
    """
    b, length, hv, dv = v.shape
    dk = k.shape[-1]
    qh = expand_key_heads(q.flatten(0, 1), hv).view(b, length, hv, dk).transpose(1, 2) * scale
    kh = expand_key_heads(k.flatten(0, 1), hv).view(b, length, hv, dk).transpose(1, 2)
    vh, gh, bh = v.transpose(1, 2), g.transpose(1, 2), beta.transpose(1, 2)  # [B, HV, L, .]
    s = state if state is not None else v.new_zeros(b, hv, dv, dk)
    outs = []
    for start in range(0, length, chunk):
        sl = slice(start, start + chunk)
        qc, kc, vc, bc = qh[:, :, sl], kh[:, :, sl], vh[:, :, sl], bh[:, :, sl, None]
        gate_cum = gh[:, :, sl].cumsum(-1)  # [B, HV, C]
        n = gate_cum.shape[-1]
        lower = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
        diff = gate_cum[..., :, None] - gate_cum[..., None, :]
        gamma = diff.masked_fill(~lower, float("-inf")).exp()
        strict = gamma * (~torch.eye(n, dtype=torch.bool, device=v.device))
        a = bc * (kc @ kc.transpose(-1, -2)) * strict
        eye = torch.eye(n, dtype=v.dtype, device=v.device)
        rhs = bc * (vc - gate_cum.exp()[..., None] * (kc @ s.transpose(-1, -2)))
        delta = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        decay_q = gate_cum.exp()[..., None] * (qc @ s.transpose(-1, -2))
        outs.append(decay_q + ((qc @ kc.transpose(-1, -2)) * gamma) @ delta)
        tail = (gate_cum[..., -1:] - gate_cum).exp()[..., None]  # e^(G_last - G_j)
        s = gate_cum[..., -1].exp()[..., None, None] * s + (tail * delta).transpose(-1, -2) @ kc
    return torch.cat(outs, dim=2).transpose(1, 2), s


COMMIT_FUNCTIONS = {
    "snapshot": commit_snapshot,
    "replay": commit_replay,
    "closed_form": commit_closed_form,
}


def conv_gather_index(parents: torch.Tensor, width: int) -> torch.Tensor:
    """Indices [n, width] into cat(history[width-1], x[n]) of each node's conv inputs.

    Column r holds the r-th predecessor along the ancestor path (r = 0 is the node itself);
    when the path runs out of tree nodes it continues into the history, most recent first.
    """
    hist = width - 1
    node = torch.arange(parents.numel(), device=parents.device)
    back = torch.zeros_like(node)  # steps already taken into the history
    cols = []
    for _ in range(width):
        inside = node >= 0
        back = back + (~inside).long()
        cols.append(torch.where(inside, hist + node, hist - back))
        node = torch.where(inside, parents[node.clamp(min=0)], node)
    return torch.stack(cols, dim=1)


def tree_short_conv(
    x: torch.Tensor,
    history: torch.Tensor,
    weight: torch.Tensor,
    parents: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: bool = True,
) -> torch.Tensor:
    """Depthwise causal conv along ancestor paths.

    x [n, C] tree inputs, history [W-1, C] oldest first, weight [C, W] with weight[:, W-1]
    multiplying the current token. Returns act(b + sum_r w[:, W-1-r] * x_{pi_r(i)}).
    """
    index = conv_gather_index(parents, weight.shape[1]).to(x.device)
    return gathered_short_conv(x, history, weight.flip(1), index, bias, activation)


def gathered_short_conv(
    x: torch.Tensor,
    history: torch.Tensor,
    taps: torch.Tensor,
    index: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: bool = True,
) -> torch.Tensor:
    """:func:`tree_short_conv` with the gather index [n, W] (:func:`conv_gather_index`) given and the
    weight as ``taps`` [C, W] = weight.flip(1): taps[:, r] multiplies the r-th predecessor (column r).

    Shape-static in the index (no host reads), so a precomputed index makes it capturable.
    """
    ext = torch.cat([history.to(x.dtype), x], dim=0)
    gathered = ext[index]  # [n, W, C]
    y = torch.einsum("nrc,cr->nc", gathered, taps.to(x.dtype))
    if bias is not None:
        y = y + bias
    return F.silu(y) if activation else y


def conv_history_after(history: torch.Tensor, x: torch.Tensor, path: list[int]) -> torch.Tensor:
    """The last W-1 conv inputs along the accepted path (filled from the old history)."""
    hist = history.shape[0]
    if hist == 0:
        return history.clone()
    seq = torch.cat([history, x[path]], dim=0) if path else history
    return seq[-hist:].clone()
