"""The EAGLE drafter's per-layer attention in one Triton launch (:func:`rope_attend`): rotary on the
queries and keys, the keys and values written into the static buffers at the rows' slots, and the masked
softmax attention over every buffer row, what :meth:`~repro.drafters.eagle_fast.FastEagle._layer` does
between its q|k|v and o_proj linears (its eager sequence, 11 aten launches and the mask, is the reference:
tests/drafters/test_eagle_attention.py).

**Grid**: one program per kv head. It rotates its head's new keys and writes them and the values at
``slots``, then a block barrier (``tl.debug_barrier``: the block's global stores are visible to its own
threads after it; no other program reads this head's buffers), then attends for every query head of its
group and every row, the (row, group head) pairs in blocks of ``BM`` query rows, online softmax over the
buffer rows in blocks of ``BS`` (the buffer's keys are loaded ``.cg``, from L2).

**Rounding**, as the eager code: ``x cos`` rounded to the data type, ``+ roll(x, hd / 2) sin_signed``
rounded (keys stored, queries fed to the dot as they would be by ``baddbmm``), scores and softmax in
float32 (float32 data: IEEE dots, not TF32), the softmax's weights rounded to the data type for the
values' dot (as ``p.to(values.dtype)``; unnormalised here), the output rounded once. Rounding to bf16 is
round to nearest even in Triton's CPU interpreter too (whose casts truncate), so the interpreter's keys
equal torch's bit for bit. Half precision or float32 only: float64 (CPU's exact runs) stays eager.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.drafters.growth_kernels import _rnd  # round to a dtype, exact in the interpreter too

DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def fused_attention_default(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether :func:`rope_attend` serves data of ``dtype`` on ``device``: float32 or half precision, a
    power-of-two head dim of at least 16 (the dots' smallest tile), on CUDA or under Triton's
    interpreter (float64 and plain CPU keep the eager reference)."""
    runs = device.type == "cuda" or bool(triton.knobs.runtime.interpret)
    return runs and dtype in DTYPES and head_dim >= 16 and head_dim == triton.next_power_of_2(head_dim)


