"""Row-block x matrix Triton kernels for the decode and verify steps, the glue around the matmul fused in.

A decode step multiplies one row (n <= 4 rows here) by every weight matrix of the model, so its time is
the time to stream the weights: each program of the GEMV variant owns ``block_n`` output rows and walks
K in ``block_k`` chunks, loading [block_n, block_k] weight tiles (contiguous along K, as nn.Linear
stores them), with many programs in flight; all rows of x share each weight tile. A verify step
multiplies the T nodes of a draft tree (n = 5 .. :data:`MAX_VERIFY_ROWS` rows): the same kernel's
row-tiled variant runs a grid of output blocks x row blocks, each program one ``tl.dot`` per K chunk on
a [block_m, block_k] x [block_k, block_n] tile (tiles >= 16; float32 accumulation), the RMS of its row
block computed in the program as before. At small widths a launch costs more than its arithmetic, so
folding the norm, SiLU * up and residual launches into the matmul is what counts. Arithmetic is float32
(float64 for float64 data), each output rounded once to x's dtype. What each kernel folds in:

- :func:`norm_linear`: ``rms_norm(x, scale, eps) @ W^T (+ bias)``; every program recomputes its rows'
  RMS (rows of a few thousand elements) instead of a separate norm launch.
- :func:`norm_gate_up`: ``SiLU(g) * u`` with ``[g; u] = rms_norm(x) @ gate_up^T``; a program computes
  the same output block of g and of u, so the [n, 2 I] intermediate is never written.
- :func:`linear_residual`: ``residual + x @ W^T (+ bias)`` (the addmm of out_proj / down_proj).
- :func:`norm_linear_argmax`: :func:`norm_linear` of one row (the LM head) with its argmax (first on ties)
  into a device buffer: each program also writes its block's maximum, a one-program reduce picks the
  column (and can move the decode step's length on).

Semantics are those of :func:`repro.models.layers.rms_norm`, ``F.silu`` and ``F.linear`` (pinned in
tests/gdn/test_triton_linear.py): float32 results agree to ~1e-6 (the row-tiled dots are exact "ieee"
float32, as cuBLAS without TF32), float64 ones to rounding; bf16 ones carry one bf16 rounding of the
output (the torch glue rounds after every op): the normed row is not rounded to bf16 before the matmul
(the row-tiled variant feeds the tensor cores its hi and lo bf16 parts, two dots on one weight tile, so
the row keeps ~16 bits). The default block sizes are untuned guesses (GEMV: about 512 programs for the
row counts of the 1.3B model, [block_n, block_k] tiles of at most 4096 weights, 4 warps; row-tiled: see
:func:`_row_tiles`); ``block_m``/``block_n``/``block_k``/``num_warps`` override them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.errors import ConfigError
from repro.gdn.triton_common import acc_dtype, interpreting, pow2, round_to, silu

MAX_ROWS = 4  # rows of x the GEMV variant takes (decode: 1); its programs keep them all in registers
# rows of x per call in all (the row-tiled variant above MAX_ROWS): the verify slots of the budgets the
# routes use (16..256 nodes); larger slots keep cuBLAS (StaticDecoder checks this before it calls)
MAX_VERIFY_ROWS = 256


@triton.jit
def _rstd(x_ptr, x_stride, eps, rows, n_rows, RB: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
          ACC: tl.constexpr):  # fmt: skip
    """1 / rms of the rows ``rows`` [RB] of x [n_rows, K] -> [RB] (rows past n_rows: 1 / sqrt(eps))."""
    m_r = rows < n_rows
    ss = tl.zeros([RB, BK], dtype=ACC)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m = m_r[:, None] & (o_k < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_stride + o_k[None, :], mask=m, other=0.0).to(ACC)
        ss += x * x
    return 1.0 / tl.sqrt(tl.sum(ss, axis=1) / K + eps)


@triton.jit
def _x_chunk(x_ptr, x_stride, scale_ptr, rstd, rows, k0, n_rows, K: tl.constexpr,
             BK: tl.constexpr, NORM: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """Columns k0 .. k0 + BK of the rows ``rows`` of x [RB, BK] (normed and scaled with NORM), zero
    outside."""
    o_k = k0 + tl.arange(0, BK)
    m_k = o_k < K
    m = (rows < n_rows)[:, None] & m_k[None, :]
    x = tl.load(x_ptr + rows[:, None] * x_stride + o_k[None, :], mask=m, other=0.0).to(ACC)
    if NORM:
        x = x * rstd[:, None] * tl.load(scale_ptr + o_k, mask=m_k, other=0.0).to(ACC)[None, :]
    return x


@triton.jit
def _tile_dot(w_ptr, x, o_n, k0, N_W: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, ACC: tl.constexpr,
              DOT: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """x [RB, BK] (in ACC) times the weight rows o_n [BN], columns k0 .. k0 + BK -> [RB, BN] in ACC.

    Not DOT (RB <= 4 rows): broadcast products summed over K. DOT (RB, BN, BK >= 16): one tl.dot, exact
    ("ieee") for float32 / float64 weights; half weights take x as hi + lo in their dtype (SPLIT: two
    tensor-core dots, x kept to ~16 bits; else x as it is, e.g. an unnormed half row: one dot), both
    accumulated in float32. UPCAST (the CPU interpreter, whose tl.dot misreads bf16 operands): the half
    operands upcast to ACC first (the same products, exact)."""
    o_k = k0 + tl.arange(0, BK)
    m = (o_n < N_W)[:, None] & (o_k < K)[None, :]
    w = tl.load(w_ptr + o_n[:, None] * K + o_k[None, :], mask=m, other=0.0)
    if DOT:
        wt = tl.trans(w)  # [BK, BN]
        if w.dtype == tl.float32 or w.dtype == tl.float64:
            acc = tl.dot(x, wt.to(ACC), input_precision="ieee", out_dtype=ACC)
        else:
            hi = x.to(w.dtype)
            if UPCAST:
                wt = wt.to(ACC)
            acc = tl.dot(hi.to(wt.dtype), wt, out_dtype=ACC)
            if SPLIT:
                lo = (x - hi.to(ACC)).to(w.dtype)
                acc += tl.dot(lo.to(wt.dtype), wt, out_dtype=ACC)
    else:
        acc = tl.sum(w.to(ACC)[None, :, :] * x[:, None, :], axis=2)
    return acc


@triton.jit
def _gemv_kernel(
    x_ptr,
    x_stride,
    scale_ptr,
    w_ptr,
    bias_ptr,
    res_ptr,
    res_stride,
    out_ptr,
    best_ptr,
    best_idx_ptr,
    eps,
    n_rows,
    N: tl.constexpr,
    K: tl.constexpr,
    RB: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    NORM: tl.constexpr,
    GATE_UP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    ARGMAX: tl.constexpr,
    ACC: tl.constexpr,
    DOT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Output columns pid(0) * BN .. + BN of rows pid(1) * RB .. + RB. GATE_UP: W is [2 N, K] = [gate; up]
    and the output is SiLU(x W_gate^T) * (x W_up^T); else out = x W^T (+ bias) (+ residual). DOT: the
    row-tiled variant (tl.dot tiles, :func:`_tile_dot`). ARGMAX (one row): also the block's largest
    output as stored (the first on ties) and its column, into best / best_idx [pid(0)]."""
    pid = tl.program_id(0)
    o_n = pid * BN + tl.arange(0, BN)
    rows = tl.program_id(1) * RB + tl.arange(0, RB)
    rstd = tl.zeros([RB], dtype=ACC)
    if NORM:
        rstd = _rstd(x_ptr, x_stride, eps, rows, n_rows, RB, K, BK, ACC)
    acc = tl.zeros([RB, BN], dtype=ACC)
    acc_up = tl.zeros([RB, BN], dtype=ACC)
    for k0 in range(0, K, BK):
        x = _x_chunk(x_ptr, x_stride, scale_ptr, rstd, rows, k0, n_rows, K, BK, NORM, ACC)
        acc += _tile_dot(w_ptr, x, o_n, k0, N, K, BK, ACC, DOT, NORM, UPCAST)
        if GATE_UP:
            acc_up += _tile_dot(w_ptr + N * K, x, o_n, k0, N, K, BK, ACC, DOT, NORM, UPCAST)
    m_n = o_n < N
    m = (rows < n_rows)[:, None] & m_n[None, :]
    if GATE_UP:
        acc = silu(acc) * acc_up
    if HAS_BIAS:
        acc += tl.load(bias_ptr + o_n, mask=m_n, other=0.0).to(ACC)[None, :]
    if RESIDUAL:
        acc += tl.load(res_ptr + rows[:, None] * res_stride + o_n[None, :], mask=m, other=0.0).to(ACC)
    tl.store(out_ptr + rows[:, None] * N + o_n[None, :], round_to(acc, out_ptr), mask=m)
    if ARGMAX:
        y = tl.sum(round_to(acc, out_ptr).to(ACC), axis=0)  # RB = 1: row 0 as stored
        y = tl.where(m_n, y, float("-inf"))
        tl.store(best_ptr + pid, tl.max(y, axis=0))
        tl.store(best_idx_ptr + pid, pid * BN + tl.argmax(y, axis=0, tie_break_left=True))


