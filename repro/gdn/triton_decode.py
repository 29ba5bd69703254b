"""Fused Triton kernels for the static decoder's per-layer glue: fewer, larger launches per token.

A decode GDN layer of :class:`repro.models.static.StaticDecoder` with ``fused=True`` runs: :func:`rms_norm`,
the stacked input projection (one matmul), :func:`gdn_decode_step` (short conv + SiLU, q/k L2 norms,
gates and one recurrent step, state updated in place), :func:`gated_norm` (GatedRMSNorm, and the conv
history moved on by the token), the output projection (addmm), :func:`rms_norm`, the stacked MLP
gate|up matmul, :func:`silu_mul`, the down projection (addmm): 9 launches. Tree verification uses
:func:`gdn_tree_prologue` for the conv, norms and gates of all n nodes before the tree kernel
(:mod:`repro.gdn.triton_tree`) and :func:`gated_norm` without the shift after it.

:func:`gdn_decode_layer` (the fused decode step, ``fuse_decode``) does :func:`gdn_decode_step`, then
:func:`gated_norm` with the history shift, in one launch: one program per key head owns its q and k
channels, its value heads' v channels and states, so it can move its history channels on after reading
them, with no other program reading them.

Semantics are those of the torch functions they replace (pinned in tests/gdn/test_triton_decode.py):
:func:`repro.gdn.reference.gathered_short_conv` (conv through the gather index [n, W] into
cat(history, conv inputs); the decode step uses the one-node index), ``repro.models.layers.l2norm``
(eps 1e-6), ``gdn_gates`` (softplus with torch's threshold 20), :func:`repro.gdn.reference.recurrent_gdn`
(value-first state ``S = e^g S (I - beta k k^T) + beta v k^T``, ``o = scale S q``; value head hv reads
key head hv // (HV // H)), ``GatedRMSNorm`` and ``rms_norm``. Arithmetic is float32 (float64 when the
state is float64), each output rounded once to its dtype; the torch glue rounds bf16 after every op,
so bf16 results agree to bf16 accuracy, float32 ones to ~1e-6.

Layout: ``proj`` [n, C + V_z + 2 HV] is the stacked projection (conv inputs q|k|v of C = 2 H d_k + HV d_v
channels, z, a, b); the conv history is [W-1, C] oldest first; ``taps`` [C, W] (taps[:, r] multiplies
the r-th predecessor). The decode kernel only reads the history (other programs read the same rows);
:func:`gated_norm` shifts it afterwards, each program owning a block of channels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from repro.gdn.triton_common import acc_dtype, interpreting, pdl_args, pdl_start, pow2, round_to, silu
from repro.grid import ld


class GDNDims(NamedTuple):
    """Head counts and sizes of one GDN layer."""

    heads_k: int  # H
    heads_v: int  # HV
    d_k: int
    d_v: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.heads_k * self.d_k + self.heads_v * self.d_v


# ------------------------------------------------------------------------------ device functions


@triton.jit
def _conv_silu(
    x_ptr,
    x_stride,
    hist_ptr,
    taps_ptr,
    bias_ptr,
    idx_ptr,
    row,
    chan,
    m_chan,
    C: tl.constexpr,
    W: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    CG: tl.constexpr = False,
):
    """SiLU(bias + sum_r taps[c, r] ext[idx[row, r], c]) for channels ``chan`` [BLOCK] (ext = history
    rows, then x rows; CG: x read from L2 only, as a persistent launch's scratch)."""
    HIST: tl.constexpr = W - 1
    acc = tl.zeros([BLOCK], dtype=ACC)
    for r in tl.static_range(W):
        j = tl.load(idx_ptr + row * W + r)
        in_x = j >= HIST
        jx = tl.maximum(j - HIST, 0)
        jh = tl.minimum(j, tl.maximum(HIST - 1, 0))
        b_x = ld(x_ptr + jx * x_stride + chan, m_chan & in_x, CG).to(ACC)
        b_h = tl.load(hist_ptr + jh * C + chan, mask=m_chan & (j < HIST), other=0.0).to(ACC)
        b_w = tl.load(taps_ptr + chan * W + r, mask=m_chan, other=0.0).to(ACC)
        acc += b_w * tl.where(in_x, b_x, b_h)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + chan, mask=m_chan, other=0.0).to(ACC)
    return silu(acc)


