"""Fused Triton commits of an accepted tree path (one GDN layer, one sequence), capturable.

The kernels read the accepted path's last node from a 1-element device tensor (``node``), so a
CUDA graph replays them for whatever node the device-side acceptance chose; nothing is read on
the host.

- :func:`commit_closed_form_fused`: the closed-form state commit of
  :func:`repro.gdn.reference.commit_closed_form`, in place,
  ``S <- exp(G_a) S + sum_{j on path(a)} exp(G_a - G_j) delta_j k_j^T``, from the verification
  factors (delta [n, HV, d_v], gate_cum [n, HV], k [n, HV, d_k], float32) and the ancestor mask
  (row a is the path). Grid (HV, d_v / BV): each program keeps a [BV, d_k] float32 tile of the update,
  accumulates it over the nodes in blocks of BM (off-path nodes weigh 0; their rows are read anyway so
  that no load waits on the path mask and the blocks pipeline: the first version masked them by the
  path, and the commit (with the conv commit) took 23 us per layer at GDN-1.3B in
  results/2026-11-30-h200-model-3, a chain of dependent load latencies), then
  rescales and adds its state tile. The dots run in exact fp32 ("ieee"): the state persists across
  steps, so the commit's rounding must stay at float32's.
- :func:`commit_path_fused`: the same commit, reading only the accepted path's rows: the path is
  gathered on the device from the ancestor row (a cumsum gives each path node its position; helpers
  :func:`repro.gdn.triton_common.accepted_path` and :func:`~repro.gdn.triton_common.path_rows_update`,
  shared with the delayed-commit verification of :mod:`repro.gdn.triton_tree`), and the conv-history
  commit runs in the same launch on extra programs. Its cost grows with the accepted depth d, not with the
  tree size. The first version (256 programs of 32 x 64 state tiles, 4 warps, the path rows in a
  software-pipelined loop from the first block: ``OLD_PATH_TILES``) measured 8.6 us in graphs at every
  depth 1..16 at GDN-1.3B (results/2026-12-01-h200-kernels-3), 8x its bandwidth floor and slower than
  token replay below depth 8: its sm_90 code (compiled here ahead of time) ran the path gather ~3 times
  (the pipeline's prologue stages) with ~40 barriers. Now: 16 x 64 tiles (512 programs at GDN-1.3B,
  768 at Weaver's shape), the first block of 16 path rows in straight-line code (no pipeline; a loop only
  past 16 rows), ~20 barriers, 128-bit state and row accesses, no spills.
- :func:`commit_path_indexed`: the same commit (and conv history) reading the path from a path index
  (:func:`write_path_index`: int32 [length, nodes from the path's end up], written once per step by one
  launch for every layer) instead of gathering it in every program: a program loads its state tile, the
  length and the end node in one round trip and the path's rows in the second; no ancestor row, cumsum
  or one-hot reduce (the latency of commit_path_fused is that chain, not its bytes: 7.3-7.7 us at every
  depth at GDN-1.3B vs replay's 2.65 us at depth 1, results/2026-12-01-h200-fused-engine/scripts/
  dev-kernels13). Contractions: blocks of 16 rows as one exact dot, or rank-1 updates in straight-line
  code (no shared memory, no barrier). Stacked operands (a leading layer dim) commit L layers in one
  launch. The static decoder uses it (StaticDecoder.indexed_commit).
- :func:`commit_conv_fused`: the conv history after the path, in place: row j (oldest first) of the
  new [W-1, C] history is ``cat(history, conv_inputs)[conv_index[a, W-2-j]]`` (conv_index as
  :func:`repro.gdn.reference.conv_gather_index`: column r = the r-th predecessor). Grid over channel
  blocks; a program loads every row it needs before it writes, and channels are disjoint across
  programs, so the in-place write cannot race.

Cost at GDN-1.3B (HV = 8, d_k = d_v = 256), n = 64: the state (2 MB) is read and written once and the
path's factors read, ~1-2 us of bandwidth per layer; torch's version is ~10 launches per layer. The path
commit also waits on three dependent loads (the node, its ancestor row, the path's rows) before its
arithmetic, so its latency floor lies above the bandwidth floor: about one launch plus three memory
round trips.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.gdn.triton_common import (  # also patches the CPU interpreter
    accepted_path,
    check_factor_shapes,
    check_factors,
    commit_indexed_tile,
    commit_path_tile,
    path_rows_update,
    pdl_args,
    pdl_start,
)


@triton.jit
def _closed_form_commit_kernel(
    state, delta, k, gate_cum, anc, node_ptr, n,
    HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    hv = tl.program_id(0)
    o_v = tl.program_id(1) * BV + tl.arange(0, BV)
    m_v = o_v < DV
    o_k = tl.arange(0, BK)  # the whole d_k (BK >= DK): one accumulator, the factors read once
    m_k = o_k < DK
    node = tl.load(node_ptr)
    g_end = tl.load(gate_cum + node * HV + hv)
    acc = tl.zeros([BV, BK], dtype=tl.float32)
    for m0 in range(0, n, BM):
        # every load of a block depends only on the loop index (no load waits on the path mask), so
        # the blocks pipeline; off-path rows are read and weighted 0 (a few hundred kB per layer)
        o_m = m0 + tl.arange(0, BM)
        m_m = o_m < n
        on_path = tl.load(anc + node * n + o_m, mask=m_m, other=0) != 0
        g_m = tl.load(gate_cum + o_m * HV + hv, mask=m_m, other=0.0)
        rows = o_m[:, None] * HV + hv
        d = tl.load(delta + rows * DV + o_v[None, :], mask=m_m[:, None] & m_v[None, :], other=0.0)
        kt = tl.load(k + rows * DK + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)
        w = tl.where(on_path, tl.exp(g_end - g_m), 0.0)  # selected, not multiplied: no inf * 0
        dw = tl.where(on_path[:, None], d * w[:, None], 0.0)
        acc += tl.dot(tl.trans(dw), kt, input_precision="ieee")
    p_s = state + (hv * DV + o_v[:, None]) * DK + o_k[None, :]
    m_s = m_v[:, None] & m_k[None, :]
    s = tl.load(p_s, mask=m_s, other=0.0)
    tl.store(p_s, tl.exp(g_end) * s + acc, mask=m_s)


@triton.jit
def _conv_commit_block(
    history, inputs, in_row, index, node_ptr, C, i_c, HIST: tl.constexpr, W: tl.constexpr, HP: tl.constexpr,
    BC: tl.constexpr,
):  # fmt: skip
    """Channels [i_c * BC, (i_c + 1) * BC) of the conv history after the path to ``node``, in place
    (``inputs``' rows ``in_row`` elements apart, its channels contiguous)."""
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    node = tl.load(node_ptr)
    rows = tl.arange(0, HP)  # new history row j, oldest first
    m_r = (rows < HIST) & (node >= 0)  # node < 0: nothing accepted, the history stays
    src = tl.load(index + node * W + (HIST - 1 - rows), mask=m_r, other=0)  # index into cat(history, inputs)
    from_hist = src < HIST
    m = m_r[:, None] & m_c[None, :]
    h = tl.load(history + src[:, None] * C + o_c[None, :], mask=m & from_hist[:, None], other=0.0)
    p_x = inputs + (src[:, None] - HIST) * in_row + o_c[None, :]
    x = tl.load(p_x, mask=m & ~from_hist[:, None], other=0.0)
    new = tl.where(from_hist[:, None], h, x.to(h.dtype))
    # in place: every thread's loads of the old rows before any thread's stores (the load and store layouts
    # differ with the launch's warps; without it the H200 read rewritten rows at Weaver's shape, 4 warps)
    tl.debug_barrier()
    tl.store(history + rows[:, None] * C + o_c[None, :], new, mask=m)


@triton.jit
def _conv_commit_kernel(
    history, inputs, in_row, index, node_ptr, C, HIST: tl.constexpr, W: tl.constexpr, HP: tl.constexpr,
    BC: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    _conv_commit_block(history, inputs, in_row, index, node_ptr, C, tl.program_id(0), HIST, W, HP, BC)


@triton.jit
def _path_commit_kernel(
    state, delta, k, gate_cum, anc, node_ptr, n, history, inputs, in_row, index, C,
    HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, NP: tl.constexpr, BM: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PEEL: tl.constexpr, DOT: tl.constexpr, CONV: tl.constexpr,
    HIST: tl.constexpr, W: tl.constexpr, HP: tl.constexpr, BC: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """Programs [0, HV * NV * NK): one [BV, BK] state tile each (the path's rows only); with CONV, the
    programs after them: one block of BC conv channels each."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    NV: tl.constexpr = (DV + BV - 1) // BV
    NK: tl.constexpr = (DK + BK - 1) // BK
    if pid < HV * NV * NK:
        hv = pid // (NV * NK)
        o_v = ((pid // NK) % NV) * BV + tl.arange(0, BV)
        o_k = (pid % NK) * BK + tl.arange(0, BK)
        p_s = state + (hv * DV + o_v[:, None]) * DK + o_k[None, :]
        m_s = (o_v < DV)[:, None] & (o_k < DK)[None, :]
        s = tl.load(p_s, mask=m_s, other=0.0)  # issued first: independent of the path
        if PEEL:
            # the first BM path rows in straight-line code (every accepted depth <= BM), the rest in a loop
            live, a, on_path, pos, length = accepted_path(anc, node_ptr, n, NP)
            g_end = tl.where(live, tl.load(gate_cum + a * HV + hv).to(s.dtype), 0.0)
            acc = path_rows_update(tl.zeros_like(s), 0, on_path, pos, length, g_end, delta, k, gate_cum, hv,
                                   o_v, o_k, HV, DV, DK, NP, BM, DOT)  # fmt: skip
            for m0 in range(BM, length, BM):
                acc = path_rows_update(acc, m0, on_path, pos, length, g_end, delta, k, gate_cum, hv, o_v,
                                       o_k, HV, DV, DK, NP, BM, DOT)  # fmt: skip
            new = tl.exp(g_end) * s + acc
        else:
            new = commit_path_tile(s, delta, k, gate_cum, anc, node_ptr, n, hv, o_v, o_k, HV, DV, DK, NP, BM)
        tl.store(p_s, new, mask=m_s)
    elif CONV:
        i_c = pid - HV * NV * NK
        _conv_commit_block(history, inputs, in_row, index, node_ptr, C, i_c, HIST, W, HP, BC)


@triton.jit
def _path_index_kernel(anc, node_ptr, n, path, NP: tl.constexpr):
    """One program: the path to ``node`` as a path index (:func:`write_path_index`)."""
    live, a, on_path, pos, length = accepted_path(anc, node_ptr, n, NP)
    tl.store(path + length - pos, tl.arange(0, NP), mask=on_path != 0)  # 1 + r, r = length - 1 - pos
    tl.store(path, length)


@triton.jit
def _conv_path_block(
    history, inputs, in_row, path, cap, C, i_c, HIST: tl.constexpr, HP: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """:func:`_conv_commit_block` for a path index: row j (oldest first) of the new history is the input
    of the node r = HIST - 1 - j steps above the path's end (``path[1 + r]``) if r < length, else the old
    history's row j + length; no gather index, no load waits on another but the rows on the path index.
    ``in_row``: the inputs' row stride (a column slice of the in_proj output is read in place)."""
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    length = tl.load(path)
    rows = tl.arange(0, HP)
    back = HIST - 1 - rows
    m_r = rows < HIST
    from_in = back < length
    node = tl.load(path + 1 + back, mask=m_r & (back < cap), other=0)  # not waiting for the length
    m = m_r[:, None] & m_c[None, :]
    h = tl.load(history + (rows + length)[:, None] * C + o_c[None, :], mask=m & ~from_in[:, None], other=0.0)
    x = tl.load(inputs + node[:, None] * in_row + o_c[None, :], mask=m & from_in[:, None], other=0.0)
    new = tl.where(from_in[:, None], x.to(h.dtype), h)
    tl.debug_barrier()  # in place: every load of the old rows before any store (see _conv_commit_block)
    tl.store(history + rows[:, None] * C + o_c[None, :], new, mask=m & (length > 0))


@triton.jit
def _indexed_commit_kernel(
    state, delta, k, gate_cum, path, cap, history, inputs, in_layer, in_row, C, n,
    HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, MODE: tl.constexpr, CONV: tl.constexpr, HIST: tl.constexpr, HP: tl.constexpr,
    BC: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """:func:`_path_commit_kernel` reading the path from a path index: the state tile, the length and the
    path's end in the first round trip, the path's rows (and the end's gate) in the second. Grid axis 1:
    the layer of stacked operands (state [L, HV, d_v, d_k], factors [L, n, ...], conv [L, ...]; one path);
    the conv inputs at strides (``in_layer``, ``in_row``, 1)."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    state += layer * (HV * DV * DK)
    delta += layer * n * (HV * DV)
    k += layer * n * (HV * DK)
    gate_cum += layer * n * HV
    NV: tl.constexpr = (DV + BV - 1) // BV
    NK: tl.constexpr = (DK + BK - 1) // BK
    if pid < HV * NV * NK:
        hv = pid // (NV * NK)
        o_v = ((pid // NK) % NV) * BV + tl.arange(0, BV)
        o_k = (pid % NK) * BK + tl.arange(0, BK)
        p_s = state + (hv * DV + o_v[:, None]) * DK + o_k[None, :]
        m_s = (o_v < DV)[:, None] & (o_k < DK)[None, :]
        s = tl.load(p_s, mask=m_s, other=0.0)
        new = commit_indexed_tile(s, True, delta, k, gate_cum, path, cap, hv, o_v, o_k, HV, DV, DK, BM, MODE)
        tl.store(p_s, new, mask=m_s)
    elif CONV:
        hist_l, inputs_l = history + layer * (HIST * C), inputs + layer * in_layer
        _conv_path_block(hist_l, inputs_l, in_row, path, cap, C, pid - HV * NV * NK, HIST, HP, BC)


def commit_closed_form_fused(
    state: torch.Tensor,
    delta: torch.Tensor,
    k: torch.Tensor,
    gate_cum: torch.Tensor,
    ancestors: torch.Tensor,
    node: torch.Tensor,
    *,
    block_v: int | None = None,
    block_m: int = 16,
    num_warps: int | None = None,
) -> None:
    """Fold the path to ``node`` (1-element int64 device tensor) into ``state`` [HV, d_v, d_k] in place.

    delta [n, HV, d_v], k [n, HV, d_k], gate_cum [n, HV]: float32 (TreeFactors of the verification);
    ancestors bool [n, n] with the diagonal set. All on one device, contiguous. Reads every node's rows
    (cost fixed by n); :func:`commit_path_fused` reads the path's rows only.
    """
    hv, dv, dk = state.shape
    n = delta.shape[0]
    anc = check_factors(state, delta, k, gate_cum, ancestors)
    if state.dtype != torch.float32:
        raise ValueError(f"state must be contiguous float32, got {state.dtype}")
    bv = block_v or min(32, triton.next_power_of_2(dv))
    bk = triton.next_power_of_2(dk)
    warps = num_warps or (8 if bv * bk >= 8192 else 4)
    grid = (hv, triton.cdiv(dv, bv))
    _closed_form_commit_kernel[grid](
        state, delta.contiguous(), k.contiguous(), gate_cum.contiguous(), anc, node, n,
        HV=hv, DK=dk, DV=dv, BM=block_m, BK=bk, BV=bv, num_warps=warps, **pdl_args(state.device),
    )  # fmt: skip


def commit_path_fused(
    state: torch.Tensor,
    delta: torch.Tensor,
    k: torch.Tensor,
    gate_cum: torch.Tensor,
    ancestors: torch.Tensor,
    node: torch.Tensor,
    *,
    conv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    block_v: int = 16,
    block_k: int = 64,
    block_m: int = 16,
    num_warps: int = 4,
    num_stages: int = 1,
    dot: bool = True,
    peel: bool = True,
) -> None:
    """:func:`commit_closed_form_fused` (same arguments and result) reading only the accepted path's rows,
    with the conv-history commit in the same launch.

    The path to ``node`` (1-element int64 device tensor; < 0: nothing to commit) is gathered on the device
    from the ancestor row (:func:`repro.gdn.triton_common.accepted_path`): the bytes read grow with the
    accepted depth d (d (d_v + d_k + 1) 4 per head), not with the tree. One launch, a static grid of
    HV * (d_v / block_v) * (d_k / block_k) state-tile programs (defaults: SpecLA shape 512, Weaver 768),
    then, with ``conv`` = (history [W-1, C], conv_inputs [n, C], conv_index [n, W]), one program per 256
    channels doing :func:`commit_conv_fused`'s work (the same device code). Capture-safe: no host reads.
    state float32 (float64 under the CPU interpreter, for the exactness tests).

    Tuning knobs (the GPU script scripts/gpu/dev-kernels13.py sweeps them): ``block_m`` path rows per
    gathered block; ``peel`` (default): the first block in straight-line code, a loop only past
    ``block_m`` rows (else the loop from the first row: the earlier kernel, with its tiles 32 x 64, 4
    warps and 3 stages); ``dot``: the block's contraction as an exact fp32 dot (needs every block >= 16;
    smaller tiles fall back to broadcast products).
    """
    hv, dv, dk = state.shape
    n = delta.shape[0]
    anc = check_factors(state, delta, k, gate_cum, ancestors)
    bv, bk = _path_tiles(dv, dk, block_v, block_k)
    tiles = path_commit_programs(hv, dv, dk, block_v, block_k)
    history, inputs, index, c, hist, width, bc = state, state, node, 1, 0, 1, 1
    if conv is not None and conv[0].shape[0] > 0:
        history, inputs, index = conv
        hist, c = history.shape
        width = index.shape[1]
        _check_conv(history, inputs, index)
        inputs, index, bc = _channels_contiguous(inputs), index.contiguous(), _CONV_BLOCK
    blocks = triton.cdiv(c, bc) if hist else 0
    use_dot = dot and min(bv, bk, block_m) >= 16  # tl.dot's smallest tile
    _path_commit_kernel[(tiles + blocks,)](
        state, delta.contiguous(), k.contiguous(), gate_cum.contiguous(), anc, node, n,
        history, inputs, inputs.stride(0), index, c,
        HV=hv, DK=dk, DV=dv, NP=triton.next_power_of_2(n), BM=block_m, BK=bk, BV=bv, PEEL=peel,
        DOT=use_dot, CONV=hist > 0, HIST=hist, W=width, HP=triton.next_power_of_2(max(hist, 1)), BC=bc,
        num_warps=num_warps, num_stages=num_stages, **pdl_args(state.device),
    )  # fmt: skip


INDEXED_MODES = {"products": 0, "dot": 1, "rank1": 2}
"""Contractions of :func:`commit_path_indexed`: a gathered block of path rows summed as broadcast
products, the same as one exact fp32 dot, or one rank-1 update per path row in straight-line code."""


def path_index_buffer(n: int, device: torch.device | str) -> torch.Tensor:
    """A path index for trees of up to ``n`` nodes (:func:`write_path_index`), empty (length 0)."""
    return torch.zeros(n + 1, dtype=torch.int32, device=device)


def write_path_index(ancestors: torch.Tensor, node: torch.Tensor, path: torch.Tensor) -> None:
    """The root-to-``node`` path as a path index, on the device, in one launch (capture-safe):
    ``path[0]`` = its number of nodes d (0 when node < 0), ``path[1 + r]`` = the node r steps above
    ``node`` (r = 0: node itself, r = d - 1: the root), r < d; the entries past d are left as they are.

    ``ancestors`` bool/uint8 [n, n] (diagonal set), ``node`` 1-element int64, ``path`` int32 [>= n + 1]
    (:func:`path_index_buffer`). Written once per step, it is read by every layer's
    :func:`commit_path_indexed` (no ancestor row, cumsum and reduce per layer and tile)."""
    n = ancestors.shape[0]
    if (
        ancestors.shape != (n, n)
        or path.dtype != torch.int32
        or path.numel() < n + 1
        or not path.is_contiguous()
    ):
        raise ValueError(
            f"a path index of a {n}-node tree is contiguous int32 [>= {n + 1}], got {path.dtype} "
            f"{tuple(path.shape)} (ancestors {tuple(ancestors.shape)})"
        )
    anc = (
        ancestors.contiguous().view(torch.uint8) if ancestors.dtype == torch.bool else ancestors.contiguous()
    )
    _path_index_kernel[(1,)](anc, node, n, path, NP=triton.next_power_of_2(n), num_warps=4)


def commit_path_indexed(
    state: torch.Tensor,
    delta: torch.Tensor,
    k: torch.Tensor,
    gate_cum: torch.Tensor,
    path: torch.Tensor,
    *,
    conv: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_v: int = 16,
    block_k: int = 64,
    block_m: int = 16,
    num_warps: int = 4,
    num_stages: int = 1,
    mode: str = "dot",
) -> None:
    """:func:`commit_path_fused` (the same commit, in place) with the path read from a path index
    (:func:`write_path_index`, int32: length, then the nodes from the path's end up) instead of gathered
    from the ancestor row in every program: each program loads its state tile, the length and the end
    node at once, then the path's rows; no cumsum, no one-hot reduce, one dependent load fewer. ``conv``
    = (history [W-1, C], conv_inputs [n, C]): the conv-history commit in the same launch, also from the
    path index (no gather index); the inputs are read in place at their strides (a column slice of the
    in_proj output: no copy) when their last dim is contiguous. ``mode`` (:data:`INDEXED_MODES`): "dot"
    (needs every block >= 16, else "products"), "products" or "rank1"; tiles and warps as in
    :func:`commit_path_fused`.

    Stacked layers (every operand with a leading layer dim L: state [L, HV, d_v, d_k], delta [L, n, HV,
    d_v], k, gate_cum, history [L, W-1, C], conv_inputs [L, n, C]; contiguous, the conv inputs' last dim
    at least): L layers' commits of the same path in one launch (grid axis 1), the launch and its two round
    trips paid once."""
    stacked = state.dim() == 4
    layers = state.shape[0] if stacked else 1
    ops = (state, delta, k, gate_cum) + (tuple(conv) if conv is not None else ())
    if stacked and (any(t.shape[0] != layers for t in ops) or not all(t.is_contiguous() for t in ops[:5])):
        raise ValueError(f"stacked operands need one leading layer dim {layers}, contiguous")
    one = tuple(t[0] for t in ops) if stacked else ops
    hv, dv, dk = one[0].shape
    check_factor_shapes(*one[:4])
    n = one[1].shape[0]
    if path.dtype != torch.int32 or path.numel() < 2 or not path.is_contiguous():
        raise ValueError(f"path must be a contiguous int32 path index, got {path.dtype} {tuple(path.shape)}")
    if mode not in INDEXED_MODES:
        raise ValueError(f"mode must be one of {', '.join(INDEXED_MODES)}, got {mode!r}")
    bv, bk = _path_tiles(dv, dk, block_v, block_k)
    tiles = path_commit_programs(hv, dv, dk, block_v, block_k)
    history, inputs, c, hist, bc = state, state, 1, 0, 1
    if conv is not None and one[4].shape[0] > 0:
        history, inputs = conv
        hist, c = one[4].shape
        if one[5].shape[1] != c or not history.is_contiguous():
            raise ValueError(
                f"conv shapes disagree: history {tuple(history.shape)}, inputs {tuple(inputs.shape)}"
            )
        inputs, bc = _channels_contiguous(inputs), _CONV_BLOCK
    in_layer, in_row = (inputs.stride(0), inputs.stride(1)) if stacked and hist else (0, inputs.stride(-2))
    blocks = triton.cdiv(c, bc) if hist else 0
    code = INDEXED_MODES[mode]
    if code == 1 and min(bv, bk, block_m) < 16:  # tl.dot's smallest tile
        code = 0
    _indexed_commit_kernel[(tiles + blocks, layers)](
        state, delta.contiguous(), k.contiguous(), gate_cum.contiguous(), path, path.numel() - 1, history,
        inputs, in_layer, in_row, c, n,
        HV=hv, DK=dk, DV=dv, BM=block_m, BK=bk, BV=bv, MODE=code, CONV=hist > 0, HIST=hist,
        HP=triton.next_power_of_2(max(hist, 1)), BC=bc, num_warps=num_warps, num_stages=num_stages,
        **pdl_args(state.device),
    )  # fmt: skip


def _path_tiles(dv: int, dk: int, block_v: int, block_k: int) -> tuple[int, int]:
    return min(block_v, triton.next_power_of_2(dv)), min(block_k, triton.next_power_of_2(dk))


def path_commit_programs(hv: int, dv: int, dk: int, block_v: int = 16, block_k: int = 64) -> int:
    """State-tile programs of :func:`commit_path_fused` (its conv programs not counted)."""
    bv, bk = _path_tiles(dv, dk, block_v, block_k)
    return hv * triton.cdiv(dv, bv) * triton.cdiv(dk, bk)


OLD_PATH_TILES = dict(block_v=32, block_k=64, block_m=16, num_warps=4, num_stages=3, peel=False)
"""The earlier path kernel's settings (results/2026-12-01-h200-kernels-3: 8.6 us at SpecLA's shape at every
depth): for comparisons in the benchmarks."""


_CONV_BLOCK = 256  # conv channels per program


def _channels_contiguous(inputs: torch.Tensor) -> torch.Tensor:
    """``inputs`` itself when its last dim is contiguous (the kernels take its row stride), else a copy."""
    return inputs if inputs.stride(-1) == 1 else inputs.contiguous()


def _check_conv(history: torch.Tensor, conv_inputs: torch.Tensor, conv_index: torch.Tensor) -> None:
    hist, c = history.shape
    width = conv_index.shape[1]
    if width != hist + 1 or conv_inputs.shape[1] != c or not history.is_contiguous():
        raise ValueError(
            f"conv shapes disagree: history {tuple(history.shape)}, inputs {tuple(conv_inputs.shape)}, "
            f"index {tuple(conv_index.shape)}"
        )


def commit_conv_fused(
    history: torch.Tensor, conv_inputs: torch.Tensor, conv_index: torch.Tensor, node: torch.Tensor
) -> None:
    """The conv history [W-1, C] after the path to ``node``, in place.

    conv_inputs [n, C] (the verified nodes' raw conv inputs; read at its row stride, e.g. a column slice
    of the in_proj output, without a copy), conv_index [n, W] (conv_gather_index).
    """
    hist, c = history.shape
    if hist == 0:
        return
    _check_conv(history, conv_inputs, conv_index)
    inputs = _channels_contiguous(conv_inputs)
    _conv_commit_kernel[(triton.cdiv(c, _CONV_BLOCK),)](
        history, inputs, inputs.stride(0), conv_index.contiguous(), node, c,
        HIST=hist, W=hist + 1, HP=triton.next_power_of_2(hist), BC=_CONV_BLOCK, num_warps=4,
        **pdl_args(history.device),
    )  # fmt: skip