@triton.jit
def _argmax_reduce_kernel(best_ptr, best_idx_ptr, pick_ptr, len_ptr, max_len, P: tl.constexpr,
                          BP: tl.constexpr, ADVANCE: tl.constexpr):  # fmt: skip
    """pick = the column of the largest of the P block maxima (the first block on ties); ADVANCE: also
    length = min(length + 1, max_len) (the decode step's counter)."""
    o = tl.arange(0, BP)
    m = o < P
    best = tl.load(best_ptr + o, mask=m, other=float("-inf"))
    j = tl.argmax(best, axis=0, tie_break_left=True)
    idx = tl.load(best_idx_ptr + o, mask=m, other=0)
    tl.store(pick_ptr, tl.sum(tl.where(o == j, idx, 0), axis=0).to(pick_ptr.dtype.element_ty))
    if ADVANCE:
        length = tl.load(len_ptr)
        tl.store(len_ptr, tl.minimum(length + 1, max_len))


def _default_block_n(rows_out: int) -> int:
    """About 512 programs (2-4 per SM on an H200) within 4..64 rows each; in the CPU interpreter, which
    runs programs one by one, as few programs as possible."""
    if interpreting():
        return min(64, pow2(rows_out))
    return max(4, min(64, pow2(rows_out // 512 + 1) // 2))


def _row_tiles(
    n: int, rows_out: int, k: int, half: bool, block_m: int | None, block_n: int | None, block_k: int | None
) -> tuple[int, int, int, int]:
    """(BM, BN, BK, warps) of the row-tiled variant, each tile a power of two >= 16 (tl.dot's smallest):
    BM up to 64 rows (one row block for T <= 64: every weight read once), BN for about 256 programs (2 per
    SM on an H200) within 16..64 (the interpreter: as few programs as possible), BK 64 (half) or 32
    (float32 / float64) columns; 8 warps for 64-row blocks, else 4 (64-row blocks on 4 warps reach sm_90's
    255-register cap; the defaults compile without spills at the tiny-qwen35 and GDN-1.3B matrices:
    tests/gdn/test_triton_linear.py). Untuned guesses; ``block_*`` and ``num_warps`` override them."""
    bm = max(16, pow2(block_m or min(64, n)))
    if interpreting():
        default_n = min(64, pow2(rows_out))
    else:
        default_n = min(64, pow2(triton.cdiv(rows_out * triton.cdiv(n, bm), 256)))
    bn = max(16, pow2(block_n or default_n))
    bk = max(16, pow2(min(block_k or (128 if interpreting() else 64 if half else 32), k)))
    return bm, bn, bk, 8 if bm >= 64 else 4


def tiles(
    n: int,
    rows_out: int,
    k: int,
    half: bool,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
) -> tuple[int, int, int, int]:
    """(rows per program, BN, BK, warps) of a launch on ``n`` rows of x [n, k] and ``rows_out`` outputs:
    the GEMV variant's for n <= :data:`MAX_ROWS` (every row, [BN, BK] tiles of <= 4096 weights: registers,
    4 warps), else :func:`_row_tiles`."""
    if n > MAX_ROWS:
        return _row_tiles(n, rows_out, k, half, block_m, block_n, block_k)
    bn = pow2(block_n or _default_block_n(rows_out))
    return pow2(n), bn, pow2(min(block_k or max(128, 4096 // bn), k)), 4


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    rows_out: int,
    *,
    norm: tuple[torch.Tensor, float] | None = None,
    gate_up: bool = False,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    best: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_VERIFY_ROWS:
        raise ConfigError(
            f"the linear kernels take x of 1..{MAX_VERIFY_ROWS} rows [n, K], got shape {tuple(x.shape)}"
        )
    n, k = x.shape
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ConfigError(f"weight {tuple(weight.shape)} is not [N, {k}] for x of shape {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if not weight.is_contiguous():
        raise ConfigError("the GEMV kernels read a row-major (contiguous) weight")
    if residual is not None and (residual.shape != (n, rows_out) or residual.stride(-1) != 1):
        raise ConfigError(f"residual must be a row-major [{n}, {rows_out}], got {tuple(residual.shape)}")
    half = x.dtype in (torch.bfloat16, torch.float16)
    tiled = n > MAX_ROWS
    rb, bn, bk, warps = tiles(n, rows_out, k, half, block_m, block_n, block_k)
    out = torch.empty(n, rows_out, dtype=x.dtype, device=x.device)
    scale, eps = norm if norm is not None else (x, 0.0)
    best_val, best_idx = best if best is not None else (x, x)
    _gemv_kernel[(triton.cdiv(rows_out, bn), triton.cdiv(n, rb))](
        x, x.stride(0), scale, weight, bias if bias is not None else x,
        residual if residual is not None else x, residual.stride(0) if residual is not None else 0,
        out, best_val, best_idx, float(eps), n, N=rows_out, K=k, RB=rb, BN=bn, BK=bk,
        NORM=norm is not None, GATE_UP=gate_up, HAS_BIAS=bias is not None, RESIDUAL=residual is not None,
        ARGMAX=best is not None, ACC=acc_dtype(x.dtype), DOT=tiled, UPCAST=tiled and half and interpreting(),
        num_warps=num_warps or warps,
    )  # fmt: skip
    return out


def norm_linear(
    x: torch.Tensor,
    norm_scale: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    **blocks: int,
) -> torch.Tensor:
    """``rms_norm(x, norm_scale, eps) @ weight^T (+ bias)`` for x [n, K] (n <= :data:`MAX_VERIFY_ROWS`;
    row-tiled above :data:`MAX_ROWS`), weight [N, K] -> [n, N].

    ``blocks``: block_m (row-tiled), block_n, block_k, num_warps (untuned defaults).
    """
    return _launch(x, weight, weight.shape[0], norm=(norm_scale, eps), bias=bias, **blocks)


def norm_gate_up(
    x: torch.Tensor, norm_scale: torch.Tensor, eps: float, gate_up: torch.Tensor, **blocks: int
) -> torch.Tensor:
    """``SiLU(g) * u`` with ``[g; u] = rms_norm(x, norm_scale, eps) @ gate_up^T``; gate_up [2 I, K] is
    cat(gate_proj, up_proj) -> [n, I]. ``blocks``: block_m (row-tiled), block_n (columns of g and of u per
    program), block_k, num_warps (untuned defaults)."""
    if gate_up.shape[0] % 2:
        raise ConfigError(f"gate_up must stack gate and up projections [2 I, K], got {tuple(gate_up.shape)}")
    return _launch(x, gate_up, gate_up.shape[0] // 2, norm=(norm_scale, eps), gate_up=True, **blocks)


def linear_residual(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: torch.Tensor | None = None,
    **blocks: int,
) -> torch.Tensor:
    """``residual + x @ weight^T (+ bias)`` for x [n, K] (n <= :data:`MAX_VERIFY_ROWS`), weight [N, K],
    residual [n, N] -> [n, N] in x's dtype. ``blocks``: block_m (row-tiled), block_n, block_k, num_warps
    (untuned defaults)."""
    return _launch(x, weight, weight.shape[0], residual=residual, bias=bias, **blocks)


def norm_linear_argmax(
    x: torch.Tensor,
    norm_scale: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pick: torch.Tensor,
    advance: tuple[torch.Tensor, int] | None = None,
    **blocks: int,
) -> torch.Tensor:
    """:func:`norm_linear` of one row (the LM head), and its argmax (the first on ties, of the logits as
    returned) into ``pick`` [1] int64, in two launches: the GEMV writes each block's maximum, a one-program
    reduce picks among them. ``advance`` = (length [1] int64, max_len): the reduce also moves the decode
    step's counter on, ``length = min(length + 1, max_len)``. Returns the logits [1, N]."""
    if x.shape[0] != 1:
        raise ConfigError(f"norm_linear_argmax takes one row, got shape {tuple(x.shape)}")
    rows_out = weight.shape[0]
    bn = pow2(blocks.get("block_n") or _default_block_n(rows_out))
    parts = triton.cdiv(rows_out, bn)
    best = (
        torch.empty(parts, dtype=_acc_torch_dtype(x.dtype), device=x.device),
        torch.empty(parts, dtype=torch.long, device=x.device),
    )
    logits = _launch(
        x, weight, rows_out, norm=(norm_scale, eps), bias=bias, best=best, **{**blocks, "block_n": bn}
    )
    length, max_len = advance if advance is not None else (pick, 0)
    _argmax_reduce_kernel[(1,)](
        *best, pick, length, int(max_len), P=parts, BP=pow2(parts), ADVANCE=advance is not None,
        num_warps=4 if parts <= 1024 else 8,
    )  # fmt: skip
    return logits


def _acc_torch_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of :func:`~repro.gdn.triton_common.acc_dtype`."""
    return torch.float64 if dtype == torch.float64 else torch.float32
