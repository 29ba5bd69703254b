"""Triton kernels of the static DFlash drafter's step inputs (the fast path of
:class:`~repro.drafters.static_dflash.StaticDFlash`): what a step did in small torch ops around its
matmuls, in few launches.

At the tiny family's width a drafter step is bound by its launches (results/2026-12-04-h200-engine-runs: the
DFlash draft is 0.14 ms of DDTree's 0.49 ms step); each kernel here is one launch, capturable (no host read),
and equal to the torch ops it replaces (tests/drafters/test_ingest_kernels.py, under Triton's interpreter):

- :func:`gather_features`: one launch per feature layer for the accepted path's rows of that layer's hidden
  states (``torch.cat([h.index_select(0, path) ...]).to(dtype)``) into the fc input and the feature buffer
  at positions ``start + j`` (``index_copy_``); the first also writes the positions and the committed length
  ``start + count`` (7 aten launches before, 2 with two feature layers).
- :func:`launched_inputs`: the step inputs ``[bonus, start, path length, path + zeros]`` taken from a
  launched, unread verify's result and the committed length (5 copies before).
- :func:`last_feature`: Weaver's root feature, the feature row of the last committed position (4 aten
  launches before);
- :func:`block_rows`: the block's input rows, the root's embedding then the mask token's (3 before).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.drafters.triton_dtypes import round_to, tl_dtype  # round_to: exact in the interpreter too

COLUMN_BLOCK = 1024  # feature columns a program copies


@triton.jit
def _gather_features_kernel(
    src, src_stride, path, start_ptr, count_ptr, rows, rows_stride, feat, feat_stride, positions, length,
    col0, width, BH: tl.constexpr, FIRST: tl.constexpr,
):  # fmt: skip
    """Path row ``pid0``, column block ``pid1`` of one feature layer: src[path[j]] into rows[j] and
    feat[start + j] at column ``col0``; the first layer's also write positions[j] and the length."""
    j = tl.program_id(0)
    cb = tl.program_id(1)
    start = tl.load(start_ptr)
    node = tl.load(path + j)
    o = cb * BH + tl.arange(0, BH)
    m = o < width
    y = tl.load(src + node * src_stride + o, mask=m, other=0.0)
    tl.store(rows + j * rows_stride + col0 + o, y, mask=m)
    tl.store(feat + (start + j) * feat_stride + col0 + o, y, mask=m)
    if FIRST and cb == 0:
        tl.store(positions + j, start + j)
        if j == 0:
            tl.store(length, start + tl.load(count_ptr))


