"""One Triton kernel for a gated-attention layer's decode core: the glue between the q|k|v projection
and the output projection of one token, in one launch.

:func:`attention_decode` takes the token's stacked projection row ``qkv`` [1, Q + 2 H_kv hd] (Q = H hd,
or 2 H hd with the output gate: per head [q | gate], as ``q_proj`` lays it out) and does, per query
head (one program each): q and k RMSNorm, rotary on the first ``rot`` channels at position
``length`` (the cos/sin rows of a table made once, :func:`rotary_table`), softmax attention over the
cached rows ``0 .. length - 1`` of its key head and the token itself (an online softmax over blocks of
rows), times ``sigmoid(gate)``. The first query head of each key head also writes the token's rotated
key and its value into the cache at row ``length``; no program reads that row (the token's own key and
value are used from registers, rounded to the cache dtype as a later step reads them), so there is no
race. The cache length is read on the device: the launch is capture-safe.

It replaces :func:`repro.models.static.attention_prologue` (after the projection),
``attention_core``, the KV writes and the output gate of a decode step (about 30 aten launches).
Arithmetic is float32 (float64 for float64 data), the output rounded once; the torch glue rounds bf16
after every op, so bf16 results agree to bf16 accuracy and float32 ones to ~1e-6 (pinned in
tests/gdn/test_fused_decode.py against the torch glue).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.gdn.triton_common import acc_dtype, interpreting, pow2, round_to


def rotary_table(inv_freq: torch.Tensor, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[rows, 2, rot]: cos and sin of every position 0 .. rows - 1 in ``dtype`` (angles in float64, as
    :func:`repro.models.layers.rotary_tables` makes them)."""
    freqs = torch.arange(rows, dtype=torch.float64, device=device)[:, None] * inv_freq.to(device)[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    return torch.stack([emb.cos(), emb.sin()], dim=1).to(dtype).contiguous()


@triton.jit
def _norm_rotary(row_ptr, scale_ptr, rope_ptr, eps, HD: tl.constexpr, ROT: tl.constexpr, BD: tl.constexpr,
                 ACC: tl.constexpr):  # fmt: skip
    """RMSNorm (times scale) of the head at ``row_ptr`` [HD], then rotary of its first ROT channels by
    the cos|sin row at ``rope_ptr`` [2, ROT] -> [BD] (zero past HD)."""
    o = tl.arange(0, BD)
    m = o < HD
    x = tl.load(row_ptr + o, mask=m, other=0.0).to(ACC)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / HD + eps)
    y = x * rstd * tl.load(scale_ptr + o, mask=m, other=0.0).to(ACC)
    if ROT > 0:
        half: tl.constexpr = ROT // 2
        in_rot = o < ROT
        p = tl.where(o < half, o + half, o - half)  # rotate_half's partner channel
        xp = tl.load(row_ptr + p, mask=in_rot, other=0.0).to(ACC)
        yp = xp * rstd * tl.load(scale_ptr + p, mask=in_rot, other=0.0).to(ACC)
        cos = tl.load(rope_ptr + o, mask=in_rot, other=1.0).to(ACC)
        sin = tl.load(rope_ptr + ROT + o, mask=in_rot, other=0.0).to(ACC)
        sign = tl.where(o < half, -1.0, 1.0).to(ACC)
        y = tl.where(in_rot, y * cos + sign * yp * sin, y)
    return y


