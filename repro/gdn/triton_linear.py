"""Row-vector x matrix (GEMV) Triton kernels for the decode step, and their row-tiled variant for the verify
step, with the glue around the matmul fused in.

A decode step multiplies one row (n <= 4 rows here) by every weight matrix of the model, so its time is
the time to stream the weights, and what keeps HBM busy is bytes in flight. Each program owns
``block_n`` output rows and walks its share of K in ``block_k`` steps, loading [block_n, block_k] weight
tiles (contiguous along K, as nn.Linear stores them: 128-bit loads; rows past N re-read the last row
instead of masking); all rows of x share each tile. The loop body is loads and FMAs only: the products
go into a [block_n, block_k] accumulator per row (float32; float64 for float64 data) reduced over K once
after the loop, and x and the norm scale are loaded as tiles in the weight tile's register layout (a 1-D
load broadcast against the tile, or a reduce per step, would go through shared memory with barriers on
every step: what made the first version of these kernels 2x slower than cuBLAS). Each output is rounded
once to x's dtype. What each kernel folds in:

- :func:`norm_linear`: ``rms_norm(x, scale, eps) @ W^T (+ bias)``. The norm is a per-row factor: the loop
  multiplies by ``x * scale``, and ``rsqrt(mean(x^2) + eps)`` (x's rows loaded whole before the loop,
  summed after it) scales the sums in the epilogue; no pass over x before the weights start streaming.
- :func:`norm_gate_up`: ``SiLU(g) * u`` with ``[g; u] = rms_norm(x) @ gate_up^T``; a program computes
  the same row block of g and of u, so the [n, 2 I] intermediate is never written.
- :func:`linear_residual`: ``residual + x @ W^T (+ bias)`` (the addmm of out_proj / down_proj).
- :func:`norm_linear_argmax`: :func:`norm_linear` of one row (the LM head) with its argmax (first on ties)
  into a device buffer: each program also writes its block's maximum, a one-program reduce picks the
  column (and can move the decode step's length on).

Verify steps (n = 5 .. :data:`MAX_VERIFY_ROWS` rows, the T nodes of a draft tree) take the row-tiled
variant (:func:`_rows_kernel`): a grid of output blocks x row blocks, each program one ``tl.dot`` per K
chunk on a [block_m, block_k] x [block_k, block_n] tile (tiles >= 16; float32 accumulation; exact "ieee"
dots for float32 data; half data feeds the tensor cores the row times the norm scale as hi and lo bf16
parts, two dots on one weight tile, so the row keeps ~16 bits), the row block's sum of squares gathered
from the same chunks, the 1 / rms factor in the same epilogue (:func:`_finish`). At small widths a launch
costs more than its arithmetic, so folding the norm, SiLU * up and residual launches into the matmul is
what counts there. Configurations
(:class:`RowsConfig`) come from :func:`row_tiles`: keyword overrides, then :data:`TUNED_ROWS` (measured
at the tiny-qwen35 matrices: a budget-32 verify 10% faster, results/2026-12-03-h200-rows-tune), then
untuned defaults. At the GDN-1.3B and Qwen3.6-27B widths the best of ~40 configurations a matrix (also
split-K, and the row rounded once instead of hi + lo: measured at 3562a89, not kept) reached 0.47-0.68x
of cuBLAS for the normed kinds (the A operand is built in registers every K step), so those shapes verify
on cuBLAS (fuse_verify off in the engine).

A normed kind can read a weight with the norm scale folded into its columns instead (``folded=``,
:func:`fold_norm`; the StaticDecoder's default with fuse_verify): x enters the dots as it is (one dot a K
chunk) and its sum of squares comes from a second pass over x after the K loop (summing the chunk that
fed the dot gave wrong results at some tiles on the H200). A tiny-qwen35 verify step is 8% shorter
than on the scaled rows; at GDN-1.3B the folded matrices reach 0.56-0.81x of cuBLAS, still short
(results/2026-12-04-h200-folded-norms).

A verify's rows can also take the GEMV kernel in groups of 4 rows (the "gemv" form; ``GROUPED``: a third
program axis over the groups, the last group's missing rows repeating its last row, computed and never
stored; x kept in float32, no hi / lo split). Which form a launch takes (:func:`form_for`): the call's
``form``, else :func:`verify_form` / REPRO_VERIFY_ROWS, else "dot". "auto" takes gemv up to
:data:`GEMV_VERIFY_ROWS` rows (a 17-node verify step 6% faster than the scaled rows at the tiny width;
gemv is 1.4x / 1.6x slower at 33 / 65 nodes: each group reads the weights again, the LM head most) and
dot above; over the folded rows it changed no route's step (0.365 vs 0.364 ms, routes-ab), so the
default stays "dot".

Split-K (``split_k`` > 1, for matrices with few output rows): a grid of (row blocks, K slices) writes
float32 partial sums into a workspace, and a second launch adds the slices in a fixed order and applies
the epilogue (norm factor from x itself, SiLU * up, bias, residual, rounding, the argmax's block maxima):
deterministic, no atomics.

Launch configurations (:class:`GemvConfig`: block_n, block_k, num_warps, num_stages, split_k) are picked
per call by :func:`select_config`: keyword overrides first, then the table made active with
:func:`gemv_configs` (a mapping keyed by (kind, N, K), or ``"legacy"``: the first untuned defaults, or
``"heuristic"``), then :data:`TUNED` (measured values: ``scripts/gpu/gemv-tune.py`` prints them), else
:func:`heuristic_config`. The choice is made on the host when the kernel is launched, so for a CUDA graph
it is the one active at capture. (num_stages is passed through; Triton pipelines only loads that feed
dots, so expect it to change little here.)

Programmatic dependent launch (:func:`repro.gdn.triton_common.dependent_launch`, on by default; Hopper and
later, never in the interpreter): every kernel here is launched as a programmatic dependent, so that the
next launch of the stream (in a CUDA graph too) is scheduled while this one drains. With
``early_weights`` the GEMV kernel loads its first K step's weight tile(s) *before* ``griddepcontrol.wait``
(weights are constant; x, the norm scale and everything the previous kernel writes are read after it), so
that the first HBM round trip of a small matrix would overlap the previous kernel's tail: measured slower
(GDN-1.3B decode 1117 -> 1213 us), so off by default. Results are bitwise those of a plain launch.
Measured on an H200 (decode step, random bf16 weights, results/2026-12-02-h200-pdl-slots/scripts/pdl):
GDN-1.3B 1163 -> 1117 us, Qwen3.6-27B 13635 -> 13630 us (GEMVs alone as dependents, the day before:
1164 -> 1113, 13633 -> 13582), logits bitwise equal.

Semantics are those of :func:`repro.models.layers.rms_norm`, ``F.silu`` and ``F.linear`` (pinned in
tests/gdn/test_triton_linear.py): float32 results agree to ~1e-6; bf16 ones carry one bf16 rounding of the
output (the torch glue rounds after every op, and the normed row is not rounded to bf16 before the
matmul here).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from repro.errors import ConfigError
from repro.gdn.triton_common import (
    H200_SMS,
    acc_dtype,
    early_weights,
    interpreting,
    load_tile,
    pdl_args,
    pdl_start,
    pow2,
    round_to,
    silu,
    sm_count,
)

MAX_ROWS = 4  # rows of x the GEMV variant takes (decode: 1); its programs keep them all in registers
# rows of x per call in all (the row-tiled variant above MAX_ROWS): the verify slots of the budgets the
# routes use (16..256 nodes); larger slots keep cuBLAS (StaticDecoder checks this before it calls)
MAX_VERIFY_ROWS = 256
KINDS = ("norm_linear", "norm_gate_up", "linear_residual", "norm_linear_argmax")
REDUCE_BLOCK = 256  # output columns per program of the split-K reduce
SMALL_WEIGHTS = 1 << 20  # heuristic_config: below, the legacy configuration
SPLIT_WEIGHTS = 1 << 22  # heuristic_config: below, no split-K
# a verify's forms (module docstring): REPRO_VERIFY_ROWS sets one for a whole command, verify_form for a block
VERIFY_FORMS = ("auto", "dot", "gemv")
GEMV_VERIFY_ROWS = 17
GROUPED_PROGRAMS = 1024  # grouped_config: block_n doubled while the launch has more programs


@dataclass(frozen=True)
class GemvConfig:
    """One launch configuration: output rows and K columns per tile, warps, pipeline stages, K slices."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 1
    split_k: int = 1

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ConfigError(f"GemvConfig.{name} must be a power of two, got {v}")
        if self.num_stages < 1 or self.split_k < 1:
            raise ConfigError(f"GemvConfig needs num_stages >= 1 and split_k >= 1, got {self}")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