@triton.jit
def _l2norm(x):
    return x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def _qk(
    x_ptr,
    x_stride,
    hist_ptr,
    taps_ptr,
    bias_ptr,
    idx_ptr,
    row,
    kh,
    H: tl.constexpr,
    DK: tl.constexpr,
    W: tl.constexpr,
    C: tl.constexpr,
    BK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    CG: tl.constexpr = False,
):
    """Key head ``kh``'s q and k of node ``row``: conv, SiLU, L2 norm ([BK], zero past d_k)."""
    o_k = tl.arange(0, BK)
    m_k = o_k < DK
    q = _conv_silu(x_ptr, x_stride, hist_ptr, taps_ptr, bias_ptr, idx_ptr, row, kh * DK + o_k, m_k,
                   C, W, BK, HAS_BIAS, ACC, CG)  # fmt: skip
    k = _conv_silu(x_ptr, x_stride, hist_ptr, taps_ptr, bias_ptr, idx_ptr, row, H * DK + kh * DK + o_k, m_k,
                   C, W, BK, HAS_BIAS, ACC, CG)  # fmt: skip
    return _l2norm(q), _l2norm(k)


@triton.jit
def _gates(a_ptr, b_ptr, nd_ptr, dtb_ptr, head, beta_scale, ACC: tl.constexpr, CG: tl.constexpr = False):
    """g = neg_decay softplus(a + dt_bias) (threshold 20, as F.softplus), beta = beta_scale sigmoid(b)
    (CG: a and b read from L2 only)."""
    if CG:
        a, b = tl.load(a_ptr, cache_modifier=".cg"), tl.load(b_ptr, cache_modifier=".cg")
    else:
        a, b = tl.load(a_ptr), tl.load(b_ptr)
    a = a.to(ACC) + tl.load(dtb_ptr + head).to(ACC)
    soft = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    g = tl.load(nd_ptr + head).to(ACC) * soft
    b = b.to(ACC)
    beta = beta_scale * (1.0 / (1.0 + tl.exp(-b)))
    return g, beta


@triton.jit
def _shift_history(hist_ptr, x_ptr, chan, m_c, C: tl.constexpr, HIST: tl.constexpr, HP: tl.constexpr,
                   CG: tl.constexpr = False):  # fmt: skip
    """Move the history rows [HIST, C] (oldest first) of channels ``chan`` on by the token's conv inputs
    ``x`` [C]: row r takes row r + 1, the newest row takes x. HP: pow2(HIST). CG: x read from L2 only."""
    r = tl.arange(0, HP)[:, None]
    c = chan[None, :]
    mc = m_c[None, :]
    older = tl.load(hist_ptr + (r + 1) * C + c, mask=mc & (r + 1 < HIST), other=0.0)
    newest = ld(x_ptr + c + 0 * r, mc & (r + 1 == HIST), CG)
    moved = tl.where(r + 1 < HIST, older, newest.to(older.dtype))
    tl.debug_barrier()  # every row of the block is read before any is overwritten
    tl.store(hist_ptr + r * C + c, moved, mask=mc & (r < HIST))


# ------------------------------------------------------------------------------------- kernels


