"""Triton kernels for a gated-attention layer's core: the glue between the q|k|v projection and the
output projection, in one launch, for one decode token and for a draft tree's nodes.

:func:`attention_decode` takes the token's stacked projection row ``qkv`` [1, Q + 2 H_kv hd] (Q = H hd,
or 2 H hd with the output gate: per head [q | gate], as ``q_proj`` lays it out) and does, per query
head (one program each): q and k RMSNorm, rotary on the first ``rot`` channels at position
``length`` (the cos/sin rows of a table made once, :func:`rotary_table`), softmax attention over the
cached rows ``0 .. length - 1`` of its key head and the token itself (an online softmax over blocks of
rows), times ``sigmoid(gate)``. The first query head of each key head also writes the token's rotated
key and its value into the cache at row ``length``; no program reads that row (the token's own key and
value are used from registers, rounded to the cache dtype as a later step reads them), so there is no
race. The cache length is read on the device: the launch is capture-safe.

It replaces :func:`repro.models.static_layers.attention_prologue` (after the projection),
``attention_core``, the KV writes and the output gate of a decode step (about 30 aten launches).
Arithmetic is float32 (float64 for float64 data), the output rounded once; the torch glue rounds bf16
after every op, so bf16 results agree to bf16 accuracy and float32 ones to ~1e-6 (pinned in
tests/gdn/test_fused_decode.py against the torch glue).

:func:`attention_tree` is the same for the n nodes of a draft tree (StaticDecoder's verify): node i
sits at position ``length + depth[i] - 1`` and attends to the cache rows ``0 .. length - 1`` and to its
ancestors-or-self among the nodes (the slot's ancestor mask); the cache is not written, the nodes'
normed, rotated keys are returned for the commit. One program per key head and block of query rows
(node x query head of the key head's group): the scores and the weighted values are ``tl.dot`` tiles
over blocks of cache rows, then over blocks of tree nodes whose keys the program makes from ``qkv``
(the first block of rows stores them). Dot operands are in the data's dtype (bf16: q and the
probabilities rounded to bf16 as the torch glue rounds them; float32: "ieee" dots), the softmax and
accumulators float32 (float64 for float64 data). It replaces ``attention_prologue`` (after the
projection), ``attention_core``, the output gate and the per-step masks and rotary tables of a verify
(about 35 aten launches a layer; pinned in tests/gdn/test_tree_attention.py against the torch path).

The tree kernel's cache rows can be split (flash-decoding), for grids too small to fill the GPU: a decode
step through it (``tree_attention_decode``) at Qwen3.6-27B's shape has 4 key heads x 1 row block = 4
programs each walking the whole cache, and DFlash's block (repro/drafters/dflash_fast.py) few more. With
S > 1 splits (a third grid axis) program s takes whole blocks of BR cache rows, ceil(blocks / S) of them
from block s ceil(blocks / S) on (blocks = ceil(length / BR), computed on the device from ``length``:
the launch stays capture-safe; splits past the last block take none and write nothing); split 0 also
takes the tree's nodes (and stores their keys: the same for every S). Each writes its unnormalised
partial (acc, running max m, sum l; float32, float64 for float64 data) to a workspace [S, n, H, hd + 2];
a second launch (:func:`_attention_tree_combine_kernel`, one program per node and query head) merges the
used splits' partials with weights exp(m_s - max m) in one fixed reduction (deterministic), divides,
gates and rounds once. S = 1 is the unsplit kernel (one launch, unchanged arithmetic); float32 results
for S > 1 agree with it to ~1e-7 and bf16 ones to bf16 rounding (the probabilities are rounded to bf16
against each split's own running max; pinned in tests/gdn/test_tree_attention_split.py for S = 1..4).
The default S (:func:`tree_splits`): as many as keep key heads x row blocks x S within one wave over the
SMs (132 on an H200), at most MAX_SPLITS = 64 and at most one per block of BR rows of the buffer's
capacity ``rows``; 1 when the unsplit grid already fills the SMs and in the interpreter (``splits=``
overrides). Measured on an H200 (scripts/gpu/attn-split.py, bf16, the kernel alone in CUDA graphs;
results/2026-12-02-h200-pdl-slots/scripts/attn-split): a 27B decode step (n = 1, S = 33) 21.0 -> 10.1 us at
512 cached rows, 72.4 -> 10.8 at 2048, 294 -> 19.4 at 8192; a 16-row DFlash block (S = 5) 70.2 -> 24.8 at
2048; 65 nodes keep S = 1 (S = 2 was slower); the tiny family 1.4-22x. At 512 rows the best S (8) beat the
rule's by 1.7 us: the rule sizes S by the capacity, not the (device-side) length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.gdn.triton_common import acc_dtype, interpreting, pdl_args, pdl_start, pow2, round_to, sm_count


def rotary_table(inv_freq: torch.Tensor, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[rows, 2, rot]: cos and sin of every position 0 .. rows - 1 in ``dtype`` (angles in float64, as
    :func:`repro.models.layers.rotary_tables` makes them)."""
    freqs = torch.arange(rows, dtype=torch.float64, device=device)[:, None] * inv_freq.to(device)[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    return torch.stack([emb.cos(), emb.sin()], dim=1).to(dtype).contiguous()


@triton.jit
def _norm_rotary(
    row_ptr, o, scale_ptr, rope_ptr, eps, HD: tl.constexpr, ROT: tl.constexpr, ACC: tl.constexpr
):  # fmt: skip
    """RMSNorm (times scale) of the heads at ``row_ptr`` (a pointer, or a [BM, 1] block of them: one head
    a row), then rotary of their first ROT channels by the cos|sin rows at ``rope_ptr`` ([2, ROT] each,
    shaped as ``row_ptr``). ``o``: the channel offsets ([BD] or [1, BD]); the result has the broadcast
    shape of the two and is zero past HD."""
    m = o < HD
    x = tl.load(row_ptr + o, mask=m, other=0.0).to(ACC)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=-1, keep_dims=True) / HD + eps)
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
def _softmax_step(s, m_i, l_i):
    """One block of an online softmax along the last axis: scores ``s`` (masked entries -inf), the running
    max ``m_i`` and sum ``l_i`` (the shape of ``s`` with the last axis kept as 1; ``m_i`` finite) ->
    (p = exp(s - m_new), the factor alpha = exp(m_i - m_new) of what was summed so far, m_new, l_new)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=-1, keep_dims=True))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=-1, keep_dims=True)


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
    PDL: tl.constexpr,
):
    """Query head ``pid``: norms, rotary, attention over the cache and the token, output gate."""
    pdl_start(PDL)
    h = tl.program_id(0)
    kvh = h // (H // HKV)
    length = tl.load(len_ptr)
    Q_STRIDE: tl.constexpr = 2 * HD if GATE else HD
    Q_OUT: tl.constexpr = H * Q_STRIDE
    rope = rope_ptr + length * 2 * ROT
    o_d = tl.arange(0, BD)
    m_d = o_d < HD
    q = _norm_rotary(qkv_ptr + h * Q_STRIDE, o_d, q_scale_ptr, rope, q_eps, HD, ROT, ACC)
    k = _norm_rotary(qkv_ptr + Q_OUT + kvh * HD, o_d, k_scale_ptr, rope, k_eps, HD, ROT, ACC)
    v = tl.load(qkv_ptr + Q_OUT + HKV * HD + kvh * HD + o_d, mask=m_d, other=0.0)
    k_c = round_to(k, keys_ptr)
    v_c = v.to(values_ptr.dtype.element_ty)
    cache = kvh * rows * HD
    if h % (H // HKV) == 0:  # the token's key and value into row ``length`` (read by no program here)
        tl.store(keys_ptr + cache + length * HD + o_d, k_c, mask=m_d)
        tl.store(values_ptr + cache + length * HD + o_d, v_c, mask=m_d)
    # online softmax, started at the token itself (its key and value as the cache holds them)
    m_i = tl.sum(q * k_c.to(ACC), axis=0, keep_dims=True) * scale
    l_i = tl.full([1], 1.0, ACC)
    acc = v_c.to(ACC)
    o_r = tl.arange(0, BR)
    r0 = length * 0
    while r0 < length:  # a while loop: the interpreter takes no device value as a range bound
        r = r0 + o_r
        m_r = r < length
        m = m_r[:, None] & m_d[None, :]
        kb = tl.load(keys_ptr + cache + r[:, None] * HD + o_d[None, :], mask=m, other=0.0).to(ACC)
        s = tl.sum(kb * q[None, :], axis=1) * scale
        p, alpha, m_i, l_i = _softmax_step(tl.where(m_r, s, float("-inf")), m_i, l_i)
        vb = tl.load(values_ptr + cache + r[:, None] * HD + o_d[None, :], mask=m, other=0.0).to(ACC)
        acc = acc * alpha + tl.sum(p[:, None] * vb, axis=0)
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
        ACC=acc_dtype(qkv.dtype), num_warps=4 if br * bd <= 4096 else 8, **pdl_args(qkv.device),
    )  # fmt: skip
    return out


@triton.jit(do_not_specialize=["splits"])  # one compile for every S > 1
def _attention_tree_kernel(
    qkv_ptr,
    q_scale_ptr,
    k_scale_ptr,
    rope_ptr,
    keys_ptr,
    values_ptr,
    len_ptr,
    depth_ptr,
    anc_ptr,
    out_ptr,
    k_out_ptr,
    part_ptr,
    q_eps,
    k_eps,
    scale,
    rows,
    n,
    qkv_stride,
    splits,
    H: tl.constexpr,
    HKV: tl.constexpr,
    HD: tl.constexpr,
    ROT: tl.constexpr,
    GATE: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    BR: tl.constexpr,
    BT: tl.constexpr,
    ACC: tl.constexpr,
    DOT: tl.constexpr,
    SPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Key head ``pid 0``, query rows ``pid 1`` (row r: node r // G, query head G kvh + r % G), split
    ``pid 2`` of the cache rows: norms, rotary, online softmax over the split's cache rows, then (split 0
    only) over the tree's keys (made here from ``qkv``; the first row block writes them out) under the
    ancestor mask; not SPLIT (``splits`` = 1): the output gate and the output, else the partial (acc, m,
    l) into ``part_ptr`` [splits, n, H, HD + 2] for :func:`_attention_tree_combine_kernel`."""
    pdl_start(PDL)
    kvh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    G: tl.constexpr = H // HKV
    Q_STRIDE: tl.constexpr = 2 * HD if GATE else HD
    K_COL: tl.constexpr = H * Q_STRIDE
    length = tl.load(len_ptr).to(tl.int32)  # int32 index arithmetic (fewer registers)
    o_d = tl.arange(0, BD)[None, :]
    m_d = o_d < HD
    r = pid_m * BM + tl.arange(0, BM)
    live = r < n * G
    node = tl.minimum(r // G, n - 1)  # rows past the last node: a valid one, never stored
    h = kvh * G + r % G
    q_row = qkv_ptr + node[:, None] * qkv_stride + h[:, None] * Q_STRIDE
    rope = rope_ptr + (length + tl.load(depth_ptr + node).to(tl.int32) - 1)[:, None] * 2 * ROT
    q = round_to(_norm_rotary(q_row, o_d, q_scale_ptr, rope, q_eps, HD, ROT, ACC), qkv_ptr).to(DOT)
    m_i = tl.full([BM, 1], -1.0e30, ACC)  # finite: a block with every score masked adds nothing
    l_i = tl.zeros([BM, 1], ACC)
    acc = tl.zeros([BM, BD], ACC)
    o_r = tl.arange(0, BR)
    cache = kvh * rows * HD
    if not SPLIT:
        r0 = length * 0
        end = length
        n_tree = n
    else:
        r0, end, _ = _split_rows(length, pid_s, BR, splits)
        n_tree = tl.where(pid_s == 0, n, 0)  # the tree's keys: split 0's
    while r0 < end:  # the cache rows [r0, end): a while loop, as in _attention_decode_kernel
        c = r0 + o_r
        m_c = c < end
        m = m_c[:, None] & m_d
        kb = tl.load(keys_ptr + cache + c[:, None] * HD + o_d, mask=m, other=0.0).to(DOT)
        s = tl.dot(q, tl.trans(kb), input_precision="ieee").to(ACC) * scale
        p, alpha, m_i, l_i = _softmax_step(tl.where(m_c[None, :], s, float("-inf")), m_i, l_i)
        vb = tl.load(values_ptr + cache + c[:, None] * HD + o_d, mask=m, other=0.0).to(DOT)
        acc = acc * alpha + tl.dot(round_to(p, qkv_ptr).to(DOT), vb, input_precision="ieee").to(ACC)
        r0 += BR
    for j0 in range(0, n_tree, BT):  # the tree's nodes, each key made once per block of query rows
        j = j0 + tl.arange(0, BT)
        m_j = j < n
        jc = tl.minimum(j, n - 1)
        k_row = qkv_ptr + jc[:, None] * qkv_stride + K_COL + kvh * HD
        rope_j = rope_ptr + (length + tl.load(depth_ptr + jc).to(tl.int32) - 1)[:, None] * 2 * ROT
        kt = round_to(_norm_rotary(k_row, o_d, k_scale_ptr, rope_j, k_eps, HD, ROT, ACC), k_out_ptr)
        mine = m_j[:, None] & m_d & (pid_m == 0)
        tl.store(k_out_ptr + j[:, None] * HKV * HD + kvh * HD + o_d, kt, mask=mine)
        vt = tl.load(k_row + HKV * HD + o_d, mask=m_d, other=0.0).to(DOT)
        seen = tl.load(anc_ptr + node[:, None] * n + j[None, :], mask=m_j[None, :], other=0) != 0
        s = tl.dot(q, tl.trans(kt.to(DOT)), input_precision="ieee").to(ACC) * scale
        p, alpha, m_i, l_i = _softmax_step(tl.where(seen, s, float("-inf")), m_i, l_i)
        acc = acc * alpha + tl.dot(round_to(p, qkv_ptr).to(DOT), vt, input_precision="ieee").to(ACC)
    if not SPLIT:
        out = acc / l_i
        if GATE:
            gate = tl.load(q_row + HD + o_d, mask=m_d, other=0.0).to(ACC)
            out = out / (1.0 + tl.exp(-gate))
        dest = out_ptr + node[:, None] * (H * HD) + h[:, None] * HD + o_d
        tl.store(dest, round_to(out, out_ptr), mask=live[:, None] & m_d)
    else:  # the partial of a split that has rows (or split 0); the others are never read
        _, _, used = _split_rows(length, pid_s, BR, splits)
        keep = live[:, None] & (pid_s < used)
        part = part_ptr + ((pid_s * n + node) * H + h)[:, None] * (HD + 2)
        tl.store(part + o_d, acc, mask=keep & m_d)
        tl.store(part + HD, m_i, mask=keep)
        tl.store(part + HD + 1, l_i, mask=keep)


@triton.jit
def _split_rows(length, s, BR: tl.constexpr, splits):
    """Split ``s``'s cache rows [lo, hi) of [0, length): whole blocks of BR rows, ceil(blocks / splits)
    a split, the last ones empty when too few; and ``used``: the splits with rows (at least 1)."""
    blocks = tl.cdiv(length, BR)
    per = tl.maximum(tl.cdiv(blocks, splits), 1)
    lo = tl.minimum(s * per * BR, length)
    hi = tl.minimum(lo + per * BR, length)
    return lo, hi, tl.maximum(tl.cdiv(blocks, per), 1)


@triton.jit(do_not_specialize=["splits"])
def _attention_tree_combine_kernel(
    part_ptr,
    qkv_ptr,
    len_ptr,
    out_ptr,
    n,
    qkv_stride,
    splits,
    H: tl.constexpr,
    HD: tl.constexpr,
    GATE: tl.constexpr,
    BD: tl.constexpr,
    BR: tl.constexpr,
    SP: tl.constexpr,
    ACC: tl.constexpr,
    PDL: tl.constexpr,
):
    """Query row ``pid`` (node pid // H, head pid % H): the used splits' partials merged (weights
    exp(m_s - max m), summed in one fixed reduction), divided, gated, rounded once."""
    pdl_start(PDL)
    row = tl.program_id(0)
    node = row // H
    h = row % H
    _, _, used = _split_rows(tl.load(len_ptr).to(tl.int32), 0, BR, splits)
    o_s = tl.arange(0, SP)
    m_s = o_s < used
    o_d = tl.arange(0, BD)
    m_d = o_d < HD
    part = part_ptr + (o_s * n * H + row) * (HD + 2)
    m = tl.load(part + HD, mask=m_s, other=-1.0e30).to(ACC)
    w = tl.where(m_s, tl.exp(m - tl.max(m, axis=0)), 0.0)
    den = tl.sum(tl.load(part + HD + 1, mask=m_s, other=0.0).to(ACC) * w, axis=0)
    acc = tl.load(part[:, None] + o_d[None, :], mask=m_s[:, None] & m_d[None, :], other=0.0).to(ACC)
    out = tl.sum(acc * w[:, None], axis=0) / den
    if GATE:
        Q_STRIDE: tl.constexpr = 2 * HD
        gate = tl.load(qkv_ptr + node * qkv_stride + h * Q_STRIDE + HD + o_d, mask=m_d, other=0.0).to(ACC)
        out = out / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * HD + o_d, round_to(out, out_ptr), mask=m_d)