ConfigKey = tuple[str, int, int]  # (kind, N: output columns (I for gate|up), K)
# the fastest configuration of each decode matrix of the paper shapes in scripts/gpu/gemv-tune.py's sweep on
# an H200 (results/2026-12-01-h200-verify-glue/scripts/gemv-tune; us per call in a CUDA graph, % of the
# measured copy bandwidth); other shapes: the heuristic
TUNED: dict[ConfigKey, GemvConfig] = {
    ("norm_linear", 8208, 2048): GemvConfig(32, 256, 8, 1, 1),  # gdn-1.3b in_proj: 11.3 us, 70%
    ("linear_residual", 2048, 2048): GemvConfig(4, 1024, 4, 1, 1),  # gdn-1.3b out_proj: 4.7 us, 42%
    ("norm_gate_up", 5632, 2048): GemvConfig(16, 256, 8, 1, 1),  # gdn-1.3b gate|up: 13.7 us, 79%
    ("linear_residual", 2048, 5632): GemvConfig(8, 1024, 16, 1, 1),  # gdn-1.3b down: 9.7 us, 56%
    ("norm_linear_argmax", 32000, 2048): GemvConfig(32, 256, 8, 3, 1),  # gdn-1.3b lm_head: 38.6 us, 80%
    ("norm_linear", 16480, 5120): GemvConfig(4, 1024, 4, 1, 1),  # qwen3.6-27b in_proj: 44.9 us, 88%
    ("linear_residual", 5120, 6144): GemvConfig(16, 512, 8, 1, 1),  # qwen3.6-27b out_proj: 17.4 us, 85%
    ("norm_gate_up", 17408, 5120): GemvConfig(2, 1024, 4, 1, 1),  # qwen3.6-27b gate|up: 89.5 us, 94%
    ("linear_residual", 5120, 17408): GemvConfig(16, 512, 8, 1, 1),  # qwen3.6-27b down: 43.8 us, 96%
    ("norm_linear", 14336, 5120): GemvConfig(16, 256, 4, 1, 1),  # qwen3.6-27b attn q|k|v: 39.2 us, 88%
    ("norm_linear_argmax", 248320, 5120): GemvConfig(64, 128, 4, 1, 1),  # qwen3.6-27b lm_head: 611 us, 98%
}
_active: list[Mapping[ConfigKey, GemvConfig] | str] = []  # gemv_configs' stack


def _env_form(value: str) -> str:
    if value not in VERIFY_FORMS:
        raise ConfigError(f"the verify form (REPRO_VERIFY_ROWS) must be one of {VERIFY_FORMS}, got {value!r}")
    return value


_verify_form: list[str] = [_env_form(os.environ.get("REPRO_VERIFY_ROWS", "dot"))]  # verify_form's stack


def form_for(rows: int, form: str | None = None) -> str:
    """The form ("dot" or "gemv") a launch of ``rows`` > MAX_ROWS rows takes: ``form``, else the active
    one (:func:`verify_form`, REPRO_VERIFY_ROWS), "auto" resolved by the row count."""
    form = _env_form(form or _verify_form[-1])
    if form == "auto":
        return "gemv" if rows <= GEMV_VERIFY_ROWS else "dot"
    return form


@contextlib.contextmanager
def verify_form(form: str) -> Iterator[None]:
    """Within the block, launches of more than :data:`MAX_ROWS` rows take ``form`` (:data:`VERIFY_FORMS`)
    unless a call names its own. Capture a CUDA graph inside the block to keep the choice."""
    _verify_form.append(_env_form(form))
    try:
        yield
    finally:
        _verify_form.pop()