@triton.jit
def decode_tile(proj_ptr, hist_ptr, taps_ptr, bias_ptr, idx_ptr, nd_ptr, dtb_ptr, state_ptr, o_ptr, scale,
                beta_scale, hv, iv, H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                W: tl.constexpr, A_OFF: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                HAS_BIAS: tl.constexpr, ACC: tl.constexpr, CG: tl.constexpr):  # fmt: skip
    """Value head ``hv``, d_v tile ``iv``: conv/norms/gates of the token, one recurrent step of that state
    tile in place, its o. CG: ``proj`` read from L2 only (a persistent launch's scratch)."""
    kh = hv // (HV // H)
    C: tl.constexpr = 2 * H * DK + HV * DV
    q, k = _qk(proj_ptr, 0, hist_ptr, taps_ptr, bias_ptr, idx_ptr, 0, kh, H, DK, W, C, BK, HAS_BIAS, ACC, CG)
    o_k = tl.arange(0, BK)
    o_v = iv * BV + tl.arange(0, BV)
    m_v = o_v < DV
    v = _conv_silu(proj_ptr, 0, hist_ptr, taps_ptr, bias_ptr, idx_ptr, 0, 2 * H * DK + hv * DV + o_v, m_v,
                   C, W, BV, HAS_BIAS, ACC, CG)  # fmt: skip
    g, beta = _gates(proj_ptr + A_OFF + hv, proj_ptr + A_OFF + HV + hv, nd_ptr, dtb_ptr, hv, beta_scale, ACC,
                     CG)  # fmt: skip
    p_s = state_ptr + hv * (DV * DK) + o_v[:, None] * DK + o_k[None, :]
    m_s = m_v[:, None] & (o_k < DK)[None, :]
    s = tl.load(p_s, mask=m_s, other=0.0).to(ACC) * tl.exp(g)
    pred = tl.sum(s * k[None, :], axis=1)
    s += (beta * (v - pred))[:, None] * k[None, :]
    o = tl.sum(s * q[None, :], axis=1) * scale
    tl.store(p_s, round_to(s, state_ptr), mask=m_s)
    tl.store(o_ptr + hv * DV + o_v, round_to(o, o_ptr), mask=m_v)


@triton.jit
def _decode_kernel(
    proj_ptr,
    hist_ptr,
    taps_ptr,
    bias_ptr,
    idx_ptr,
    nd_ptr,
    dtb_ptr,
    state_ptr,
    o_ptr,
    scale,
    beta_scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    W: tl.constexpr,
    A_OFF: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    PDL: tl.constexpr,
):
    """One (value head, d_v tile) program: :func:`decode_tile`."""
    pdl_start(PDL)
    hv, iv = tl.program_id(0), tl.program_id(1)
    decode_tile(proj_ptr, hist_ptr, taps_ptr, bias_ptr, idx_ptr, nd_ptr, dtb_ptr, state_ptr, o_ptr, scale,
                beta_scale, hv, iv, H, HV, DK, DV, W, A_OFF, BK, BV, HAS_BIAS, ACC, False)  # fmt: skip