@triton.jit
def _attention_decode_kernel(
    qkv_ptr,
    q_scale_ptr,
    k_scale_ptr,
    rope_ptr,
    keys_ptr,
    values_ptr,
    len_ptr,
    out_ptr,
    q_eps,
    k_eps,
    scale,
    rows,
    H: tl.constexpr,
    HKV: tl.constexpr,
    HD: tl.constexpr,
    ROT: tl.constexpr,
    GATE: tl.constexpr,
    BD: tl.constexpr,
    BR: tl.constexpr,
    ACC: tl.constexpr,
):
    """Query head ``pid``: norms, rotary, attention over the cache and the token, output gate."""
    h = tl.program_id(0)
    kvh = h // (H // HKV)
    length = tl.load(len_ptr)
    Q_STRIDE: tl.constexpr = 2 * HD if GATE else HD
    Q_OUT: tl.constexpr = H * Q_STRIDE
    rope = rope_ptr + length * 2 * ROT
    q = _norm_rotary(qkv_ptr + h * Q_STRIDE, q_scale_ptr, rope, q_eps, HD, ROT, BD, ACC)
    k = _norm_rotary(qkv_ptr + Q_OUT + kvh * HD, k_scale_ptr, rope, k_eps, HD, ROT, BD, ACC)
    o_d = tl.arange(0, BD)
    m_d = o_d < HD
    v = tl.load(qkv_ptr + Q_OUT + HKV * HD + kvh * HD + o_d, mask=m_d, other=0.0)
    k_c = round_to(k, keys_ptr)
    v_c = v.to(values_ptr.dtype.element_ty)
    cache = kvh * rows * HD
    if h % (H // HKV) == 0:  # the token's key and value into row ``length`` (read by no program here)
        tl.store(keys_ptr + cache + length * HD + o_d, k_c, mask=m_d)
        tl.store(values_ptr + cache + length * HD + o_d, v_c, mask=m_d)
    # online softmax, started at the token itself (its key and value as the cache holds them)
    m_i = tl.sum(q * k_c.to(ACC), axis=0) * scale
    l_i = tl.full([], 1.0, ACC)
    acc = v_c.to(ACC)
    o_r = tl.arange(0, BR)
    r0 = length * 0
    while r0 < length:  # a while loop: the interpreter takes no device value as a range bound
        r = r0 + o_r
        m_r = r < length
        m = m_r[:, None] & m_d[None, :]
        kb = tl.load(keys_ptr + cache + r[:, None] * HD + o_d[None, :], mask=m, other=0.0).to(ACC)
        s = tl.sum(kb * q[None, :], axis=1) * scale
        s = tl.where(m_r, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        vb = tl.load(values_ptr + cache + r[:, None] * HD + o_d[None, :], mask=m, other=0.0).to(ACC)
        acc = acc * alpha + tl.sum(p[:, None] * vb, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
        r0 += BR
    out = acc / l_i
    if GATE:
        gate = tl.load(qkv_ptr + h * Q_STRIDE + HD + o_d, mask=m_d, other=0.0).to(ACC)
        out = out / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + h * HD + o_d, round_to(out, out_ptr), mask=m_d)


def attention_decode(
    qkv: torch.Tensor,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
    eps: tuple[float, float],
    rope: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    length: torch.Tensor,
    heads: int,
    output_gate: bool,
    *,
    block_rows: int | None = None,
) -> torch.Tensor:
    """One token's attention (see the module docstring): ``qkv`` [1, Q + 2 H_kv hd], the q and k norm
    scales [hd] and eps, ``rope`` [rows, 2, rot] (:func:`rotary_table`), ``keys``/``values``
    [H_kv, rows, hd] (row ``length`` written), ``length`` [1] int64 on the device. Returns [1, H hd]
    (gated) in qkv's dtype. ``block_rows``: cache rows per softmax block (default: tiles of <= 4096
    entries, 16..64 rows; 16 interpreted)."""
    kv_heads, rows, hd = keys.shape
    if qkv.dim() != 2 or qkv.shape[0] != 1 or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be one contiguous row [1, N], got {tuple(qkv.shape)}")
    if not (keys.is_contiguous() and values.is_contiguous()) or heads % kv_heads:
        raise ValueError("keys and values must be contiguous [H_kv, rows, hd] and H_kv must divide H")
    q_out = heads * hd * (2 if output_gate else 1)
    if qkv.shape[1] != q_out + 2 * kv_heads * hd:
        raise ValueError(f"qkv has {qkv.shape[1]} columns, expected {q_out + 2 * kv_heads * hd}")
    out = torch.empty(1, heads * hd, dtype=qkv.dtype, device=qkv.device)
    bd = pow2(hd)
    br = pow2(block_rows or (16 if interpreting() else min(64, max(16, 4096 // bd))))
    table = rope if rope.numel() else qkv  # no rotary: any valid pointer (never read)
    _attention_decode_kernel[(heads,)](
        qkv, q_scale, k_scale, table, keys, values, length, out, float(eps[0]), float(eps[1]), hd**-0.5,
        rows, H=heads, HKV=kv_heads, HD=hd, ROT=rope.shape[-1], GATE=output_gate, BD=bd, BR=br,
        ACC=acc_dtype(qkv.dtype), num_warps=4 if br * bd <= 4096 else 8,
    )  # fmt: skip
    return out
