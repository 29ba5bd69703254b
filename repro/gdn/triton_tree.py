"""Fused Triton kernels for Gated DeltaNet tree verification (one layer, one sequence).

Pinned to :mod:`repro.gdn.reference` (``tree_gdn``, ``TreeFactors``, ``commit_closed_form``); the
math is in shared/gdn-tree-math.md. Conventions are the reference's: q, k [n, H, d_k]; v [n, HV, d_v];
g (log decay), beta [n, HV]; state S0 [HV, d_v, d_k] float32 (value-first); ``ancestors`` bool [n, n]
with the diagonal set (``ancestors[i, j]``: j is on the path to i), nodes in topological order.

Kernels
-------
``_tree_verify_kernel`` (masked WY form, no state written). Grid ``(HV, d_v / BV)``: one program per
value head and d_v tile. A program walks the n nodes in row blocks of ``BR`` rows (BR = 16, 32 or 64,
a power of two >= 16; n need not be a multiple: rows/cols past n are masked to zero, and a padded row
has an all-zero mask row, so its G, Gamma, A and P rows are 0 and it never feeds a real row). For row
block r (rows R) it computes, all in float32:

    G_R      = sum_{c <= r} (Mbar[R, c] g_c)                      (ancestor sums; stored to gate_cum)
    Gamma_Rc = exp(G_R - G_c) on ancestors, 0 elsewhere          (masked BEFORE exp)
    A_Rc     = diag(beta_R) (K_R K_c^T o Gamma_Rc o M)            (strictly lower: c < r, or c = r below diag)
    P_Rc     = scale (Q_R K_c^T o Gamma_Rc o Mbar)
    X        = beta_R (V_R - e^{G_R} K_R S0^T) - sum_{c < r} A_Rc Delta_c     (block forward substitution)
    Delta_R  = (I + A_RR)^-1 X                                    (the diagonal block's inverse, in registers)
    O_R      = scale e^{G_R} Q_R S0^T + sum_{c <= r} P_Rc Delta_c

This is the reference's U - W S0^T = T diag(beta) (V - e^G K S0^T), reorganised as a blocked
triangular solve on the right-hand side: T itself is never formed beyond the BR x BR diagonal blocks.
Delta rows of earlier blocks are read back from the ``delta`` output (written by this same program,
ordered by a CTA barrier). K/Q are read in d_k chunks of BK, so d_k = 256 costs no extra registers.

The diagonal block's inverse uses recursive doubling (block forward substitution written as masked
products): D_1 = I, D_2s = D_s - D_s L_s D_s with L_s = A restricted to the lower-left s x s sub-block
of every 2s x 2s diagonal block. It is exactly the recursive triangular inversion T21 = -T22 A21 T11
(no power series, so no cancellation, and no dependence on the tree depth: the float32 IEEE path
matches float64 to ~1e-7), and needs no dynamic indexing or scratch memory. The levels s = 1..8 (inside
the 16 x 16 diagonal blocks) run as batched [BR/16, 16, 16] dots on the extracted diagonal blocks
(``inverse`` 1, :func:`inverse_scheme`, BR >= 32); the levels s = 16, 32 as full [BR, BR] masked products.

Precision: ``precision`` picks ``input_precision`` for every float32 x float32 dot ("ieee": exact fp32
FMA; "tf32x3": three tf32 products, ~fp32 accuracy on tensor cores; "tf32": one tf32 product). When the
inputs are bf16/fp16, the input-only products (K K^T, Q K^T) run natively in that dtype with fp32
accumulation (exact products), the rest as ``precision`` says. G, Gamma, beta scaling, the state and
every output but o stay float32; o is rounded once (round-to-nearest-even) to the input dtype.
Errors measured on the H200 (||x - ref|| / ||ref||, float64 reference on the upcast inputs, random
trees n = 16..256, both paper shapes): "ieee" and "tf32x3" o and delta ~1e-7 (float32 inputs; bf16
inputs: delta ~1e-7, o 1.7e-3 = the bf16 rounding of o itself); "tf32" delta 4-6e-4, o 8e-4 (float32
inputs) or 1.7e-3 (bf16 inputs). The CPU interpreter computes every dot in exact fp32.

Two-phase verification (:func:`tree_gdn_split`, for few value heads). ``_tree_keys_kernel`` (grid HV x
NR^2 programs, NR = n / BR, those above the diagonal exit; a pending commit's programs besides) computes
every key-only block once per head: G, the masked A_rc and P_rc blocks over the full d_k, and the diagonal
blocks' inverses (stored in place of A_rr), into two float32 [HV, NR BR, NR BR] scratch buffers.
``_tree_values_kernel`` (grid HV x d_v / BV) then runs the same block forward substitution and outputs as
``_tree_verify_kernel``, reading those blocks instead of recomputing them, so narrow d_v tiles (BV = 16 at
the SpecLA shape: 128 programs) no longer repeat the d_k-long K K^T / Q K^T dots and the inverses. Same
arithmetic, same error bounds (pinned by the same tests). Measured on an H200 (bf16, CUDA graphs,
results/2026-12-01-h200-kernels-4): SpecLA's shape T = 128 27.7 us vs the one-kernel form's 50.2 (its 8
value heads gave that one too few programs); Weaver's 43.0 vs 42.7 (48 heads: a tie). The static decoder
picks it for few value heads. Phase 1 also runs, beside the key work, HV x d_v / BVC programs
(:func:`commit_tiles`) that compute phase 2's state products K S0^T and Q S0^T for every node
(``terms``, default; after the pending commit of their S0 rows when there is one), so phase 2's serial
walk has no d_k loop (SpecLA T = 64 14.9 -> 12.5 us; results/2026-12-03-h200-split-terms). At 64 < T
<= 128 ("tf32") it walks two 64-row blocks in registers, 4 warps: SpecLA T = 128 19.0 us, Weaver 31.2,
below the fused kernel's 38.5 (results/2026-12-03-h200-inverse-halves; :func:`tree_gdn_split`). With
``peel`` (tree kernel "split_peel") node 0 is solved before the row blocks, which hold the other nodes, and
one more phase-1 program per row block writes node 0's column: at 33 / 65 nodes one / two 32-row blocks
instead of two / three (Weaver 12.5 / 18.9 us vs 16.9 / 29.1; H100, results/2026-12-06-h100-peel-root/callGI),
at 129 two 64-row blocks (with the mask in aligned rows a win at Weaver's shape only, 38.6 vs 49.8 us:
results/2026-12-06-h100-aligned-mask), so the static decoder takes it at 17-65 nodes under PEEL_ROOT.

Blocked verification (:func:`tree_gdn_blocked`, issue 13: short serial chains). The same masked WY form
with T = (I + A)^-1 made explicit, so that the value work has no serial chain at all. Three launches:
``_tree_keys_kernel`` (as in the split form: A_rc, P_rc, the diagonal inverses T_rr, G; grid HV x NR x
NR), ``_tree_inverse_kernel`` (grid HV x (NR + value tiles): one column panel c of T per program, by block
forward substitution T_rc = -T_rr sum_{c<=j<r} A_rj T_jc; then PT_rc = sum_{c<=j<=r} P_rj T_jc; into two
float32 [HV, NP, NP] scratch buffers; its serial depth is NR - 1 block steps of [BR, BR] dots, no d_k or
d_v work; beside them, programs computing X0 = beta (V - e^G K S0^T) and scale e^G Q S0^T per BRV x BV
tile), and ``_tree_wy_kernel`` (grid HV x n / BRV x d_v / BV, every program independent): Delta_R = sum_c
T_Rc X0_c, O_R = scale e^{G_R} Q_R S0^T + sum_c PT_Rc X0_c over the column blocks c up to its rows.
Explicit T is the same recursive block elimination as the blocked solve (no power series), so the error
bounds are the split kernel's. A pending commit runs in phase 1, as in the split form. Why: the split
kernel's value phase walks the row blocks in series, each step a d_k loop, the off-diagonal dots and a
global-memory round trip of Delta behind a CTA barrier; here the only serial chain is phase 2's column
panel 0 (NR - 1 steps of [BR, BR] dots: one step at n = 128, BR = 64), and phase 3 is one pass of
independent loads and dots per program. Measured on an H200 (results/2026-12-01-h200-verify-glue,
scripts/tree-verify-fast; bf16, CUDA graphs): it does not win. Best setting (BR = 32) at T = 128: Weaver
43.0 us (fused 42.4, split 43.0), SpecLA 29.1 (split 27.6); default settings 54 / 40 at T = 128 and 147 /
76 at T = 256 (fused 105 / split 58.7). All three designs land at ~43 us at Weaver's T = 128, so the split
value phase's serial chain is not what bounds them; the common cost (the key phase they share or its
inputs) is the next thing to profile. Kept as a bench method (``tree_blocked``) and a backend option, not
a default.

Delayed commit (SpecLA, ``pending=``). In the one-launch kernel: before its row blocks, each program folds
the previous step's accepted path into its own [BV, d_k] rows of S0
(:func:`repro.gdn.triton_common.commit_path_tile`, the path's rows only, exact "ieee" dots), writes them
back in place and, after a CTA barrier, verifies from them: the separate commit launch disappears and the
committed state is the next step's start. A program reads no S0 rows but its own, so the in-place write
cannot race. Cost: d (d_v/BV + d_k) rows per program and one extra pass over its S0 tile. The conv-history
commit cannot move here (the conv runs before this kernel): it stays a separate launch
(:func:`repro.gdn.triton_commit.commit_conv_fused`). In the split and blocked forms the commit is extra
programs of phase 1 (one [32, d_k] S0 tile each): the key phase reads no S0, so the commit runs beside it,
off the value phase's serial chain, which then starts from the committed state. The one-launch prologue
had cost the split form's value phase ~10 us at the SpecLA shape, T = 64
(results/2026-12-01-h200-kernels-3: 28.0 us a step against 17.8 for the verify).

``_tree_states_kernel`` (per-node state caching, the SGLang-style baseline and the "snapshot" commit).
Grid ``(HV, d_v / BVS)``: each program keeps a [BVS, d_k] float32 state tile in registers and walks the
nodes in order: S_i = e^{g_i} S_p (I - beta_i k_i k_i^T) + beta_i v_i k_i^T from its parent's state
(registers when the parent is the previous node, S0 when it is -1, else re-read from the output written
earlier, after a CTA barrier), and writes S_i. No dots: plain fp32 FMAs; store-bound (it writes
n * HV * d_v * d_k * 4 bytes: 403 MB at the Weaver shape, n = 128). BVS = 8 by default (the most
programs; measured best).

Cost at the Weaver shape (H=16, HV=48, d_k=d_v=128), T = n = 128, defaults for "tf32" (BR=64, BV=64)
-------------------------------------------------------------------------------------------------
Grid 48 x 2 = 96 programs (one wave on 132 SMs). Per program: K S0^T and Q S0^T 2*2*128*128*64 =
4.2 MFLOP; K K^T and Q K^T on the 3 lower (r, c) blocks 3*2*2*64*64*128 = 6.3 MFLOP; two diagonal
inverses 2*(2*2*2*64^3 + 4*2*4*2*16^3) = 4.7 MFLOP; A Delta, T X and P Delta 6*2*64*64*64 = 3.1 MFLOP:
~18 MFLOP, ~1.8 GFLOP per call (1.2 GFLOP without the K-only work that each d_v tile repeats). Bytes:
q, k (bf16) 1.0 MB, v 1.6 MB, S0 3.1 MB, o (bf16) 1.6 MB, delta 3.1 MB, TreeFactors.k (fp32, written
by tile 0) 3.1 MB, mask 16 kB: ~14 MB, ~3 us at the measured 4.3 TB/s. Flops at ~400 TFLOP/s (tf32
dense) are ~4 us if the whole chip worked on them. Both floors are far under what a single program's
chain of dependent small dots takes, so the kernel is latency-bound: per-program serial depth (row
blocks x (d_k loop + inverse levels + solve)) is the cost, not bandwidth or peak flops.
Measured on one H200 (CUDA-graph replays, bf16 inputs, random trees, per call incl. all glue), us:
  Weaver n =             16     32     64    128    256
    tf32                6.3    9.7   17.8   39.7   99.8
    tf32x3             10.5   18.5   38.0   90.0  243
    ieee               18.4   25.9   53.6  125    321
    states (snapshots) 23.7   44.6   93.9  199    412     (~2.1 TB/s written)
  SpecLA chain n = 16 / 64 / 128: tf32 8.5 / 22.3 / 50.1; ieee 18.3 / 53.6 / 123.7
(float32 inputs, Weaver n = 128: tf32 45.7, tf32x3 187, ieee 199 us.)

Tiling choices and registers. BR = 64 for "tf32" (fewer serial row blocks; [64, 64] dots can use
Hopper's 64-row warpgroup MMA; not checked in the SASS) and BR = 32 for "ieee"/"tf32x3" (at BR = 64
those dots were slow, presumably spilling: BR=64, BV=64, 4 warps ran 4.7 ms in "ieee", 40x slower;
the compiler's register report was not read). d_v tiles of 64 (32 for "ieee"): two
programs per Weaver head, more SMs busy, at the price of repeating the K-only work per tile; one program
per head (BV = 128) measured 52 vs 43 us. With BR = 64, BV = 64 and 8 warps each [64, 64] fp32 tile is
16 registers per thread; the live set (X, O, A or P, the inverse, two dot temporaries, the K/Q chunks)
stays under ~150 registers. n = 256 and d_k = 256 grow no tile: rows are walked in blocks (NR = n / BR
trips, each with r off-diagonal blocks, so the work grows ~n^2 / BR^2 but registers do not), d_k in
chunks of BK = 64. Shared memory is only what tl.dot stages operands through (a few 8-16 kB tiles).
Since tried: the K-only part once per head in its own launch (the split form below), software pipelining of
the d_k loop (num_stages 2-3: no gain, results/2026-12-03-h200-tree-walk/callY knobs); the 64 x 64
diagonal inverse's last two levels on 32-row blocks (results/2026-12-03-h200-inverse-halves), either cut
out of the [64, 64] registers (reshape, permute, masked sums: fused SpecLA T = 128 59.9 vs 46.4 us, the
split form's phase 1 at 64-row blocks 20.0 vs 13.1) or, in phase 1, from the halves' own K K^T dots
(20.0-22.2 vs 13.2): both slower than the masked [64, 64] products, although they have 1/4-1/8 of the
flops (not profiled; both put [32, 32] dots and two 32-row inverses in a 64-row program). Not yet tried:
persistent scheduling across layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from repro.gdn.reference import PendingCommit, TreeFactors
from repro.gdn.triton_common import (
    check_factors,
    commit_indexed_tile,
    commit_path_tile,
    interpreting,
    pdl_args,
    pdl_start,
    pow2,
)

PRECISIONS = ("ieee", "tf32x3", "tf32")
# warps of both launches of the split form at every block size (measured faster than 8: tree_gdn_split)
SPLIT_WARPS = 4
# phase 2 of the split form: Delta row blocks in registers, or read back from the delta output (split_walk)
WALKS = ("registers", "memory")


@triton.jit
def _level_mask(ri, ci, LVL: tl.constexpr):
    """Lower-left s x s sub-block (s = 2^LVL) of every 2s x 2s diagonal block, for row/col indices."""
    same = (ri >> (LVL + 1)) == (ci >> (LVL + 1))
    return same & (((ri >> LVL) & 1) == 1) & (((ci >> LVL) & 1) == 0)


@triton.jit
def _unit_lower_inverse(b_a, BR: tl.constexpr, LOG2_BR: tl.constexpr, PREC: tl.constexpr, INV: tl.constexpr):
    """(I + A)^-1 for a strictly lower triangular [BR, BR] A, by recursive doubling.

    D_1 = I; D_{2s} = D_s - D_s L_s D_s where L_s keeps A's lower-left s x s sub-block of every
    2s x 2s diagonal block. After log2(BR) levels D is the full inverse. ``INV`` (:func:`inverse_scheme`):
    0 every level as a masked [BR, BR] product; else the first four levels (s = 1..8, inside the 16 x 16
    diagonal blocks) as batched [BR/16, 16, 16] dots on the extracted diagonal blocks (BR >= 32), the
    rest masked.
    """
    o_i = tl.arange(0, BR)
    ri = o_i[:, None]
    ci = o_i[None, :]
    if INV > 0:
        NB: tl.constexpr = BR // 16
        o_b = tl.arange(0, NB)
        m_bb = o_b[:, None, None, None] == o_b[None, :, None, None]
        # the 16 x 16 diagonal blocks of A as [NB, 16, 16]
        a4 = tl.permute(tl.reshape(b_a, [NB, 16, NB, 16]), [0, 2, 1, 3])
        a3 = tl.sum(tl.where(m_bb, a4, 0.0), axis=1)
        r3 = tl.arange(0, 16)[None, :, None]
        c3 = tl.arange(0, 16)[None, None, :]
        b3 = o_b[:, None, None]
        t3 = tl.where((r3 == c3) & (b3 >= 0), 1.0, 0.0)
        for lvl in tl.static_range(4):
            m_l = _level_mask(r3, c3, lvl)
            l3 = tl.where(m_l, a3, 0.0)
            lt3 = tl.dot(l3, t3, input_precision=PREC)
            t3 = t3 - tl.dot(t3, lt3, input_precision=PREC)
        t4 = tl.where(m_bb, t3[:, None, :, :], 0.0)
        b_t = tl.reshape(tl.permute(t4, [0, 2, 1, 3]), [BR, BR])
        for lvl in tl.static_range(4, LOG2_BR):
            m_l = _level_mask(ri, ci, lvl)
            b_l = tl.where(m_l, b_a, 0.0)
            b_lt = tl.dot(b_l, b_t, input_precision=PREC)
            b_t = b_t - tl.dot(b_t, b_lt, input_precision=PREC)
    else:
        b_t = tl.where(ri == ci, 1.0, 0.0)
        for lvl in tl.static_range(LOG2_BR):
            m_l = _level_mask(ri, ci, lvl)
            b_l = tl.where(m_l, b_a, 0.0)
            b_lt = tl.dot(b_l, b_t, input_precision=PREC)
            b_t = b_t - tl.dot(b_t, b_lt, input_precision=PREC)
    return b_t


@triton.jit
def _block_mask(anc_ptr, rows, cols, n, ns, CHAIN: tl.constexpr):
    """[BR, BC] ancestor-or-self mask of rows x cols (in bounds, rows >= cols; CHAIN: the lower triangle), the
    mask's rows ``ns`` bytes apart (:func:`mask_rows`)."""
    m_rc = (rows < n)[:, None] & (cols < n)[None, :] & (rows[:, None] >= cols[None, :])
    if not CHAIN:
        b_anc = tl.load(anc_ptr + rows[:, None] * ns + cols[None, :], mask=m_rc, other=0)
        m_rc = m_rc & (b_anc != 0)
    return m_rc