@triton.jit
def _decode_layer_kernel(
    proj_ptr,
    hist_ptr,
    taps_ptr,
    bias_ptr,
    idx_ptr,
    nd_ptr,
    dtb_ptr,
    state_ptr,
    o_ptr,
    w_ptr,
    y_ptr,
    scale,
    beta_scale,
    eps,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    W: tl.constexpr,
    A_OFF: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    HP: tl.constexpr,
    BG: tl.constexpr,
    ACC: tl.constexpr,
    PDL: tl.constexpr,
):
    """Key head ``pid`` and its group of value heads: the decode core (as ``_decode_kernel``), the gated
    norm of each value head (as ``_gated_norm_kernel``; o goes through the scratch ``o_ptr`` [HV, DV] in
    the state dtype) and the history shift of the channels this program alone reads (the key head's q
    and k channels, its value heads' v channels), after every read of them."""
    pdl_start(PDL)
    kh = tl.program_id(0)
    G: tl.constexpr = HV // H
    C: tl.constexpr = 2 * H * DK + HV * DV
    q, k = _qk(proj_ptr, 0, hist_ptr, taps_ptr, bias_ptr, idx_ptr, 0, kh, H, DK, W, C, BK, HAS_BIAS, ACC)
    o_k = tl.arange(0, BK)
    m_k = o_k < DK
    for j in range(G):  # runtime loops (no unrolling: the 1.3B head walks 16 tiles of d_v)
        hv = kh * G + j
        g, beta = _gates(proj_ptr + A_OFF + hv, proj_ptr + A_OFF + HV + hv, nd_ptr, dtb_ptr, hv, beta_scale,
                         ACC)  # fmt: skip
        ss = tl.zeros([BV], dtype=ACC)
        for v0 in range(0, DV, BV):
            o_v = v0 + tl.arange(0, BV)
            m_v = o_v < DV
            v = _conv_silu(proj_ptr, 0, hist_ptr, taps_ptr, bias_ptr, idx_ptr, 0, 2 * H * DK + hv * DV + o_v,
                           m_v, C, W, BV, HAS_BIAS, ACC)  # fmt: skip
            p_s = state_ptr + hv * (DV * DK) + o_v[:, None] * DK + o_k[None, :]
            m_s = m_v[:, None] & m_k[None, :]
            s = tl.load(p_s, mask=m_s, other=0.0).to(ACC) * tl.exp(g)
            pred = tl.sum(s * k[None, :], axis=1)
            s += (beta * (v - pred))[:, None] * k[None, :]
            o = tl.sum(s * q[None, :], axis=1) * scale
            tl.store(p_s, round_to(s, state_ptr), mask=m_s)
            o = round_to(o, o_ptr).to(ACC)
            tl.store(o_ptr + hv * DV + o_v, o, mask=m_v)
            ss += o * o
        rms = tl.sqrt(tl.sum(ss, axis=0) / DV + eps)
        tl.debug_barrier()  # the head's o tiles are written before they are read back
        for v0 in range(0, DV, BV):
            o_v = v0 + tl.arange(0, BV)
            m_v = o_v < DV
            x = tl.load(o_ptr + hv * DV + o_v, mask=m_v, other=0.0).to(ACC)
            y = x / rms * tl.load(w_ptr + o_v, mask=m_v, other=0.0).to(ACC)
            if HAS_Z:
                y *= silu(tl.load(proj_ptr + C + hv * DV + o_v, mask=m_v, other=0.0).to(ACC))
            tl.store(y_ptr + hv * DV + o_v, round_to(y, y_ptr), mask=m_v)
    if HP > 0:
        tl.debug_barrier()  # every conv read of the history is done before it moves
        _shift_history(hist_ptr, proj_ptr, kh * DK + o_k, m_k, C, W - 1, HP)
        _shift_history(hist_ptr, proj_ptr, H * DK + kh * DK + o_k, m_k, C, W - 1, HP)
        o_g = tl.arange(0, BG)
        _shift_history(hist_ptr, proj_ptr, 2 * H * DK + kh * G * DV + o_g, o_g < G * DV, C, W - 1, HP)


