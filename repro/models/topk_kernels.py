"""Row-wise top-k in one or two Triton launches: what the drafters and DDTree's tree stage ask of
``torch.topk`` on the GPU path, without its several launches a call.

At the tiny family's vocabulary (4096) ``torch.topk`` plus DDTree's float64 log of the top
probabilities took 35 us of graph time a step, against ~10 us for the best-first heap that reads them
(results/2026-12-01-h200-fused-engine, dev-bestfirst). Here each row's chunk of ``CHUNK`` entries is one
program: every entry becomes one int64 key, (order-preserving bits of the float32 value) << 32 |
(2^31 - 1 - index), so that the largest keys are the largest values and, among equal values, the smaller
indices; a bitonic top-k (``tl.topk``) of the keys gives both. Rows longer than a chunk take a second
launch that ranks the chunks' winners. The order is defined: value descending, ties to the smaller
index (``torch.topk`` leaves tie order unspecified; a stable descending sort gives the same as here).

``log=True`` writes the values as float64 ``log(clamp(p, tiny, 1))`` (DDTree's scores,
:func:`repro.decoding.tree_builders.top_log_probs`), else in the input's dtype. Inputs float32, bf16 or
float16 (float64 values do not fit the key: :func:`row_topk` leaves them to ``torch.topk``, as it does
every CPU tensor). NaN is not ranked (callers pass probabilities or logits); -0.0 ranks just below +0.0.

Measured (results/2026-12-04-h200-topk): DDTree's top-k + logs 6.8 us against 34.6, an EAGLE level's 3.7-3.9
against 22-27; in one process the device step of DDTree 0.416 -> 0.359 ms and of SpecLA 0.731 -> 0.590.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.gdn.triton_common import pow2

# entries of a row one program ranks at most, and its warps: DDTree's 15 x 4096, k 32 took 21.6 us on
# 4096-entry chunks, 6.8 on 1024 (four programs a row, then the merge), 6.1 on 512; the routes A/B preferred
# 1024 to 4096 (results/2026-12-04-h200-topk, callCC)
CHUNK = 1024
WARPS = 4
KEYED = (torch.float32, torch.bfloat16, torch.float16)  # dtypes whose values fit the key's upper half
MAX_K = 128  # the largest k ranked here: at k 512 torch.topk was faster (topk-bench, 15 x 4096: 31 vs 44 us)
MAX_ROW = 32768  # the longest row ranked here: 248320 entries (61 chunks) lost to torch.topk (98 vs 68 us)
MAX_MERGE = 8192  # the most chunk winners one merge program ranks (keys in registers)
KERNELS = True  # False: row_topk uses torch.topk on CUDA too (the A/B of scripts/gpu/routes-ab.py)
LOWEST: tl.constexpr = tl.constexpr(-(2**63))  # the key of a masked entry
LOW_MASK: tl.constexpr = tl.constexpr(2**32 - 1)
INDEX_TOP: tl.constexpr = tl.constexpr(2**31 - 1)  # key's lower half: INDEX_TOP - index


@triton.jit
def _keys(v, idx, valid):
    """int64 keys of float32 values ``v`` at indices ``idx``: larger key = larger value, then smaller
    index; ``LOWEST`` where not ``valid``."""
    bits = v.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits
    key = (ordered.to(tl.int64) << 32) | (-idx + INDEX_TOP).to(tl.int64)  # tensor first: constexpr
    return tl.where(valid, key, LOWEST)


@triton.jit
def _emit(top, vals, ids, k, LOG: tl.constexpr, KP: tl.constexpr):
    """Write the first ``k`` of the descending keys ``top`` [KP]: values (float64 logs when LOG) and
    int64 indices."""
    j = tl.arange(0, KP)
    hi = (top >> 32).to(tl.int32)
    bits = hi ^ ((hi >> 31) & 0x7FFFFFFF)
    value = bits.to(tl.float32, bitcast=True)
    index = -(top & LOW_MASK).to(tl.int32) + INDEX_TOP
    keep = j < k
    if LOG:
        tiny = tl.full([KP], 2.2250738585072014e-308, tl.float64)
        p = tl.minimum(tl.maximum(value.to(tl.float64), tiny), 1.0)
        tl.store(vals + j, tl.log(p), mask=keep)
    else:
        tl.store(vals + j, value.to(vals.dtype.element_ty), mask=keep)
    tl.store(ids + j, index.to(tl.int64), mask=keep)


@triton.jit
def _topk_chunks_kernel(
    x, stride_x, n, parts, vals, stride_v, ids, stride_i, k,
    CHUNK: tl.constexpr, KP: tl.constexpr, CHUNKS: tl.constexpr, LOG: tl.constexpr,
):  # fmt: skip
    """Program (row, chunk): the top KP keys of the row's chunk; the row's result when it is the only
    chunk, else into ``parts`` [rows, CHUNKS, KP]."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    idx = c * CHUNK + tl.arange(0, CHUNK)
    valid = idx < n
    v = tl.load(x + row * stride_x + idx, mask=valid, other=0.0).to(tl.float32)
    top = tl.topk(_keys(v, idx, valid), KP)
    if CHUNKS == 1:
        _emit(top, vals + row * stride_v, ids + row * stride_i, k, LOG, KP)
    else:
        tl.store(parts + (row * CHUNKS + c) * KP + tl.arange(0, KP), top)