@dataclass(frozen=True)
class RowsConfig:
    """One launch configuration of the row-tiled variant: rows, output columns and K columns per tile
    (powers of two; tl.dot takes >= 16), warps, pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ConfigError(f"RowsConfig.{name} must be a power of two, got {v}")
        if self.num_stages < 1:
            raise ConfigError(f"RowsConfig needs num_stages >= 1, got {self}")


RowsKey = tuple[str, int, int, int]  # (kind, N (I for gate|up), K, row_tiles' default block_m)
# the row-tiled variant's fastest configurations in scripts/gpu/rows-tune.py's sweep on an H200 (half data;
# results/2026-12-03-h200-rows-tune; us per call in a CUDA graph, the defaults' beside): the tiny-qwen35
# matrices at 16 rows (block_m 16: slots of 5-16 nodes) and 33 (block_m 64: 33-64 nodes, e.g. budget 32);
# other shapes: row_tiles' defaults. At the GDN-1.3B and Qwen3.6-27B widths no configuration came near
# cuBLAS for the normed kinds (0.47-0.68x), so those verify on cuBLAS (StaticDecoder's fuse_verify off)
TUNED_ROWS: dict[RowsKey, RowsConfig] = {
    ("norm_linear", 584, 192, 16): RowsConfig(16, 16, 128, 2),  # gdn in_proj: 3.3 us (default 3.5)
    ("norm_gate_up", 384, 192, 16): RowsConfig(16, 16, 64, 2),  # gate|up: 3.9 (4.5)
    ("linear_residual", 192, 384, 16): RowsConfig(16, 32, 128, 4),  # down: 2.2 (2.5)
    ("norm_linear", 576, 192, 16): RowsConfig(16, 32, 128, 2),  # attn q|k|v: 3.5 (3.8)
    ("norm_linear", 4096, 192, 16): RowsConfig(16, 64, 64, 4),  # lm_head: 3.9 (7.0)
    ("norm_linear", 584, 192, 64): RowsConfig(32, 16, 64, 4),  # gdn in_proj: 3.8 (5.2)
    ("linear_residual", 192, 192, 64): RowsConfig(64, 16, 64, 4),  # gdn out_proj: 2.0 (2.2)
    ("linear_residual", 192, 384, 64): RowsConfig(64, 16, 128, 4),  # down: 2.4 (2.8)
    # 33-64 rows of the normed kinds: retuned on fold_norm's weights (the engine's verify; 2.9 / 2.6 / 3.5 us
    # against the entries above's 3.1 / 2.8 / 4.6: results/2026-12-04-h200-folded-norms/callBW)
    ("norm_gate_up", 384, 192, 64): RowsConfig(32, 16, 256, 4, 2),  # gate|up
    ("norm_linear", 576, 192, 64): RowsConfig(32, 16, 128, 4, 3),  # attn q|k|v
    ("norm_linear", 4096, 192, 64): RowsConfig(64, 32, 256, 4, 3),  # lm_head
    # 17-32 rows (block_m 32: chain DFlash's 17-node verify), on the folded weights; us at 17 rows (the
    # untuned defaults'), results/2026-12-04-h200-derive-rows/callCF: the verify step 195.7 -> 192.0 us
    ("norm_linear", 584, 192, 32): RowsConfig(32, 32, 256, 4, 2),  # gdn in_proj: 2.6 (2.6)
    ("norm_gate_up", 384, 192, 32): RowsConfig(32, 16, 256, 4, 2),  # gate|up: 3.0 (3.1)
    ("linear_residual", 192, 384, 32): RowsConfig(32, 16, 128, 4, 3),  # down: 2.3 (2.5)
    ("norm_linear", 576, 192, 32): RowsConfig(32, 16, 256, 4, 3),  # attn q|k|v: 2.5 (2.6)
    ("norm_linear", 4096, 192, 32): RowsConfig(32, 32, 64, 4, 3),  # lm_head: 3.1 (3.4)
}


@contextlib.contextmanager
def gemv_configs(table: Mapping[ConfigKey, GemvConfig] | str) -> Iterator[None]:
    """Within the block, launches look their configuration up in ``table`` ((kind, N, K) -> config; a
    missing key falls through to :data:`TUNED` and the heuristic), or use ``"legacy"`` (the first defaults)
    or ``"heuristic"`` for every shape. Capture a CUDA graph inside the block to keep its choices."""
    if isinstance(table, str) and table not in ("legacy", "heuristic"):
        raise ConfigError(f"gemv_configs takes a table, 'legacy' or 'heuristic', got {table!r}")
    _active.append(table)
    try:
        yield
    finally:
        _active.pop()


def legacy_config(n_out: int, k: int) -> GemvConfig:
    """The first, untuned defaults: about 512 programs (2-4 per SM on an H200) within 4..64 rows each,
    [block_n, block_k] tiles of at most 4096 weights, 4 warps; in the CPU interpreter, which runs programs
    one by one, as few programs as possible."""
    if interpreting():
        bn = min(64, pow2(n_out))
    else:
        bn = max(4, min(64, pow2(n_out // 512 + 1) // 2))
    return GemvConfig(bn, min(max(128, 4096 // bn), pow2(k)))


def heuristic_config(kind: str, n_out: int, k: int, rows: int = 1, sms: int = H200_SMS) -> GemvConfig:
    """A launch configuration from the shape alone. What keeps HBM busy is bytes in flight, so: block_n
    as large (<= 32) as still leaves >= 4 programs per SM (``sms``); the K step widened to tiles of 8192
    weights (gate|up: two of 4096; fewer with more rows of x, for registers) within the largest power of
    two <= K and <= 4096, so that each thread issues about four 16-byte loads per step; 8 warps at 8192
    weights, 4 below; split-K while fewer than 2 programs per SM remain and every slice keeps >= 256
    columns (the K step narrowed to fit a slice), for matrices of >= 4M weights only (below, the reduce's
    launch costs more than idle SMs do). Matrices under 1M weights, where a launch's latency dominates,
    and the CPU interpreter (few programs) get the legacy configuration (measured faster than cuBLAS at
    the tiny widths)."""
    width = 2 if kind == "norm_gate_up" else 1
    if interpreting() or n_out * k * width < SMALL_WEIGHTS:
        return legacy_config(n_out, k)
    tile = max(256, 8192 // width // pow2(rows))  # weights of one matrix per K step
    bn = tile // 256
    while bn > 1 and triton.cdiv(n_out, bn) < 4 * sms:
        bn //= 2
    bk = min(tile // bn, 4096, pow2(k + 1) // 2)
    split = 1
    while (
        triton.cdiv(n_out, bn) * split < 2 * sms and k >= 512 * split and n_out * k * width >= SPLIT_WEIGHTS
    ):
        split *= 2
    bk = min(bk, pow2(k // split + 1) // 2)  # a whole step per slice
    return GemvConfig(bn, bk, 8 if bn * bk * width >= 8192 else 4, 1, split)


def select_config(
    kind: str, n_out: int, k: int, rows: int = 1, device: torch.device | None = None, **overrides: int
) -> GemvConfig:
    """The configuration of one launch (see the module docstring for the order); ``overrides``: any of
    GemvConfig's fields (block_n alone also resets block_k to the legacy rule's ``max(128, 4096 // bn)``)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown GEMV kind {kind!r}; known: {', '.join(KINDS)}")
    table = _active[-1] if _active else None
    key = (kind, n_out, k)
    if table == "legacy":
        cfg = legacy_config(n_out, k)
    elif not isinstance(table, str) and table is not None and key in table:
        cfg = table[key]
    elif table != "heuristic" and key in TUNED:
        cfg = TUNED[key]
    else:
        sms = sm_count(device) if device is not None else H200_SMS
        cfg = heuristic_config(kind, n_out, k, rows, sms)
    given = {f: v for f, v in overrides.items() if v is not None}
    unknown = set(given) - set(GemvConfig.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown GEMV launch options {sorted(unknown)}")
    if "block_n" in given and "block_k" not in given:
        given["block_k"] = max(128, 4096 // pow2(given["block_n"]))
    cfg = replace(
        cfg, **{f: pow2(v) if f in ("block_n", "block_k", "num_warps") else v for f, v in given.items()}
    )
    bk = min(cfg.block_k, pow2(k))
    return replace(cfg, block_k=bk, split_k=triton.cdiv(k, _k_slice(k, bk, cfg.split_k)))  # no empty slices


def grouped_config(
    kind: str, n_out: int, k: int, groups: int, device: torch.device | None = None, **overrides: int
) -> GemvConfig:
    """The configuration of the GEMV kernel over ``groups`` groups of 4 rows (the "gemv" verify form):
    :func:`select_config`'s for 4 rows, without split-K (one K pass per group), block_n doubled (within
    32, the K step narrowed to the legacy rule's) while the launch has more than :data:`GROUPED_PROGRAMS`
    programs; ``overrides`` as select_config's. (block_n 64 took tiny-qwen35's LM head [4096, 192] to
    54 / 91 us at 33 / 65 rows against 14 / 25 at 32: results/2026-12-04-h200-verify-forms.)"""
    cfg = select_config(kind, n_out, k, MAX_ROWS, device, **overrides)
    bn = cfg.block_n
    while "block_n" not in overrides and triton.cdiv(n_out, bn) * groups > GROUPED_PROGRAMS and bn < 32:
        bn *= 2
    if bn != cfg.block_n:  # select_config's block_n override: the K step by the legacy rule
        cfg = select_config(kind, n_out, k, MAX_ROWS, device, **{**overrides, "block_n": bn})
    return replace(cfg, split_k=1)


def _k_slice(k: int, block_k: int, split_k: int) -> int:
    """Columns of K per slice: whole chunks."""
    return triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k


# ------------------------------------------------------------------------------------------- kernels


@triton.jit
def _row_step(acc, acc_up, x_ptr, w, wu, sc, zero_n, o_k, m_k, NORM: tl.constexpr, GATE_UP: tl.constexpr,
              EVEN_K: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """One row of x (NORM: times the norm scale sc) against the weight tile(s) w (wu) [BN, BK]: the
    elementwise products added into acc (acc_up); reduced over K after the loop."""
    x = load_tile(x_ptr, zero_n, o_k, m_k, 0, EVEN_K, ACC)
    if NORM:
        x = x * sc
    acc += w * x
    if GATE_UP:
        acc_up += wu * x
    return acc, acc_up


@triton.jit
def _collect(acc, acc_up, a, u, r: tl.constexpr, RB: tl.constexpr, GATE_UP: tl.constexpr):
    """Row r of the sums acc (acc_up) [RB, BN]: row r's accumulators a (u) [BN, BK] reduced over K."""
    at_r = (tl.arange(0, RB) == r)[:, None]
    acc = tl.where(at_r, tl.sum(a, axis=1)[None, :], acc)
    if GATE_UP:
        acc_up = tl.where(at_r, tl.sum(u, axis=1)[None, :], acc_up)
    return acc, acc_up


@triton.jit
def _x_rows(x_ptr, x_stride, K, n_rows, RB: tl.constexpr, KP: tl.constexpr, ACC: tl.constexpr):
    """x [RB, KP] in one load (the norm's sum of squares; K <= KP), zero outside [n_rows, K]."""
    rows = tl.arange(0, RB)
    o = tl.arange(0, KP)
    m = (rows < n_rows)[:, None] & (o < K)[None, :]
    return tl.load(x_ptr + rows[:, None] * x_stride + o[None, :], mask=m, other=0.0).to(ACC)


@triton.jit
def _finish(acc, acc_up, ss, blk, N, K, eps, bias_ptr, res_ptr, res_stride, out_ptr, best_ptr,
            best_idx_ptr, n_rows, RB: tl.constexpr, BN: tl.constexpr, NORM: tl.constexpr,
            GATE_UP: tl.constexpr, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, ARGMAX: tl.constexpr,
            ACC: tl.constexpr):  # fmt: skip
    """The epilogue of output columns blk * BN .. + BN of every row from the sums over K acc (acc_up)
    [RB, BN] and ss [RB] (sum of x^2): norm factor, SiLU * up, bias, residual, rounding, store (rows
    < n_rows of out / residual; the row-tiled variant passes them offset to its row block); ARGMAX (one
    row): the block's largest output as stored (the first on ties) and its column, into best / best_idx
    [blk]."""
    rows = tl.arange(0, RB)
    o_n = blk * BN + tl.arange(0, BN)
    m_n = o_n < N
    m = (rows < n_rows)[:, None] & m_n[None, :]
    if NORM:
        rstd = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * rstd[:, None]
        acc_up = acc_up * rstd[:, None]
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
        tl.store(best_ptr + blk, tl.max(y, axis=0))
        tl.store(best_idx_ptr + blk, blk * BN + tl.argmax(y, axis=0, tie_break_left=True))


@triton.jit
def _w_tiles(w_ptr, o_w, o_k, m_k, N, K, GATE_UP: tl.constexpr, EVEN_K: tl.constexpr, ACC: tl.constexpr):
    """The weight tile [BN, BK] of rows o_w, columns o_k (GATE_UP: and the up half's, rows N + o_w)."""
    w = load_tile(w_ptr, o_w, o_k, m_k, K, EVEN_K, ACC)
    wu = w
    if GATE_UP:
        wu = load_tile(w_ptr + N * K, o_w, o_k, m_k, K, EVEN_K, ACC)
    return w, wu


@triton.jit
def _row_ptr(x_ptr, x_stride, j: tl.constexpr, last, GROUPED: tl.constexpr):
    """Row j of x; GROUPED: rows past ``last`` (a short last group) re-read row ``last`` (never stored)."""
    if GROUPED:
        return x_ptr + tl.minimum(last, j) * x_stride
    return x_ptr + j * x_stride


@triton.jit
def _k_step(a0, a1, a2, a3, u0, u1, u2, u3, x_ptr, x_stride, scale_ptr, w, wu, zero_n, o_k, m_k, last,
            N_ROWS: tl.constexpr, NORM: tl.constexpr, GATE_UP: tl.constexpr, EVEN_K: tl.constexpr,
            ACC: tl.constexpr, GROUPED: tl.constexpr):  # fmt: skip
    """One K step of every row of x (N_ROWS <= 4; GROUPED: rows past ``last`` repeat it) against the
    weight tile(s) w (wu) [BN, BK]."""
    sc = w
    if NORM:
        sc = load_tile(scale_ptr, zero_n, o_k, m_k, 0, EVEN_K, ACC)
    a0, u0 = _row_step(a0, u0, x_ptr, w, wu, sc, zero_n, o_k, m_k, NORM, GATE_UP, EVEN_K, ACC)
    if N_ROWS > 1:
        x1 = _row_ptr(x_ptr, x_stride, 1, last, GROUPED)
        a1, u1 = _row_step(a1, u1, x1, w, wu, sc, zero_n, o_k, m_k, NORM, GATE_UP, EVEN_K, ACC)
    if N_ROWS > 2:
        x2 = _row_ptr(x_ptr, x_stride, 2, last, GROUPED)
        a2, u2 = _row_step(a2, u2, x2, w, wu, sc, zero_n, o_k, m_k, NORM, GATE_UP, EVEN_K, ACC)
    if N_ROWS > 3:
        x3 = _row_ptr(x_ptr, x_stride, 3, last, GROUPED)
        a3, u3 = _row_step(a3, u3, x3, w, wu, sc, zero_n, o_k, m_k, NORM, GATE_UP, EVEN_K, ACC)
    return a0, a1, a2, a3, u0, u1, u2, u3


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
    ws_ptr,
    eps,
    N,
    K,
    k_slice,
    n_rows,
    N_ROWS: tl.constexpr,
    RB: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    KP: tl.constexpr,
    EARLY_X: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    NORM: tl.constexpr,
    GATE_UP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    ARGMAX: tl.constexpr,
    ACC: tl.constexpr,
    PDL: tl.constexpr,
    EARLY_W: tl.constexpr,
    GROUPED: tl.constexpr,
):
    """Output columns pid * BN .. + BN of every row, over K columns sid * k_slice .. + k_slice (program
    axis 1; all of K without split). GROUPED (a verify's n > 4 rows, no split): program axis 2 is a
    group of N_ROWS = 4 rows of the ``n_rows``, the last group's missing rows repeating its last row
    (computed, never stored). GATE_UP: W is [2 N, K] = [gate; up] and the output is
    SiLU(x W_gate^T) * (x W_up^T); else out = x W^T (+ bias) (+ residual). NORM: x times the norm scale
    in the loop, the 1 / rms factor (x read whole, K <= KP) in the epilogue; EARLY_X: x's rows are loaded
    before the loop (their latency hidden behind it) rather than after it (no registers held through
    it). SPLIT > 1: the sums go to the float32 workspace ws [SPLIT, N_ROWS, 2 N] (per slice and row: the
    sums, then the up sums) for :func:`_split_reduce_kernel`, which applies the epilogue. PDL: launched
    as a programmatic dependent; EARLY_W (with PDL): its first weight tile(s) are loaded before the wait
    (weights are constant), everything else after it (module docstring)."""
    if PDL == 1:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    sid = tl.program_id(1)
    rows_here = N_ROWS
    if GROUPED:
        r0 = tl.program_id(2) * N_ROWS
        x_ptr += r0 * x_stride
        out_ptr += r0 * N
        res_ptr += r0 * res_stride
        rows_here = tl.minimum(n_rows - r0, N_ROWS)
    last = rows_here - 1
    o_n = pid * BN + tl.arange(0, BN)
    o_w = tl.minimum(o_n, N - 1)  # past N: re-read the last row (never stored), so no row masks
    zero_n = o_n * 0
    k_lo = sid * k_slice
    k_hi = tl.minimum(K, k_lo + k_slice)  # > k_lo: no slice is empty
    if EARLY_W:  # the first step's tiles, ahead of the wait
        o_k = k_lo + tl.arange(0, BK)
        m_k = o_k < K
        w, wu = _w_tiles(w_ptr, o_w, o_k, m_k, N, K, GATE_UP, EVEN_K, ACC)
    if PDL:
        gdc_wait()
    xs = tl.zeros([RB, KP], dtype=ACC)
    if NORM and SPLIT == 1 and EARLY_X:
        xs = _x_rows(x_ptr, x_stride, K, rows_here, RB, KP, ACC)  # issued first, summed after the loop
    zero = tl.zeros([BN, BK], dtype=ACC)
    a0, a1, a2, a3 = zero, zero, zero, zero
    u0, u1, u2, u3 = zero, zero, zero, zero
    k_start = k_lo
    if EARLY_W:
        a0, a1, a2, a3, u0, u1, u2, u3 = _k_step(a0, a1, a2, a3, u0, u1, u2, u3, x_ptr, x_stride, scale_ptr,
                                                 w, wu, zero_n, o_k, m_k, last, N_ROWS, NORM, GATE_UP,
                                                 EVEN_K, ACC, GROUPED)  # fmt: skip
        k_start = k_lo + BK
    for k0 in range(k_start, k_hi, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        w, wu = _w_tiles(w_ptr, o_w, o_k, m_k, N, K, GATE_UP, EVEN_K, ACC)
        a0, a1, a2, a3, u0, u1, u2, u3 = _k_step(a0, a1, a2, a3, u0, u1, u2, u3, x_ptr, x_stride, scale_ptr,
                                                 w, wu, zero_n, o_k, m_k, last, N_ROWS, NORM, GATE_UP,
                                                 EVEN_K, ACC, GROUPED)  # fmt: skip
    acc = tl.zeros([RB, BN], dtype=ACC)
    acc_up = tl.zeros([RB, BN], dtype=ACC)
    acc, acc_up = _collect(acc, acc_up, a0, u0, 0, RB, GATE_UP)
    if N_ROWS > 1:
        acc, acc_up = _collect(acc, acc_up, a1, u1, 1, RB, GATE_UP)
    if N_ROWS > 2:
        acc, acc_up = _collect(acc, acc_up, a2, u2, 2, RB, GATE_UP)
    if N_ROWS > 3:
        acc, acc_up = _collect(acc, acc_up, a3, u3, 3, RB, GATE_UP)
    if SPLIT == 1:
        if NORM and not EARLY_X:
            xs = _x_rows(x_ptr, x_stride, K, rows_here, RB, KP, ACC)
        ss = tl.sum(xs * xs, axis=1)
        _finish(acc, acc_up, ss, pid, N, K, eps, bias_ptr, res_ptr, res_stride, out_ptr, best_ptr,
                best_idx_ptr, rows_here, RB, BN, NORM, GATE_UP, HAS_BIAS, RESIDUAL, ARGMAX, ACC)  # fmt: skip
    else:
        rows = tl.arange(0, RB)
        part = ws_ptr + ((sid * N_ROWS + rows) * 2 * N)[:, None] + o_n[None, :]
        m = (rows < N_ROWS)[:, None] & (o_n < N)[None, :]
        tl.store(part, acc, mask=m)
        if GATE_UP:
            tl.store(part + N, acc_up, mask=m)


@triton.jit
def _split_reduce_kernel(x_ptr, x_stride, ws_ptr, eps, N, K, bias_ptr, res_ptr, res_stride, out_ptr,
                         best_ptr, best_idx_ptr, N_ROWS: tl.constexpr, RB: tl.constexpr, BN: tl.constexpr,
                         KP: tl.constexpr, SPLIT: tl.constexpr, NORM: tl.constexpr, GATE_UP: tl.constexpr,
                         HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, ARGMAX: tl.constexpr,
                         ACC: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Output columns pid * BN .. + BN: the SPLIT slices' partial sums added in slice order, then the
    epilogue (:func:`_finish`; NORM: the sum of squares from x itself)."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    o_n = pid * BN + tl.arange(0, BN)
    rows = tl.arange(0, RB)
    m = (rows < N_ROWS)[:, None] & (o_n < N)[None, :]
    acc = tl.zeros([RB, BN], dtype=ACC)
    acc_up = tl.zeros([RB, BN], dtype=ACC)
    for s in tl.static_range(SPLIT):
        part = ws_ptr + ((s * N_ROWS + rows) * 2 * N)[:, None] + o_n[None, :]
        acc += tl.load(part, mask=m, other=0.0).to(ACC)
        if GATE_UP:
            acc_up += tl.load(part + N, mask=m, other=0.0).to(ACC)
    ss = tl.zeros([RB], dtype=ACC)
    if NORM:
        xs = _x_rows(x_ptr, x_stride, K, N_ROWS, RB, KP, ACC)
        ss = tl.sum(xs * xs, axis=1)
    _finish(acc, acc_up, ss, pid, N, K, eps, bias_ptr, res_ptr, res_stride, out_ptr, best_ptr,
            best_idx_ptr, N_ROWS, RB, BN, NORM, GATE_UP, HAS_BIAS, RESIDUAL, ARGMAX, ACC)  # fmt: skip


# ----------------------------------------------------------------------- the row-tiled variant (verify)


@triton.jit
def _x_chunk(x_ptr, x_stride, rows, k0, n_rows, K, BK: tl.constexpr, ACC: tl.constexpr):
    """Columns k0 .. k0 + BK of the rows ``rows`` of x [RB, BK] in ACC, zero outside."""
    o_k = k0 + tl.arange(0, BK)
    m = (rows < n_rows)[:, None] & (o_k < K)[None, :]
    return tl.load(x_ptr + rows[:, None] * x_stride + o_k[None, :], mask=m, other=0.0).to(ACC)


@triton.jit
def _gated_chunk(x_ptr, x_stride, z_ptr, z_stride, gw_ptr, res_ptr, rows, k0, n_rows, eps, DV: tl.constexpr,
                 BK: tl.constexpr, HAS_Z: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """The gated RMS norm of one value head (columns k0 .. k0 + DV of the rows ``rows`` of x, BK >= DV
    wide, zero past DV), as :func:`repro.gdn.triton_decode.gated_norm` computes it: x / rms(x) times the
    norm weight, times SiLU(z), rounded to the residual's dtype (the layer's), in ACC."""
    o_d = tl.arange(0, BK)
    m_d = o_d < DV
    m = (rows < n_rows)[:, None] & m_d[None, :]
    x = tl.load(x_ptr + rows[:, None] * x_stride + (k0 + o_d)[None, :], mask=m, other=0.0).to(ACC)
    rms = tl.sqrt(tl.sum(x * x, axis=1) / DV + eps)
    y = x / rms[:, None] * tl.load(gw_ptr + o_d, mask=m_d, other=0.0).to(ACC)[None, :]
    if HAS_Z:
        y *= silu(tl.load(z_ptr + rows[:, None] * z_stride + (k0 + o_d)[None, :], mask=m, other=0.0).to(ACC))
    return round_to(y, res_ptr).to(ACC)


@triton.jit
def _dot_tile(w_ptr, x, o_n, k0, N, K, BK: tl.constexpr, ACC: tl.constexpr, SPLIT: tl.constexpr,
          UPCAST: tl.constexpr):  # fmt: skip
    """x [RB, BK] (in ACC) times the weight rows o_n [BN], columns k0 .. k0 + BK -> [RB, BN] in ACC, one
    tl.dot (RB, BN, BK >= 16): exact ("ieee") for float32 / float64 weights; half weights take x as hi +
    lo in their dtype (SPLIT: two tensor-core dots, x kept to ~16 bits; else x as it is, e.g. an unnormed
    half row: one dot), both accumulated in float32. UPCAST (the CPU interpreter, whose tl.dot misreads
    bf16 operands): the half operands upcast to ACC first (the same products, exact)."""
    o_k = k0 + tl.arange(0, BK)
    m = (o_n < N)[:, None] & (o_k < K)[None, :]
    w = tl.load(w_ptr + o_n[:, None] * K + o_k[None, :], mask=m, other=0.0)
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
    return acc


@triton.jit
def _rows_kernel(
    x_ptr,
    x_stride,
    scale_ptr,
    w_ptr,
    bias_ptr,
    res_ptr,
    res_stride,
    out_ptr,
    z_ptr,
    z_stride,
    gw_ptr,
    eps,
    n_rows,
    N,
    K,
    RB: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    NORM: tl.constexpr,
    SCALED: tl.constexpr,
    GATE_UP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    HAS_Z: tl.constexpr,
    DV: tl.constexpr,
    ACC: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """Output columns pid(0) * BN .. + BN of rows pid(1) * RB .. + RB: one tl.dot a K chunk
    (:func:`_dot_tile`; SCALED: x times the norm scale, as hi + lo parts for half weights, its sum of
    squares gathered beside; NORM without SCALED: the weights carry the scale (:func:`fold_norm`), x goes
    in as it is, one dot, and a second pass over x sums its squares), then :func:`_finish` on the row
    block (the 1 / rms factor from the sum of squares). The K loop steps by DV (= BK but when GATED).
    GATED: x is a GDN core's output of value heads DV wide, a K chunk is one head (BK >= DV) and goes in
    gated-normed (:func:`_gated_chunk`: the weight ``gw``, SiLU of z with HAS_Z), rounded as the separate
    gated norm rounds it (:func:`gated_linear_residual`)."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    row0 = tl.program_id(1) * RB
    o_n = pid * BN + tl.arange(0, BN)
    rows = row0 + tl.arange(0, RB)
    ss = tl.zeros([RB], dtype=ACC)
    acc = tl.zeros([RB, BN], dtype=ACC)
    acc_up = tl.zeros([RB, BN], dtype=ACC)
    for k0 in range(0, K, DV):
        if GATED:
            x = _gated_chunk(x_ptr, x_stride, z_ptr, z_stride, gw_ptr, res_ptr, rows, k0, n_rows, eps, DV, BK,
                             HAS_Z, ACC)  # fmt: skip
        else:
            x = _x_chunk(x_ptr, x_stride, rows, k0, n_rows, K, BK, ACC)
        if SCALED:
            ss += tl.sum(x * x, axis=1)
            o_k = k0 + tl.arange(0, BK)
            x = x * tl.load(scale_ptr + o_k, mask=o_k < K, other=0.0).to(ACC)[None, :]
        acc += _dot_tile(w_ptr, x, o_n, k0, N, K, BK, ACC, SCALED, UPCAST)
        if GATE_UP:
            acc_up += _dot_tile(w_ptr + N * K, x, o_n, k0, N, K, BK, ACC, SCALED, UPCAST)
    if NORM and not SCALED:  # a second pass over x: summing the chunk that fed the dot gave wrong results
        for k0 in range(0, K, BK):  # at some tiles on the H200 (2e-2 to 0.3 off)
            x = _x_chunk(x_ptr, x_stride, rows, k0, n_rows, K, BK, ACC)
            ss += tl.sum(x * x, axis=1)
    _finish(acc, acc_up, ss, pid, N, K, eps, bias_ptr, res_ptr + row0 * res_stride, res_stride,
            out_ptr + row0 * N, out_ptr, out_ptr, n_rows - row0, RB, BN, NORM, GATE_UP, HAS_BIAS, RESIDUAL,
            False, ACC)  # fmt: skip


@triton.jit
def _argmax_reduce_kernel(best_ptr, best_idx_ptr, pick_ptr, len_ptr, max_len, P: tl.constexpr,
                          BP: tl.constexpr, ADVANCE: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """pick = the column of the largest of the P block maxima (the first block on ties); ADVANCE: also
    length = min(length + 1, max_len) (the decode step's counter)."""
    pdl_start(PDL)
    o = tl.arange(0, BP)
    m = o < P
    best = tl.load(best_ptr + o, mask=m, other=float("-inf"))
    j = tl.argmax(best, axis=0, tie_break_left=True)
    idx = tl.load(best_idx_ptr + o, mask=m, other=0)
    tl.store(pick_ptr, tl.sum(tl.where(o == j, idx, 0), axis=0).to(pick_ptr.dtype.element_ty))
    if ADVANCE:
        length = tl.load(len_ptr)
        tl.store(len_ptr, tl.minimum(length + 1, max_len))


# ------------------------------------------------------------------------------------------- launches


def _epilogue_blocks(cfg: GemvConfig, rows_out: int) -> tuple[int, int]:
    """(columns per epilogue program, epilogue programs): the GEMV's own blocks, or the split reduce's."""
    bn = cfg.block_n if cfg.split_k == 1 else min(REDUCE_BLOCK, pow2(rows_out))
    return bn, triton.cdiv(rows_out, bn)


def row_tiles(
    n: int, rows_out: int, k: int, half: bool, kind: str = "norm_linear", **overrides: int | None
) -> RowsConfig:
    """The row-tiled variant's configuration for x of n rows against a [rows_out (x 2 for gate|up), k]
    weight: ``overrides`` (RowsConfig fields) first, then :data:`TUNED_ROWS` (keyed by (kind, N, K, the
    default block_m); the entry's own block_m may differ), else the untuned defaults, each tile a power
    of two >= 16 (tl.dot's smallest): block_m up to 64 rows (one row block for T <= 64: every weight read
    once), block_n for about 256 programs (2 per SM on an H200; halved for gate|up's two tiles) within
    16..64 (the interpreter: as few programs as possible), block_k 64 (half) or 32 (float32 / float64)
    columns; 8 warps for 64-row blocks, else 4 (64-row blocks on 4 warps reach sm_90's 255-register cap;
    the defaults compile without spills at the tiny-qwen35 and GDN-1.3B matrices:
    tests/gdn/test_triton_linear_rows.py); 3 stages."""
    given = {f: v for f, v in overrides.items() if v is not None}
    unknown = set(given) - set(RowsConfig.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown row-tiled launch options {sorted(unknown)}")
    bm = max(16, pow2(given.get("block_m") or min(64, n)))
    tuned = TUNED_ROWS.get((kind, rows_out, k, bm)) if half and not interpreting() else None
    if tuned is not None:
        cfg = tuned
        bm = pow2(given.get("block_m") or tuned.block_m)
    else:
        if interpreting():
            default_n = min(64, pow2(rows_out))
        else:
            default_n = min(64, pow2(triton.cdiv(rows_out * triton.cdiv(n, bm), 256)))
            if kind == "norm_gate_up":  # two weight tiles and two accumulators a program
                default_n = max(1, default_n // 2)
        bk = 128 if interpreting() else 64 if half else 32
        cfg = RowsConfig(bm, default_n, bk, 8 if bm >= 64 else 4)
    cfg = replace(cfg, **{f: pow2(v) if f.startswith(("block", "num_w")) else v for f, v in given.items()})
    bn, bk = max(16, cfg.block_n), max(16, min(cfg.block_k, pow2(k)))
    return replace(cfg, block_m=bm, block_n=bn, block_k=bk)


def _launch_rows(
    kind: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    rows_out: int,
    out: torch.Tensor,
    norm: tuple[torch.Tensor, float] | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    scaled: bool,
    gate: tuple[torch.Tensor | None, torch.Tensor, float, int] | None = None,
    **overrides: int,
) -> torch.Tensor:
    """The row-tiled variant's launch (n > :data:`MAX_ROWS` rows of x) into ``out``; ``scaled`` (with
    ``norm``): x times the norm scale in the loop, else ``weight`` carries it (:func:`fold_norm`);
    ``gate`` = (z or None, norm weight, eps, d_v): x gated-normed per value head first
    (:func:`gated_linear_residual`)."""
    n, k = x.shape
    half = weight.dtype in (torch.bfloat16, torch.float16)  # the dots' operand type (a gated x may be wider)
    cfg = row_tiles(n, rows_out, k, half, kind, **overrides)  # folded or not: the same tiles
    scale, eps = norm if norm is not None else (x, 0.0)
    z, gw, gate_eps, dv = gate if gate is not None else (None, x, 0.0, cfg.block_k)
    if gate is not None:
        eps, cfg = gate_eps, replace(cfg, block_k=max(16, pow2(dv)))  # a K chunk: one value head
    _rows_kernel[(triton.cdiv(rows_out, cfg.block_n), triton.cdiv(n, cfg.block_m))](
        x, x.stride(0), scale, weight, bias if bias is not None else x,
        residual if residual is not None else x, residual.stride(0) if residual is not None else 0,
        out, z if z is not None else x, z.stride(0) if z is not None else 0, gw,
        float(eps), n, rows_out, k, RB=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k,
        NORM=norm is not None, SCALED=norm is not None and scaled, GATE_UP=kind == "norm_gate_up",
        HAS_BIAS=bias is not None, RESIDUAL=residual is not None, GATED=gate is not None,
        HAS_Z=z is not None, DV=dv, ACC=acc_dtype(x.dtype), UPCAST=half and interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_args(x.device),
    )  # fmt: skip
    return out


def _launch(
    kind: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    rows_out: int,
    *,
    norm: tuple[torch.Tensor, float] | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    best: tuple[torch.Tensor, torch.Tensor] | None = None,
    cfg: GemvConfig | None = None,
    form: str | None = None,
    folded: torch.Tensor | None = None,
    **blocks: int,
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
    if weight.numel() >= 2**31:
        raise ConfigError(f"weight {tuple(weight.shape)} has 2^31 or more elements (int32 offsets)")
    if folded is not None and (folded.shape != weight.shape or folded.dtype != weight.dtype or norm is None):
        raise ConfigError(
            f"folded must be fold_norm(weight, norm scale) {tuple(weight.shape)} of a normed kind"
        )
    if residual is not None and (residual.shape != (n, rows_out) or residual.stride(-1) != 1):
        raise ConfigError(f"residual must be a row-major [{n}, {rows_out}], got {tuple(residual.shape)}")
    groups = 1
    if n > MAX_ROWS:
        if best is not None:
            raise ConfigError(f"the argmax kernel takes one row, got {n}")
        if form_for(n, form) == "dot":
            out = torch.empty(n, rows_out, dtype=x.dtype, device=x.device)
            w_rows, scaled = (weight, True) if folded is None else (folded, False)
            return _launch_rows(kind, x, w_rows, rows_out, out, norm, bias, residual, scaled, **blocks)
        groups = triton.cdiv(n, MAX_ROWS)
        cfg = cfg or grouped_config(kind, rows_out, k, groups, x.device, **blocks)
    cfg = cfg or select_config(kind, rows_out, k, n, x.device, **blocks)
    bn, bk, split = cfg.block_n, cfg.block_k, cfg.split_k
    k_slice = _k_slice(k, bk, split)
    rows = min(n, MAX_ROWS)  # a program's rows (a group of them when GROUPED)
    kp = pow2(k) if norm is not None else 1  # the norm reads x's rows whole: before the K loop if that
    early_x = kp * rows <= 512 * cfg.num_warps  # costs <= 16 elements a thread through it, else after it
    out = torch.empty(n, rows_out, dtype=x.dtype, device=x.device)
    scale, eps = norm if norm is not None else (x, 0.0)
    best_val, best_idx = best if best is not None else (x, x)
    ws = x
    if split > 1:
        ws = torch.empty(split, n, 2 * rows_out, dtype=_acc_torch_dtype(x.dtype), device=x.device)
    flags = dict(
        NORM=norm is not None, GATE_UP=kind == "norm_gate_up", HAS_BIAS=bias is not None,
        RESIDUAL=residual is not None, ARGMAX=best is not None, ACC=acc_dtype(x.dtype),
    )  # fmt: skip
    bias_, res_ = bias if bias is not None else x, residual if residual is not None else x
    res_stride = residual.stride(0) if residual is not None else 0
    _gemv_kernel[(triton.cdiv(rows_out, bn), split, groups)](
        x, x.stride(0), scale, weight, bias_, res_, res_stride, out, best_val, best_idx, ws, float(eps),
        rows_out, k, k_slice, n, N_ROWS=rows, RB=pow2(rows), BN=bn, BK=bk, KP=kp, EARLY_X=early_x,
        SPLIT=split, EVEN_K=k % bk == 0, EARLY_W=early_weights(x.device), GROUPED=groups > 1, **flags,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_args(x.device, gemv=True),
    )  # fmt: skip
    if split > 1:
        rbn, parts = _epilogue_blocks(cfg, rows_out)
        _split_reduce_kernel[(parts,)](
            x, x.stride(0), ws, float(eps), rows_out, k, bias_, res_, res_stride, out, best_val, best_idx,
            N_ROWS=n, RB=pow2(n), BN=rbn, KP=kp, SPLIT=split, **flags,
            num_warps=4 if kp * pow2(n) <= 2048 else 8, **pdl_args(x.device),
        )  # fmt: skip
    return out


def norm_linear(
    x: torch.Tensor,
    norm_scale: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    folded: torch.Tensor | None = None,
    **blocks: int,
) -> torch.Tensor:
    """``rms_norm(x, norm_scale, eps) @ weight^T (+ bias)`` for x [n, K] (n <= :data:`MAX_VERIFY_ROWS`;
    row-tiled above :data:`MAX_ROWS`), weight [N, K] -> [n, N].

    ``folded``: :func:`fold_norm` (weight, norm_scale), which the row-tiled ("dot") form reads instead
    of weight, x going into its dots as it is (the GEMV forms keep weight and the scale).
    ``blocks``: GemvConfig fields overriding :func:`select_config`'s choice (n <= 4), or RowsConfig
    fields overriding :func:`row_tiles`' (more rows), or ``form`` (more rows: "dot", "gemv" or "auto",
    :func:`form_for`; GemvConfig fields then for "gemv").
    """
    norm = (norm_scale, eps)
    return _launch("norm_linear", x, weight, weight.shape[0], norm=norm, bias=bias, folded=folded, **blocks)


def norm_gate_up(
    x: torch.Tensor,
    norm_scale: torch.Tensor,
    eps: float,
    gate_up: torch.Tensor,
    folded: torch.Tensor | None = None,
    **blocks: int,
) -> torch.Tensor:
    """``SiLU(g) * u`` with ``[g; u] = rms_norm(x, norm_scale, eps) @ gate_up^T``; gate_up [2 I, K] is
    cat(gate_proj, up_proj) -> [n, I]. ``folded``: as :func:`norm_linear`'s. ``blocks``: GemvConfig
    fields (block_n: rows of g and of u per program)."""
    if gate_up.shape[0] % 2:
        raise ConfigError(f"gate_up must stack gate and up projections [2 I, K], got {tuple(gate_up.shape)}")
    rows_out, norm = gate_up.shape[0] // 2, (norm_scale, eps)
    return _launch("norm_gate_up", x, gate_up, rows_out, norm=norm, folded=folded, **blocks)


def fold_norm(weight: torch.Tensor, norm_scale: torch.Tensor) -> torch.Tensor:
    """weight [N, K] with the norm scale folded into its columns, ``weight * norm_scale`` rounded once to
    weight's dtype: ``rms_norm(x, s) @ W^T = (x @ (W diag s)^T) / rms(x)``, so a normed kind's row-tiled
    launch (``folded=``) feeds x to the tensor cores as it is (one dot a K chunk; with the scale, the
    scaled half row goes in as hi + lo parts, two dots, built in registers every K step). In half
    precision the folded weight carries one more rounding (2^-9 relative), where the unfused path
    rounds the normed row instead."""
    if weight.dim() != 2 or norm_scale.shape != (weight.shape[1],):
        raise ConfigError(
            f"fold_norm: scale {tuple(norm_scale.shape)} does not match weight {tuple(weight.shape)}"
        )
    acc = torch.float64 if weight.dtype == torch.float64 else torch.float32
    return (weight.to(acc) * norm_scale.to(acc)[None, :]).to(weight.dtype).contiguous()


def linear_residual(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: torch.Tensor | None = None,
    **blocks: int,
) -> torch.Tensor:
    """``residual + x @ weight^T (+ bias)`` for x [n, K] (n <= :data:`MAX_VERIFY_ROWS`), weight [N, K],
    residual [n, N] -> [n, N] in x's dtype. ``blocks``: as :func:`norm_linear`'s."""
    return _launch("linear_residual", x, weight, weight.shape[0], residual=residual, bias=bias, **blocks)


def gated_linear_residual(
    o: torch.Tensor,
    z: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    residual: torch.Tensor,
    **blocks: int,
) -> torch.Tensor:
    """``residual + gated_norm(o, z) @ weight^T`` in one row-tiled launch: a GDN layer's output norm (RMS
    over each value head's d_v, times ``norm_weight`` [d_v], times SiLU(z)), its output projection and the
    residual. o [n, HV, d_v] (MAX_ROWS < n <= :data:`MAX_VERIFY_ROWS`), z [n, HV d_v] with unit column
    stride or None, weight [N, HV d_v], residual [n, N] in the layer's dtype -> [n, N] in that dtype. The
    gated row is rounded to that dtype before the matmul, as :func:`repro.gdn.triton_decode.gated_norm`
    rounds it, so the result is the two launches' (to float32 summation order). ``blocks``: RowsConfig
    fields but block_k (one value head a K chunk)."""
    n, hv, dv = o.shape
    k = hv * dv
    if not MAX_ROWS < n <= MAX_VERIFY_ROWS:
        raise ConfigError(f"gated_linear_residual takes {MAX_ROWS + 1}..{MAX_VERIFY_ROWS} rows, got {n}")
    if weight.dim() != 2 or weight.shape[1] != k or not weight.is_contiguous():
        raise ConfigError(f"weight must be a row-major [N, {k}], got {tuple(weight.shape)}")
    if norm_weight.shape != (dv,) or (z is not None and (z.shape != (n, k) or z.stride(-1) != 1)):
        raise ConfigError(f"norm weight [{dv}] and z [{n}, {k}] (unit column stride) expected")
    rows_out = weight.shape[0]
    if residual.shape != (n, rows_out) or residual.stride(-1) != 1:
        raise ConfigError(f"residual must be a row-major [{n}, {rows_out}], got {tuple(residual.shape)}")
    x = o.reshape(n, k)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(n, rows_out, dtype=residual.dtype, device=o.device)
    gate = (z, norm_weight, float(eps), dv)
    kind = "linear_residual"
    return _launch_rows(kind, x, weight, rows_out, out, None, None, residual, False, gate, **blocks)


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
    returned) into ``pick`` [1] int64, in two launches (three with split-K): the GEMV writes each block's
    maximum, a one-program reduce picks among them. ``advance`` = (length [1] int64, max_len): the reduce
    also moves the decode step's counter on, ``length = min(length + 1, max_len)``. Returns the logits
    [1, N]."""
    if x.shape[0] != 1:
        raise ConfigError(f"norm_linear_argmax takes one row, got shape {tuple(x.shape)}")
    rows_out = weight.shape[0]
    cfg = select_config("norm_linear_argmax", rows_out, x.shape[1], 1, x.device, **blocks)
    parts = _epilogue_blocks(cfg, rows_out)[1]
    best = (
        torch.empty(parts, dtype=_acc_torch_dtype(x.dtype), device=x.device),
        torch.empty(parts, dtype=torch.long, device=x.device),
    )
    logits = _launch(
        "norm_linear_argmax", x, weight, rows_out, norm=(norm_scale, eps), bias=bias, best=best, cfg=cfg
    )
    length, max_len = advance if advance is not None else (pick, 0)
    _argmax_reduce_kernel[(1,)](
        *best, pick, length, int(max_len), P=parts, BP=pow2(parts), ADVANCE=advance is not None,
        num_warps=4 if parts <= 1024 else 8, **pdl_args(x.device),
    )  # fmt: skip
    return logits


def _acc_torch_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of :func:`~repro.gdn.triton_common.acc_dtype`."""
    return torch.float64 if dtype == torch.float64 else torch.float32