TREE_ATTENTION_MAX_HEAD_DIM = 256  # a query row's head is one register tile of the kernel
_HALF = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}  # half-precision dot operands
_TORCH_ACC = {tl.float32: torch.float32, tl.float64: torch.float64}
MAX_SPLITS = 64  # the combine's [splits, head_dim] tile stays one register tile


def tree_splits(programs: int, capacity_blocks: int, sms: int) -> int:
    """The default number of cache-row splits S of :func:`attention_tree`: as many as keep the grid
    (``programs`` = key heads x query row blocks, times S) within one wave over the ``sms`` SMs, at most
    MAX_SPLITS and at most one split per block of BR rows of the cache's capacity; 1 when the programs
    already fill the SMs."""
    return max(1, min(sms // max(programs, 1), MAX_SPLITS, capacity_blocks))


def tree_blocks(
    dtype: torch.dtype,
    device: torch.device,
    n: int,
    heads: int,
    kv_heads: int,
    hd: int,
    rows: int,
    block_m: int | None = None,
    block_rows: int | None = None,
    splits: int | None = None,
) -> tuple[int, int, int]:
    """(block_m, block_rows, splits) of :func:`attention_tree`'s launch: the given ones, else the defaults."""
    bd = max(16, pow2(hd))
    half = dtype in _HALF
    group_rows = pow2(heads // kv_heads * n)
    # half precision: query tiles of <= 4096 entries of a padded head, cache tiles of <= 16384 (the H200,
    # results/2026-12-01-h200-verify-glue/scripts/tree-attention: at the 27B shape, hd 256, 16 x 64 took
    # 28 us against 43-61 for 32 x 32, 32 x 16, 16 x 16, 64 x 32; 64 x 64 at the tiny family's hd, 16 us);
    # float32, whose "ieee" dots run on FMAs: 1024 / 2048 (few register spills at hd 48 and 256, ptxas)
    bm = block_m or (16 if interpreting() else min(64, max(16, (4096 if half else 1024) // bd), group_rows))
    br = block_rows or (16 if interpreting() else min(64, max(16, (16384 if half else 2048) // bd)))
    bm, br = pow2(max(16, bm)), pow2(br)
    if splits is None:
        programs = kv_heads * triton.cdiv(heads // kv_heads * n, bm)
        splits = 1 if interpreting() else tree_splits(programs, rows // br, sm_count(device))
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"splits must be in 1 .. {MAX_SPLITS}, got {splits}")
    return bm, br, splits


def attention_tree(
    qkv: torch.Tensor,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
    eps: tuple[float, float],
    rope: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    length: torch.Tensor,
    depth: torch.Tensor,
    ancestors: torch.Tensor,
    heads: int,
    output_gate: bool,
    *,
    block_m: int | None = None,
    block_rows: int | None = None,
    splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention of a tree's n nodes (see the module docstring): ``qkv`` [n, Q + 2 H_kv hd] (rows
    may be strided), norm scales, eps and ``rope`` as :func:`attention_decode` takes them, ``keys`` /
    ``values`` [H_kv, rows, hd] (read only: rows [0, length)), ``length`` [1] int64, ``depth`` [n] int64
    (root level 1: node i sits at position length + depth[i] - 1) and ``ancestors`` [n, n] bool or uint8
    (row i: the ancestors-or-self of i), all on the device.

    Returns (out [n, H hd] gated, in qkv's dtype; k [n, H_kv, hd]: the nodes' normed, rotated keys in
    the cache dtype; v [n, H_kv, hd]: a view of qkv). ``block_m``: query rows (node x head of a group)
    per program; ``block_rows``: cache rows per softmax block (defaults below, 16 interpreted; from the
    few blocks scripts/gpu/tree-attention.py times); tree nodes go 16 a block. ``splits``: the cache rows'
    splits S (default :func:`tree_splits`; 1 interpreted): S > 1 adds the combine launch."""
    n = qkv.shape[0]
    kv_heads, rows, hd = keys.shape
    if qkv.dim() != 2 or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be [n, N] with unit column stride, got {tuple(qkv.shape)}")
    if not (keys.is_contiguous() and values.is_contiguous()) or heads % kv_heads:
        raise ValueError("keys and values must be contiguous [H_kv, rows, hd] and H_kv must divide H")
    if hd > TREE_ATTENTION_MAX_HEAD_DIM:
        raise ValueError(f"head_dim {hd} exceeds the tree kernel's {TREE_ATTENTION_MAX_HEAD_DIM}")
    q_out = heads * hd * (2 if output_gate else 1)
    if qkv.shape[1] != q_out + 2 * kv_heads * hd:
        raise ValueError(f"qkv has {qkv.shape[1]} columns, expected {q_out + 2 * kv_heads * hd}")
    if depth.shape != (n,) or depth.dtype != torch.long or ancestors.shape != (n, n):
        raise ValueError(f"depth must be int64 [{n}] and ancestors [{n}, {n}]")
    mask = ancestors.contiguous()
    mask = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    out = torch.empty(n, heads * hd, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(n, kv_heads, hd, dtype=keys.dtype, device=qkv.device)
    v = qkv[:, q_out + kv_heads * hd :].view(n, kv_heads, hd)
    bd = max(16, pow2(hd))  # tl.dot tiles: 16+ on every axis
    bm, br, splits = tree_blocks(
        qkv.dtype, qkv.device, n, heads, kv_heads, hd, rows, block_m, block_rows, splits
    )
    table = rope if rope.numel() else qkv  # no rotary: any valid pointer (never read)
    acc = acc_dtype(qkv.dtype)
    # the interpreter's dot multiplies bf16 bit patterns: there the operands go as float32, rounded to
    # bf16 first (the same products)
    dot = acc if interpreting() else _HALF.get(qkv.dtype, acc)
    grid = (kv_heads, triton.cdiv(heads // kv_heads * n, bm))
    # the splits' partials (acc | m | l per query row; S = 1: none, any valid pointer never read)
    part = (
        out
        if splits == 1
        else torch.empty(splits, n, heads, hd + 2, dtype=_TORCH_ACC[acc], device=qkv.device)
    )
    _attention_tree_kernel[grid + (splits,)](
        qkv, q_scale, k_scale, table, keys, values, length, depth.contiguous(), mask, out, k, part,
        float(eps[0]), float(eps[1]), hd**-0.5, rows, n, qkv.stride(0), splits, H=heads, HKV=kv_heads, HD=hd,
        ROT=rope.shape[-1], GATE=output_gate, BD=bd, BM=bm, BR=br, BT=16, ACC=acc, DOT=dot, SPLIT=splits > 1,
        num_warps=8 if bm * max(bd, br) > 4096 or bd >= 256 else 4, **pdl_args(qkv.device),
    )  # fmt: skip
    if splits > 1:
        sp = pow2(splits)
        _attention_tree_combine_kernel[(n * heads,)](
            part, qkv, length, out, n, qkv.stride(0), splits, H=heads, HD=hd, GATE=output_gate, BD=bd,
            BR=br, SP=sp, ACC=acc, num_warps=8 if sp * bd > 4096 else 4, **pdl_args(qkv.device),
        )  # fmt: skip
    return out, k, v


@triton.jit
def _context_kv_kernel(
    kv_ptr,
    pos_ptr,
    k_scale_ptr,
    rope_ptr,
    keys_ptr,
    values_ptr,
    eps,
    kv_stride,
    rows,
    KV: tl.constexpr,
    LKV: tl.constexpr,
    HD: tl.constexpr,
    BD: tl.constexpr,
    ACC: tl.constexpr,
    PDL: tl.constexpr,
):
    """Feature row ``pid0``, (layer, key head) ``pid1``: the key RMSNorm'd (the layer's scale) and rotated at
    the row's position into ``keys``, the value copied into ``values`` ([L, KV, rows, HD] each)."""
    pdl_start(PDL)
    i = tl.program_id(0)
    lh = tl.program_id(1)
    layer = lh // KV
    pos = tl.load(pos_ptr + i)
    o = tl.arange(0, BD)
    m = o < HD
    row = kv_ptr + i * kv_stride
    k = _norm_rotary(row + lh * HD, o, k_scale_ptr + layer * HD, rope_ptr + pos * 2 * HD, eps, HD, HD, ACC)
    dst = (lh * rows + pos) * HD + o  # [L, KV] flattened: lh = layer * KV + head
    tl.store(keys_ptr + dst, round_to(k, keys_ptr), mask=m)
    v = tl.load(row + LKV * HD + lh * HD + o, mask=m, other=0.0)
    tl.store(values_ptr + dst, v.to(values_ptr.dtype.element_ty), mask=m)


def write_context_kv(
    kv: torch.Tensor,
    positions: torch.Tensor,
    k_scale: torch.Tensor,
    eps: float,
    rope: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """Context keys and values of every layer in one launch (DFlash's ingest of accepted feature rows).

    ``kv`` [n, 2 L KV hd]: per row every layer's raw key heads, then every layer's value heads (the stacked
    k|v projections); ``positions`` [n] int64 on the device (distinct); ``k_scale`` [L, hd] (each layer's
    k_norm weight; RMSNorm with ``eps``); ``rope`` [rows, 2, hd] (:func:`rotary_table`: cos | sin, rotary
    over the whole head in ``rotate_half`` style). Writes row ``positions[i]`` of ``keys`` / ``values``
    [L, KV, rows, hd] (contiguous): the normed, rotated key (arithmetic in float32, float64 for float64
    data, rounded once) and the value as given."""
    layers, kv_heads, rows, hd = keys.shape
    n = kv.shape[0]
    if kv.dim() != 2 or kv.stride(-1) != 1 or kv.shape[1] != 2 * layers * kv_heads * hd:
        raise ValueError(
            f"kv must be [n, {2 * layers * kv_heads * hd}] with contiguous rows, got {tuple(kv.shape)}"
        )
    if not (keys.is_contiguous() and values.is_contiguous()) or values.shape != keys.shape:
        raise ValueError("keys and values must be contiguous [L, KV, rows, hd] of one shape")
    if k_scale.shape != (layers, hd) or rope.shape[1:] != (2, hd) or positions.shape != (n,):
        raise ValueError(
            f"k_scale must be [{layers}, {hd}], rope [rows, 2, {hd}], positions [{n}]; got "
            f"{tuple(k_scale.shape)}, {tuple(rope.shape)}, {tuple(positions.shape)}"
        )
    if n == 0:
        return
    _context_kv_kernel[(n, layers * kv_heads)](
        kv, positions, k_scale.contiguous(), rope.contiguous(), keys, values, float(eps), kv.stride(0), rows,
        KV=kv_heads, LKV=layers * kv_heads, HD=hd, BD=pow2(hd), ACC=acc_dtype(kv.dtype), num_warps=1,
        **pdl_args(kv.device),
    )  # fmt: skip