def gather_features(
    sources: tuple[torch.Tensor, ...],
    path: torch.Tensor,
    start: torch.Tensor,
    count: torch.Tensor,
    feat: torch.Tensor,
    length: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fc input rows [P, F] (``feat``'s dtype: the feature layers' rows of the padded ``path`` [P],
    side by side) and their positions ``start + 0 .. P - 1`` [P]; also written into ``feat`` [max_len, F]
    at those positions, and ``length`` (a 0-d int64 tensor) set to ``start + count`` (``start``,
    ``count``: 0-d int64 device tensors). Each source [N, H_s] with contiguous rows; sum(H_s) = F.
    Sources in another dtype are cast (by torch, before the kernel)."""
    n, f = path.shape[0], feat.shape[1]
    if sum(s.shape[1] for s in sources) != f or any(s.stride(-1) != 1 for s in sources):
        raise ValueError(f"the sources' columns must add up to the feature width {f}, each row contiguous")
    if feat.stride(-1) != 1:
        raise ValueError("feat must have contiguous rows")
    # another dtype than the features' is cast by torch first (its rounding; the interpreter's casts to
    # bf16 truncate): the drafter and the target share one dtype on the routes, so this costs no launch
    sources = tuple(s if s.dtype == feat.dtype else s.to(feat.dtype) for s in sources)
    rows = torch.empty(n, f, dtype=feat.dtype, device=feat.device)
    positions = torch.empty(n, dtype=torch.long, device=feat.device)
    col0 = 0
    for i, src in enumerate(sources):
        width = src.shape[1]
        bh = min(COLUMN_BLOCK, triton.next_power_of_2(width))
        _gather_features_kernel[(n, triton.cdiv(width, bh))](
            src, src.stride(0), path, start, count, rows, rows.stride(0), feat, feat.stride(0), positions,
            length, col0, width, BH=bh, FIRST=i == 0, num_warps=4,
        )  # fmt: skip
        col0 += width
    return rows, positions


@triton.jit
def _launched_inputs_kernel(result, length, inp, width, n, BN: tl.constexpr):
    """inp = [result[1], length, result[0], result[2 : 2 + width], zeros] (n entries)."""
    o = tl.arange(0, BN)
    path = tl.load(result + 2 + (o - 3), mask=(o >= 3) & (o < 3 + width), other=0)
    head = tl.where(o == 0, tl.load(result + 1), tl.where(o == 1, tl.load(length), tl.load(result)))
    tl.store(inp + o, tl.where(o < 3, head, path), mask=o < n)


def launched_inputs(result: torch.Tensor, length: torch.Tensor, inp: torch.Tensor, width: int) -> None:
    """``inp`` [3 + P] (int64) = [bonus, start, path length, path + zeros] from a launched verify's
    ``result`` (``[path length, bonus, path nodes by depth ...]``, int64) and the committed ``length``
    (0-d): the first ``width`` path nodes, zeros after them."""
    if result.dtype != inp.dtype or length.dtype != inp.dtype or width > inp.shape[0] - 3:
        raise ValueError("result, length and inp must be int64, and width at most inp's path entries")
    n = inp.shape[0]
    _launched_inputs_kernel[(1,)](result, length, inp, width, n, BN=triton.next_power_of_2(n), num_warps=1)


@triton.jit
def _last_feature_kernel(feat, feat_stride, length, tail, width, BH: tl.constexpr):
    """tail = feat[max(length - 1, 0)], column block ``pid``."""
    o = tl.program_id(0) * BH + tl.arange(0, BH)
    m = o < width
    row = tl.maximum(tl.load(length) - 1, 0)
    tl.store(tail + o, tl.load(feat + row * feat_stride + o, mask=m, other=0.0), mask=m)


def last_feature(feat: torch.Tensor, length: torch.Tensor, tail: torch.Tensor) -> None:
    """``tail`` [1, F] = the feature row of the last committed position, ``feat[max(length - 1, 0)]``
    (Weaver's root feature; ``length`` a 0-d int64 device tensor)."""
    if feat.stride(-1) != 1 or not tail.is_contiguous() or tail.shape != (1, feat.shape[1]):
        raise ValueError(f"tail must be contiguous [1, {feat.shape[1]}] and feat's rows contiguous")
    width = feat.shape[1]
    bh = min(COLUMN_BLOCK, triton.next_power_of_2(width))
    _last_feature_kernel[(triton.cdiv(width, bh),)](
        feat, feat.stride(0), length, tail, width, BH=bh, num_warps=4
    )


@triton.jit
def _block_rows_kernel(
    embedding,
    emb_stride,
    root_ptr,
    mask_id,
    out,
    width,
    scale,
    BH: tl.constexpr,
    SCALE: tl.constexpr,
    ACC: tl.constexpr,
    DT: tl.constexpr,
):
    """Block row ``pid0`` (0: the root, else the mask token), column block ``pid1``: its embedding row."""
    r = tl.program_id(0)
    o = tl.program_id(1) * BH + tl.arange(0, BH)
    m = o < width
    token = tl.where(r == 0, tl.load(root_ptr), mask_id)
    x = tl.load(embedding + token * emb_stride + o, mask=m, other=0.0)
    if SCALE:
        x = round_to(x.to(ACC) * scale, DT)
    tl.store(out + r * width + o, x, mask=m)


def block_rows(
    embedding: torch.Tensor, root: torch.Tensor, mask_id: int, rows: int, scale: float
) -> torch.Tensor:
    """The DFlash block's input rows [rows, hidden]: the embedding of ``root`` (a 1-element int64 device
    tensor) then of ``mask_id`` for the other rows, times ``scale`` (when not 1: in float32, float64 for
    float64 rows, rounded once, as torch multiplies a tensor by a Python float)."""
    if embedding.stride(-1) != 1:
        raise ValueError("embedding rows must be contiguous")
    width = embedding.shape[1]
    out = torch.empty(rows, width, dtype=embedding.dtype, device=embedding.device)
    bh = min(COLUMN_BLOCK, triton.next_power_of_2(width))
    _block_rows_kernel[(rows, triton.cdiv(width, bh))](
        embedding, embedding.stride(0), root, int(mask_id), out, width, float(scale), BH=bh,
        SCALE=scale != 1.0, ACC=tl.float64 if embedding.dtype == torch.float64 else tl.float32,
        DT=tl_dtype(embedding.dtype), num_warps=4,
    )  # fmt: skip
    return out