@triton.jit
def _first_node_column(anc_ptr, rows, n, ns, CHAIN: tl.constexpr):
    """[BR] mask: node 0 is on the path to each of ``rows`` (rows >= 1, in bounds; CHAIN: every row)."""
    m_rows = (rows < n) & (rows > 0)
    if not CHAIN:
        m_rows = m_rows & (tl.load(anc_ptr + rows * ns, mask=m_rows, other=0) != 0)
    return m_rows


@triton.jit
def _block_gates(
    g_ptr, anc_ptr, r, n, ns, i_h, HV: tl.constexpr, BR: tl.constexpr, CHAIN: tl.constexpr, NPG: tl.constexpr,
    STRICT: tl.constexpr, OFF: tl.constexpr = 0,
):  # fmt: skip
    """G of row block r (value head i_h; its rows start at OFF + r BR): the sum of g over each row's
    ancestors, from one load of the mask's row block [BR, NPG] and of g (:func:`gate_columns`: NPG a power
    of two >= n; STRICT: >= n - 1 only, each row's own g added apart, the mask's diagonal being set,
    :func:`repro.gdn.reference.ancestor_gates`). A loop over the column blocks c <= r (a [BR, BR] load
    and sum each) cost phase 1 of the split form 1.2-1.3 us more at 32-row blocks and 1.7-6.7 at 64
    (SpecLA / Weaver, T = 128; results/2026-12-03-h200-tree-walk); the fused kernel tied."""
    rows = OFF + r * BR + tl.arange(0, BR)
    cols = tl.arange(0, NPG)
    b_g = tl.load(g_ptr + cols * HV + i_h, mask=cols < n, other=0.0).to(tl.float32)
    m_rc = _block_mask(anc_ptr, rows, cols, n, ns, CHAIN)
    if STRICT:
        m_rc = m_rc & (rows[:, None] != cols[None, :])
    b_gr = tl.sum(tl.where(m_rc, b_g[None, :], 0.0), axis=1)
    if STRICT:
        b_gr += tl.load(g_ptr + rows * HV + i_h, mask=rows < n, other=0.0).to(tl.float32)
    return b_gr


@triton.jit
def _first_node_columns(
    q_ptr, k_ptr, g_ptr, beta_ptr, anc_ptr, c0_ptr, gcum_ptr, kx_ptr, r, n, ns, scale, i_h, i_kh,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
    CHAIN: tl.constexpr, PREC: tl.constexpr, UPCAST_QK: tl.constexpr, WRITE_K: tl.constexpr,
    NPG: tl.constexpr, STRICT: tl.constexpr,
):  # fmt: skip
    """Node 0's column of row block r (the split form's peel; rows 1 + r BR ..): A[R, 0] = beta_R (K_R k_0)
    e^{G_R - g_0} and P[R, 0] = scale (Q_R k_0) e^{G_R - g_0} where node 0 is an ancestor, into ``c0``
    [2, HV, n] (A's column, P's column; by node); K_R k_0 and Q_R k_0 as dots with a 16-row tile whose
    row 0 is node 0 (dots take >= 16 rows). Block 0's program also writes node 0's own P[0, 0], G_0 = g_0
    and its expanded key. Programs of their own beside the block pairs, so the diagonal programs (phase 1's
    serial chain: dots, then the inverse) carry no dots of node 0; that move came with the narrower gate
    load, and the two were not timed apart (results/2026-12-06-h100-peel-root/NOTES.md, calls GE-GF)."""
    rows = 1 + r * BR + tl.arange(0, BR)
    m_rows = rows < n
    o_k = tl.arange(0, BK)
    o_z = tl.arange(0, 16)
    b_kk0 = tl.zeros([BR, 16], dtype=tl.float32)
    b_qk0 = tl.zeros([BR, 16], dtype=tl.float32)
    b_q00 = tl.zeros([16, 16], dtype=tl.float32)
    for kk in range(0, DK, BK):
        m_k = (kk + o_k) < DK
        p_r = rows[:, None] * (H * DK) + i_kh * DK + (kk + o_k)[None, :]
        b_k = tl.load(k_ptr + p_r, mask=m_rows[:, None] & m_k[None, :], other=0.0)
        b_q = tl.load(q_ptr + p_r, mask=m_rows[:, None] & m_k[None, :], other=0.0)
        p_0 = (i_kh * DK + kk + o_k)[None, :] + 0 * o_z[:, None]
        m_0 = (o_z == 0)[:, None] & m_k[None, :]
        b_k0 = tl.load(k_ptr + p_0, mask=m_0, other=0.0)
        b_q0 = tl.load(q_ptr + p_0, mask=m_0, other=0.0)
        if WRITE_K:
            p_kx0 = (i_h * DK + kk + o_k)[None, :] + 0 * o_z[:, None]
            tl.store(kx_ptr + p_kx0, b_k0.to(tl.float32), mask=m_0 & (r == 0))
        if UPCAST_QK:
            b_k = b_k.to(tl.float32)
            b_q = b_q.to(tl.float32)
            b_k0 = b_k0.to(tl.float32)
            b_q0 = b_q0.to(tl.float32)
        b_kk0 += tl.dot(b_k, tl.trans(b_k0), input_precision=PREC)
        b_qk0 += tl.dot(b_q, tl.trans(b_k0), input_precision=PREC)
        b_q00 += tl.dot(b_q0, tl.trans(b_k0), input_precision=PREC)
    first = (o_z == 0)[None, :]
    b_g0 = tl.load(g_ptr + i_h).to(tl.float32)
    b_gr = _block_gates(g_ptr, anc_ptr, r, n, ns, i_h, HV, BR, CHAIN, NPG, STRICT, 1)
    m_r0 = _first_node_column(anc_ptr, rows, n, ns, CHAIN)
    b_gam0 = tl.where(m_r0, tl.exp(tl.where(m_r0, b_gr - b_g0, 0.0)), 0.0)
    b_beta = tl.load(beta_ptr + rows * HV + i_h, mask=m_rows, other=0.0).to(tl.float32)
    b_kk0_r = tl.sum(tl.where(first, b_kk0, 0.0), axis=1)
    b_qk0_r = tl.sum(tl.where(first, b_qk0, 0.0), axis=1)
    tl.store(c0_ptr + i_h * n + rows, b_beta * b_kk0_r * b_gam0, mask=m_rows)
    tl.store(c0_ptr + (HV + i_h) * n + rows, scale * b_qk0_r * b_gam0, mask=m_rows)
    if r == 0:
        b_q00_s = tl.sum(tl.sum(tl.where((o_z == 0)[:, None] & first, b_q00, 0.0), axis=1), axis=0)
        tl.store(c0_ptr + (HV + i_h) * n, scale * b_q00_s)
        tl.store(gcum_ptr + i_h, b_g0)


@triton.jit
def _pending_prologue(
    s0_ptr, pd_ptr, pk_ptr, pg_ptr, panc_ptr, pnode_ptr, pn, i_h, o_v,
    HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr, BK: tl.constexpr, PNP: tl.constexpr,
):  # fmt: skip
    """The delayed commit of S0[i_h, o_v, :] in place (the calling program owns those rows and reads
    no others), d_k in chunks of BK; ends with a CTA barrier so that the program's loads see it.
    PNP = 0: ``panc_ptr`` is the path index of the path to ``pnode`` (PendingCommit.path), read directly
    (:func:`~repro.gdn.triton_common.commit_indexed_tile`); else the ancestor mask, gathered per chunk."""
    o_k = tl.arange(0, BK)
    m_v = o_v < DV
    if PNP == 0:
        live = tl.load(pnode_ptr) >= 0  # the path index is the stash's: read only while its node is pending
    for kk in range(0, DK, BK):
        o_kk = kk + o_k
        p_s = s0_ptr + i_h * (DV * DK) + o_v[:, None] * DK + o_kk[None, :]
        m_s = m_v[:, None] & (o_kk < DK)[None, :]
        b_s = tl.load(p_s, mask=m_s, other=0.0)
        if PNP == 0:
            b_s = commit_indexed_tile(b_s, live, pd_ptr, pk_ptr, pg_ptr, panc_ptr, pn, i_h, o_v, o_kk,
                                      HV, DV, DK, 16, 1)  # fmt: skip
        else:
            b_s = commit_path_tile(b_s, pd_ptr, pk_ptr, pg_ptr, panc_ptr, pnode_ptr, pn, i_h, o_v, o_kk,
                                   HV, DV, DK, PNP, 16)  # fmt: skip
        tl.store(p_s, b_s, mask=m_s)
    tl.debug_barrier()