@triton.jit
def _topk_merge_kernel(
    parts, vals, stride_v, ids, stride_i, k,
    KP: tl.constexpr, CHUNKS: tl.constexpr, MP: tl.constexpr, LOG: tl.constexpr,
):  # fmt: skip
    """Program row: the top KP of the row's CHUNKS x KP chunk winners (padded to MP keys)."""
    row = tl.program_id(0)
    j = tl.arange(0, MP)
    cand = tl.load(parts + row * CHUNKS * KP + j, mask=j < CHUNKS * KP, other=LOWEST)
    _emit(tl.topk(cand, KP), vals + row * stride_v, ids + row * stride_i, k, LOG, KP)


def plan(n: int, k: int) -> tuple[int, int, int, int]:
    """(KP, chunk, chunks, merged keys MP) of ranking rows of ``n`` entries for the top ``k``."""
    kp = max(2, pow2(k))  # tl.topk needs two keys at least
    chunk = max(min(CHUNK, pow2(n)), 2 * kp)
    chunks = triton.cdiv(n, chunk)
    return kp, chunk, chunks, pow2(chunks * kp) if chunks > 1 else 0


def triton_topk_applies(x: torch.Tensor, k: int) -> bool:
    """Whether the kernels rank ``x`` [..., n]: a dtype of :data:`KEYED`, ``1 <= k <= MAX_K``, k at most
    the row length, rows of at most :data:`MAX_ROW` entries and :data:`MAX_MERGE` chunk winners."""
    n = x.shape[-1] if x.dim() else 0
    if not (x.dtype in KEYED and 1 <= k <= min(MAX_K, n) and n <= MAX_ROW):
        return False
    return plan(n, k)[3] <= MAX_MERGE


def row_topk(
    x: torch.Tensor, k: int, log: bool = False, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``x`` [..., n] and their indices (int64), value
    descending; ``log``: the values as float64 ``log(clamp(v, tiny, 1))``; ``out``: (values, ids)
    [..., k] to write into. On CUDA where :func:`triton_topk_applies` (and :data:`KERNELS`), the kernels
    (:func:`launch_topk`: ties to the smaller index); elsewhere ``torch.topk`` (the CPU reference path;
    torch's tie order)."""
    if KERNELS and x.is_cuda and triton_topk_applies(x, k):
        return launch_topk(x, k, log, out)
    if not log:
        if out is None:
            return tuple(torch.topk(x, k, dim=-1))
        torch.topk(x, k, dim=-1, out=out)
        return out
    values, index = torch.topk(x, k, dim=-1)
    values = values.to(torch.float64).clamp(torch.finfo(torch.float64).tiny, 1.0).log()
    if out is None:
        return values, index
    out[0].copy_(values)
    out[1].copy_(index)
    return out


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """Each row's index of its largest entry (int64 [...] of ``x`` [..., n]), the first on ties:
    ``x.argmax(-1)``. On CUDA where the kernels apply (and :data:`KERNELS`), :func:`launch_topk` at k = 1
    (its ties go to the smaller index, as argmax's; a NaN ranks by its bits, where argmax takes any NaN);
    elsewhere ``torch.argmax``. A verify's [33, 4096] bf16 logits: 14.5 us for torch's reduce kernel on
    the H200 (results/2026-12-04-h200-derive-rows/callCG)."""
    if KERNELS and x.is_cuda and triton_topk_applies(x, 1):
        return launch_topk(x, 1)[1][..., 0]
    return x.argmax(-1)


def launch_topk(
    x: torch.Tensor, k: int, log: bool = False, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`row_topk` by the kernels (CUDA, or CPU tensors under Triton's interpreter): one launch a
    call, two when a row spans several chunks. ``out``'s rows must be contiguous."""
    if not triton_topk_applies(x, k):
        raise ValueError(f"the top-k kernels do not rank {x.dtype} rows of {x.shape[-1]} for k = {k}")
    n = x.shape[-1]
    lead = x.shape[:-1]
    rows = x.reshape(-1, n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    r = rows.shape[0]
    want = torch.float64 if log else x.dtype
    if out is None:
        vals = torch.empty(*lead, k, dtype=want, device=x.device)
        ids = torch.empty(*lead, k, dtype=torch.long, device=x.device)
    else:
        vals, ids = out
        shaped = vals.shape == ids.shape == (*lead, k)
        if not shaped or vals.dtype != want or ids.dtype != torch.long:
            raise ValueError(f"out must be ({want}, int64) tensors of shape {(*lead, k)}")
    if r == 0:
        return vals, ids
    v2, i2 = vals.view(r, k), ids.view(r, k)
    kp, chunk, chunks, mp = plan(n, k)
    # the chunks' winners for the merge; one chunk writes the result itself (parts unused: any int64 tensor)
    parts = torch.empty(r, chunks, kp, dtype=torch.long, device=x.device) if chunks > 1 else i2
    _topk_chunks_kernel[(r, chunks)](
        rows, rows.stride(0), n, parts, v2, v2.stride(0), i2, i2.stride(0), k,
        CHUNK=chunk, KP=kp, CHUNKS=chunks, LOG=log, num_warps=max(1, min(WARPS, chunk // 128)),
    )  # fmt: skip
    if chunks > 1:
        _topk_merge_kernel[(r,)](
            parts, v2, v2.stride(0), i2, i2.stride(0), k,
            KP=kp, CHUNKS=chunks, MP=mp, LOG=log, num_warps=max(1, min(8, mp // 1024)),
        )  # fmt: skip
    return vals, ids
