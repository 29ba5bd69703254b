"""The EAGLE drafter's per-layer attention in one Triton launch (:func:`rope_attend`): rotary on the
queries and keys, the keys and values written into the static buffers at the rows' slots, and the masked
softmax attention over every buffer row, what :meth:`~repro.drafters.eagle_fast.FastEagle._layer` does
between its q|k|v and o_proj linears. Its eager sequence (``eager_tables`` once per forward: the table's
rows and the additive mask, 2 launches; ``rope_attend_eager`` per layer: rotary 3, the KV writes 2, attention
5) is the reference (tests/drafters/test_eagle_attention.py).

**Grid**: kv heads x splits (:func:`launch_plan`: one program per :data:`CHUNK` buffer rows, so that a
long buffer is read by many SMs). Program (h, j) owns the buffer rows [lo, hi) of chunk j of kv head h:

1. it rotates head h's new keys and writes them and the values at the rows' slots that fall in its chunk
   (each slot is written by exactly one program, and only that program reads it);
2. a block barrier (``tl.debug_barrier``: the block's global stores are visible to its own threads), then
   the online softmax over its chunk for every query head of the group and every row (the (row, group
   head) pairs in blocks of ``BM`` query rows; keys in blocks of ``BS``, loaded ``.cg``: from L2);
3. with one split it writes the output; with more it stores its partial (max, sum, weighted values:
   float32 scratch), then a block barrier and one ``atomic_add`` (acq_rel, gpu scope) on the head's
   counter: the head's last program to arrive merges the partials (loaded ``.cg``), writes the output
   and sets the counter back to 0 for the next launch (``counters``: zeros the caller keeps; no program
   ever waits on another, so any number of programs may be resident). Triton's CPU interpreter runs the
   programs one after another: the last one merges.

**Rounding**, as the eager code: ``x cos`` rounded to the data type, ``+ roll(x, hd / 2) sin_signed``
rounded (keys stored, queries fed to the dot as they would be by ``baddbmm``), scores and softmax in
float32 (float32 data: IEEE dots, not TF32), the softmax's weights rounded to the data type for the
values' dot (as ``p.to(values.dtype)``; unnormalised here), the output rounded once. Rounding to bf16 is
round to nearest even in Triton's CPU interpreter too (whose casts truncate), so the interpreter's keys
equal torch's bit for bit; there the bf16 dots run in float32 (its bf16 dot is wrong; the products of bf16
values are exact in float32). Half precision or float32 only: float64 (CPU's exact runs) stays eager.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.drafters.triton_dtypes import round_to  # round to a dtype, exact in the interpreter too

CHUNK = 256  # buffer rows per program (launch_plan)
MAX_SPLITS = 16
DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


# On CUDA by default since its GPU cases (test_eagle_attention.py) and scripts/gpu/eagle-attn.py ran on the
# H200 (results/2026-12-02-h200-host-path): 2.4-4.8x faster than the eager glue per layer call, a SpecLA
# proposal 0.78 -> 0.52 ms (tiny) and 1.77 -> 1.49 ms (GDN-1.3B EAGLE shape); False keeps the eager glue.
CUDA_DEFAULT = True


def fused_attention_default(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether :func:`rope_attend` serves data of ``dtype`` on ``device``: float32 or half precision, an even
    head dim of at least 16 (the dots' smallest tile), under Triton's interpreter or on CUDA with
    :data:`CUDA_DEFAULT` (float64 and plain CPU keep the eager reference)."""
    runs = (device.type == "cuda" and CUDA_DEFAULT) or bool(triton.knobs.runtime.interpret)
    return runs and dtype in DTYPES and head_dim >= 16 and head_dim % 2 == 0