@triton.jit
def _tree_verify_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    s0_ptr,
    anc_ptr,
    o_ptr,
    delta_ptr,
    gcum_ptr,
    kx_ptr,
    pd_ptr,
    pk_ptr,
    pg_ptr,
    panc_ptr,
    pnode_ptr,
    pn,
    n,
    ns,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BR: tl.constexpr,
    LOG2_BR: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    CHAIN: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST_QK: tl.constexpr,
    INV: tl.constexpr,
    WRITE_K: tl.constexpr,
    PENDING: tl.constexpr,
    PNP: tl.constexpr,
    PDL: tl.constexpr,
    NPG: tl.constexpr,
    STRICT: tl.constexpr,
):
    """One (value head, d_v tile): blocked masked-WY verification over all n nodes.

    With PENDING, first the delayed commit: this program's [BV, d_k] rows of S0 get the previous step's
    accepted path folded in (closed form over the path's rows only, factors pd/pk/pg of ``pn`` nodes,
    mask panc, path end pnode) and are written back in place; the verification then starts from them.

    Writes o [n, HV, DV] (this tile's columns), delta [n, HV, DV] float32 and gate_cum [n, HV] float32
    (every d_v tile writes the same G values: a benign duplicate).
    """
    pdl_start(PDL)
    i_h = tl.program_id(0)
    i_v = tl.program_id(1)
    i_kh = i_h // (HV // H)
    num_blocks = tl.cdiv(n, BR)
    o_r = tl.arange(0, BR)
    o_c = tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < DV

    if PENDING:  # this program owns S0[i_h, o_v, :] and reads no other rows of S0: in place is race-free
        _pending_prologue(
            s0_ptr, pd_ptr, pk_ptr, pg_ptr, panc_ptr, pnode_ptr, pn, i_h, o_v, HV, DV, DK, BK, PNP
        )

    for r in range(0, num_blocks):
        rows = r * BR + o_r
        m_rows = rows < n

        # ---- G for this block's rows: sum over ancestors, which all sit in column blocks c <= r
        b_gr = _block_gates(g_ptr, anc_ptr, r, n, ns, i_h, HV, BR, CHAIN, NPG, STRICT)
        tl.store(gcum_ptr + rows * HV + i_h, b_gr, mask=m_rows)
        b_beta = tl.load(beta_ptr + rows * HV + i_h, mask=m_rows, other=0.0).to(tl.float32)
        b_eg = tl.exp(b_gr)

        # ---- diagonal block products and the S0 products, one pass over d_k
        b_ks = tl.zeros([BR, BV], dtype=tl.float32)
        b_qs = tl.zeros([BR, BV], dtype=tl.float32)
        b_kk = tl.zeros([BR, BR], dtype=tl.float32)
        b_qk = tl.zeros([BR, BR], dtype=tl.float32)
        for kk in range(0, DK, BK):
            m_k = (kk + o_k) < DK
            p_qk = rows[:, None] * (H * DK) + i_kh * DK + (kk + o_k)[None, :]
            m_qk = m_rows[:, None] & m_k[None, :]
            b_k = tl.load(k_ptr + p_qk, mask=m_qk, other=0.0)
            b_q = tl.load(q_ptr + p_qk, mask=m_qk, other=0.0)
            if WRITE_K:  # the float32 keys expanded to value heads, for TreeFactors.k (tile 0 only)
                p_kx = rows[:, None] * (HV * DK) + i_h * DK + (kk + o_k)[None, :]
                tl.store(kx_ptr + p_kx, b_k.to(tl.float32), mask=m_qk & (i_v == 0))
            if UPCAST_QK:
                b_k = b_k.to(tl.float32)
                b_q = b_q.to(tl.float32)
            # S0^T chunk [BK, BV]: S0[h, v, kk + j]
            p_s = s0_ptr + i_h * (DV * DK) + o_v[None, :] * DK + (kk + o_k)[:, None]
            b_s = tl.load(p_s, mask=m_k[:, None] & m_v[None, :], other=0.0)
            b_kk += tl.dot(b_k, tl.trans(b_k), input_precision=PREC)
            b_qk += tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
            b_ks += tl.dot(b_k.to(tl.float32), b_s, input_precision=PREC)
            b_qs += tl.dot(b_q.to(tl.float32), b_s, input_precision=PREC)

        p_v = rows[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
        m_rv = m_rows[:, None] & m_v[None, :]
        b_vv = tl.load(v_ptr + p_v, mask=m_rv, other=0.0).to(tl.float32)
        b_x = b_beta[:, None] * (b_vv - b_eg[:, None] * b_ks)
        b_o = (scale * b_eg)[:, None] * b_qs

        # ---- off-diagonal blocks c < r: forward substitution and output contributions
        for c in range(0, r):
            cols = c * BR + o_c
            m_cols = cols < n
            b_gc = tl.load(gcum_ptr + cols * HV + i_h, mask=m_cols, other=0.0)
            m_rc = m_rows[:, None] & m_cols[None, :]
            if not CHAIN:
                b_anc = tl.load(anc_ptr + rows[:, None] * ns + cols[None, :], mask=m_rc, other=0)
                m_rc = m_rc & (b_anc != 0)
            b_gam = tl.where(m_rc, tl.exp(tl.where(m_rc, b_gr[:, None] - b_gc[None, :], 0.0)), 0.0)
            b_kc_kk = tl.zeros([BR, BR], dtype=tl.float32)
            b_kc_qk = tl.zeros([BR, BR], dtype=tl.float32)
            for kk in range(0, DK, BK):
                m_k = (kk + o_k) < DK
                p_r = rows[:, None] * (H * DK) + i_kh * DK + (kk + o_k)[None, :]
                p_c = cols[:, None] * (H * DK) + i_kh * DK + (kk + o_k)[None, :]
                b_k = tl.load(k_ptr + p_r, mask=m_rows[:, None] & m_k[None, :], other=0.0)
                b_q = tl.load(q_ptr + p_r, mask=m_rows[:, None] & m_k[None, :], other=0.0)
                b_kc = tl.load(k_ptr + p_c, mask=m_cols[:, None] & m_k[None, :], other=0.0)
                if UPCAST_QK:
                    b_k = b_k.to(tl.float32)
                    b_q = b_q.to(tl.float32)
                    b_kc = b_kc.to(tl.float32)
                b_kc_kk += tl.dot(b_k, tl.trans(b_kc), input_precision=PREC)
                b_kc_qk += tl.dot(b_q, tl.trans(b_kc), input_precision=PREC)
            b_a = b_beta[:, None] * b_kc_kk * b_gam
            b_p = scale * b_kc_qk * b_gam
            p_dc = cols[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
            b_dc = tl.load(delta_ptr + p_dc, mask=m_cols[:, None] & m_v[None, :], other=0.0)
            b_x -= tl.dot(b_a, b_dc, input_precision=PREC)
            b_o += tl.dot(b_p, b_dc, input_precision=PREC)

        # ---- diagonal block: Gamma, A (strict), P (with diagonal), inverse, Delta, O
        cols = r * BR + o_c
        m_rc = m_rows[:, None] & (cols < n)[None, :] & (rows[:, None] >= cols[None, :])
        if not CHAIN:
            b_anc = tl.load(anc_ptr + rows[:, None] * ns + cols[None, :], mask=m_rc, other=0)
            m_rc = m_rc & (b_anc != 0)
        b_gam = tl.where(m_rc, tl.exp(tl.where(m_rc, b_gr[:, None] - b_gr[None, :], 0.0)), 0.0)
        b_a = tl.where(rows[:, None] > cols[None, :], b_beta[:, None] * b_kk * b_gam, 0.0)
        b_p = scale * b_qk * b_gam
        b_t = _unit_lower_inverse(b_a, BR, LOG2_BR, PREC, INV)
        b_d = tl.dot(b_t, b_x, input_precision=PREC)
        b_o += tl.dot(b_p, b_d, input_precision=PREC)
        tl.store(delta_ptr + p_v, b_d, mask=m_rv)
        tl.store(o_ptr + p_v, b_o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m_rv)
        # later blocks read these delta rows and G values back (written by other threads of this CTA)
        tl.debug_barrier()


@triton.jit
def _tree_keys_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, anc_ptr, a_ptr, p_ptr, c0_ptr, gcum_ptr, kx_ptr,
    s0_ptr, pd_ptr, pk_ptr, pg_ptr, panc_ptr, pnode_ptr, pn, ks_ptr, qs_ptr, n, ns, NP, NR, scale,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BR: tl.constexpr,
    LOG2_BR: tl.constexpr, BK: tl.constexpr, CHAIN: tl.constexpr, PREC: tl.constexpr,
    UPCAST_QK: tl.constexpr, INV: tl.constexpr, WRITE_K: tl.constexpr,
    PENDING: tl.constexpr, PNP: tl.constexpr, NCT: tl.constexpr, BVC: tl.constexpr, BKC: tl.constexpr,
    TERMS: tl.constexpr, RC: tl.constexpr, PDL: tl.constexpr, NPG: tl.constexpr, STRICT: tl.constexpr,
    PEEL: tl.constexpr = 0, P_APART: tl.constexpr = 0,
):  # fmt: skip
    """Phase 1 of :func:`tree_gdn_split` (and of :func:`tree_gdn_blocked`), one (value head, row block r,
    column block c <= r) per program (grid axis 1 holds NR x NR of them; those with c > r exit at once):
    the key-only blocks A_rc = diag(beta_r) (K_r K_c^T o Gamma_rc) and P_rc = scale (Q_r K_c^T o Gamma_rc)
    into a [HV, NP, NP] float32 scratch each; a diagonal program (c = r) stores the inverse
    (I + A_rr)^-1 in place of A_rr (phase 2 needs only that) and writes G_r (and k expanded).
    With PENDING, the first NCT programs of axis 1 are the delayed commit instead, one [BVC, d_k] tile of
    S0 each (:func:`_pending_prologue`, d_k in chunks of BKC): nothing here reads S0, so the commit runs
    beside the key work and the next phase (launched after this one completes) starts from it. With TERMS
    the same NCT programs (after the commit, if any) write phase 2's state products K S0^T and Q S0^T of
    their d_v rows for every node (:func:`_state_products`, RC rows at a time) into ks / qs [n, HV, d_v]
    float32: the value phase's d_k-long dots leave its serial chain for programs beside the key work.
    PEEL (:func:`tree_gdn_split`'s ``peel``): node 0 is left out of the row blocks (row block r holds nodes
    1 + r BR .., at scratch rows and columns r BR ..: aligned tiles); NR more programs after the block
    pairs write its column, A[R, 0] and P[R, 0] (node 0 is an ancestor of every node of a draft tree, the
    root, but the mask decides), and node 0's own terms (:func:`_first_node_columns`).
    P_APART (:func:`tree_gdn_split`'s ``p_apart``): NR more programs (after those) write the diagonal blocks'
    P_rr, so that a diagonal program's serial chain (its d_k-long dots, then the inverse) has the K K^T dots
    alone (:func:`_block_pair`)."""
    pdl_start(PDL)
    i_h = tl.program_id(0)
    pid = tl.program_id(1)
    if PENDING or TERMS:
        if pid < NCT:
            o_v = pid * BVC + tl.arange(0, BVC)
            if PENDING:
                _pending_prologue(s0_ptr, pd_ptr, pk_ptr, pg_ptr, panc_ptr, pnode_ptr, pn, i_h, o_v, HV, DV,
                                  DK, BKC, PNP)  # fmt: skip
            if TERMS:
                i_kh = i_h // (HV // H)
                m_v = o_v < DV
                for r0 in range(0, n, RC):
                    rows = r0 + tl.arange(0, RC)
                    m_rows = rows < n
                    b_ks, b_qs = _state_products(q_ptr, k_ptr, s0_ptr, rows, m_rows, o_v, m_v, i_h, i_kh, H,
                                                 HV, DK, DV, RC, BK, BVC, PREC)  # fmt: skip
                    p_v = rows[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
                    tl.store(ks_ptr + p_v, b_ks, mask=m_rows[:, None] & m_v[None, :])
                    tl.store(qs_ptr + p_v, b_qs, mask=m_rows[:, None] & m_v[None, :])
            return
        pid -= NCT
    i_kh = i_h // (HV // H)
    if P_APART and pid >= NR * NR + PEEL * NR:  # the diagonal blocks' P alone
        d = pid - NR * NR - PEEL * NR
        _block_pair(q_ptr, k_ptr, g_ptr, beta_ptr, anc_ptr, a_ptr, p_ptr, gcum_ptr, kx_ptr, d, d, n, ns, NP,
                    scale, i_h, i_kh, H, HV, DK, BR, LOG2_BR, BK, CHAIN, PREC, UPCAST_QK, INV, WRITE_K,
                    NPG, STRICT, PEEL, False, True)  # fmt: skip
        return
    if PEEL and pid >= NR * NR:
        _first_node_columns(q_ptr, k_ptr, g_ptr, beta_ptr, anc_ptr, c0_ptr, gcum_ptr, kx_ptr, pid - NR * NR,
                            n, ns, scale, i_h, i_kh, H, HV, DK, BR, BK, CHAIN, PREC, UPCAST_QK, WRITE_K,
                            NPG, STRICT)  # fmt: skip
        return
    r = pid // NR
    c = pid % NR
    if c > r:
        return
    if P_APART and c == r:  # the diagonal blocks' A and inverse alone
        _block_pair(q_ptr, k_ptr, g_ptr, beta_ptr, anc_ptr, a_ptr, p_ptr, gcum_ptr, kx_ptr, r, c, n, ns, NP,
                    scale, i_h, i_kh, H, HV, DK, BR, LOG2_BR, BK, CHAIN, PREC, UPCAST_QK, INV, WRITE_K,
                    NPG, STRICT, PEEL, True, False)  # fmt: skip
        return
    _block_pair(q_ptr, k_ptr, g_ptr, beta_ptr, anc_ptr, a_ptr, p_ptr, gcum_ptr, kx_ptr, r, c, n, ns, NP,
                scale, i_h, i_kh, H, HV, DK, BR, LOG2_BR, BK, CHAIN, PREC, UPCAST_QK, INV, WRITE_K, NPG,
                STRICT, PEEL, True, True)  # fmt: skip


@triton.jit
def _block_pair(
    q_ptr, k_ptr, g_ptr, beta_ptr, anc_ptr, a_ptr, p_ptr, gcum_ptr, kx_ptr, r, c, n, ns, NP, scale, i_h, i_kh,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, BR: tl.constexpr, LOG2_BR: tl.constexpr,
    BK: tl.constexpr, CHAIN: tl.constexpr, PREC: tl.constexpr, UPCAST_QK: tl.constexpr, INV: tl.constexpr,
    WRITE_K: tl.constexpr, NPG: tl.constexpr, STRICT: tl.constexpr, PEEL: tl.constexpr,
    WITH_A: tl.constexpr, WITH_P: tl.constexpr,
):  # fmt: skip
    """Row block r x column block c (c <= r) of ``_tree_keys_kernel``: WITH_A the A block (K K^T dots; on the
    diagonal its inverse, G_r and the expanded keys), WITH_P the P block (Q K^T dots)."""
    rows = PEEL + r * BR + tl.arange(0, BR)
    cols = PEEL + c * BR + tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    m_rows = rows < n
    m_cols = cols < n
    b_gr = _block_gates(g_ptr, anc_ptr, r, n, ns, i_h, HV, BR, CHAIN, NPG, STRICT, PEEL)
    b_gc = _block_gates(g_ptr, anc_ptr, c, n, ns, i_h, HV, BR, CHAIN, NPG, STRICT, PEEL)
    b_kk = tl.zeros([BR, BR], dtype=tl.float32)
    b_qk = tl.zeros([BR, BR], dtype=tl.float32)
    for kk in range(0, DK, BK):
        m_k = (kk + o_k) < DK
        p_r = rows[:, None] * (H * DK) + i_kh * DK + (kk + o_k)[None, :]
        p_c = cols[:, None] * (H * DK) + i_kh * DK + (kk + o_k)[None, :]
        m_rk = m_rows[:, None] & m_k[None, :]
        if WITH_A:
            b_k = tl.load(k_ptr + p_r, mask=m_rk, other=0.0)
        if WITH_P:
            b_q = tl.load(q_ptr + p_r, mask=m_rk, other=0.0)
        b_kc = tl.load(k_ptr + p_c, mask=m_cols[:, None] & m_k[None, :], other=0.0)
        if WITH_A and WRITE_K:  # TreeFactors.k: the float32 keys expanded to value heads (diagonal programs)
            p_kx = rows[:, None] * (HV * DK) + i_h * DK + (kk + o_k)[None, :]
            tl.store(kx_ptr + p_kx, b_k.to(tl.float32), mask=m_rk & (c == r))
        if UPCAST_QK:
            b_kc = b_kc.to(tl.float32)
        if WITH_A:
            if UPCAST_QK:
                b_k = b_k.to(tl.float32)
            b_kk += tl.dot(b_k, tl.trans(b_kc), input_precision=PREC)
        if WITH_P:
            if UPCAST_QK:
                b_q = b_q.to(tl.float32)
            b_qk += tl.dot(b_q, tl.trans(b_kc), input_precision=PREC)
    m_rc = _block_mask(anc_ptr, rows, cols, n, ns, CHAIN)
    b_gam = tl.where(m_rc, tl.exp(tl.where(m_rc, b_gr[:, None] - b_gc[None, :], 0.0)), 0.0)
    p_blk = i_h * NP * NP + (rows - PEEL)[:, None] * NP + (cols - PEEL)[None, :]
    if WITH_P:
        tl.store(p_ptr + p_blk, scale * b_qk * b_gam)
    if WITH_A:
        b_beta = tl.load(beta_ptr + rows * HV + i_h, mask=m_rows, other=0.0).to(tl.float32)
        b_a = tl.where(rows[:, None] > cols[None, :], b_beta[:, None] * b_kk * b_gam, 0.0)
        if c == r:
            tl.store(gcum_ptr + rows * HV + i_h, b_gr, mask=m_rows)
            b_a = _unit_lower_inverse(b_a, BR, LOG2_BR, PREC, INV)
        tl.store(a_ptr + p_blk, b_a)


@triton.jit
def _state_products(
    q_ptr, k_ptr, s0_ptr, rows, m_rows, o_v, m_v, i_h, i_kh,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BR: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """K S0^T and Q S0^T on ``rows`` (BR of them) x the d_v tile ``o_v`` of value head i_h, [BR, BV]
    float32 each (d_k in chunks of BK)."""
    o_k = tl.arange(0, BK)
    b_ks = tl.zeros([BR, BV], dtype=tl.float32)
    b_qs = tl.zeros([BR, BV], dtype=tl.float32)
    for kk in range(0, DK, BK):
        m_k = (kk + o_k) < DK
        p_qk = rows[:, None] * (H * DK) + i_kh * DK + (kk + o_k)[None, :]
        m_qk = m_rows[:, None] & m_k[None, :]
        b_k = tl.load(k_ptr + p_qk, mask=m_qk, other=0.0).to(tl.float32)
        b_q = tl.load(q_ptr + p_qk, mask=m_qk, other=0.0).to(tl.float32)
        p_s = s0_ptr + i_h * (DV * DK) + o_v[None, :] * DK + (kk + o_k)[:, None]
        b_s = tl.load(p_s, mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_ks += tl.dot(b_k, b_s, input_precision=PREC)
        b_qs += tl.dot(b_q, b_s, input_precision=PREC)
    return b_ks, b_qs


@triton.jit
def _state_terms(b_ks, b_qs, v_ptr, beta_ptr, gcum_ptr, rows, m_rows, o_v, m_v, i_h, scale, HV: tl.constexpr,
                 DV: tl.constexpr):  # fmt: skip
    """Row block ``rows``' state terms from its products (:func:`_state_products`): X0 = beta (V - e^G
    K S0^T) and scale e^G Q S0^T."""
    b_eg = tl.exp(tl.load(gcum_ptr + rows * HV + i_h, mask=m_rows, other=0.0))
    b_beta = tl.load(beta_ptr + rows * HV + i_h, mask=m_rows, other=0.0).to(tl.float32)
    p_v = rows[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
    b_vv = tl.load(v_ptr + p_v, mask=m_rows[:, None] & m_v[None, :], other=0.0).to(tl.float32)
    return b_beta[:, None] * (b_vv - b_eg[:, None] * b_ks), (scale * b_eg)[:, None] * b_qs


@triton.jit
def _values_start(
    q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, rows, m_rows, o_v, m_v, i_h, i_kh, scale,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BR: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Row block ``rows``' state terms: X0 = beta (V - e^G K S0^T) and scale e^G Q S0^T, [BR, BV] each."""
    b_ks, b_qs = _state_products(q_ptr, k_ptr, s0_ptr, rows, m_rows, o_v, m_v, i_h, i_kh, H, HV, DK, DV, BR,
                                 BK, BV, PREC)  # fmt: skip
    return _state_terms(b_ks, b_qs, v_ptr, beta_ptr, gcum_ptr, rows, m_rows, o_v, m_v, i_h, scale, HV, DV)


@triton.jit
def _walk_start(
    q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, delta_ptr, qs_ptr, r, n, scale, i_h, i_kh, o_v, m_v,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BR: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, TERMS: tl.constexpr, OFF: tl.constexpr = 0,
):  # fmt: skip
    """Phase 2's row block r (rows OFF + r BR ..): its rows, their [BR, BV] offsets and mask in the [n, HV,
    d_v] outputs, and the state terms X0 and scale e^G Q S0^T (TERMS: from phase 1's products in delta /
    qs; else computed)."""
    rows = OFF + r * BR + tl.arange(0, BR)
    m_rows = rows < n
    p_v = rows[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
    m_rv = m_rows[:, None] & m_v[None, :]
    if TERMS:
        b_ks = tl.load(delta_ptr + p_v, mask=m_rv, other=0.0)
        b_qs = tl.load(qs_ptr + p_v, mask=m_rv, other=0.0)
        b_x, b_o = _state_terms(b_ks, b_qs, v_ptr, beta_ptr, gcum_ptr, rows, m_rows, o_v, m_v, i_h, scale, HV,
                                DV)  # fmt: skip
    else:
        b_x, b_o = _values_start(q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, rows, m_rows, o_v, m_v, i_h,
                                 i_kh, scale, H, HV, DK, DV, BR, BK, BV, PREC)  # fmt: skip
    return rows, p_v, m_rv, b_x, b_o


@triton.jit
def _peeled_root(
    q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, c0_ptr, gcum_ptr, o_ptr, delta_ptr, qs_ptr, n, scale, i_h, i_kh,
    o_v, m_v, H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PREC: tl.constexpr, TERMS: tl.constexpr,
):  # fmt: skip
    """Node 0 left out of the row blocks (PEEL): it has no ancestor but itself, so Delta_0 = X_0 and
    O_0 = scale e^{G_0} q_0 S0^T + P_00 Delta_0 (a 16-row tile of which row 0 is live: dots take >= 16).
    Writes its delta and o rows; returns Delta_0 [BV], which every row block takes as a rank-one term."""
    rows, p_v, m_rv, b_x, b_o = _walk_start(
        q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, delta_ptr, qs_ptr, 0, 1, scale, i_h, i_kh, o_v,
        m_v, H, HV, DK, DV, 16, BK, BV, PREC, TERMS,
    )  # fmt: skip
    b_x = tl.where(m_rv, b_x, 0.0)
    b_o += tl.load(c0_ptr + (HV + i_h) * n) * b_x
    tl.store(delta_ptr + p_v, b_x, mask=m_rv)
    tl.store(o_ptr + p_v, b_o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m_rv)
    return tl.sum(b_x, axis=0)


@triton.jit
def _first_node_term(c0_ptr, rows, n, i_h, HV: tl.constexpr, b_d0, b_x, b_o):
    """A row block's terms in node 0 (PEEL): X_R -= A[R, 0] Delta_0, O_R += P[R, 0] Delta_0 (phase 1's
    ``c0`` columns)."""
    m_rows = rows < n
    b_x -= tl.load(c0_ptr + i_h * n + rows, mask=m_rows, other=0.0)[:, None] * b_d0[None, :]
    b_o += tl.load(c0_ptr + (HV + i_h) * n + rows, mask=m_rows, other=0.0)[:, None] * b_d0[None, :]
    return b_x, b_o


@triton.jit
def _values_in_registers(
    q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, a_ptr, p_ptr, c0_ptr, gcum_ptr, o_ptr, delta_ptr, qs_ptr, n, NP,
    scale, i_h, i_kh, o_v, m_v, H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BR: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, TERMS: tl.constexpr,
    NR: tl.constexpr, NRP: tl.constexpr, PEEL: tl.constexpr, b_d0,
):  # fmt: skip
    """``_tree_values_kernel``'s walk with Delta in registers (its REGS): row block r takes
    X_r -= A[R, :rR] Delta[:rR] and O_r += P[R, :rR] Delta[:rR] as one dot each over the Delta rows of
    blocks c < r (A and P read with their columns >= r BR masked to zero: those blocks of the scratch are
    not written), then Delta_r = T_rr X_r is placed into block r of the [NRP, BR, BV] register tile.
    PEEL: the blocks start at row 1, each taking node 0's term from ``b_d0`` (:func:`_peeled_root`)."""
    o_r = tl.arange(0, BR)
    o_p = tl.arange(0, NRP * BR)
    o_b = tl.arange(0, NRP)[:, None, None]
    b_d3 = tl.zeros([NRP, BR, BV], dtype=tl.float32)
    for r in tl.static_range(NR):
        rows, p_v, m_rv, b_x, b_o = _walk_start(
            q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, delta_ptr, qs_ptr, r, n, scale, i_h, i_kh, o_v,
            m_v, H, HV, DK, DV, BR, BK, BV, PREC, TERMS, PEEL,
        )  # fmt: skip
        if PEEL:
            b_x, b_o = _first_node_term(c0_ptr, rows, n, i_h, HV, b_d0, b_x, b_o)
        p_row = i_h * NP * NP + (rows - PEEL)[:, None] * NP  # the scratch holds nodes PEEL.. from row 0
        if r > 0:
            m_prev = (o_p < r * BR)[None, :]
            b_all = tl.reshape(b_d3, [NRP * BR, BV])
            b_x -= tl.dot(tl.load(a_ptr + p_row + o_p[None, :], mask=m_prev, other=0.0), b_all,
                          input_precision=PREC)  # fmt: skip
            b_o += tl.dot(tl.load(p_ptr + p_row + o_p[None, :], mask=m_prev, other=0.0), b_all,
                          input_precision=PREC)  # fmt: skip
        cols = r * BR + o_r
        b_d = tl.dot(tl.load(a_ptr + p_row + cols[None, :]), b_x, input_precision=PREC)
        b_o += tl.dot(tl.load(p_ptr + p_row + cols[None, :]), b_d, input_precision=PREC)
        b_d3 = tl.where(o_b == r, b_d[None, :, :], b_d3)
        tl.store(delta_ptr + p_v, b_d, mask=m_rv)
        tl.store(o_ptr + p_v, b_o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m_rv)


@triton.jit
def _tree_values_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, a_ptr, p_ptr, c0_ptr, gcum_ptr, o_ptr, delta_ptr, qs_ptr, n, NP,
    scale, H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BR: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, TERMS: tl.constexpr, PDL: tl.constexpr,
    REGS: tl.constexpr, NR: tl.constexpr, NRP: tl.constexpr, PEEL: tl.constexpr = 0,
):  # fmt: skip
    """Phase 2 of :func:`tree_gdn_split`, one (value head, d_v tile) per program: the blocked forward
    substitution and outputs of :func:`_tree_verify_kernel` with the key-only blocks read from phase 1's
    scratch (A_rc, P_rc, the diagonal inverses) instead of recomputed per d_v tile:
    X_r = beta_r (V_r - e^{G_r} K_r S0^T) - sum_{c<r} A_rc Delta_c, Delta_r = T_rr X_r,
    O_r = scale e^{G_r} Q_r S0^T + sum_{c<=r} P_rc Delta_c (S0 as phase 1 left it: committed there when
    a commit was pending). TERMS: phase 1 wrote the products K S0^T (into ``delta``) and Q S0^T (into the
    float32 scratch ``qs_ptr`` [n, HV, d_v]) of every row; the walk reads them and applies the gates, beta
    and V (:func:`_state_terms`) instead of running a d_k loop per row block in its chain.
    REGS: the walk keeps every Delta row block in registers ([NRP, BR, BV]; NR = NP / BR, NRP that rounded
    up to a power of two) and takes each row block's off-diagonal sums as one dot over all earlier rows, so no
    Delta row goes through global memory and back and no CTA barrier orders the steps (NR unrolled).
    PEEL (:func:`tree_gdn_split`'s ``peel``): node 0 first (:func:`_peeled_root`), then the row blocks from
    row 1, each with node 0's rank-one term: a tree of 2^k + 1 nodes walks 2^k rows in blocks instead of one
    block more."""
    pdl_start(PDL)
    i_h = tl.program_id(0)
    i_v = tl.program_id(1)
    i_kh = i_h // (HV // H)
    o_r = tl.arange(0, BR)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < DV
    b_d0 = tl.zeros([BV], dtype=tl.float32)
    if PEEL:
        b_d0 = _peeled_root(q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, c0_ptr, gcum_ptr, o_ptr, delta_ptr, qs_ptr,
                            n, scale, i_h, i_kh, o_v, m_v, H, HV, DK, DV, BK, BV, PREC, TERMS)  # fmt: skip
    if REGS:
        _values_in_registers(
            q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, a_ptr, p_ptr, c0_ptr, gcum_ptr, o_ptr, delta_ptr, qs_ptr,
            n, NP, scale, i_h, i_kh, o_v, m_v, H, HV, DK, DV, BR, BK, BV, PREC, TERMS, NR, NRP, PEEL, b_d0,
        )  # fmt: skip
        return
    for r in range(0, tl.cdiv(n - PEEL, BR)):
        rows, p_v, m_rv, b_x, b_o = _walk_start(
            q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, delta_ptr, qs_ptr, r, n, scale, i_h, i_kh, o_v,
            m_v, H, HV, DK, DV, BR, BK, BV, PREC, TERMS, PEEL,
        )  # fmt: skip
        if PEEL:
            b_x, b_o = _first_node_term(c0_ptr, rows, n, i_h, HV, b_d0, b_x, b_o)
        p_row = i_h * NP * NP + (rows - PEEL)[:, None] * NP  # the scratch holds nodes PEEL.. from row 0
        for c in range(0, r):
            cols = c * BR + o_r
            b_a = tl.load(a_ptr + p_row + cols[None, :])
            b_p = tl.load(p_ptr + p_row + cols[None, :])
            p_dc = (PEEL + cols)[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
            b_dc = tl.load(delta_ptr + p_dc, mask=(PEEL + cols < n)[:, None] & m_v[None, :], other=0.0)
            b_x -= tl.dot(b_a, b_dc, input_precision=PREC)
            b_o += tl.dot(b_p, b_dc, input_precision=PREC)
        cols = r * BR + o_r
        b_t = tl.load(a_ptr + p_row + cols[None, :])
        b_d = tl.dot(b_t, b_x, input_precision=PREC)
        b_o += tl.dot(tl.load(p_ptr + p_row + cols[None, :]), b_d, input_precision=PREC)
        tl.store(delta_ptr + p_v, b_d, mask=m_rv)
        tl.store(o_ptr + p_v, b_o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m_rv)
        tl.debug_barrier()  # later row blocks read these delta rows back


@triton.jit
def _s0_products(
    x_ptr, s0_ptr, rows, m_rows, o_v, m_v, i_h, i_kh,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
    BM: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """X_rows S0[i_h, o_v, :]^T, [BM, BV] float32 (BM = len(rows)), for keys or queries x [n, H, d_k]."""
    o_k = tl.arange(0, BK)
    b_acc = tl.zeros([BM, BV], dtype=tl.float32)
    for kk in range(0, DK, BK):
        m_k = (kk + o_k) < DK
        p_x = x_ptr + rows[:, None] * (H * DK) + i_kh * DK + (kk + o_k)[None, :]
        b_x = tl.load(p_x, mask=m_rows[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        p_s = s0_ptr + i_h * (DV * DK) + o_v[None, :] * DK + (kk + o_k)[:, None]
        b_s = tl.load(p_s, mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_acc += tl.dot(b_x, b_s, input_precision=PREC)
    return b_acc


@triton.jit
def _value_rhs(
    k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, rows, m_rows, o_v, m_v, i_h, i_kh,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
    BM: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """X0 = beta (V - e^G K S0^T) on ``rows`` (BM of them) x the d_v tile ``o_v`` of value head i_h
    (0 on masked rows)."""
    b_ks = _s0_products(k_ptr, s0_ptr, rows, m_rows, o_v, m_v, i_h, i_kh, H, HV, DK, DV, BK, BM, BV, PREC)
    b_g = tl.load(gcum_ptr + rows * HV + i_h, mask=m_rows, other=0.0)
    b_b = tl.load(beta_ptr + rows * HV + i_h, mask=m_rows, other=0.0).to(tl.float32)
    p_v = v_ptr + rows[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
    b_v = tl.load(p_v, mask=m_rows[:, None] & m_v[None, :], other=0.0).to(tl.float32)
    return b_b[:, None] * (b_v - tl.exp(b_g)[:, None] * b_ks)


@triton.jit
def _tree_inverse_kernel(
    a_ptr, p_ptr, t_ptr, pt_ptr, q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, x0_ptr, qs_ptr,
    n, NP, NR, scale,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BR: tl.constexpr,
    BK: tl.constexpr, BRX: tl.constexpr, BVX: tl.constexpr, PREC: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """Phase 2 of :func:`tree_gdn_blocked`. Programs (value head, c < NR): column panel c of
    T = (I + A)^-1 from phase 1's blocks (A_rc below the diagonal, T_rr on it) by block forward
    substitution, X_c = T_cc, X_r = -T_rr sum_{c<=j<r} A_rj X_j, then PT_rc = sum_{c<=j<=r} P_rj X_j
    (the blocks r >= c of the panel; those above stay unwritten). Programs (value head, NR + i), when
    the grid has them (precomputed X0): the value-side right-hand sides of BRX rows x BVX columns tile i,
    X0 = beta (V - e^G K S0^T) and QS = scale e^G Q S0^T, float32 [n, HV, d_v] each: they run beside the
    panels' serial chain instead of inside every phase-3 program."""
    pdl_start(PDL)
    i_h = tl.program_id(0)
    c = tl.program_id(1)
    if c < NR:
        o_b = tl.arange(0, BR)
        base = i_h * NP * NP
        cols = c * BR + o_b
        b_x = tl.load(a_ptr + base + cols[:, None] * NP + cols[None, :])
        tl.store(t_ptr + base + cols[:, None] * NP + cols[None, :], b_x)
        tl.debug_barrier()
        for r in range(c + 1, NR):
            rows = r * BR + o_b
            b_acc = tl.zeros([BR, BR], dtype=tl.float32)
            for j in range(c, r):
                jr = j * BR + o_b
                b_a = tl.load(a_ptr + base + rows[:, None] * NP + jr[None, :])
                b_xj = tl.load(t_ptr + base + jr[:, None] * NP + cols[None, :])
                b_acc += tl.dot(b_a, b_xj, input_precision=PREC)
            b_t = tl.load(a_ptr + base + rows[:, None] * NP + rows[None, :])
            b_x = -tl.dot(b_t, b_acc, input_precision=PREC)
            tl.store(t_ptr + base + rows[:, None] * NP + cols[None, :], b_x)
            tl.debug_barrier()  # later blocks of this panel read it back
        for r in range(c, NR):
            rows = r * BR + o_b
            b_acc = tl.zeros([BR, BR], dtype=tl.float32)
            for j in range(c, r + 1):
                jr = j * BR + o_b
                b_p = tl.load(p_ptr + base + rows[:, None] * NP + jr[None, :])
                b_xj = tl.load(t_ptr + base + jr[:, None] * NP + cols[None, :])
                b_acc += tl.dot(b_p, b_xj, input_precision=PREC)
            tl.store(pt_ptr + base + rows[:, None] * NP + cols[None, :], b_acc)
    else:
        i_kh = i_h // (HV // H)
        nvx = tl.cdiv(DV, BVX)
        rows = ((c - NR) // nvx) * BRX + tl.arange(0, BRX)
        o_v = ((c - NR) % nvx) * BVX + tl.arange(0, BVX)
        m_rows = rows < n
        m_v = o_v < DV
        b_x0 = _value_rhs(k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, rows, m_rows, o_v, m_v, i_h, i_kh,
                          H, HV, DK, DV, BK, BRX, BVX, PREC)  # fmt: skip
        b_qs = _s0_products(q_ptr, s0_ptr, rows, m_rows, o_v, m_v, i_h, i_kh,
                            H, HV, DK, DV, BK, BRX, BVX, PREC)  # fmt: skip
        b_g = tl.load(gcum_ptr + rows * HV + i_h, mask=m_rows, other=0.0)
        p_out = rows[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
        m_out = m_rows[:, None] & m_v[None, :]
        tl.store(x0_ptr + p_out, b_x0, mask=m_out)
        tl.store(qs_ptr + p_out, (scale * tl.exp(b_g))[:, None] * b_qs, mask=m_out)


@triton.jit
def _tree_wy_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, s0_ptr, t_ptr, pt_ptr, gcum_ptr, x0_ptr, qs_ptr, o_ptr, delta_ptr,
    n, NP, scale,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BRV: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, PRE_X0: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """Phase 3 of :func:`tree_gdn_blocked`, one (value head, BRV rows R, d_v tile) per program, no
    dependence on any other program: for each column block c (BC wide) up to R's last row,
    Delta_R += T_Rc X0_c and O_R += PT_Rc X0_c with X0_c = beta_c (V_c - e^{G_c} K_c S0^T) (computed
    here, or read from phase 2's programs with PRE_X0); then O_R += scale e^{G_R} Q_R S0^T (likewise).
    T and PT are read under the mask col <= row < n (their blocks above the diagonal are never written)."""
    pdl_start(PDL)
    i_h = tl.program_id(0)
    i_r = tl.program_id(1)
    i_v = tl.program_id(2)
    i_kh = i_h // (HV // H)
    rows = i_r * BRV + tl.arange(0, BRV)
    m_rows = rows < n
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < DV
    base = i_h * NP * NP
    b_d = tl.zeros([BRV, BV], dtype=tl.float32)
    b_o = tl.zeros([BRV, BV], dtype=tl.float32)
    for c0 in range(0, (i_r + 1) * BRV, BC):
        cols = c0 + tl.arange(0, BC)
        m_cols = cols < n
        if PRE_X0:
            p_x0 = x0_ptr + cols[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
            b_x0 = tl.load(p_x0, mask=m_cols[:, None] & m_v[None, :], other=0.0)
        else:
            b_x0 = _value_rhs(k_ptr, v_ptr, beta_ptr, s0_ptr, gcum_ptr, cols, m_cols, o_v, m_v, i_h, i_kh,
                              H, HV, DK, DV, BK, BC, BV, PREC)  # fmt: skip
        m_rc = m_rows[:, None] & m_cols[None, :] & (rows[:, None] >= cols[None, :])
        p_rc = base + rows[:, None] * NP + cols[None, :]
        b_d += tl.dot(tl.load(t_ptr + p_rc, mask=m_rc, other=0.0), b_x0, input_precision=PREC)
        b_o += tl.dot(tl.load(pt_ptr + p_rc, mask=m_rc, other=0.0), b_x0, input_precision=PREC)
    p_out = rows[:, None] * (HV * DV) + i_h * DV + o_v[None, :]
    m_out = m_rows[:, None] & m_v[None, :]
    if PRE_X0:
        b_o += tl.load(qs_ptr + p_out, mask=m_out, other=0.0)
    else:
        b_qs = _s0_products(q_ptr, s0_ptr, rows, m_rows, o_v, m_v, i_h, i_kh,
                            H, HV, DK, DV, BK, BRV, BV, PREC)  # fmt: skip
        b_gr = tl.load(gcum_ptr + rows * HV + i_h, mask=m_rows, other=0.0)
        b_o += (scale * tl.exp(b_gr))[:, None] * b_qs
    tl.store(delta_ptr + p_out, b_d, mask=m_out)
    tl.store(o_ptr + p_out, b_o.to(o_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m_out)


@triton.jit
def _tree_states_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    s0_ptr,
    par_ptr,
    out_ptr,
    n,
    H: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BKS: tl.constexpr,
    BV: tl.constexpr,
    PDL: tl.constexpr,
):
    """One (value head, d_v tile): the state after every node, in node order, from its parent's state."""
    pdl_start(PDL)
    i_h = tl.program_id(0)
    i_v = tl.program_id(1)
    i_kh = i_h // (HV // H)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BKS)
    m_v = o_v < DV
    m_k = o_k < DK
    m_s = m_v[:, None] & m_k[None, :]
    p_tile = i_h * (DV * DK) + o_v[:, None] * DK + o_k[None, :]
    node_stride = HV * DV * DK
    b_s0 = tl.load(s0_ptr + p_tile, mask=m_s, other=0.0).to(tl.float32)
    b_prev = b_s0
    off_i = tl.zeros([], dtype=tl.int64)  # i * node_stride, kept in 64 bits
    for i in range(0, n):
        p = tl.load(par_ptr + i)
        from_mem = (p >= 0) & (p != i - 1)
        p_safe = tl.maximum(p, 0).to(tl.int64)
        b_ld = tl.load(out_ptr + p_safe * node_stride + p_tile, mask=m_s & from_mem, other=0.0)
        b_par = tl.where(p == i - 1, b_prev, tl.where(p < 0, b_s0, b_ld))
        b_g = tl.load(g_ptr + i * HV + i_h).to(tl.float32)
        b_beta = tl.load(beta_ptr + i * HV + i_h).to(tl.float32)
        b_k = tl.load(k_ptr + i * (H * DK) + i_kh * DK + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_vv = tl.load(v_ptr + i * (HV * DV) + i_h * DV + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_st = b_par * tl.exp(b_g)
        b_pred = tl.sum(b_st * b_k[None, :], axis=1)
        b_st = b_st + (b_beta * (b_vv - b_pred))[:, None] * b_k[None, :]
        tl.store(out_ptr + off_i + p_tile, b_st, mask=m_s)
        b_prev = b_st
        off_i += node_stride
        # a later node may re-read this state through other threads of the CTA
        tl.debug_barrier()


def _pow2_at_least(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(int(x)))


def gate_columns(n: int) -> dict[str, int | bool]:
    """The tree kernels' gate load (``_block_gates``): NPG columns, a power of two >= n, or >= n - 1 with
    STRICT where that is narrower (n = 2^k + 1, the engine's slots of a root and a power-of-two budget:
    2^k columns, not 2^(k+1)). Measured on an H100 (bf16, CUDA graphs, results/2026-12-06-h100-peel-root/
    callGI): STRICT at 65 / 129 nodes, fused 46.9 / 106.2 -> 37.3 / 83.8 us (Weaver), split 35.6 -> 29.0
    at 65; STRICT everywhere cost the split form's 64-row blocks registers (T = 128: 168 -> 205, Weaver
    31.5 -> 34.9 us), hence only where it narrows the load."""
    full, strict = _pow2_at_least(n), _pow2_at_least(n - 1)
    return {"NPG": min(full, strict), "STRICT": strict < full}


INVERSES = (0, 1)


def inverse_scheme(block_rows: int, inverse: int | None = None) -> int:
    """The diagonal-block inverse of :func:`_unit_lower_inverse` for ``block_rows``-row blocks
    (:data:`INVERSES`): 0 every doubling level a masked [BR, BR] product, 1 its first four levels batched
    on 16-row blocks (BR >= 32; the default there). ``inverse`` if given and it fits."""
    if inverse is None:
        return int(block_rows >= 32)
    if inverse not in INVERSES or (inverse == 1 and block_rows < 32):
        raise ValueError(f"inverse {inverse} does not fit {block_rows}-row blocks (0; 1 from 32 rows)")
    return inverse


def _check_inputs(q, k, v, g, beta, state) -> tuple[int, int, int, int, int]:
    n, h, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if k.shape != q.shape or v.shape[0] != n or g.shape != (n, hv) or beta.shape != (n, hv):
        raise ValueError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"g {tuple(g.shape)}, beta {tuple(beta.shape)}"
        )
    if hv % h:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({h})")
    if state.shape != (hv, dv, dk):
        raise ValueError(f"state must be [HV, d_v, d_k] = {(hv, dv, dk)}, got {tuple(state.shape)}")
    if n < 1:
        raise ValueError("empty tree")
    return n, h, hv, dk, dv


def default_tiles(
    n: int,
    hv: int,
    dv: int,
    precision: str,
    block_rows: int | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> tuple[int, int, int]:
    """(block_rows, block_v, num_warps) of :func:`tree_gdn_fused`: the given ones, defaults for the rest."""
    exact = precision != "tf32"  # fp32 FMA / 3xTF32 dots: smaller tiles keep them out of local memory
    br = block_rows or min(32 if exact else 64, _pow2_at_least(n))
    bv = block_v or min(32 if precision == "ieee" else 64, _pow2_at_least(dv))
    if block_v is None and bv > 32 and hv * triton.cdiv(dv, bv) < 64:
        bv = 32  # few heads (GDN-1.3B: 8 of d_v 256): more programs (results/2026-11-30-h200-tree-tiles)
    return br, bv, num_warps or (8 if br * max(br, bv) >= 4096 else 4)


def tree_gdn_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    ancestors: torch.Tensor | None,
    scale: float,
    precision: str = "ieee",
    *,
    chain: bool = False,
    block_rows: int | None = None,
    block_v: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 1,
    inverse: int | None = None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    pending: PendingCommit | None = None,
) -> tuple[torch.Tensor, TreeFactors]:
    """Fused tree verification; the semantics and shapes of :func:`repro.gdn.reference.tree_gdn`.

    ``pending`` (SpecLA's delayed commit): the previous step's accepted path, folded into ``state`` (then
    contiguous float32, updated in place: the committed state is the next step's start) by the same
    launch before it verifies from it; equal to :func:`repro.gdn.reference.apply_pending` then this
    call. Its factors must not be this call's outputs (``out``): double-buffer them across steps.

    Returns (o [n, HV, d_v] in q's dtype, TreeFactors with delta [n, HV, d_v] and gate_cum [n, HV]
    in float32, k expanded to value heads in float32, the raw v, g, beta, and no snapshots).
    ``chain=True`` (or ``ancestors=None``) treats the nodes as one chain (mask = lower triangle,
    computed in the kernel). ``out`` = (o, delta, gate_cum) preallocated outputs (e.g. for graphs), or
    (o, delta, gate_cum, k): TreeFactors.k [n, HV, d_k] float32 written there too.
    Tuning knobs: ``block_rows`` (BR, power of two 16..64), ``block_v`` (d_v tile; the grid is
    HV x d_v / block_v), ``block_k`` (d_k chunk), ``num_warps``, ``num_stages``, ``inverse`` (the
    diagonal-block inverse, :func:`inverse_scheme`). Defaults: BR = min(64, n) for "tf32", min(32, n)
    otherwise (>= 16); BV = 64 (32 for "ieee", and when 64 would leave fewer than 64 programs); BK = 64.
    """
    c = _TreeCall.of(q, k, v, g, beta, state, ancestors, precision, chain, pending, out)
    br, bv, warps = default_tiles(c.n, c.hv, c.dv, precision, block_rows, block_v, num_warps)
    bk = _check_tiles(br, block_k, c.dk)
    _tree_verify_kernel[(c.hv, triton.cdiv(c.dv, bv))](
        c.q, c.k, c.v, c.g, c.beta, c.state, c.anc, c.o, c.delta, c.gate_cum, c.k_exp, *c.p_ops, c.p_node,
        c.p_n, c.n, c.anc_stride, float(scale),
        H=c.h, HV=c.hv, DK=c.dk, DV=c.dv, BR=br, LOG2_BR=br.bit_length() - 1, BK=bk, BV=bv,
        CHAIN=c.chain, PREC=precision, UPCAST_QK=c.upcast, INV=inverse_scheme(br, inverse), WRITE_K=c.write_k,
        PENDING=pending is not None, PNP=c.pnp, **gate_columns(c.n), num_warps=warps,
        num_stages=num_stages, **pdl_args(c.q.device, verify=True),
    )  # fmt: skip
    return c.o, c.factors()


def split_tiles(
    n: int, hv: int, dv: int, precision: str, block_rows: int | None = None, block_v: int | None = None
) -> tuple[int, int]:
    """(block_rows, block_v) of :func:`tree_gdn_split`: the given ones, else BR = 64 for "tf32" at 64 < n
    <= 256 (two to four row blocks, walked in registers by phase 2; measured: :func:`tree_gdn_split`)
    except at n = 65-96 and 129-160, where the last 64-row block would hold at most 32 rows (the engine's
    slots of 65 and 129 nodes), min(32, n) otherwise (>= 16), and the widest BV in 64, 32, 16 that still
    gives phase 2 at least 128 programs (SpecLA, HV = 8, d_v = 256: 16; Weaver, HV = 48, d_v = 128: 32),
    at most 32 for "ieee". A block costs the same however few of its rows are nodes; at 65 / 129 nodes
    32-row blocks (memory walk) measured SpecLA 20.6 / 32.6 us vs 23.5 / 35.3 on 64-row blocks, the tiny
    family's layer 18.2 vs 20.6 at 65, Weaver's a tie (35.0 / 72.0 vs 35.1 / 72.4; H200, bf16, CUDA
    graphs: results/2026-12-03-h200-tree-slots). Not at 193-224: seven 32-row blocks there, and at 256
    nodes eight lost to four 64-row ones (Weaver 116.2 vs 92.1 us, :func:`split_walk`)."""
    wide = precision == "tf32" and 64 < n <= 256 and not (n <= 160 and (n - 1) % 64 < 32)
    br = block_rows or (64 if wide else min(32, _pow2_at_least(n)))
    bv = block_v or next((b for b in (64, 32) if hv * triton.cdiv(dv, b) >= 128), 16)
    if block_v is None and precision == "ieee":
        bv = min(bv, 32)  # fp32 FMA dots: the fused kernel's "ieee" tile bound (registers)
    return br, min(bv, _pow2_at_least(dv))


def tree_gdn_split(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    ancestors: torch.Tensor | None,
    scale: float,
    precision: str = "ieee",
    *,
    chain: bool = False,
    block_rows: int | None = None,
    block_v: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    pending: PendingCommit | None = None,
    commit_block_v: int | None = None,
    terms: bool | None = None,
    walk: str | None = None,
    inverse: int | None = None,
    peel: bool = False,
    keys_only: bool = False,
    p_apart: bool | None = None,
) -> tuple[torch.Tensor, TreeFactors]:
    """:func:`tree_gdn_fused` (same arguments, results and ``pending``) in two launches: for few heads,
    and at any head count for trees of 65-256 nodes (:func:`repro.gdn.chain.select_tree_kernel`).

    Phase 1 (``_tree_keys_kernel``, HV x NR^2 programs, NR = n / BR row blocks; the programs above the
    diagonal exit at once; with ``pending``, the commit's programs besides): the key-only work (G, the masked
    A and P blocks, the diagonal blocks' inverses) once per head and block pair, into float32 scratch [HV, NR
    BR, NR BR] (two of them: 8 MB at HV = 48, n = 256). Phase 2 (``_tree_values_kernel``, grid HV x d_v / BV):
    the substitution and outputs per d_v tile, reading those blocks. The single-launch kernel repeats the
    key-only work in every d_v tile and runs one program per (head, tile) through all of it: 64 programs at
    the SpecLA shape (HV = 8, d_k = 256), 40x above its floor. Here the d_k-long K K^T / Q K^T dots and the
    inverses spread over HV NR (NR + 1) / 2 programs, and phase 2 gets narrow tiles (more programs) without
    repeating them. Same arithmetic as the fused kernel, so the same error bounds.
    ``pending`` runs in phase 1's launch, beside the key work (which reads no S0): HV x d_v /
    ``commit_block_v`` programs more (:func:`commit_tiles`), no launch and no serial step more. ``terms``
    (default where those tiles are >= 16 rows, as tensor-core dots need): those programs (there with or
    without ``pending``) also compute every node's K S0^T and Q S0^T for phase 2 (float32 scratch [n, HV,
    d_v]), so that phase 2's serial walk has no d_k loop (the same dots over row chunks of 64: not bitwise
    the other forms, within the same bounds). Measured on an H200 (bf16, "tf32", CUDA graphs;
    results/2026-12-03-h200-split-terms): SpecLA's shape 14.9 -> 12.5 us at T = 64 and 23.0 -> 22.3 at T =
    128 (with a pending commit 15.3 -> 13.1 and 26.0 -> 23.4, on 16-row commit tiles above 64 nodes),
    Weaver's 40.7 -> 39.1 at T = 128. Computing them in phase 2 before its walk instead was slower at
    every tile, and so was walking pairs of phase 1's blocks (the pair's inverse M - M N M in the chain:
    24.4 us at SpecLA T = 128), and so were the products spread over row chunks of programs
    (results/2026-12-03-h200-rows-tune/callV). ``walk`` (:data:`WALKS`; default :func:`split_walk`): phase
    2 with every Delta row block in registers, or read back from the delta output behind a CTA barrier.
    Whole form at T = 128 (results/2026-12-03-h200-inverse-halves, tree-phases): 64-row blocks, registers
    walk, 4 warps (the defaults there: :func:`split_tiles`) SpecLA 19.0 us, Weaver 31.2 (fused 38.5); with
    8 warps 21.0 / 42.1; 32-row blocks, memory walk 22.2 at SpecLA (results/2026-12-03-h200-tree-walk:
    Weaver 36.9). 4 warps are faster in both phases at both block sizes (phase 1 at 64-row blocks 12.4 vs
    13.2 us, at 32 8.0 vs 10.1).
    ``peel``: node 0 (no ancestor but itself) solved before the row blocks, which
    then hold nodes 1..n-1 (the tiles chosen for n - 1 rows), each taking node 0's term as a rank-one
    update: the engine's slots of 2^k + 1 nodes (a draft tree's root and a power-of-two budget) walk 2^k
    rows instead of a whole row block more for one node. Same arithmetic (node 0's column K k_0, Q k_0 as
    dots of the same precision), so the same error bounds.
    ``keys_only``: phase 1 alone (timing its share, as `repro bench kernels` does: o and the factors' delta
    are then left unwritten, so the results are not a verification).
    ``p_apart`` (default :func:`split_p_apart`): the diagonal blocks' P = Q K^T in programs of their own, so
    that a diagonal program's chain has half the dots before its inverse. Same arithmetic.
    """
    c = _TreeCall.of(q, k, v, g, beta, state, ancestors, precision, chain, pending, out)
    if peel and c.n < 2:
        raise ValueError("peel needs at least two nodes (node 0 and a row block)")
    br, bv = split_tiles(c.n - peel, c.hv, c.dv, precision, block_rows, block_v)
    bk = _check_tiles(br, block_k, c.dk)
    warps = num_warps or SPLIT_WARPS
    pend = pending is not None
    bvc = commit_tiles(c.dv, c.dk, commit_block_v)[0]
    if terms is None:
        terms = bvc >= 16
    elif terms and bvc < 16:
        raise ValueError(f"terms needs commit tiles of >= 16 rows (commit_block_v, d_v), got {bvc}")
    qs = torch.empty_like(c.delta) if terms else None
    c0 = torch.empty(2, c.hv, c.n, dtype=torch.float32, device=c.q.device) if peel else None
    if p_apart is None:
        p_apart = split_p_apart(c.hv, br, triton.cdiv(c.n - peel, br))
    a_blocks, p_blocks, npad = _key_blocks(
        c, br, bk, precision, scale, warps, pend, commit_block_v, qs, inverse, c0=c0, p_apart=p_apart
    )
    if keys_only:
        return c.o, c.factors()
    _value_walk(c, a_blocks, p_blocks, npad, br, bk, bv, precision, scale, warps, qs, walk, c0)
    return c.o, c.factors()


def _value_walk(
    c: _TreeCall,
    a_blocks: torch.Tensor,
    p_blocks: torch.Tensor,
    npad: int,
    br: int,
    bk: int,
    bv: int,
    precision: str,
    scale: float,
    warps: int,
    qs: torch.Tensor | None = None,
    walk: str | None = None,
    c0: torch.Tensor | None = None,
) -> None:
    """Launch ``_tree_values_kernel`` (phase 2 of the split form) on phase 1's blocks (:func:`_key_blocks`):
    writes c.o and c.delta; ``qs`` given: phase 1 wrote the state products (K S0^T in c.delta, Q S0^T in
    ``qs``); ``walk`` (:data:`WALKS`, default :func:`split_walk`): Delta kept in registers or read back
    from c.delta; ``c0``: phase 1 left node 0 out of its row blocks, its columns there."""
    nr = npad // br
    walk = walk or split_walk(br, nr)
    if walk not in WALKS:
        raise ValueError(f"walk must be one of {WALKS}, got {walk!r}")
    terms = qs is not None
    _tree_values_kernel[(c.hv, triton.cdiv(c.dv, bv))](
        c.q, c.k, c.v, c.beta, c.state, a_blocks, p_blocks, a_blocks if c0 is None else c0, c.gate_cum, c.o,
        c.delta,
        qs if terms else c.delta, c.n, npad, float(scale), H=c.h, HV=c.hv, DK=c.dk, DV=c.dv, BR=br, BK=bk,
        BV=bv, PREC=precision, TERMS=terms, REGS=walk == "registers", NR=nr, NRP=pow2(nr),
        PEEL=int(c0 is not None),
        num_warps=warps, **pdl_args(c.q.device, verify=True),
    )  # fmt: skip


def split_p_apart(hv: int, block_rows: int, row_blocks: int) -> bool:
    """Whether phase 1 of the split form writes the diagonal blocks' P in programs of their own
    (``_tree_keys_kernel``'s P_APART): at most 16 value heads on two 32-row blocks. Measured on an
    H100 (bf16, tf32 dots, CUDA graphs, whole form / phase 1 alone, us; results/2026-12-06-h100-p-apart):
    SpecLA's shape at T = 64 11.5 / 6.5 against 13.0 / 7.7, the tiny family's 65-node slot peeled 9.5 / 4.7
    against 9.9 / 5.0 and its 33-node slot a tie (9.3 / 4.5 against 9.4 / 4.7); Weaver's 48 heads at T =
    64 a tie. On 64-row blocks slower at both paper shapes (SpecLA T = 128 22.0 against 18.8, Weaver 34.0
    against 31.4, Weaver T = 256 114 against 96): the keys kernel compiles to 217 registers a thread against
    167 (three programs a multiprocessor down to two), and the extra programs' Q and K loads add up. One
    32-row block (n <= 32) was not timed."""
    return hv <= 16 and block_rows == 32 and row_blocks == 2


def split_walk(block_rows: int, row_blocks: int) -> str:
    """Phase 2's walk for ``row_blocks`` blocks of ``block_rows`` rows: "registers" for 64-row blocks, at
    most four of them (T <= 256), else "memory". Measured on an H200 (bf16, tf32 dots, phase 2 alone on
    phase 1's state products; results/2026-12-03-h200-tree-walk): 64-row blocks, registers vs memory,
    SpecLA T = 128 5.7 vs 6.7 us, Weaver 9.7 vs 16.4. At 32-row blocks (four steps) the whole split form
    lost with registers (SpecLA 23.3 vs 22.1, Weaver 39.8 vs 36.9), at Weaver T = 256 (eight steps) badly
    (179 vs 118; not profiled: presumably the unrolled walk's registers). At T = 256 on four 64-row blocks
    (whole form, results/2026-12-03-h200-persistent-decode/callAF): Weaver 92.1 registers vs 96.3 memory,
    SpecLA 40.4 vs 38.4 (32-row blocks, memory: 116.2 / 44.9; fused 99.6 / 116.9): the rule takes Weaver's
    gain at four blocks and pays SpecLA's 2 us (one rule for every head count)."""
    return "registers" if block_rows >= 64 and row_blocks <= 4 else "memory"


def commit_tiles(
    dv: int, dk: int, block_v: int | None = None, long_programs: bool = False
) -> tuple[int, int]:
    """(BVC, BKC) of phase 1's delayed-commit programs: ``block_v`` (default 32; 16 for ``long_programs``,
    which commit and then compute the state products of more than 64 nodes) S0 rows per program, d_k
    in chunks of BKC (all of it up to 4096 elements a tile: the path is gathered once per chunk).
    SpecLA's shape on an H200 (results/2026-12-02-h200-delayed-phase1): the split step with the commit
    17.6 / 29.9 us at T = 64 / 128 with 32 rows (path index), 18.6 / 30.4 with 16, 17.5 / 30.0 with 64
    (but 20.3 / 34.0 with 64 when the path is gathered from the mask, once per chunk). With the state
    products in the same programs (results/2026-12-03-h200-split-terms, three calls): T = 64 12.7-13.1 us
    with 32 rows, 15.1 with 16; T = 128 24.7-25.1 with 32, 23.4-23.6 with 16: hence ``long_programs``."""
    bvc = min(block_v or (16 if long_programs else 32), _pow2_at_least(dv))
    if bvc < 1 or bvc & (bvc - 1):
        raise ValueError(f"commit_block_v must be a power of two, got {block_v}")
    return bvc, min(_pow2_at_least(dk), max(16, 4096 // bvc))


def _key_blocks(
    c: _TreeCall,
    br: int,
    bk: int,
    precision: str,
    scale: float,
    warps: int,
    pending: bool = False,
    commit_block_v: int | None = None,
    qs: torch.Tensor | None = None,
    inverse: int | None = None,
    key_programs: bool = True,
    c0: torch.Tensor | None = None,
    node0_programs: bool = True,
    p_apart: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Launch ``_tree_keys_kernel`` (phase 1 of the split and blocked forms): returns the float32 scratch
    (A blocks with the diagonal inverses, P blocks), each [HV, NP, NP], and NP = n rounded up to BR;
    writes G and TreeFactors.k; ``pending``: commits c's pending path into c.state too; ``qs`` given:
    the state products K S0^T into c.delta and Q S0^T into ``qs`` (the split form's ``terms``);
    ``inverse``: the diagonal inverse (:func:`inverse_scheme`). ``key_programs`` False: the launch without
    its key-only programs (the commit's and products' alone: timing their share; the scratch is left
    unwritten). ``c0`` given ([2, HV, n] float32): node 0 outside the row blocks, its columns of A and P
    there (the split form's ``peel``; NP = the other n - 1 rounded up to BR); ``node0_programs`` False:
    without the programs that write those columns (timing their share; ``c0`` left unwritten); ``p_apart``:
    the diagonal blocks' P in NR programs of their own (``_tree_keys_kernel``'s P_APART)."""
    peel = c0 is not None
    nr = triton.cdiv(c.n - peel, br)
    npad = nr * br
    a_blocks = torch.empty(c.hv, npad, npad, dtype=torch.float32, device=c.q.device)
    p_blocks = torch.empty(c.hv, npad, npad, dtype=torch.float32, device=c.q.device)
    terms = qs is not None
    bvc, bkc = commit_tiles(c.dv, c.dk, commit_block_v, long_programs=pending and terms and c.n > 64)
    nct = triton.cdiv(c.dv, bvc) if pending or terms else 0
    if p_apart and peel and not node0_programs:
        raise ValueError("p_apart places its programs after node 0's: node0_programs must be on")
    keys = nr * nr + nr * (peel and node0_programs) + nr * p_apart
    _tree_keys_kernel[(c.hv, nct + (keys if key_programs else 0))](
        c.q, c.k, c.g, c.beta, c.anc, a_blocks, p_blocks, a_blocks if c0 is None else c0, c.gate_cum, c.k_exp,
        c.state, *c.p_ops, c.p_node,
        c.p_n, c.delta, qs if terms else c.delta, c.n, c.anc_stride, npad, nr, float(scale),
        H=c.h, HV=c.hv, DK=c.dk, DV=c.dv, BR=br, LOG2_BR=br.bit_length() - 1, BK=bk, CHAIN=c.chain,
        PREC=precision, UPCAST_QK=c.upcast, INV=inverse_scheme(br, inverse), WRITE_K=c.write_k,
        PENDING=pending, PNP=c.pnp, NCT=nct, BVC=bvc, BKC=bkc, TERMS=terms, RC=min(64, _pow2_at_least(c.n)),
        **gate_columns(c.n), PEEL=int(peel), P_APART=int(p_apart),
        num_warps=warps, **pdl_args(c.q.device, verify=True),
    )  # fmt: skip
    return a_blocks, p_blocks, npad


def blocked_tiles(
    n: int,
    hv: int,
    dv: int,
    precision: str,
    block_rows: int | None = None,
    block_rows_v: int | None = None,
    block_cols: int | None = None,
    block_v: int | None = None,
) -> tuple[int, int, int, int]:
    """(BR, BRV, BC, BV) of :func:`tree_gdn_blocked`: the given ones, else BR = min(64, n) for "tf32"
    (fewer serial column steps; 32 for the exact dots), BRV = BC = min(32, n) (>= 16), and BV = 64 when
    that still gives the value launch >= 256 programs, else 32 (always <= 32 for "ieee")."""
    n2 = _pow2_at_least(n)
    br = block_rows or min(64 if precision == "tf32" else 32, n2)
    brv = block_rows_v or min(32, n2)
    bc = block_cols or min(32, n2)
    wide = precision != "ieee" and hv * triton.cdiv(n, brv) * triton.cdiv(dv, 64) >= 256
    bv = block_v or (64 if wide else 32)
    for name, b in (("block_rows_v", brv), ("block_cols", bc)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b}")
    return br, brv, bc, min(bv, _pow2_at_least(dv))


def tree_gdn_blocked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    ancestors: torch.Tensor | None,
    scale: float,
    precision: str = "ieee",
    *,
    chain: bool = False,
    block_rows: int | None = None,
    block_rows_v: int | None = None,
    block_cols: int | None = None,
    block_v: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_warps_v: int | None = None,
    num_stages_v: int = 1,
    precompute_x0: bool = True,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    pending: PendingCommit | None = None,
) -> tuple[torch.Tensor, TreeFactors]:
    """:func:`tree_gdn_fused` (same arguments, results and ``pending``, committed in phase 1 as in
    :func:`tree_gdn_split`) with T = (I + A)^-1 explicit:
    three launches whose serial chains are short (module docstring, "Blocked verification").

    Phase 1 (``_tree_keys_kernel``, HV x NR x NR programs of BR = ``block_rows`` rows): A, P blocks and
    the diagonal inverses; phase 2 (``_tree_inverse_kernel``, HV x NR): T and PT = P T by column panels;
    phase 3 (``_tree_wy_kernel``, HV x n / BRV x d_v / BV; BRV = ``block_rows_v`` rows, column blocks of
    BC = ``block_cols``): Delta = T X0 and O = scale e^G Q S0^T + PT X0 with X0 = beta (V - e^G K S0^T).
    ``precompute_x0`` (default on): X0 and scale e^G Q S0^T are computed once, by extra programs of phase 2
    (tiles of BRV x BV, beside the column panels' serial chain), instead of in every phase-3 program (each
    of which then repeats K S0^T for all its column blocks). ``num_warps`` (phases 1-2; 8 for BR >= 64,
    else 4), ``num_warps_v`` (phase 3; 4) and ``num_stages_v`` (phase 3's software pipelining) are the
    other knobs. Scratch: four float32 [HV, NP, NP] buffers (NP = n rounded up to BR), and two float32
    [n, HV, d_v] with ``precompute_x0``.
    """
    c = _TreeCall.of(q, k, v, g, beta, state, ancestors, precision, chain, pending, out)
    br, brv, bc, bv = blocked_tiles(c.n, c.hv, c.dv, precision, block_rows, block_rows_v, block_cols, block_v)
    bk = _check_tiles(br, block_k, c.dk)
    warps = num_warps or (8 if br >= 64 else 4)
    a_blocks, p_blocks, npad = _key_blocks(c, br, bk, precision, scale, warps, pending is not None)
    t_full = torch.empty_like(a_blocks)
    pt_full = torch.empty_like(p_blocks)
    nr = npad // br
    # X0 and QS tiles of BRX = BRV rows x BVX = BV columns beside the column panels (precompute_x0)
    nx = triton.cdiv(c.n, brv) * triton.cdiv(c.dv, bv) if precompute_x0 else 0
    x0, qs = (torch.empty_like(c.delta) for _ in range(2)) if nx else (c.delta, c.delta)
    _tree_inverse_kernel[(c.hv, nr + nx)](
        a_blocks, p_blocks, t_full, pt_full, c.q, c.k, c.v, c.beta, c.state, c.gate_cum, x0, qs,
        c.n, npad, nr, float(scale),
        H=c.h, HV=c.hv, DK=c.dk, DV=c.dv, BR=br, BK=bk, BRX=brv, BVX=bv, PREC=precision, num_warps=warps,
        **pdl_args(c.q.device, verify=True),
    )  # fmt: skip
    _tree_wy_kernel[(c.hv, triton.cdiv(c.n, brv), triton.cdiv(c.dv, bv))](
        c.q, c.k, c.v, c.beta, c.state, t_full, pt_full, c.gate_cum, x0, qs, c.o, c.delta, c.n, npad,
        float(scale), H=c.h, HV=c.hv, DK=c.dk, DV=c.dv, BRV=brv, BC=bc, BK=bk, BV=bv, PREC=precision,
        PRE_X0=nx > 0, num_warps=num_warps_v or 4, num_stages=num_stages_v,
        **pdl_args(c.q.device, verify=True),
    )  # fmt: skip
    return c.o, c.factors()


@dataclass
class _TreeCall:
    """The checked, contiguous operands and the outputs of one tree-kernel call (fused or split)."""

    n: int
    h: int
    hv: int
    dk: int
    dv: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    state: torch.Tensor
    anc: torch.Tensor
    chain: bool
    p_ops: tuple
    p_node: torch.Tensor
    p_n: int
    o: torch.Tensor
    delta: torch.Tensor
    gate_cum: torch.Tensor
    k_exp: torch.Tensor
    write_k: bool
    upcast: bool

    @classmethod
    def of(
        cls,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        ancestors: torch.Tensor | None,
        precision: str,
        chain: bool,
        pending: PendingCommit | None,
        out: tuple[torch.Tensor, ...] | None,
    ) -> _TreeCall:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        n, h, hv, dk, dv = _check_inputs(q, k, v, g, beta, state)
        chain = chain or ancestors is None
        if not chain and ancestors.shape != (n, n):
            raise ValueError(f"ancestors must be [n, n] = {(n, n)}, got {tuple(ancestors.shape)}")
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        if q.dtype != k.dtype:
            raise ValueError(f"q and k must share a dtype, got {q.dtype} and {k.dtype}")
        p_ops, p_node, p_n = _pending_operands(state, pending, out)
        state = state.contiguous().float()  # pending: already contiguous float32, so the caller's tensor
        anc = q if chain else mask_rows(ancestors)  # chain: the kernel builds the lower triangle itself
        if out is None:
            o = torch.empty(n, hv, dv, dtype=q.dtype, device=q.device)
            delta = torch.empty(n, hv, dv, dtype=torch.float32, device=q.device)
            gate_cum = torch.empty(n, hv, dtype=torch.float32, device=q.device)
        else:
            o, delta, gate_cum = out[:3]
        k_exp, write_k = _keys_out(q, k, hv, out)
        # the CPU interpreter keeps bf16 as raw uint16 and its tl.dot multiplies those bits: upcast there
        upcast = interpreting() and q.dtype == torch.bfloat16
        return cls(n, h, hv, dk, dv, q, k, v, g, beta, state, anc, chain, p_ops, p_node, p_n, o, delta,
                   gate_cum, k_exp, write_k, upcast)  # fmt: skip

    @property
    def anc_stride(self) -> int:
        """The ancestor mask's row stride (n where the mask is built from indices)."""
        return self.n if self.chain else self.anc.stride(0)

    @property
    def pnp(self) -> int:
        """The prologue's PNP: 0 when the pending commit comes with a path index (int32), else the
        ancestor row's padded width."""
        return 0 if self.p_ops[3].dtype == torch.int32 else pow2(self.p_n)

    def factors(self) -> TreeFactors:
        return TreeFactors(
            delta=self.delta, gate_cum=self.gate_cum, k=self.k_exp, v=self.v, g=self.g, beta=self.beta
        )


MASK_ROW_ALIGN = 16  # bytes: a row stride Triton specialises (divisibility 16)
MASK_PAD_ABOVE = 65  # nodes: above, gate loads span >= 128 columns and an unaligned stride costs registers


def mask_rows(ancestors: torch.Tensor) -> torch.Tensor:
    """The ancestor mask [n, n] as the tree kernels read it: uint8, each row contiguous, rows at the given
    row stride (a view of a wider buffer is read in place); a copy with rows of a multiple of
    :data:`MASK_ROW_ALIGN` bytes where n > :data:`MASK_PAD_ABOVE` and the stride is not one. The kernels
    gather [rows, nodes] tiles of it; with an unaligned stride (the engine's slots of 2^k + 1 nodes)
    Triton cannot specialise it, and at 129 nodes phase 1 of the split form took 229-255 registers a
    thread (spilling at the SpecLA shape and in the peeled form) against 153-171 with an aligned one (the
    wheel's ptxas for sm_90 on the CPU, scripts/sm90_resources.py; the H100 compiled the same), at 97-100
    nodes 248-255 against 178-207; at 33 / 65 nodes (gate loads of <= 64 columns) the split form's were
    unchanged. Measured on an H100 (results/2026-12-06-h100-aligned-mask, bf16, CUDA graphs) at 129
    nodes: split 71.6 -> 49.8 us (Weaver), 33.8 -> 27.6 (SpecLA), 27.7 -> 19.3 (tiny); a budget-128 DDTree
    step 0.520 -> 0.464 ms. The engine's slots of those sizes keep an aligned copy (one per verify step,
    not per layer: :func:`aligned_mask`)."""
    flags = ancestors if ancestors.dtype in (torch.bool, torch.uint8) else ancestors != 0
    if flags.stride(-1) != 1:
        flags = flags.contiguous()
    n = flags.shape[0]
    if _copied(n, flags.stride(0)):
        flags = _aligned_rows(n, flags.device).copy_(flags)
    return flags.view(torch.uint8)


def _copied(n: int, row_stride: int) -> bool:
    """Whether :func:`mask_rows` reads a mask of ``n`` nodes at this row stride from an aligned copy."""
    return n > MASK_PAD_ABOVE and row_stride % MASK_ROW_ALIGN != 0


def _aligned_rows(n: int, device: torch.device) -> torch.Tensor:
    """A zeroed bool [n, n] view of rows padded to a multiple of :data:`MASK_ROW_ALIGN` bytes."""
    width = -(-n // MASK_ROW_ALIGN) * MASK_ROW_ALIGN
    return torch.zeros(n, width, dtype=torch.bool, device=device)[:, :n]


def aligned_mask(n: int, device: torch.device) -> torch.Tensor | None:
    """Where :func:`mask_rows` would copy a contiguous [n, n] mask (n > :data:`MASK_PAD_ABOVE`, not a
    multiple of :data:`MASK_ROW_ALIGN`): a zeroed bool [n, n] mask with aligned rows to keep the copy in
    (the engine's slots, refreshed once a verify step); else None."""
    return _aligned_rows(n, device) if _copied(n, n) else None


def _check_tiles(br: int, block_k: int | None, dk: int) -> int:
    """BK (``block_k`` or min(64, d_k)) after checking that BR is a power of two >= 16."""
    if br < 16 or br & (br - 1):
        raise ValueError(f"block_rows must be a power of two >= 16, got {br}")
    return block_k or min(64, _pow2_at_least(dk))


def _keys_out(
    q: torch.Tensor, k: torch.Tensor, hv: int, out: tuple[torch.Tensor, ...] | None
) -> tuple[torch.Tensor, bool]:
    """(TreeFactors.k, whether the kernel writes it): the float32 keys per value head, written into
    ``out[3]`` when given (double-buffered factors of a delayed commit), else a new tensor, or the
    input itself when there is nothing to expand or convert."""
    if out is not None and len(out) > 3:
        return out[3], True
    n, h, dk = k.shape
    if hv != h or k.dtype != torch.float32:
        return torch.empty(n, hv, dk, dtype=torch.float32, device=q.device), True
    return k, False


def _pending_operands(
    state: torch.Tensor, pending: PendingCommit | None, out: tuple[torch.Tensor, ...] | None
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, int]:
    """(delta, k, gate_cum, uint8 mask), node and n of a pending commit, checked; placeholders without."""
    if pending is None:
        return (state, state, state, state), state, 1  # unused: PENDING is off
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(
            f"a pending commit updates the state in place: it must be contiguous float32, got {state.dtype}"
        )
    if out is not None and any(pending.delta.data_ptr() == x.data_ptr() for x in out[1:]):
        raise ValueError("the pending commit's factors are this verification's outputs: double-buffer them")
    p_anc = check_factors(state, pending.delta, pending.k, pending.gate_cum, pending.ancestors)
    if pending.path is not None:  # the path index of the same path: read in place of the mask
        if pending.path.dtype != torch.int32 or pending.path.numel() < pending.delta.shape[0] + 1:
            raise ValueError(f"a pending path index is int32 [>= n + 1], got {pending.path.dtype}")
        p_anc = pending.path
    ops = (pending.delta.contiguous(), pending.k.contiguous(), pending.gate_cum.contiguous(), p_anc)
    return ops, pending.node, pending.delta.shape[0]


def chain_gdn_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    precision: str = "ieee",
    **kwargs,
) -> tuple[torch.Tensor, TreeFactors]:
    """:func:`tree_gdn_fused` on a chain (parents[i] = i - 1): same kernel, mask from indices."""
    return tree_gdn_fused(q, k, v, g, beta, state, None, scale, precision, chain=True, **kwargs)


def tree_states_fused(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    parents: torch.Tensor,
    *,
    block_v: int | None = None,
    num_warps: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The float32 state after every node, [n, HV, d_v, d_k] (the reference's ``snapshots``).

    ``parents`` [n] int (-1: child of the committed prefix; else < i). One program per (value head,
    d_v tile) walks the nodes in order, each node starting from its parent's state.
    """
    n, h, dk = k.shape
    hv, dv = v.shape[1], v.shape[2]
    if state.shape != (hv, dv, dk) or parents.shape != (n,) or hv % h:
        raise ValueError("tree_states_fused: bad shapes")
    k, v, g, beta = (x.contiguous() for x in (k, v, g, beta))
    state = state.contiguous().float()
    par = parents.to(device=k.device, dtype=torch.int32).contiguous()
    bks = _pow2_at_least(dk, 1)
    # small d_v tiles: more programs in flight for this store-bound walk (BV=8 measured best on the H200)
    bv = block_v or min(_pow2_at_least(dv, 1), max(8, 1024 // bks))
    warps = num_warps or (8 if bv * bks >= 4096 else 4)
    states = out if out is not None else torch.empty(n, hv, dv, dk, dtype=torch.float32, device=k.device)
    grid = (hv, triton.cdiv(dv, bv))
    _tree_states_kernel[grid](
        k, v, g, beta, state, par, states, n,
        H=h, HV=hv, DK=dk, DV=dv, BKS=bks, BV=bv, num_warps=warps, **pdl_args(k.device, verify=True),
    )  # fmt: skip
    return states