@triton.jit
def _rotate(x_ptr, c_ptr, s_ptr, d, HD: tl.constexpr, rows_ok, DT: tl.constexpr):
    """``x cos`` rounded to DT, ``+ roll(x, HD / 2) sin_signed`` rounded to DT (float32 values): the
    eager ``addcmul(x * cos, x.roll(hd // 2, -1), sin)``. Pointers are [rows, 1] row starts."""
    m = rows_ok[:, None]
    x = tl.load(x_ptr + d[None, :], mask=m, other=0.0).to(tl.float32)
    xr = tl.load(x_ptr + ((d + HD // 2) % HD)[None, :], mask=m, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + d[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + d[None, :], mask=m, other=0.0).to(tl.float32)
    return _rnd(_rnd(x * c, DT) + xr * s, DT)


@triton.jit
def _rope_attend_kernel(
    qkv_ptr, rope_ptr, pos_ptr, k_ptr, v_ptr, mask_ptr, slot_ptr, out_ptr,
    n, S, s_pos, s_slot, s_qkv, s_rope, s_rope_sin, s_kh, s_ks, s_vh, s_vs, s_mask, s_out, scale,
    HEADS: tl.constexpr, KV: tl.constexpr, HD: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
    BS: tl.constexpr, DT: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    h = tl.program_id(0)  # the kv head
    G: tl.constexpr = HEADS // KV
    d = tl.arange(0, HD)
    keys = k_ptr + h * s_kh
    values = v_ptr + h * s_vh
    # 1. this head's new keys (rotated) and values at the rows' slots
    for r0 in range(0, n, BN):
        r = r0 + tl.arange(0, BN)
        ok = r < n
        pos = tl.load(pos_ptr + r * s_pos, mask=ok, other=0)
        slot = tl.load(slot_ptr + r * s_slot, mask=ok, other=0)
        rope = rope_ptr + pos[:, None] * s_rope
        k = _rotate(qkv_ptr + r[:, None] * s_qkv + (HEADS + h) * HD, rope, rope + s_rope_sin, d, HD, ok, DT)
        tl.store(keys + slot[:, None] * s_ks + d[None, :], k.to(k_ptr.dtype.element_ty), mask=ok[:, None])
        v = tl.load(qkv_ptr + r[:, None] * s_qkv + (HEADS + KV + h) * HD + d[None, :], mask=ok[:, None])
        tl.store(values + slot[:, None] * s_vs + d[None, :], v, mask=ok[:, None])
    tl.debug_barrier()  # the block's writes are visible to its threads
    # 2. attention: query rows (row, group head) in blocks of BM, keys in blocks of BS
    for m0 in range(0, n * G, BM):
        m = m0 + tl.arange(0, BM)
        ok = m < n * G
        r = m // G
        head = h * G + m % G
        pos = tl.load(pos_ptr + r * s_pos, mask=ok, other=0)
        rope = rope_ptr + pos[:, None] * s_rope
        q = _rotate(qkv_ptr + r[:, None] * s_qkv + head[:, None] * HD, rope, rope + s_rope_sin, d, HD, ok, DT)
        q = q.to(DOT)
        top = tl.full([BM], float("-inf"), tl.float32)
        total = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, HD], tl.float32)
        for s0 in range(0, S, BS):
            cols = s0 + tl.arange(0, BS)
            inb = cols < S
            kb = tl.load(keys + cols[:, None] * s_ks + d[None, :], inb[:, None], 0.0, cache_modifier=".cg")
            vb = tl.load(values + cols[:, None] * s_vs + d[None, :], inb[:, None], 0.0, cache_modifier=".cg")
            vis = tl.load(mask_ptr + r[:, None] * s_mask + cols[None, :], ok[:, None] & inb[None, :], 0)
            sc = tl.dot(q, tl.trans(kb.to(DOT)), input_precision=PREC) * scale
            sc = tl.where(vis != 0, sc, float("-inf"))
            new = tl.maximum(top, tl.max(sc, axis=1))
            base = tl.where(new == float("-inf"), 0.0, new)  # nothing visible yet: no -inf - -inf
            p = tl.exp(sc - base[:, None])
            alpha = tl.exp(top - base)
            total = total * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(_rnd(p, DT).to(DOT), vb.to(DOT), input_precision=PREC)
            top = new
        o = _rnd(acc / tl.where(ok, total, 1.0)[:, None], DT)  # padding rows: 0, not 0 / 0
        tl.store(out_ptr + r[:, None] * s_out + head[:, None] * HD + d[None, :], o.to(DT), mask=ok[:, None])


def rope_attend(
    qkv: torch.Tensor,
    rope: torch.Tensor,
    positions: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    slots: torch.Tensor,
    heads: int,
    kv_heads: int,
    hd: int,
    block_s: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """One launch of the drafter layer's attention for ``n`` rows: ``qkv`` [n, (heads + 2 kv_heads) hd]
    (q | k | v, rows of unit column stride), the signed rotary table ``rope`` [rows, 2, hd] (cos, sin_signed)
    read at ``positions`` [n], the keys and values buffers [kv_heads, S, hd] written at ``slots`` [n]
    (rotated keys, values), ``mask`` [n, S] (bool, True = visible). Returns [n, heads hd], the eager
    ``attend(rot q, keys, values, bias)``. ``block_s``, ``num_warps``: launch options (speed only)."""
    n, S = mask.shape
    if qkv.dtype not in DTYPES or keys.dtype != qkv.dtype or values.dtype != qkv.dtype:
        raise ValueError(f"rope_attend takes float32 or half precision, got {qkv.dtype}")
    if hd != triton.next_power_of_2(hd) or hd < 16 or heads % kv_heads:
        raise ValueError(f"rope_attend needs a power-of-two head_dim >= 16 and heads / kv_heads, got {hd}")
    for t in (qkv, rope, keys, values, mask):
        if t.stride(-1) != 1:
            raise ValueError("rope_attend needs unit strides along the last dim")
    out = torch.empty(n, heads * hd, dtype=qkv.dtype, device=qkv.device)
    p2 = triton.next_power_of_2
    groups = heads // kv_heads
    block_s = block_s or max(16, min(128, 8192 // hd))
    dt = DTYPES[qkv.dtype]
    wide = qkv.dtype == torch.float32 or bool(triton.knobs.runtime.interpret)  # float32 dots (exact products)
    _rope_attend_kernel[(kv_heads,)](
        qkv, rope, positions, keys, values, mask.view(torch.uint8), slots, out,
        n, S, positions.stride(0), slots.stride(0), qkv.stride(0), rope.stride(0), rope.stride(1),
        keys.stride(0), keys.stride(1), values.stride(0), values.stride(1), mask.stride(0), out.stride(0),
        hd**-0.5,
        HEADS=heads, KV=kv_heads, HD=hd, BN=min(64, max(2, p2(n))), BM=min(64, max(16, p2(n * groups))),
        BS=block_s, DT=dt, DOT=tl.float32 if wide else dt, PREC="ieee" if wide else None,
        num_warps=num_warps,
    )  # fmt: skip
    return out