@triton.jit
def _rotate(x_ptr, c_ptr, s_ptr, d, HD: tl.constexpr, rows_ok, DT: tl.constexpr):
    """``x cos`` rounded to DT, ``+ roll(x, HD / 2) sin_signed`` rounded to DT (float32 values): the
    eager ``addcmul(x * cos, x.roll(hd // 2, -1), sin)``. Pointers are [rows, 1] row starts; ``d`` the
    columns (padded to a power of two: 0 past HD)."""
    m = rows_ok[:, None] & (d < HD)[None, :]
    x = tl.load(x_ptr + d[None, :], mask=m, other=0.0).to(tl.float32)
    xr = tl.load(x_ptr + ((d + HD // 2) % HD)[None, :], mask=m, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + d[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + d[None, :], mask=m, other=0.0).to(tl.float32)
    return round_to(round_to(x * c, DT) + xr * s, DT)


@triton.jit
def _attend_chunk(
    q, keys, values, mask_row, lo, hi, s_ks, s_vs, d, ok, scale, BM: tl.constexpr, HD: tl.constexpr,
    HP: tl.constexpr, BS: tl.constexpr, DT: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Online softmax of the rotated queries ``q`` [BM, HP] (HD columns, zeros to HP) over buffer rows
    [lo, hi) in blocks of BS (``mask_row`` [BM, 1]: the rows' mask pointers): the running max, sum and
    weighted values (float32; -inf, 0, 0 where nothing is visible)."""
    top = tl.full([BM], float("-inf"), tl.float32)
    total = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, HP], tl.float32)
    for s0 in range(lo, hi, BS):
        cols = s0 + tl.arange(0, BS)
        inb = cols < hi
        kv_ok = inb[:, None] & (d < HD)[None, :]
        kb = tl.load(keys + cols[:, None] * s_ks + d[None, :], kv_ok, 0.0, cache_modifier=".cg")
        vb = tl.load(values + cols[:, None] * s_vs + d[None, :], kv_ok, 0.0, cache_modifier=".cg")
        vis = tl.load(mask_row + cols[None, :], ok[:, None] & inb[None, :], 0)
        sc = tl.dot(q, tl.trans(kb.to(DOT)), input_precision=PREC) * scale
        sc = tl.where(vis != 0, sc, float("-inf"))
        new = tl.maximum(top, tl.max(sc, axis=1))
        base = tl.where(new == float("-inf"), 0.0, new)  # nothing visible yet: no -inf - -inf
        p = tl.exp(sc - base[:, None])
        alpha = tl.exp(top - base)
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(round_to(p, DT).to(DOT), vb.to(DOT), input_precision=PREC)
        top = new
    return top, total, acc


@triton.jit(do_not_specialize=["n", "S", "chunk", "splits"])  # one binary for every n, S and split > 1
def _rope_attend_kernel(
    qkv_ptr, rope_ptr, pos_ptr, k_ptr, v_ptr, mask_ptr, slot_ptr, out_ptr, part_ptr, stat_ptr, ctr_ptr,
    n, S, chunk, splits, s_pos, s_slot, s_qkv, s_rope, s_rope_sin, s_kh, s_ks, s_vh, s_vs, s_mask, s_out,
    scale,
    HEADS: tl.constexpr, KV: tl.constexpr, HD: tl.constexpr, HP: tl.constexpr, MERGE: tl.constexpr,
    BN: tl.constexpr, BM: tl.constexpr, BS: tl.constexpr, DT: tl.constexpr, DOT: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    h = tl.program_id(0)  # the kv head
    j = tl.program_id(1)  # the buffer rows [lo, hi) of this program
    G: tl.constexpr = HEADS // KV
    lo = j * chunk
    hi = tl.minimum(lo + chunk, S)
    d = tl.arange(0, HP)  # the head's columns, padded to a power of two
    dm = (d < HD)[None, :]
    keys = k_ptr + h * s_kh
    values = v_ptr + h * s_vh
    # 1. this head's new keys (rotated) and values at the rows' slots in [lo, hi)
    for r0 in range(0, n, BN):
        r = r0 + tl.arange(0, BN)
        pos = tl.load(pos_ptr + r * s_pos, mask=r < n, other=0)
        slot = tl.load(slot_ptr + r * s_slot, mask=r < n, other=0)
        ok = (r < n) & (slot >= lo) & (slot < hi)
        rope = rope_ptr + pos[:, None] * s_rope
        k = _rotate(qkv_ptr + r[:, None] * s_qkv + (HEADS + h) * HD, rope, rope + s_rope_sin, d, HD, ok, DT)
        w = ok[:, None] & dm
        tl.store(keys + slot[:, None] * s_ks + d[None, :], k.to(k_ptr.dtype.element_ty), mask=w)
        v = tl.load(qkv_ptr + r[:, None] * s_qkv + (HEADS + KV + h) * HD + d[None, :], mask=w)
        tl.store(values + slot[:, None] * s_vs + d[None, :], v, mask=w)
    tl.debug_barrier()  # the block's writes are visible to its threads (no other program reads [lo, hi))
    # 2. attention over [lo, hi): query rows (row, group head) in blocks of BM
    M = n * G
    for m0 in range(0, M, BM):
        m = m0 + tl.arange(0, BM)
        ok = m < M
        r = m // G
        head = h * G + m % G
        pos = tl.load(pos_ptr + r * s_pos, mask=ok, other=0)
        rope = rope_ptr + pos[:, None] * s_rope
        q = _rotate(qkv_ptr + r[:, None] * s_qkv + head[:, None] * HD, rope, rope + s_rope_sin, d, HD, ok, DT)
        mask_row = mask_ptr + r[:, None] * s_mask
        top, total, acc = _attend_chunk(q.to(DOT), keys, values, mask_row, lo, hi, s_ks, s_vs, d, ok, scale,
                                        BM, HD, HP, BS, DT, DOT, PREC)  # fmt: skip
        if not MERGE:
            o = round_to(acc / tl.where(ok, total, 1.0)[:, None], DT)  # padding rows: 0, not 0 / 0
            tl.store(
                out_ptr + r[:, None] * s_out + head[:, None] * HD + d[None, :],
                o.to(DT),
                mask=ok[:, None] & dm,
            )
        else:  # this chunk's partial: [h, j, m] rows of part (HD wide) and stat (max, sum)
            row = (h * splits + j) * M + m
            tl.store(part_ptr + row[:, None] * HP + d[None, :], acc, mask=ok[:, None])
            tl.store(stat_ptr + 2 * row, top, mask=ok)
            tl.store(stat_ptr + 2 * row + 1, total, mask=ok)
    if MERGE:  # 3. the head's last program to finish merges the partials (and resets the counter)
        tl.debug_barrier()  # every thread's partials stored before the release
        done = tl.atomic_add(ctr_ptr + h, 1, sem="acq_rel", scope="gpu")
        tl.debug_barrier()
        if done == splits - 1:
            for m0 in range(0, M, BM):
                m = m0 + tl.arange(0, BM)
                ok = m < M
                top = tl.full([BM], float("-inf"), tl.float32)
                for jj in range(splits):  # the rows' max over the chunks
                    row = (h * splits + jj) * M + m
                    top = tl.maximum(
                        top, tl.load(stat_ptr + 2 * row, mask=ok, other=0.0, cache_modifier=".cg")
                    )
                base = tl.where(top == float("-inf"), 0.0, top)
                total = tl.zeros([BM], tl.float32)
                acc = tl.zeros([BM, HP], tl.float32)
                for jj in range(splits):
                    row = (h * splits + jj) * M + m
                    w = tl.exp(tl.load(stat_ptr + 2 * row, mask=ok, other=0.0, cache_modifier=".cg") - base)
                    total += w * tl.load(stat_ptr + 2 * row + 1, mask=ok, other=0.0, cache_modifier=".cg")
                    part = tl.load(part_ptr + row[:, None] * HP + d[None, :], mask=ok[:, None], other=0.0,
                                   cache_modifier=".cg")  # fmt: skip
                    acc += w[:, None] * part
                r = m // G
                head = h * G + m % G
                o = round_to(acc / tl.where(ok, total, 1.0)[:, None], DT)
                tl.store(
                    out_ptr + r[:, None] * s_out + head[:, None] * HD + d[None, :],
                    o.to(DT),
                    mask=ok[:, None] & dm,
                )
            tl.atomic_xchg(ctr_ptr + h, 0, sem="relaxed", scope="gpu")  # ready for the next launch


def launch_plan(
    S: int, hd: int, splits: int | None = None, block_s: int | None = None
) -> tuple[int, int, int]:
    """(splits, chunk, block_s) of a launch over ``S`` buffer rows of head dim ``hd``: keys in blocks of
    ``block_s`` rows (default: 8192 elements, 16 to 128 rows), ``splits`` programs per kv head (default:
    one per :data:`CHUNK` rows, at most :data:`MAX_SPLITS`) of ``chunk`` rows each (whole key blocks; the
    splits that are left once the chunks are rounded up)."""
    block_s = block_s or max(16, min(128, 8192 // triton.next_power_of_2(hd)))
    if splits is None:
        splits = max(1, min(MAX_SPLITS, triton.cdiv(S, max(CHUNK, block_s))))
    chunk = triton.cdiv(triton.cdiv(S, splits), block_s) * block_s
    return triton.cdiv(S, chunk), chunk, block_s


def kernel_constants(
    n: int, S: int, heads: int, kv_heads: int, hd: int, dtype: torch.dtype, splits: int | None = None,
    block_s: int | None = None, num_warps: int | None = None,
) -> tuple[int, int, dict]:  # fmt: skip
    """The splits (programs a kv head), the chunk (buffer rows a program) and the kernel's constexprs and
    ``num_warps`` of a launch (:func:`rope_attend`'s options; blocks chosen to run without register spills
    on sm_90: phase 1 in blocks of 16 rows, query blocks of up to 64 rows, 32 at head dims above 64, 8 warps
    from query blocks of 4096 elements; tests/drafters/test_eagle_attention.py compiles them for sm_90)."""
    p2 = triton.next_power_of_2
    splits, chunk, block_s = launch_plan(S, hd, splits, block_s)
    hp = p2(hd)
    bm = min(64 if hp <= 64 else 32, max(16, p2(n * (heads // kv_heads))))
    dt = DTYPES[dtype]
    wide = dtype == torch.float32 or bool(triton.knobs.runtime.interpret)  # float32 dots (exact products)
    return splits, chunk, dict(
        HEADS=heads, KV=kv_heads, HD=hd, HP=hp, MERGE=splits > 1, BN=16, BM=bm, BS=block_s,
        DT=dt, DOT=tl.float32 if wide else dt, PREC="ieee" if wide else None,
        num_warps=num_warps or (8 if bm * hp >= 4096 else 4),
    )  # fmt: skip


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
    counters: torch.Tensor | None = None,
    splits: int | None = None,
    block_s: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """One launch of the drafter layer's attention for ``n`` rows: ``qkv`` [n, (heads + 2 kv_heads) hd]
    (q | k | v, rows of unit column stride), the signed rotary table ``rope`` [rows, 2, hd] (cos, sin_signed)
    read at ``positions`` [n], the keys and values buffers [kv_heads, S, hd] written at ``slots`` [n]
    (rotated keys, values), ``mask`` [n, S] (bool, True = visible). Returns [n, heads hd], the eager
    ``rope_attend_eager`` of :mod:`repro.drafters.eagle_fast`.

    ``splits``: programs per kv head, each over its chunk of the buffer rows (default: :func:`launch_plan`);
    with more than one, ``counters`` [>= kv_heads] int32 zeros that the launch leaves zero (made here when
    not given: one more launch). ``block_s``, ``num_warps`` (default: 4, 8 for query blocks of 4096
    elements and more): launch options. All of them change speed (and with the splits the float32
    summation order), never what is computed."""
    n, S = mask.shape
    if qkv.dtype not in DTYPES or keys.dtype != qkv.dtype or values.dtype != qkv.dtype:
        raise ValueError(f"rope_attend takes float32 or half precision, got {qkv.dtype}")
    if hd % 2 or hd < 16 or heads % kv_heads:
        raise ValueError(f"rope_attend needs an even head_dim >= 16 and heads / kv_heads, got {hd}")
    for t in (qkv, rope, keys, values, mask):
        if t.stride(-1) != 1:
            raise ValueError("rope_attend needs unit strides along the last dim")
    dev = qkv.device
    out = torch.empty(n, heads * hd, dtype=qkv.dtype, device=dev)
    splits, chunk, meta = kernel_constants(n, S, heads, kv_heads, hd, qkv.dtype, splits, block_s, num_warps)
    rows = n * (heads // kv_heads)
    if splits > 1:
        part = torch.empty(kv_heads, splits, rows, meta["HP"], dtype=torch.float32, device=dev)
        stat = torch.empty(kv_heads, splits, rows, 2, dtype=torch.float32, device=dev)
        counters = torch.zeros(kv_heads, dtype=torch.int32, device=dev) if counters is None else counters
    else:
        part = stat = out
        counters = slots
    _rope_attend_kernel[(kv_heads, splits)](
        qkv, rope, positions, keys, values, mask.view(torch.uint8), slots, out, part, stat, counters,
        n, S, chunk, splits, positions.stride(0), slots.stride(0), qkv.stride(0), rope.stride(0),
        rope.stride(1), keys.stride(0), keys.stride(1), values.stride(0), values.stride(1), mask.stride(0),
        out.stride(0), hd**-0.5, **meta,
    )  # fmt: skip
    return out
