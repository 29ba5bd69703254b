"""Weaver's device growth fused: one Triton kernel per Weaver step, on one or many programs
(:func:`grow_fused`).

The same tree as :func:`repro.drafters.weaver_growth.grow_on_device` (the torch version, about 100
aten ops per step) from one launch per step of ``width`` nodes (W; the root a step of its own). The
kernel runs these stages for the step's m <= W nodes at once, with a barrier between stages that pass
vectors (one row a node) through global scratch (every vector a stage needs is reloaded from scratch:
``x = base[d] + W_e E[token]``, ``y = x + W_o attention``, ...):

0. the pops (reads only): m argmaxes of the candidate table (float64 keys, push order as the
   tie-break, validity), kept in registers between pops (each pop pushes its parent's next rank);
   the nodes' tokens / parents / depths / scores / ancestor rows; the writes follow barrier 1 (every
   read of the tables precedes them);
1. ``W_e E[token]``; 2. RMSNorm, q / k / v (k, v into the nodes' cache slots); 3. attention of each
   node over its ancestors' slots and its own (no node of a step sees another); 4. o_proj; 5. RMSNorm,
   gate / up; 6. ``SiLU(gate) * up``, down; 7. the final norm, out_proj (``u``); 8. pool scores
   ``l_d + <u, E[pool]>``;
9. per node: log-softmax, the ``keep`` best children (ties go to the lower pool position; float32
   arithmetic: one sort of keys packing log q's order-preserving bits with the position, float64: rank
   by counting) and the node's first-child candidate entry.

Every linear reads each weight block once for all the step's nodes (a [W, block] product), so a
step of W nodes costs about one node's weight traffic and latency: the point of wider steps. A
linear holds its input rows in registers, whole; where those rows would take more than two tiles for
the step's nodes (:func:`linear_tiles`: the target's hidden size into W_e and the intermediate size
into down_proj at the 27B shape at 4 nodes a step, 177 registers a thread and one program a SM),
those two linears read their rows from memory CK columns a time instead (``CHUNK``; 128 registers,
two programs a SM; sums over the chunks, rounded once).
Vectors pass between stages in the adapter's dtype, so a half-precision adapter is rounded where
torch rounds its ops' outputs (arithmetic in float32; float64 for a float64 adapter). The root is
the same kernel without the pops (it also clears the tables). Per growth, torch adds only
``base = W_g g + W_f f``, the pool's embedding rows ``E[pool]`` and one zeroing of the barrier
counters. Exact in-row ties of log q (two pool tokens with the same score under one parent) are the
one place the order may differ from torch's ``topk``, whose tie order is unspecified; everything else
(scores, push order, padding) is the torch version's.

**Programs** (``programs`` = P, a launch option; :func:`default_programs` picks it from the shapes:
one program a row block, as many as the SMs hold at once). P = 1 is one CTA walking every weight
matrix (latency bound: ~40 us a one-node step at the tiny family on an H200). At the 27B shape every SM holds
two programs (8 warps, ~128 registers a thread) and two a SM stream the weights faster than one
(H200, 65 nodes: 79 us a node at P = 264 against 103 at P = 132; 4 warps at P = 528: 75 us, not the
default, as num_warps changes the rounding; results/2026-12-02-h200-growth-residency).

With P > 1 every linear splits its output rows into blocks of ``TILE / (in-width x WP)`` rows (WP:
W's power of two) and program p computes blocks p, p + P, ...; the pool scores split their blocks of
``BP`` tokens the same way, node by node; attention (``HEADWISE``, chosen from the shapes: the
all-heads key block ``NP x d_model`` over :data:`ATT_TILE`) splits (node, head) pairs over the
programs, each head in blocks of ``ATT_CHUNK / head_dim`` slots, or nodes (all heads at once); the
visible slots come from each node's ancestor row (written by program 0 after barrier 1). Every program
pops redundantly (the tokens and depths it needs, in registers) and recomputes the vectors between
stages; program 0 alone writes the pops (after barrier 1: every program has read the tables); the
ranking splits the nodes over the programs. P is a
runtime argument: one binary serves every P > 1 (P = 1 compiles the single-program code). A row's
value never depends on P: the same block shape (TILE, num_warps) computes it whichever program owns
it, so the tree and the scores are bitwise those of P = 1 at the same launch options (GPU tests and
``scripts/gpu/weaver-mp.py`` check it).

**Grid barrier** (P > 1; P = 1: a block barrier). The launch of the step from node n owns counter
``sync[n]`` (int32;
``sync`` is zeroed by one ``zero_`` before the growth's launches, so no counter is reset while in
use). Barrier k (1..8): a block barrier (every thread's stores issued), then one thread does
``atomic_add(sync[n], 1, acq_rel, gpu)`` (its release publishes the block's stores, ordered before it
by the block barrier) and polls ``sync[n]`` with acquire loads until it reaches ``k * P``, then a
block barrier (the acquire orders the block's later loads). A poll past ``spin_cap`` iterations sets
the error flag ``sync[N]`` and goes on (no hang, a wrong tree: :attr:`FusedGrowth.error` must be 0);
a program that finds the flag set does not spin. **L1**: a program's loads of what another program
wrote in the same launch (the stage vectors, the node's k / v slot and ancestor row) use ``.cg``
(cached in L2 only): L1 is per SM and not coherent, and a line (128 bytes) that holds a region read
earlier can hold a neighbouring region another program writes later. Tables written in earlier
launches and the weights load normally. **Co-residency**: a barrier waits for every program, so
all P must be resident at once: P is clamped to SMs x :func:`resident_ctas` of the compiled
kernel (its registers, warps and shared memory; at least one CTA a SM: the kernel compiled at all;
about 128 registers a thread at the 27B shape, no spills), and nothing else may hold SMs for long
(other streams' kernels delay, the flag catches a stall). The step that fills the budget (the pops
alone) runs on one program.

**CPU**: Triton's interpreter runs a grid's programs one after another, so a spinning barrier would
wait for programs that only run after it returns. There P > 1 runs *staged* (:func:`grow_fused`'s
``staged``, the default off CUDA): one launch per stage over the P programs (the pop and stage 9 on
one), each stage reading the popped nodes back from the tables: the same row, pool and head
partitions without barriers. The barriers and the concurrent pop run only on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from repro.drafters.triton_dtypes import round_to, tl_dtype
from repro.drafters.weaver_growth import DeviceGrowth
from repro.drafters.weaver_model import WeaverConfig, WeaverModel
from repro.grid import grid_sync, held_programs, ld

LIMITS = {"d_model": 512, "intermediate_size": 2048, "target_hidden_size": 2048, "pool": 2048, "nodes": 256}
MP_LIMITS = {
    "d_model": 4096,
    "intermediate_size": 8192,
    "target_hidden_size": 8192,
    "pool": 2048,
    "nodes": 256,
}
ATT_TILE = 32768  # elements of attention's key block: all heads in one block up to this, else per head
ATT_CHUNK = 4096  # per head: elements of a block of keys (values), head_dim wide
CHUNK_ROWS = 4  # output rows of a block of the linears that read their input in chunks (linear_tiles)
PER_SM = 32  # programs a SM device_programs may ask for (CUDA's CTA limit; residency clamps it)
SPIN_CAP = 1 << 20  # polls of a grid barrier before the error flag is set
STAGES = 10  # the pop, 8 stages between barriers, the ranking


@dataclass
class FusedGrowth(DeviceGrowth):
    """A fused growth's tree, its barrier error flag ([1] int32 on the device; 0: every grid barrier
    was met, nonzero: a poll ran past the spin cap and the tree is not to be trusted) and the programs
    its launches ran on (after the residency clamp)."""

    error: torch.Tensor | None = None
    programs: int = 1


def fits(config: WeaverConfig, budget: int, pool: int, programs: int = 1) -> bool:
    """Whether the kernel holds the adapter's shapes: :data:`LIMITS` on one program, :data:`MP_LIMITS`
    on several (each program holds whole input vectors and one row block of a weight in registers);
    d_model and head_dim powers of two (attention: all heads in one block up to :data:`ATT_TILE`
    elements, else per head in blocks of :data:`ATT_CHUNK`)."""
    sizes = {
        "d_model": config.d_model,
        "intermediate_size": config.intermediate_size,
        "target_hidden_size": config.target_hidden_size,
        "pool": pool,
        "nodes": budget + 1,
    }
    limits = LIMITS if programs <= 1 else MP_LIMITS
    pow2 = all(x == _p2(x) for x in (config.d_model, config.head_dim))
    return pow2 and all(sizes[k] <= v for k, v in limits.items())


def default_programs(
    config: WeaverConfig, budget: int, pool: int, slots: int, tile: int = 8192, width: int = 1
) -> int:
    """P for a device that holds ``slots`` programs at once: enough programs for the most row (or pool)
    blocks of any stage at steps of ``width`` nodes (the blocks of :func:`step_constants`), at most
    ``slots`` (all must be co-resident); 1 when the shapes fit neither limit set."""
    if not fits(config, budget, pool, 2):
        return 1
    c = step_constants(config, budget, pool, 1, torch.float32, width, tile)
    dmp, ip, hp, wp = c["DMP"], c["IP"], c["HP"], c["WP"]
    linears = [(config.d_model, dmp), (config.intermediate_size, dmp), (config.target_hidden_size, dmp)]
    if not c["CHUNK"]:  # else W_e and down_proj in blocks of BO rows
        linears += [(config.d_model, hp), (config.d_model, ip)]
    blocks = [-(-out // max(1, c["TILE"] // (inp * wp))) for out, inp in linears]
    if c["CHUNK"]:
        blocks.append(-(-config.d_model // c["BO"]))
    blocks.append(-(-pool // c["BP"]))  # the pool scores
    return max(1, min(slots, max(blocks)))


def device_programs(
    config: WeaverConfig, budget: int, pool: int, device: torch.device, tile: int = 8192, width: int = 1
) -> int:
    """:func:`default_programs` on ``device`` (CUDA: up to :data:`PER_SM` programs a SM, which
    :func:`grow_fused` clamps to the compiled kernel's residency); 1 elsewhere (the interpreter)."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return default_programs(config, budget, pool, sms * PER_SM, tile, width)


def _p2(x: int) -> int:
    return triton.next_power_of_2(int(x))


def _headwise(np_: int, dmp: int) -> bool:
    return np_ * dmp > ATT_TILE


def _tile(tile: int, *widths: int, rows: int = 1) -> int:
    """Elements per loaded block (a linear's: a weight block times the step's ``rows`` nodes): at least
    one row of the widest input for every node, at most a whole square for every node."""
    top = max(widths)
    return max(min(tile, top * top * rows), top * rows)


def linear_tiles(dmp: int, ip: int, hp: int, wp: int, tile: int) -> tuple[int, bool, int]:
    """(TILE, CHUNK, CK) of a step of ``wp`` nodes: CHUNK when whole rows of the widest inputs (the
    target's hidden size into W_e, the intermediate size into down_proj) for every node would take more
    than two tiles and at most four, as at the 27B shape at 4 nodes a step (177 registers a thread, one
    program a SM); those two linears then read their rows from memory CK columns a time, in blocks of
    :data:`CHUNK_ROWS` output rows, and TILE only has to hold the d_model-wide inputs' rows. Measured on
    an H200 (bf16, results/2026-12-04-h200-growth-chunks): 27B at 4 nodes 2860 -> 2736 us a growth (two
    programs a SM); at 8 nodes chunked rows lost (2323 -> 3531 us: still one program a SM, and every
    chunk's extra pass over the rows), so wider steps keep their rows whole."""
    chunk = 2 * tile < wp * max(hp, ip) <= 4 * tile
    if not chunk:
        return _tile(tile, dmp, ip, hp, rows=wp), False, 1
    return _tile(tile, dmp, rows=wp), True, max(16, tile // (wp * CHUNK_ROWS))


@triton.jit
def _load_vec(ptr, N: tl.constexpr, NP: tl.constexpr, ACC: tl.constexpr, CG: tl.constexpr):
    o = tl.arange(0, NP)
    return ld(ptr + o, o < N, CG).to(ACC)


@triton.jit
def _load_rows(ptr, stride, jj, rows, N: tl.constexpr, NP: tl.constexpr, ACC: tl.constexpr, CG: tl.constexpr):
    """Rows ``jj`` (those with ``rows`` set) of a row-major block at ``ptr`` (``stride`` apart), [WP, NP]."""
    o = tl.arange(0, NP)
    return ld(ptr + jj[:, None] * stride + o[None, :], rows[:, None] & (o[None, :] < N), CG).to(ACC)


@triton.jit
def _layer_input(base_ptr, se, d_v, jj, rows, DM: tl.constexpr, DMP: tl.constexpr, ACC: tl.constexpr,
                 DT: tl.constexpr, CG: tl.constexpr):  # fmt: skip
    """x = base[d] + W_e E[token] of the step's rows [WP, DMP] (``se``: W_e E[token] in scratch), rounded
    to DT: every stage that needs it reloads it."""
    return round_to(
        _load_rows(base_ptr, DM, d_v, rows, DM, DMP, ACC, False)
        + _load_rows(se, DMP, jj, rows, DM, DMP, ACC, CG),
        DT,
    )


@triton.jit
def _rmsnorm(x, w_ptr, eps, N: tl.constexpr, NP: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr):
    """DraftRMSNorm of each row of x [WP, NP]: w * (x / rms(x) rounded to DT), rounded to DT."""
    ms = tl.sum(x * x, axis=1) / N
    y = round_to(x * (1.0 / tl.sqrt(ms + eps))[:, None], DT)
    return round_to(_load_vec(w_ptr, N, NP, ACC, False)[None, :] * y, DT)


@triton.jit
def _stride(nprog, PC: tl.constexpr, B: tl.constexpr):
    """The step of a loop over blocks of B split over the programs: B * P (P = PC, or ``nprog`` at PC 0)."""
    if PC > 0:
        return PC * B
    return nprog * B


@triton.jit
def _store_rows(y_ptr, y_stride, jj, rows, o_o, y, OUT: tl.constexpr, DT: tl.constexpr):
    """The [WP, BO] outputs y of columns o_o, rounded to DT, into rows ``jj`` (those with ``rows`` set)
    ``y_stride`` apart."""
    keep = rows[:, None] & (o_o[None, :] < OUT)
    tl.store(
        y_ptr + jj[:, None] * y_stride + o_o[None, :], round_to(y, DT).to(y_ptr.dtype.element_ty), mask=keep
    )


@triton.jit
def _linear(w_ptr, x, y_ptr, y_stride, jj, rows, OUT: tl.constexpr, IN: tl.constexpr, INP: tl.constexpr,
            TILE: tl.constexpr, WP: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr, UNROLL: tl.constexpr,
            nprog, PC: tl.constexpr):  # fmt: skip
    """y = x W^T for the rows x [WP, INP] in registers (W [OUT, IN] row-major, read once for every row);
    y's rows stored ``y_stride`` apart, rounded to DT, in blocks of TILE / (INP WP) output columns:
    this program's blocks (program p of P: blocks p, p + P, ...; P = PC, or the runtime ``nprog`` when
    PC is 0)."""
    BO: tl.constexpr = TILE // (INP * WP)  # TILE >= INP * WP (grow_fused)
    o_i = tl.arange(0, INP)
    if WP == 1:
        xr = tl.reshape(x, (INP,))  # one node: a [BO, INP] block against one vector (no 3-D product)
    for o0 in tl.range(
        0, OUT, _stride(nprog, PC, BO), loop_unroll_factor=UNROLL
    ):  # P > 1: the last block may be empty
        o_o = o0 + tl.arange(0, BO)
        if PC != 1:
            o_o += tl.program_id(0) * BO
        if WP == 1:
            m = (o_o[:, None] < OUT) & (o_i[None, :] < IN)
            w = tl.load(w_ptr + o_o[:, None] * IN + o_i[None, :], mask=m, other=0.0).to(ACC)
            y1 = tl.sum(w * xr[None, :], axis=1)
            tl.store(y_ptr + o_o, round_to(y1, DT).to(y_ptr.dtype.element_ty), mask=o_o < OUT)
        else:
            # the tile loaded as [1, BO, INP] pointers: it lands in the product's layout, with no layout
            # conversion through shared memory in every iteration (a [BO, INP] load broadcast to 3-D has one)
            m3 = (o_o[None, :, None] < OUT) & (o_i[None, None, :] < IN)
            w3 = tl.load(w_ptr + o_o[None, :, None] * IN + o_i[None, None, :], mask=m3, other=0.0).to(ACC)
            _store_rows(y_ptr, y_stride, jj, rows, o_o, tl.sum(w3 * x[:, None, :], axis=2), OUT, DT)


@triton.jit
def _linear_in_chunks(w_ptr, x_ptr, x_row, u_ptr, y_ptr, y_stride, jj, rows, OUT: tl.constexpr,
                      IN: tl.constexpr, CK: tl.constexpr, BO: tl.constexpr, WP: tl.constexpr,
                      ACC: tl.constexpr, DT: tl.constexpr, UNROLL: tl.constexpr, nprog, PC: tl.constexpr,
                      GATED: tl.constexpr, CG: tl.constexpr):  # fmt: skip
    """:func:`_linear` of rows read from memory CK columns a time (row j at ``x_ptr + x_row[j]``; GATED:
    SiLU(x) * u with u at ``u_ptr + x_row[j]``, rounded as torch), for inputs too wide to hold every
    node's whole row in registers: blocks of BO output rows over the programs, each summing its [WP, BO]
    outputs over the chunks."""
    o_c = tl.arange(0, CK)
    for o0 in tl.range(0, OUT, _stride(nprog, PC, BO), loop_unroll_factor=UNROLL):
        o_o = o0 + tl.arange(0, BO)
        if PC != 1:
            o_o += tl.program_id(0) * BO
        acc = tl.zeros([WP, BO], dtype=ACC)
        for k0 in tl.range(0, IN, CK):
            kk = k0 + o_c
            m3 = (o_o[None, :, None] < OUT) & (kk[None, None, :] < IN)
            w3 = tl.load(w_ptr + o_o[None, :, None] * IN + kk[None, None, :], mask=m3, other=0.0).to(ACC)
            mx = rows[:, None] & (kk[None, :] < IN)
            x = ld(x_ptr + x_row[:, None] + kk[None, :], mx, CG).to(ACC)
            if GATED:
                u = ld(u_ptr + x_row[:, None] + kk[None, :], mx, CG).to(ACC)
                x = round_to(round_to(x / (1.0 + tl.exp(-x)), DT) * u, DT)
            acc += tl.sum(w3 * x[:, None, :], axis=2)
        _store_rows(y_ptr, y_stride, jj, rows, o_o, acc, OUT, DT)


@triton.jit
def _sync(sync_ptr, n, K: tl.constexpr, N: tl.constexpr, nprog, PC: tl.constexpr, SPIN: tl.constexpr):
    """Barrier ``K`` (1-based) of the launch whose step starts at node ``n``: a block barrier, and on
    ``nprog`` programs (PC 0) a grid barrier on counter ``sync[n]`` (module docstring); past SPIN polls
    it sets ``sync[N]``."""
    if PC != 1:
        grid_sync(sync_ptr + n, sync_ptr + N, K * nprog, SPIN)
    else:
        tl.debug_barrier()


@triton.jit
def _pick(v, jj, j):
    """Entry ``j`` of the [WP] vector v."""
    return tl.sum(tl.where(jj == j, v, 0), axis=0)


@triton.jit
def _pops(n0, m, key_ptr, rank_ptr, order_ptr, valid_ptr, dep_ptr, score_ptr, ctok_ptr, clq_ptr,
          N: tl.constexpr, NP: tl.constexpr, KEEP: tl.constexpr, W: tl.constexpr,
          WP: tl.constexpr):  # fmt: skip
    """The step's ``m`` pops from the tables (reads only; the table kept in registers between pops): pop j
    takes the best candidate (float64 key, push order as the tie-break) as node ``n0 + j`` and pushes its
    parent's next rank with order ``2 n0 - 1 + j``. Returns the updated table (key, rank, order, valid
    [NP]) and per pop [WP]: parent (0 when the table was empty), token, depth, score (-inf when empty),
    liveness."""
    o = tl.arange(0, NP)
    inb = o < N
    jj = tl.arange(0, WP)
    valid = tl.load(valid_ptr + o, mask=inb, other=0) != 0
    key = tl.load(key_ptr + o, mask=inb & valid, other=0.0)
    order = tl.load(order_ptr + o, mask=inb, other=0)
    rank = tl.load(rank_ptr + o, mask=inb, other=0)
    par_v = tl.zeros([WP], dtype=tl.int32)
    tok_v = tl.zeros([WP], dtype=tl.int64)
    dep_v = tl.zeros([WP], dtype=tl.int32)
    scn_v = tl.full([WP], float("-inf"), dtype=tl.float64)
    live_v = tl.zeros([WP], dtype=tl.int32)
    for j in tl.static_range(W):
        act = j < m
        k = tl.where(valid, key, float("-inf"))
        best = tl.max(k, axis=0)
        hits = valid & (k == best)
        live = (tl.sum(hits.to(tl.int32), axis=0) > 0) & act
        ordh = tl.where(hits, order, 2147483647)
        first = tl.min(ordh, axis=0)
        p = tl.min(tl.where(hits & (ordh == first), o, NP), axis=0)
        p = tl.where(live, p, 0)
        at = o == p
        r = tl.sum(tl.where(at, rank, 0), axis=0)
        token = tl.load(ctok_ptr + p * KEEP + tl.minimum(r, KEEP - 1))
        depth = tl.load(dep_ptr + p) + 1
        score_n = tl.where(live, tl.sum(tl.where(at, key, 0.0), axis=0), float("-inf"))
        score_p = tl.load(score_ptr + p)
        lq_next = tl.load(clq_ptr + p * KEEP + tl.minimum(r + 1, KEEP - 1))
        upd = at & act
        key = tl.where(upd, score_p + lq_next, key)
        rank = tl.where(upd, r + 1, rank)
        order = tl.where(upd, 2 * n0 - 1 + j, order)
        valid = tl.where(upd, live & (r + 1 < KEEP), valid)
        here = jj == j
        par_v = tl.where(here, p, par_v)
        tok_v = tl.where(here, token, tok_v)
        dep_v = tl.where(here, depth, dep_v)
        scn_v = tl.where(here, score_n, scn_v)
        live_v = tl.where(here, live.to(tl.int32), live_v)
    return key, rank, order, valid, par_v, tok_v, dep_v, scn_v, live_v != 0


@triton.jit
def _pops_write(n0, m, key, rank, order, valid, par_v, tok_v, dep_v, scn_v, live_v,
                key_ptr, rank_ptr, order_ptr, valid_ptr, tok_ptr, par_ptr, dep_ptr, score_ptr, anc_ptr,
                N: tl.constexpr, NP: tl.constexpr, W: tl.constexpr, WP: tl.constexpr):  # fmt: skip
    """The step's nodes' entries (padding: token 0, parent -1) and the updated candidate table."""
    o = tl.arange(0, NP)
    inb = o < N
    jj = tl.arange(0, WP)
    tl.store(key_ptr + o, key, mask=inb & valid)
    tl.store(rank_ptr + o, rank, mask=inb)
    tl.store(order_ptr + o, order, mask=inb)
    tl.store(valid_ptr + o, valid.to(tl.int32), mask=inb)
    rows = jj < m
    tl.store(tok_ptr + n0 + jj, tl.where(live_v, tok_v, 0), mask=rows)
    tl.store(par_ptr + n0 + jj, tl.where(live_v, par_v.to(tl.int64), -1), mask=rows)
    tl.store(dep_ptr + n0 + jj, dep_v, mask=rows)
    tl.store(score_ptr + n0 + jj, scn_v, mask=rows)
    for j in tl.static_range(W):
        if j < m:
            n = n0 + j
            row = tl.load(anc_ptr + _pick(par_v, jj, j) * NP + o, mask=inb, other=0)
            tl.store(anc_ptr + n * NP + o, tl.where(o == n, 1, row).to(tl.int8), mask=inb)


@triton.jit
def _root_write(token, rank_ptr, order_ptr, valid_ptr, tok_ptr, par_ptr, dep_ptr, score_ptr, anc_ptr,
                N: tl.constexpr, NP: tl.constexpr):  # fmt: skip
    """Clear the tables; node 0 is the root."""
    o = tl.arange(0, NP)
    inb = o < N
    zero = tl.zeros([NP], dtype=tl.int32)
    tl.store(valid_ptr + o, zero, mask=inb)
    tl.store(rank_ptr + o, zero, mask=inb)
    tl.store(order_ptr + o, zero, mask=inb)
    tl.store(anc_ptr + o, (o == 0).to(tl.int8), mask=inb)
    tl.store(tok_ptr, token)
    tl.store(par_ptr, -1)
    tl.store(dep_ptr, 0)
    tl.store(score_ptr, 0.0)


@triton.jit
def _popped(tok_ptr, par_ptr, dep_ptr, score_ptr, n0, m, ROOT: tl.constexpr, WP: tl.constexpr):
    """Staged launches: the step's nodes' token, depth, score and liveness [WP] read back from the tables
    (a dead node's token reads 0, not the pop's: only entries nothing reads differ)."""
    jj = tl.arange(0, WP)
    rows = jj < m
    if ROOT:
        live = rows
    else:
        live = tl.load(par_ptr + n0 + jj, mask=rows, other=-1) >= 0
    tok = tl.load(tok_ptr + n0 + jj, mask=rows, other=0)
    dep = tl.load(dep_ptr + n0 + jj, mask=rows, other=0)
    return tok, dep, tl.load(score_ptr + n0 + jj, mask=rows, other=0.0), live


@triton.jit
def _rank_stride(nprog, PC: tl.constexpr, STAGE: tl.constexpr):
    """The step of the ranking's loop over the step's nodes: 1 in a staged launch (one program), else P."""
    if STAGE == 9:
        return 1
    return _stride(nprog, PC, 1)


@triton.jit
def _attention(q_ptr, cache_ptr, o_ptr, vis, c, ACC: tl.constexpr, DT: tl.constexpr, CG: tl.constexpr,
               NP: tl.constexpr, NH: tl.constexpr, HD: tl.constexpr, DM: tl.constexpr):  # fmt: skip
    """Softmax attention of the query at ``q_ptr + c`` over the visible slots' keys and values at
    ``cache_ptr + c`` (columns ``c``: NH heads of HD), stored at ``o_ptr + c`` (rounded as torch)."""
    o = tl.arange(0, NP)
    m2 = vis[:, None] & (c[None, :] < DM)
    kv = cache_ptr + o[:, None] * 2 * DM + c[None, :]
    q = ld(q_ptr + c, c < DM, CG).to(ACC)
    keys = ld(kv, m2, CG).to(ACC)
    s = tl.sum(tl.reshape(keys * q[None, :], (NP, NH, HD)), axis=2)  # [NP, NH]
    scale = 1.0 / tl.sqrt(tl.full([], HD, ACC))
    s = round_to(round_to(s, DT) * scale, DT)
    s = tl.where(vis[:, None], s, float("-inf"))
    e = tl.exp(s - tl.max(s, axis=0)[None, :])
    w = round_to(e / tl.sum(e, axis=0)[None, :], DT)
    vals = ld(kv + DM, m2, CG).to(ACC)
    att = tl.sum(w[:, :, None] * tl.reshape(vals, (NP, NH, HD)), axis=0)  # [NH, HD]
    tl.store(o_ptr + c, round_to(tl.reshape(att, (NH * HD,)), DT).to(o_ptr.dtype.element_ty), mask=c < DM)


@triton.jit
def _attention_head(q_ptr, cache_ptr, o_ptr, vis_ptr, s_ptr, c, ACC: tl.constexpr, DT: tl.constexpr,
                    CG: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, HD: tl.constexpr, DM: tl.constexpr,
                    CH: tl.constexpr, UNROLL: tl.constexpr):  # fmt: skip
    """:func:`_attention` of one head (columns ``c``), CH slots a time: the scores, then the weights, in
    this head's scratch ``s_ptr`` [2 NP] (ACC); the visible slots read from the ancestor row."""
    q = ld(q_ptr + c, c < DM, CG).to(ACC)
    scale = 1.0 / tl.sqrt(tl.full([], HD, ACC))
    for r0 in tl.range(0, NP, CH, loop_unroll_factor=UNROLL):
        rr = r0 + tl.arange(0, CH)
        vis = ld(vis_ptr + rr, rr < N, CG) != 0
        keys = ld(cache_ptr + rr[:, None] * 2 * DM + c[None, :], vis[:, None], CG).to(ACC)
        s = round_to(round_to(tl.sum(keys * q[None, :], axis=1), DT) * scale, DT)
        tl.store(s_ptr + rr, tl.where(vis, s, float("-inf")))
    tl.debug_barrier()
    o = tl.arange(0, NP)
    s = tl.load(s_ptr + o)
    e = tl.exp(s - tl.max(s, axis=0))
    tl.store(s_ptr + NP + o, round_to(e / tl.sum(e, axis=0), DT))
    tl.debug_barrier()
    att = tl.zeros([HD], dtype=ACC)
    for r0 in tl.range(0, NP, CH, loop_unroll_factor=UNROLL):
        rr = r0 + tl.arange(0, CH)
        vis = ld(vis_ptr + rr, rr < N, CG) != 0
        vals = ld(cache_ptr + rr[:, None] * 2 * DM + DM + c[None, :], vis[:, None], CG).to(ACC)
        att += tl.sum(tl.load(s_ptr + NP + rr)[:, None] * vals, axis=0)
    tl.store(o_ptr + c, round_to(att, DT).to(o_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["n0", "m", "nprog"])
def _step_kernel(
    # growth state
    key_ptr, rank_ptr, order_ptr, valid_ptr, tok_ptr, par_ptr, dep_ptr, score_ptr, anc_ptr,
    ctok_ptr, clq_ptr, cache_ptr, sw_ptr, sa_ptr, sync_ptr,
    # inputs
    root_ptr, base_ptr, emb_ptr, pemb_ptr, pl_ptr, pid_ptr,
    # weights
    we_ptr, n1_ptr, wq_ptr, wk_ptr, wv_ptr, wo_ptr, n2_ptr, wg_ptr, wu_ptr, wd_ptr, n3_ptr, wout_ptr,
    n0, m, nprog, eps,
    N: tl.constexpr, NP: tl.constexpr, KEEP: tl.constexpr, D: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, H: tl.constexpr, HP: tl.constexpr,
    DM: tl.constexpr, DMP: tl.constexpr, NH: tl.constexpr, HD: tl.constexpr,
    I: tl.constexpr, IP: tl.constexpr, TILE: tl.constexpr, CHUNK: tl.constexpr, CK: tl.constexpr,
    BO: tl.constexpr, BP: tl.constexpr, BR: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
    ROOT: tl.constexpr, SCORE: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr, UNROLL: tl.constexpr,
    PC: tl.constexpr, STAGE: tl.constexpr, HEADWISE: tl.constexpr, CH: tl.constexpr, SPIN: tl.constexpr,
):  # fmt: skip
    """The step of nodes ``n0`` .. ``n0 + m - 1`` (m <= W): pop them (unless ROOT: node 0, m = 1), then
    score them (if SCORE), on program ``program_id`` of P: PC = 1 one program; PC = 0 ``nprog`` programs
    with grid barriers (one binary for every P > 1); PC = P > 1 staged. STAGE -1: every stage, barriers
    between; STAGE s >= 0: stage s alone (staged launches). See the module docstring."""
    CG: tl.constexpr = PC == 0  # scratch other programs wrote in this launch: loads bypass L1
    pid = tl.program_id(0)
    o = tl.arange(0, NP)
    jj = tl.arange(0, WP)
    rows = jj < m
    if STAGE <= 0:
        if ROOT:
            tok_v = tl.where(jj == 0, tl.load(root_ptr), 0)
            dep_v = tl.zeros([WP], dtype=tl.int32)
            scn_v = tl.zeros([WP], dtype=tl.float64)
            live_v = jj == 0
        else:
            key, rank, order, valid, par_v, tok_v, dep_v, scn_v, live_v = _pops(
                n0, m, key_ptr, rank_ptr, order_ptr, valid_ptr, dep_ptr, score_ptr, ctok_ptr, clq_ptr,
                N, NP, KEEP, W, WP,
            )  # fmt: skip
        if (STAGE == 0) or (not SCORE):  # the writes now (else after barrier 1: every pop has read)
            tl.debug_barrier()  # every read of the tables above happens before a write below
            if pid == 0:
                if ROOT:
                    _root_write(tl.load(root_ptr), rank_ptr, order_ptr, valid_ptr, tok_ptr, par_ptr, dep_ptr,
                                score_ptr, anc_ptr, N, NP)  # fmt: skip
                else:
                    _pops_write(n0, m, key, rank, order, valid, par_v, tok_v, dep_v, scn_v, live_v, key_ptr,
                                rank_ptr, order_ptr, valid_ptr, tok_ptr, par_ptr, dep_ptr, score_ptr, anc_ptr,
                                N, NP, W, WP)  # fmt: skip
    else:
        tok_v, dep_v, scn_v, live_v = _popped(tok_ptr, par_ptr, dep_ptr, score_ptr, n0, m, ROOT, WP)
    if SCORE and (STAGE != 0):
        d_v = tl.minimum(dep_v, D - 1)
        # scratch (adapter dtype), one region per value and row (no region is rewritten within a launch)
        se = sw_ptr  # W_e E[token]
        sq = se + WP * DMP  # q
        so = sq + WP * DMP  # attention output
        sy = so + WP * DMP  # W_o attention
        sd = sy + WP * DMP  # down_proj output
        sg = sd + WP * DMP  # gate_proj output
        sup = sg + WP * IP  # up_proj output
        su = sup + WP * IP  # u
        ss = su + WP * HP  # pool scores
        cache_n = cache_ptr + n0 * 2 * DM  # the step's first cache slot
        # 1. W_e E[token]
        if (STAGE < 0) or (STAGE == 1):
            if CHUNK:  # E[token] read CK columns a time
                _linear_in_chunks(we_ptr, emb_ptr, tok_v * H, emb_ptr, se, DMP, jj, rows, DM, H, CK, BO, WP,
                                  ACC, DT, UNROLL, nprog, PC, False, False)  # fmt: skip
            else:
                e_tok = _load_rows(emb_ptr, H, tok_v, rows, H, HP, ACC, False)
                _linear(we_ptr, e_tok, se, DMP, jj, rows, DM, H, HP, TILE, WP, ACC, DT, UNROLL, nprog, PC)
        if STAGE < 0:
            _sync(sync_ptr, n0, 1, N, nprog, PC, SPIN)
            if pid == 0:
                if ROOT:
                    _root_write(tl.load(root_ptr), rank_ptr, order_ptr, valid_ptr, tok_ptr, par_ptr, dep_ptr,
                                score_ptr, anc_ptr, N, NP)  # fmt: skip
                else:
                    _pops_write(n0, m, key, rank, order, valid, par_v, tok_v, dep_v, scn_v, live_v, key_ptr,
                                rank_ptr, order_ptr, valid_ptr, tok_ptr, par_ptr, dep_ptr, score_ptr, anc_ptr,
                                N, NP, W, WP)  # fmt: skip
        # 2. x = base[d] + W_e E[token]; q, k, v of RMSNorm(x); k and v go to the nodes' cache slots
        if (STAGE < 0) or (STAGE == 2):
            x = _layer_input(base_ptr, se, d_v, jj, rows, DM, DMP, ACC, DT, CG)
            a = _rmsnorm(x, n1_ptr, eps, DM, DMP, ACC, DT)
            _linear(wq_ptr, a, sq, DMP, jj, rows, DM, DM, DMP, TILE, WP, ACC, DT, UNROLL, nprog, PC)
            _linear(wk_ptr, a, cache_n, 2 * DM, jj, rows, DM, DM, DMP, TILE, WP, ACC, DT, UNROLL, nprog, PC)
            _linear(wv_ptr, a, cache_n + DM, 2 * DM, jj, rows, DM, DM, DMP, TILE, WP, ACC, DT, UNROLL, nprog,
                    PC)  # fmt: skip
        if STAGE < 0:
            _sync(sync_ptr, n0, 2, N, nprog, PC, SPIN)
        # 3. attention of each node over its ancestors' slots and its own (its ancestor row): per (node,
        # head) over the programs, or per node (all heads at once)
        if (STAGE < 0) or (STAGE == 3):
            if HEADWISE:
                for h0 in tl.range(0, m * NH, _stride(nprog, PC, 1)):
                    if h0 + pid < m * NH:
                        idx = h0 + pid
                        j, head = idx // NH, idx % NH
                        c = head * HD + tl.arange(0, HD)
                        _attention_head(sq + j * DMP, cache_ptr, so + j * DMP, anc_ptr + (n0 + j) * NP,
                                        sa_ptr + WP * KP + idx * 2 * NP, c, ACC, DT, CG, N, NP, HD, DM, CH,
                                        UNROLL)  # fmt: skip
            else:
                for j0 in tl.range(0, m, _stride(nprog, PC, 1)):
                    if j0 + pid < m:
                        j = j0 + pid
                        vis = ld(anc_ptr + (n0 + j) * NP + o, o < N, CG) != 0
                        _attention(sq + j * DMP, cache_ptr, so + j * DMP, vis, tl.arange(0, DMP), ACC, DT, CG,
                                   NP, NH, HD, DM)  # fmt: skip
        if STAGE < 0:
            _sync(sync_ptr, n0, 3, N, nprog, PC, SPIN)
        # 4. W_o attention
        if (STAGE < 0) or (STAGE == 4):
            att = _load_rows(so, DMP, jj, rows, DM, DMP, ACC, CG)
            _linear(wo_ptr, att, sy, DMP, jj, rows, DM, DM, DMP, TILE, WP, ACC, DT, UNROLL, nprog, PC)
        if STAGE < 0:
            _sync(sync_ptr, n0, 4, N, nprog, PC, SPIN)
        # 5. y = x + W_o attention; gate and up of RMSNorm(y)
        if (STAGE < 0) or (STAGE == 5):
            x = _layer_input(base_ptr, se, d_v, jj, rows, DM, DMP, ACC, DT, CG)
            y = round_to(x + _load_rows(sy, DMP, jj, rows, DM, DMP, ACC, CG), DT)
            b = _rmsnorm(y, n2_ptr, eps, DM, DMP, ACC, DT)
            _linear(wg_ptr, b, sg, IP, jj, rows, I, DM, DMP, TILE, WP, ACC, DT, UNROLL, nprog, PC)
            _linear(wu_ptr, b, sup, IP, jj, rows, I, DM, DMP, TILE, WP, ACC, DT, UNROLL, nprog, PC)
        if STAGE < 0:
            _sync(sync_ptr, n0, 5, N, nprog, PC, SPIN)
        # 6. down_proj of SiLU(gate) * up
        if (STAGE < 0) or (STAGE == 6):
            if CHUNK:  # SiLU(gate) * up made CK columns a time
                _linear_in_chunks(wd_ptr, sg, jj * IP, sup, sd, DMP, jj, rows, DM, I, CK, BO, WP, ACC, DT,
                                  UNROLL, nprog, PC, True, CG)  # fmt: skip
            else:
                g = _load_rows(sg, IP, jj, rows, I, IP, ACC, CG)
                up = _load_rows(sup, IP, jj, rows, I, IP, ACC, CG)
                prod = round_to(round_to(g / (1.0 + tl.exp(-g)), DT) * up, DT)
                _linear(wd_ptr, prod, sd, DMP, jj, rows, DM, I, IP, TILE, WP, ACC, DT, UNROLL, nprog, PC)
        if STAGE < 0:
            _sync(sync_ptr, n0, 6, N, nprog, PC, SPIN)
        # 7. u = W_out RMSNorm(y + MLP)
        if (STAGE < 0) or (STAGE == 7):
            x = _layer_input(base_ptr, se, d_v, jj, rows, DM, DMP, ACC, DT, CG)
            y = round_to(x + _load_rows(sy, DMP, jj, rows, DM, DMP, ACC, CG), DT)
            hpre = round_to(y + _load_rows(sd, DMP, jj, rows, DM, DMP, ACC, CG), DT)
            h = _rmsnorm(hpre, n3_ptr, eps, DM, DMP, ACC, DT)
            _linear(wout_ptr, h, su, HP, jj, rows, H, DM, DMP, TILE, WP, ACC, DT, UNROLL, nprog, PC)
        if STAGE < 0:
            _sync(sync_ptr, n0, 7, N, nprog, PC, SPIN)
        # 8. pool scores l_d + <u, E[pool]>, per node in blocks of BP pool tokens over the programs
        if (STAGE < 0) or (STAGE == 8):
            hh = tl.arange(0, HP)
            for j in tl.range(0, m):
                d = _pick(d_v, jj, j)
                u = _load_vec(su + j * HP, H, HP, ACC, CG)
                for k0 in tl.range(0, K, _stride(nprog, PC, BP), loop_unroll_factor=UNROLL):
                    kk = k0 + pid * BP + tl.arange(0, BP)
                    em = (kk[:, None] < K) & (hh[None, :] < H)
                    prow = tl.load(pemb_ptr + (d * K + kk[:, None]) * H + hh[None, :], mask=em, other=0.0)
                    dot = round_to(tl.sum(prow.to(ACC) * u[None, :], axis=1), DT)
                    sc = round_to(tl.load(pl_ptr + d * K + kk, mask=kk < K, other=0.0).to(ACC) + dot, DT)
                    tl.store(ss + j * KP + kk, sc.to(ss.dtype.element_ty), mask=kk < K)
        if STAGE < 0:
            _sync(sync_ptr, n0, 8, N, nprog, PC, SPIN)
        # 9. per node over the programs (staged: one): log-softmax over the pool, then the KEEP best
        # children (ties: the lower position) and the node's first-child candidate entry
        if (STAGE < 0) or (STAGE == 9):
            for j0 in tl.range(0, m, _rank_stride(nprog, PC, STAGE)):
                if j0 + pid < m:
                    j = j0 + pid
                    n = n0 + j
                    d = _pick(d_v, jj, j)
                    lq_ptr = sa_ptr + j * KP
                    ok = tl.arange(0, KP)
                    inpool = ok < K
                    sc = tl.where(inpool, _load_vec(ss + j * KP, K, KP, ACC, CG), float("-inf"))
                    top = tl.max(sc, axis=0)
                    lse = tl.log(tl.sum(tl.where(inpool, tl.exp(sc - top), 0.0), axis=0))
                    lq = sc - top - lse
                    tl.store(lq_ptr + ok, lq, mask=inpool)
                    tl.debug_barrier()
                    if ACC == tl.float32:  # noqa: SIM300 - one sort of (order-preserving bits of log q, position) keys
                        bits = (lq + 0.0).to(tl.uint32, bitcast=True)  # + 0.0: -0.0 ties with 0.0
                        mono = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
                        keys = (tl.where(inpool, mono, 0).to(tl.uint64) << 32) | (KP - 1 - ok).to(tl.uint64)
                        best = (KP - 1 - (tl.sort(keys, descending=True) & 0xFFFFFFFF)).to(
                            tl.int32
                        )  # positions, best first
                        put = ok < KEEP
                        vi = tl.load(lq_ptr + best, mask=put, other=0.0)
                        tl.store(clq_ptr + n * KEEP + ok, vi.to(tl.float64), mask=put)
                        tl.store(
                            ctok_ptr + n * KEEP + ok,
                            tl.load(pid_ptr + d * K + best, mask=put, other=0),
                            mask=put,
                        )
                    else:  # float64: rank by counting, BR pool tokens a time
                        for i0 in tl.range(0, K, BR, loop_unroll_factor=UNROLL):
                            ii = i0 + tl.arange(0, BR)
                            vi = tl.load(lq_ptr + ii, mask=ii < K, other=0.0)
                            tie = (lq[None, :] == vi[:, None]) & (ok[None, :] < ii[:, None])
                            rk = tl.sum(
                                (((lq[None, :] > vi[:, None]) | tie) & inpool[None, :]).to(tl.int32), axis=1
                            )
                            put = (ii < K) & (rk < KEEP)
                            tl.store(clq_ptr + n * KEEP + rk, vi.to(tl.float64), mask=put)
                            tl.store(
                                ctok_ptr + n * KEEP + rk,
                                tl.load(pid_ptr + d * K + ii, mask=put, other=0),
                                mask=put,
                            )
                    live = _pick(live_v.to(tl.int32), jj, j) != 0
                    tl.store(key_ptr + n, _pick(scn_v, jj, j) + tl.max(lq, axis=0).to(tl.float64))
                    tl.store(valid_ptr + n, (live & (_pick(dep_v, jj, j) < D)).to(tl.int32))
                    if not ROOT:
                        tl.store(order_ptr + n, 2 * n0 - 1 + W + j)


_SLOTS: dict[tuple, int] = {}  # (device, launch constants) -> programs the device holds at once


def _device_slots(dev: torch.device, args: list, eps: float, consts: dict) -> int:
    """:func:`~repro.grid.held_programs` of the multi-program binary for these launch constants (compiled
    once; asked once per device and constants, not per growth)."""
    key = (dev, tuple(sorted((k, repr(v)) for k, v in consts.items())))
    if key not in _SLOTS:
        binary = _step_kernel.warmup(*args, 3, 2, 2, eps, ROOT=False, SCORE=True, PC=0, STAGE=-1, grid=(2,),
                                     **consts)  # fmt: skip
        binary._init_handles()
        _SLOTS[key] = held_programs(binary, consts["num_warps"], dev)
    return _SLOTS[key]


def grow_fused(
    weaver: WeaverModel,
    embedding: torch.Tensor,
    budget: int,
    root: torch.Tensor,
    rows: torch.Tensor,
    pool_logits: torch.Tensor,
    pool_ids: torch.Tensor,
    feature: torch.Tensor,
    num_warps: int = 8,
    tile: int = 8192,
    unroll: int = 1,
    programs: int | None = None,
    staged: bool | None = None,
    spin_cap: int = SPIN_CAP,
    width: int = 1,
) -> FusedGrowth:
    """:func:`repro.drafters.weaver_growth.grow_on_device`'s tree (Weaver steps of ``width`` nodes) from
    ``1 + ceil(budget / width)`` launches of one kernel (module docstring) and the barrier error flag.
    Capture-safe; CUDA tensors, or CPU ones under TRITON_INTERPRET=1.

    Launch options (speed only, never the tree): ``num_warps`` of each program, ``tile`` the elements
    of one loaded block (weights: tile / (in-width x the step's nodes, a power of two) rows a time, at
    least one; pool: tile / hidden rows; the ranking: tile / pool rows), ``unroll`` the loops' unroll
    factor, ``programs`` P (None: :func:`device_programs`; with grid barriers clamped to what the device
    holds at once: SMs x :func:`resident_ctas` of the compiled kernel). ``staged`` (default: off CUDA):
    one launch per stage instead of grid barriers (the interpreter's way to run P > 1; on CUDA a check
    of the partitions)."""
    w, cfg = weaver, weaver.config
    dev, dt = rows.device, w.dtype
    depth, k = pool_ids.shape
    n, keep = budget + 1, min(k, budget)
    acc = torch.float64 if dt == torch.float64 else torch.float32
    consts = {
        **step_constants(cfg, budget, k, depth, dt, width, tile, unroll, spin_cap),
        "num_warps": num_warps,
    }
    np_, dmp, ip, kp, hp, wp = (consts[c] for c in ("NP", "DMP", "IP", "KP", "HP", "WP"))
    cuda = dev.type == "cuda"
    if programs is None:
        programs = device_programs(cfg, budget, k, dev, tile, width)
    staged = (programs > 1 and not cuda) if staged is None else staged
    if programs > 1 and not staged and not cuda:
        raise ValueError("P > 1 programs with grid barriers need a GPU (the interpreter runs them staged)")
    base = (w.hidden_proj(rows) + w.feature_proj(feature)).contiguous()  # [D, d_model]
    state = {
        "key": torch.empty(n, dtype=torch.float64, device=dev),
        "rank": torch.empty(n, dtype=torch.int32, device=dev),
        "order": torch.empty(n, dtype=torch.int32, device=dev),
        "valid": torch.empty(n, dtype=torch.int32, device=dev),
        "tokens": torch.empty(n, dtype=torch.long, device=dev),
        "parents": torch.empty(n, dtype=torch.long, device=dev),
        "depth": torch.empty(n, dtype=torch.int32, device=dev),
        "scores": torch.empty(n, dtype=torch.float64, device=dev),
        "anc": torch.empty(n, np_, dtype=torch.int8, device=dev),
        "ctok": torch.empty(n, keep, dtype=torch.long, device=dev),
        "clq": torch.empty(n, keep, dtype=torch.float64, device=dev),
        "cache": torch.empty(n, 2, cfg.d_model, dtype=dt, device=dev),
        "sw": torch.empty(wp * (5 * dmp + 2 * ip + hp + kp), dtype=dt, device=dev),
        # per node of a step: log q, and per head: s, w
        "sa": torch.empty(wp * (kp + 2 * cfg.num_heads * np_), dtype=acc, device=dev),
        "sync": torch.zeros(n + 1, dtype=torch.int32, device=dev),  # barrier counter per step, error flag
    }
    weights = [
        w.token_proj.weight, w.input_layernorm.weight, w.q_proj.weight, w.k_proj.weight, w.v_proj.weight,
        w.o_proj.weight, w.post_attention_layernorm.weight, w.mlp.gate_proj.weight, w.mlp.up_proj.weight,
        w.mlp.down_proj.weight, w.norm.weight, w.out_proj.weight,
    ]  # fmt: skip
    pool_emb = embedding[pool_ids]  # [D, K, H]: read in place by every node (no dependent gather)
    inputs = [root, base, embedding.contiguous(), pool_emb, pool_logits.contiguous(), pool_ids.contiguous()]
    args = [*state.values(), *inputs, *[p.contiguous() for p in weights]]
    if cuda and programs > 1 and not staged:  # every program resident at once (the grid barriers)
        programs = min(programs, _device_slots(dev, args, cfg.rms_norm_eps, consts))
    programs = max(1, programs)
    steps = [(0, 1, True)] + [
        (first, min(width, n - first), first + width <= budget) for first in range(1, n, width)
    ]  # (first node, nodes, scored): the root, then the Weaver steps; the last one's nodes are not scored
    for first, m, score in steps:
        root_step = first == 0
        if staged:  # the pops, then each stage a launch (the pops and the ranking on one program)
            for s in range(STAGES if score else 1):
                grid = 1 if s in (0, STAGES - 1) else programs
                _step_kernel[(grid,)](*args, first, m, programs, cfg.rms_norm_eps, ROOT=root_step,
                                      SCORE=score, PC=programs, STAGE=s, **consts)  # fmt: skip
        else:
            p = programs if score else 1  # the last step: the pops alone
            _step_kernel[(p,)](*args, first, m, p, cfg.rms_norm_eps, ROOT=root_step, SCORE=score,
                               PC=1 if p == 1 else 0, STAGE=-1, **consts)  # fmt: skip
    return FusedGrowth(state["tokens"], state["parents"], state["scores"], state["sync"][n:], programs)


def step_constants(
    cfg: WeaverConfig,
    budget: int,
    pool: int,
    depth: int,
    dtype: torch.dtype,
    width: int = 1,
    tile: int = 8192,
    unroll: int = 1,
    spin_cap: int = SPIN_CAP,
) -> dict[str, Any]:
    """The step kernel's shape and launch constexprs (all but ROOT, SCORE, PC and STAGE, which vary per
    launch) for a Weaver of ``cfg`` growing ``budget`` nodes over ``depth`` pools of ``pool`` in steps
    of ``width`` nodes, data in ``dtype`` (:func:`grow_fused`'s launch options ``tile``, ``unroll``,
    ``spin_cap``)."""
    n = budget + 1
    np_, dmp, ip, kp = _p2(n), _p2(cfg.d_model), _p2(cfg.intermediate_size), _p2(pool)
    hp, wp = _p2(cfg.target_hidden_size), _p2(width)
    score_tile = _tile(tile, dmp, ip, hp, kp)
    ltile, chunk, ck = linear_tiles(dmp, ip, hp, wp, tile)
    return dict(
        N=n, NP=np_, KEEP=min(pool, budget), D=depth, K=pool, KP=kp, H=cfg.target_hidden_size, HP=hp,
        DM=cfg.d_model, DMP=dmp, NH=cfg.num_heads, HD=cfg.head_dim, I=cfg.intermediate_size, IP=ip,
        TILE=ltile, CHUNK=chunk, CK=ck, BO=CHUNK_ROWS, BP=max(1, min(kp, score_tile // hp)),
        BR=max(1, min(kp, score_tile // kp)), W=width, WP=wp,
        ACC=tl.float64 if dtype == torch.float64 else tl.float32, DT=tl_dtype(dtype),
        UNROLL=unroll if unroll > 1 else None, HEADWISE=_headwise(np_, dmp), SPIN=spin_cap,
        CH=max(1, min(np_, ATT_CHUNK // cfg.head_dim)),
    )  # fmt: skip