@triton.jit
def _tree_prologue_kernel(
    proj_ptr,
    proj_stride,
    hist_ptr,
    taps_ptr,
    bias_ptr,
    idx_ptr,
    nd_ptr,
    dtb_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    beta_scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    W: tl.constexpr,
    A_OFF: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    PDL: tl.constexpr,
):
    """One (node, value head): v and the gates of that head; q and k of its key head (first of a group)."""
    pdl_start(PDL)
    i = tl.program_id(0)
    hv = tl.program_id(1)
    C: tl.constexpr = 2 * H * DK + HV * DV
    x_row = proj_ptr + i * proj_stride
    o_v = tl.arange(0, BV)
    m_v = o_v < DV
    chan = 2 * H * DK + hv * DV + o_v
    v = _conv_silu(proj_ptr, proj_stride, hist_ptr, taps_ptr, bias_ptr, idx_ptr, i, chan, m_v, C, W, BV,
                   HAS_BIAS, ACC)  # fmt: skip
    tl.store(v_ptr + (i * HV + hv) * DV + o_v, round_to(v, v_ptr), mask=m_v)
    g, beta = _gates(x_row + A_OFF + hv, x_row + A_OFF + HV + hv, nd_ptr, dtb_ptr, hv, beta_scale, ACC)
    tl.store(g_ptr + i * HV + hv, round_to(g, g_ptr))
    tl.store(beta_ptr + i * HV + hv, round_to(beta, beta_ptr))
    if hv % (HV // H) == 0:
        kh = hv // (HV // H)
        q, k = _qk(proj_ptr, proj_stride, hist_ptr, taps_ptr, bias_ptr, idx_ptr, i, kh, H, DK, W, C, BK,
                   HAS_BIAS, ACC)  # fmt: skip
        o_k = tl.arange(0, BK)
        m_k = o_k < DK
        tl.store(q_ptr + (i * H + kh) * DK + o_k, round_to(q, q_ptr), mask=m_k)
        tl.store(k_ptr + (i * H + kh) * DK + o_k, round_to(k, k_ptr), mask=m_k)


@triton.jit
def _gated_norm_kernel(
    o_ptr,
    w_ptr,
    z_ptr,
    z_stride,
    out_ptr,
    hist_ptr,
    x_ptr,
    eps,
    HV: tl.constexpr,
    DV: tl.constexpr,
    BD: tl.constexpr,
    HAS_Z: tl.constexpr,
    SHIFT: tl.constexpr,
    C: tl.constexpr,
    HIST: tl.constexpr,
    HP: tl.constexpr,
    BC: tl.constexpr,
    ACC: tl.constexpr,
    PDL: tl.constexpr,
):
    """One (row, head): RMS norm over d_v, times weight, times SiLU(z). With SHIFT (one row), the program
    also moves its block of BC history channels on by the token's conv inputs ``x``."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    i = pid // HV
    h = pid % HV
    o_d = tl.arange(0, BD)
    m_d = o_d < DV
    x = tl.load(o_ptr + (i * HV + h) * DV + o_d, mask=m_d, other=0.0).to(ACC)
    y = x / tl.sqrt(tl.sum(x * x, axis=0) / DV + eps) * tl.load(w_ptr + o_d, mask=m_d, other=0.0).to(ACC)
    if HAS_Z:
        y *= silu(tl.load(z_ptr + i * z_stride + h * DV + o_d, mask=m_d, other=0.0).to(ACC))
    tl.store(out_ptr + (i * HV + h) * DV + o_d, round_to(y, out_ptr), mask=m_d)
    if SHIFT:
        chan = pid * BC + tl.arange(0, BC)
        _shift_history(hist_ptr, x_ptr, chan, chan < C, C, HIST, HP)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    scale_ptr,
    out_ptr,
    s0,
    s1,
    R1,
    eps,
    D: tl.constexpr,
    BD: tl.constexpr,
    ACC: tl.constexpr,
    PDL: tl.constexpr,
):
    """Row ``pid`` of x viewed as [R0, R1, D] (strides s0, s1, 1): x / rms(x) * scale, out contiguous."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    a = pid // R1
    b = pid % R1
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    x = tl.load(x_ptr + a * s0 + b * s1 + o_d, mask=m_d, other=0.0).to(ACC)
    y = x / tl.sqrt(tl.sum(x * x, axis=0) / D + eps) * tl.load(scale_ptr + o_d, mask=m_d, other=0.0).to(ACC)
    tl.store(out_ptr + pid * D + o_d, round_to(y, out_ptr), mask=m_d)


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, stride, I: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr
):
    """out[i, j] = SiLU(gu[i, j]) * gu[i, I + j]."""
    pdl_start(PDL)
    i = tl.program_id(0)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = o < I
    gate = tl.load(gu_ptr + i * stride + o, mask=m, other=0.0).to(ACC)
    up = tl.load(gu_ptr + i * stride + I + o, mask=m, other=0.0).to(ACC)
    tl.store(out_ptr + i * I + o, round_to(silu(gate) * up, out_ptr), mask=m)


# ------------------------------------------------------------------------------------ wrappers


def _warps(elements: int) -> int:
    return 8 if elements >= 8192 else 4


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * scale`` over the last dim of x [rows, d] or [n, heads, d] (last dim contiguous)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    d = x.shape[-1]
    r0, r1 = (x.shape[0], 1) if x.dim() == 2 else (x.shape[0], x.shape[1])
    s0, s1 = x.stride(0), (x.stride(1) if x.dim() == 3 else 0)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    bd = pow2(d)
    _rms_norm_kernel[(r0 * r1,)](
        x,
        scale,
        out,
        s0,
        s1,
        r1,
        float(eps),
        D=d,
        BD=bd,
        ACC=acc_dtype(x.dtype),
        num_warps=_warps(bd),
        **pdl_args(x.device),
    )
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of the stacked [n, 2 I] gate|up projection -> [n, I]."""
    n, two_i = gate_up.shape
    inter = two_i // 2
    out = torch.empty(n, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, pow2(inter))
    grid = (n, triton.cdiv(inter, block))
    _silu_mul_kernel[grid](
        gate_up,
        out,
        gate_up.stride(0),
        I=inter,
        BLOCK=block,
        ACC=acc_dtype(gate_up.dtype),
        **pdl_args(gate_up.device),
    )
    return out


def _conv_args(history: torch.Tensor, conv_bias: torch.Tensor | None, proj: torch.Tensor) -> tuple:
    if proj.stride(-1) != 1:
        raise ValueError("proj must have a contiguous last dim")
    return history, conv_bias if conv_bias is not None else history, conv_bias is not None


def gdn_decode_step(
    proj: torch.Tensor,
    history: torch.Tensor,
    taps: torch.Tensor,
    conv_bias: torch.Tensor | None,
    conv_index: torch.Tensor,
    neg_decay: torch.Tensor,
    dt_bias: torch.Tensor,
    beta_scale: float,
    state: torch.Tensor,
    scale: float,
    dims: GDNDims,
    *,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """One token through a GDN core: ``proj`` [1, C + V_z + 2 HV], ``history`` [W-1, C] (read only),
    ``conv_index`` [1, W] (the one-node gather index), ``state`` [HV, d_v, d_k] updated in place.

    Returns o [HV, d_v] in the state's dtype (before the gated norm). ``block_v``: d_v tile (the grid is
    HV x d_v / block_v; default: about 128 programs).
    """
    h, hv, dk, dv = dims
    width = taps.shape[1]
    history, bias, has_bias = _conv_args(history, conv_bias, proj)
    # ~128 programs on a GPU; one per head in the CPU interpreter, which runs programs one by one
    default = pow2(dv) if interpreting() else max(4, min(64, pow2(dv * hv // 128 + 1) // 2))
    bv = min(block_v or default, pow2(dv))
    bk = pow2(dk)
    o = torch.empty(hv, dv, dtype=state.dtype, device=state.device)
    a_off = proj.shape[1] - 2 * hv
    grid = (hv, triton.cdiv(dv, bv))
    _decode_kernel[grid](
        proj, history, taps, bias, conv_index, neg_decay, dt_bias, state, o, float(scale), float(beta_scale),
        H=h, HV=hv, DK=dk, DV=dv, W=width, A_OFF=a_off, BK=bk, BV=bv, HAS_BIAS=has_bias,
        ACC=acc_dtype(state.dtype), num_warps=num_warps or _warps(bv * bk), **pdl_args(state.device),
    )  # fmt: skip
    return o


def gdn_decode_layer(
    proj: torch.Tensor,
    history: torch.Tensor,
    taps: torch.Tensor,
    conv_bias: torch.Tensor | None,
    conv_index: torch.Tensor,
    neg_decay: torch.Tensor,
    dt_bias: torch.Tensor,
    beta_scale: float,
    state: torch.Tensor,
    scale: float,
    dims: GDNDims,
    norm_weight: torch.Tensor,
    eps: float,
    has_z: bool,
    out_dtype: torch.dtype,
    *,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """:func:`gdn_decode_step`, then :func:`gated_norm` with the history shift, in one launch (one
    program per key head): ``proj`` [1, C + V_z + 2 HV] (z from its columns C .. C + HV d_v when
    ``has_z``), ``history`` [W-1, C] and ``state`` [HV, d_v, d_k] updated in place.

    Returns y [1, HV d_v] in ``out_dtype`` (what the output projection reads). ``block_v``: the d_v
    tile of the state loop (default: tiles of <= 4096 state entries; the whole head interpreted).
    """
    h, hv, dk, dv = dims
    width = taps.shape[1]
    history, bias, has_bias = _conv_args(history, conv_bias, proj)
    if proj.shape[0] != 1 or not history.is_contiguous():
        raise ValueError("the fused decode layer takes one row of conv inputs and a contiguous history")
    bk = pow2(dk)
    default = pow2(dv) if interpreting() else max(1, 4096 // bk)
    bv = min(block_v or default, pow2(dv))
    o = torch.empty(hv, dv, dtype=state.dtype, device=state.device)
    y = torch.empty(1, hv * dv, dtype=out_dtype, device=proj.device)
    hist = history.shape[0]
    _decode_layer_kernel[(h,)](
        proj, history, taps, bias, conv_index, neg_decay, dt_bias, state, o, norm_weight, y, float(scale),
        float(beta_scale), float(eps), H=h, HV=hv, DK=dk, DV=dv, W=width, A_OFF=proj.shape[1] - 2 * hv,
        BK=bk, BV=bv, HAS_BIAS=has_bias, HAS_Z=has_z, HP=pow2(hist) if hist else 0, BG=pow2(hv // h * dv),
        ACC=acc_dtype(state.dtype), num_warps=num_warps or _warps(bv * bk), **pdl_args(state.device),
    )  # fmt: skip
    return y


def gdn_tree_prologue(
    proj: torch.Tensor,
    history: torch.Tensor,
    taps: torch.Tensor,
    conv_bias: torch.Tensor | None,
    conv_index: torch.Tensor,
    neg_decay: torch.Tensor,
    dt_bias: torch.Tensor,
    beta_scale: float,
    dims: GDNDims,
    kernel_dtype: torch.dtype,
) -> tuple[torch.Tensor, ...]:
    """Conv (through ``conv_index`` [n, W]), SiLU, q/k L2 norms and gates of n nodes from ``proj``
    [n, C + V_z + 2 HV]. Returns q, k [n, H, d_k] and v [n, HV, d_v] in ``kernel_dtype``, g and beta
    [n, HV] in the gate dtype (neg_decay's)."""
    h, hv, dk, dv = dims
    n, width = proj.shape[0], taps.shape[1]
    history, bias, has_bias = _conv_args(history, conv_bias, proj)
    dev, gdt = proj.device, neg_decay.dtype
    q = torch.empty(n, h, dk, dtype=kernel_dtype, device=dev)
    k = torch.empty(n, h, dk, dtype=kernel_dtype, device=dev)
    v = torch.empty(n, hv, dv, dtype=kernel_dtype, device=dev)
    g = torch.empty(n, hv, dtype=gdt, device=dev)
    beta = torch.empty(n, hv, dtype=gdt, device=dev)
    _tree_prologue_kernel[(n, hv)](
        proj, proj.stride(0), history, taps, bias, conv_index, neg_decay, dt_bias, q, k, v, g, beta,
        float(beta_scale), H=h, HV=hv, DK=dk, DV=dv, W=width, A_OFF=proj.shape[1] - 2 * hv, BK=pow2(dk),
        BV=pow2(dv), HAS_BIAS=has_bias, ACC=acc_dtype(gdt), **pdl_args(dev),
    )  # fmt: skip
    return q, k, v, g, beta


def gated_norm(
    o: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    z: torch.Tensor | None,
    out_dtype: torch.dtype,
    shift: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """GatedRMSNorm of o [n, HV, d_v] (z [n, HV d_v] or None) -> [n, HV d_v] in ``out_dtype``.

    ``shift`` = (history [W-1, C], conv inputs [1, C]): also move the conv history on by that token (n = 1).
    """
    n, hv, dv = o.shape
    o = o.contiguous()
    out = torch.empty(n, hv * dv, dtype=out_dtype, device=o.device)
    if z is not None and z.stride(-1) != 1:
        z = z.contiguous()
    hist, x = shift if shift is not None else (o, o)
    do_shift = shift is not None and hist.shape[0] > 0
    if do_shift and (n != 1 or x.stride(-1) != 1):
        raise ValueError("the history shift takes one row of contiguous conv inputs")
    c = hist.shape[1] if do_shift else 1
    bc = pow2(triton.cdiv(c, n * hv))
    bd = pow2(dv)
    _gated_norm_kernel[(n * hv,)](
        o, weight, z if z is not None else o, z.stride(0) if z is not None else 0, out, hist, x, float(eps),
        HV=hv, DV=dv, BD=bd, HAS_Z=z is not None, SHIFT=do_shift, C=c, HIST=hist.shape[0] if do_shift else 0,
        HP=pow2(max(1, hist.shape[0])) if do_shift else 1, BC=bc, ACC=acc_dtype(o.dtype),
        num_warps=_warps(max(bd, bc * pow2(max(1, hist.shape[0])))), **pdl_args(o.device),
    )  # fmt: skip
    return out
