"""Weaver's device growth fused: one Triton kernel per grown node (:func:`grow_fused`).

The same tree as :func:`repro.drafters.weaver_growth.grow_on_device` (the torch version, about 100
aten ops per node) from one launch per node, in a single program (one CTA: every shape of the tiny
adapter fits one) that runs, in order, with a block barrier between stages that pass vectors through
global scratch:

1. the pop: argmax of the candidate table (float64 keys, push order as the tie-break, validity),
   the new node's token / parent / depth / score / ancestor row, and the parent's next rank pushed;
2. the Weaver layer on the new node alone: input ``base[d] + W_e E[token]``, RMSNorm, q/k/v (k, v
   into the node's cache slot), attention over its ancestors' slots, o_proj, the SwiGLU MLP, the
   final norm and out_proj;
3. pool scores ``l_d + <u, E[pool]>``, log-softmax, the ``keep`` best children (ties go to the lower
   pool position; float32 arithmetic: one sort of keys packing log q's order-preserving bits with the
   position, float64: rank by counting) and the node's first-child candidate entry.

Vectors pass between stages in the adapter's dtype, so a half-precision adapter is rounded where
torch rounds its ops' outputs (arithmetic in float32; float64 for a float64 adapter). The root is
the same kernel without the pop (it also clears the tables). Per step, torch adds only
``base = W_g g + W_f f`` and the pool's embedding rows ``E[pool]`` (four ops). Exact in-row ties of
log q (two pool tokens with the same score under one parent) are the one place the order may differ
from torch's ``topk``, whose tie order is unspecified; everything else (scores, push order, padding)
is the torch version's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from repro.drafters.weaver_growth import DeviceGrowth

if TYPE_CHECKING:
    from repro.drafters.weaver import WeaverConfig, WeaverModel

LIMITS = {"d_model": 512, "intermediate_size": 2048, "target_hidden_size": 2048, "pool": 2048, "nodes": 256}


def fits(config: WeaverConfig, budget: int, pool: int) -> bool:
    """Whether one program per node holds the adapter's shapes (:data:`LIMITS`; d_model and head_dim
    powers of two)."""
    sizes = {
        "d_model": config.d_model,
        "intermediate_size": config.intermediate_size,
        "target_hidden_size": config.target_hidden_size,
        "pool": pool,
        "nodes": budget + 1,
    }
    pow2 = all(x == _p2(x) for x in (config.d_model, config.head_dim))
    return pow2 and all(sizes[k] <= v for k, v in LIMITS.items())


def _p2(x: int) -> int:
    return triton.next_power_of_2(int(x))


@triton.jit
def _rnd(x, DT: tl.constexpr):
    """x (float32 or float64) rounded to DT, round to nearest even, back in x's dtype. bfloat16 by integer
    arithmetic on the float32 bits (exact in Triton's CPU interpreter too, whose casts truncate)."""
    if DT == tl.bfloat16:  # noqa: SIM300 - constexpr dtypes
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(x.dtype)
    if DT == tl.float16:  # noqa: SIM300
        return x.to(DT, fp_downcast_rounding="rtne").to(x.dtype)
    return x.to(DT).to(x.dtype)


@triton.jit
def _load_vec(ptr, N: tl.constexpr, NP: tl.constexpr, ACC: tl.constexpr):
    o = tl.arange(0, NP)
    return tl.load(ptr + o, mask=o < N, other=0.0).to(ACC)


@triton.jit
def _rmsnorm(x, w_ptr, eps, N: tl.constexpr, NP: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr):
    """DraftRMSNorm: w * (x / rms(x) rounded to DT), rounded to DT."""
    ms = tl.sum(x * x, axis=0) / N
    y = _rnd(x * (1.0 / tl.sqrt(ms + eps)), DT)
    return _rnd(_load_vec(w_ptr, N, NP, ACC) * y, DT)


@triton.jit
def _linear(w_ptr, x, y_ptr, OUT: tl.constexpr, IN: tl.constexpr, INP: tl.constexpr, TILE: tl.constexpr,
            ACC: tl.constexpr, DT: tl.constexpr, UNROLL: tl.constexpr):  # fmt: skip
    """y = W x (W [OUT, IN] row-major) for x [INP] in registers; y stored rounded to DT, TILE / INP rows
    a time."""
    BO: tl.constexpr = TILE // INP  # TILE >= INP (grow_fused)
    o_i = tl.arange(0, INP)
    for o0 in tl.range(0, OUT, BO, loop_unroll_factor=UNROLL):
        o_o = o0 + tl.arange(0, BO)
        m = (o_o[:, None] < OUT) & (o_i[None, :] < IN)
        w = tl.load(w_ptr + o_o[:, None] * IN + o_i[None, :], mask=m, other=0.0).to(ACC)
        y = tl.sum(w * x[None, :], axis=1)
        tl.store(y_ptr + o_o, _rnd(y, DT).to(y_ptr.dtype.element_ty), mask=o_o < OUT)


@triton.jit(do_not_specialize=["n"])
def _node_kernel(
    # growth state
    key_ptr, rank_ptr, order_ptr, valid_ptr, tok_ptr, par_ptr, dep_ptr, score_ptr, anc_ptr,
    ctok_ptr, clq_ptr, cache_ptr, sw_ptr, sa_ptr,
    # inputs
    root_ptr, base_ptr, emb_ptr, pemb_ptr, pl_ptr, pid_ptr,
    # weights
    we_ptr, n1_ptr, wq_ptr, wk_ptr, wv_ptr, wo_ptr, n2_ptr, wg_ptr, wu_ptr, wd_ptr, n3_ptr, wout_ptr,
    n, eps,
    N: tl.constexpr, NP: tl.constexpr, KEEP: tl.constexpr, D: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, H: tl.constexpr, HP: tl.constexpr,
    DM: tl.constexpr, DMP: tl.constexpr, NH: tl.constexpr, HD: tl.constexpr,
    I: tl.constexpr, IP: tl.constexpr, TILE: tl.constexpr, BP: tl.constexpr, BR: tl.constexpr,
    ROOT: tl.constexpr, SCORE: tl.constexpr, ACC: tl.constexpr, DT: tl.constexpr, UNROLL: tl.constexpr,
):  # fmt: skip
    """Node ``n``: pop it (unless ROOT), then score it (if SCORE). See the module docstring."""
    o = tl.arange(0, NP)
    inb = o < N
    if ROOT:
        zero = tl.zeros([NP], dtype=tl.int32)
        tl.store(valid_ptr + o, zero, mask=inb)
        tl.store(rank_ptr + o, zero, mask=inb)
        tl.store(order_ptr + o, zero, mask=inb)
        tl.store(anc_ptr + o, (o == 0).to(tl.int8), mask=inb)
        token = tl.load(root_ptr)
        tl.store(tok_ptr, token)
        tl.store(par_ptr, -1)
        tl.store(dep_ptr, 0)
        tl.store(score_ptr, 0.0)
        depth = tl.full([], 0, tl.int32)
        live = tl.full([], 1, tl.int32) != 0
        score_n = tl.zeros([], dtype=tl.float64)
    else:
        valid = tl.load(valid_ptr + o, mask=inb, other=0) != 0
        key = tl.where(valid, tl.load(key_ptr + o, mask=inb & valid, other=0.0), float("-inf"))
        best = tl.max(key, axis=0)
        hits = valid & (key == best)
        live = tl.sum(hits.to(tl.int32), axis=0) > 0
        order = tl.where(hits, tl.load(order_ptr + o, mask=inb, other=0), 2147483647)
        first = tl.min(order, axis=0)
        p = tl.min(tl.where(hits & (order == first), o, NP), axis=0)
        p = tl.where(live, p, 0)
        r = tl.load(rank_ptr + p)
        token = tl.load(ctok_ptr + p * KEEP + tl.minimum(r, KEEP - 1))
        depth = tl.load(dep_ptr + p) + 1
        score_n = tl.load(key_ptr + p)
        score_p = tl.load(score_ptr + p)
        row = tl.load(anc_ptr + p * NP + o, mask=inb, other=0)
        nxt = r + 1
        lq = tl.load(clq_ptr + p * KEEP + tl.minimum(nxt, KEEP - 1))
        tl.debug_barrier()  # every read of the table above happens before a write below
        tl.store(tok_ptr + n, tl.where(live, token, 0))
        tl.store(par_ptr + n, tl.where(live, p.to(tl.int64), -1))
        tl.store(dep_ptr + n, depth)
        score_n = tl.where(live, score_n, float("-inf"))
        tl.store(score_ptr + n, score_n)
        tl.store(anc_ptr + n * NP + o, tl.where(o == n, 1, row).to(tl.int8), mask=inb)
        tl.store(key_ptr + p, score_p + lq)
        tl.store(rank_ptr + p, nxt)
        tl.store(order_ptr + p, 2 * n - 1)
        tl.store(valid_ptr + p, (live & (nxt < KEEP)).to(tl.int32))
    if SCORE:
        tl.debug_barrier()
        d = tl.minimum(depth, D - 1)
        # scratch (adapter dtype), one region per value (no slot is rewritten within a kernel)
        se = sw_ptr  # W_e E[token]
        sq = se + DMP  # q
        so = sq + DMP  # attention output
        sy = so + DMP  # W_o attention
        sd = sy + DMP  # down_proj output
        sg = sd + DMP  # gate_proj output
        sup = sg + IP  # up_proj output
        sm = sup + IP  # SiLU(gate) * up
        su = sm + IP  # u
        ss = su + HP  # pool scores
        # 1. x = base[d] + W_e E[token]
        _linear(we_ptr, _load_vec(emb_ptr + token * H, H, HP, ACC), se, DM, H, HP, TILE, ACC, DT, UNROLL)
        tl.debug_barrier()
        x = _rnd(_load_vec(base_ptr + d * DM, DM, DMP, ACC) + _load_vec(se, DM, DMP, ACC), DT)
        # 2. q, k, v of RMSNorm(x); k and v go to the node's cache slot
        a = _rmsnorm(x, n1_ptr, eps, DM, DMP, ACC, DT)
        _linear(wq_ptr, a, sq, DM, DM, DMP, TILE, ACC, DT, UNROLL)
        _linear(wk_ptr, a, cache_ptr + n * 2 * DM, DM, DM, DMP, TILE, ACC, DT, UNROLL)
        _linear(wv_ptr, a, cache_ptr + n * 2 * DM + DM, DM, DM, DMP, TILE, ACC, DT, UNROLL)
        tl.debug_barrier()
        # 3. attention over the ancestors' slots and the node's own (its ancestor row)
        vis = tl.load(anc_ptr + n * NP + o, mask=inb, other=0) != 0
        c = tl.arange(0, DMP)
        m2 = vis[:, None] & (c[None, :] < DM)
        kv = cache_ptr + o[:, None] * 2 * DM + c[None, :]
        keys = tl.load(kv, mask=m2, other=0.0).to(ACC)
        vals = tl.load(kv + DM, mask=m2, other=0.0).to(ACC)
        q = _load_vec(sq, DM, DMP, ACC)
        s = tl.sum(tl.reshape(keys * q[None, :], (NP, NH, HD)), axis=2)  # [NP, NH]
        scale = 1.0 / tl.sqrt(tl.full([], HD, ACC))
        s = _rnd(_rnd(s, DT) * scale, DT)
        s = tl.where(vis[:, None], s, float("-inf"))
        e = tl.exp(s - tl.max(s, axis=0)[None, :])
        w = _rnd(e / tl.sum(e, axis=0)[None, :], DT)
        att = tl.sum(w[:, :, None] * tl.reshape(vals, (NP, NH, HD)), axis=0)  # [NH, HD]
        tl.store(so + c, _rnd(tl.reshape(att, (DMP,)), DT).to(so.dtype.element_ty), mask=c < DM)
        tl.debug_barrier()
        # 4. y = x + W_o attention
        _linear(wo_ptr, _load_vec(so, DM, DMP, ACC), sy, DM, DM, DMP, TILE, ACC, DT, UNROLL)
        tl.debug_barrier()
        y = _rnd(x + _load_vec(sy, DM, DMP, ACC), DT)
        # 5. the SwiGLU MLP of RMSNorm(y)
        b = _rmsnorm(y, n2_ptr, eps, DM, DMP, ACC, DT)
        _linear(wg_ptr, b, sg, I, DM, DMP, TILE, ACC, DT, UNROLL)
        _linear(wu_ptr, b, sup, I, DM, DMP, TILE, ACC, DT, UNROLL)
        tl.debug_barrier()
        g = _load_vec(sg, I, IP, ACC)
        prod = _rnd(_rnd(g / (1.0 + tl.exp(-g)), DT) * _load_vec(sup, I, IP, ACC), DT)
        tl.store(sm + tl.arange(0, IP), prod.to(sm.dtype.element_ty), mask=tl.arange(0, IP) < I)
        tl.debug_barrier()
        _linear(wd_ptr, _load_vec(sm, I, IP, ACC), sd, DM, I, IP, TILE, ACC, DT, UNROLL)
        tl.debug_barrier()
        hpre = _rnd(y + _load_vec(sd, DM, DMP, ACC), DT)
        # 6. u = W_out RMSNorm(y + MLP)
        h = _rmsnorm(hpre, n3_ptr, eps, DM, DMP, ACC, DT)
        _linear(wout_ptr, h, su, H, DM, DMP, TILE, ACC, DT, UNROLL)
        tl.debug_barrier()
        # 7. pool scores l_d + <u, E[pool]>, BI pool tokens a time
        u = _load_vec(su, H, HP, ACC)
        hh = tl.arange(0, HP)
        for k0 in tl.range(0, K, BP, loop_unroll_factor=UNROLL):
            kk = k0 + tl.arange(0, BP)
            em = (kk[:, None] < K) & (hh[None, :] < H)
            rows = tl.load(pemb_ptr + (d * K + kk[:, None]) * H + hh[None, :], mask=em, other=0.0)
            dot = _rnd(tl.sum(rows.to(ACC) * u[None, :], axis=1), DT)
            sc = _rnd(tl.load(pl_ptr + d * K + kk, mask=kk < K, other=0.0).to(ACC) + dot, DT)
            tl.store(ss + kk, sc.to(ss.dtype.element_ty), mask=kk < K)
        tl.debug_barrier()
        # 8. log-softmax over the pool, then the KEEP best children (ties: the lower pool position)
        ok = tl.arange(0, KP)
        inpool = ok < K
        sc = tl.where(inpool, _load_vec(ss, K, KP, ACC), float("-inf"))
        top = tl.max(sc, axis=0)
        lse = tl.log(tl.sum(tl.where(inpool, tl.exp(sc - top), 0.0), axis=0))
        lq = sc - top - lse
        tl.store(sa_ptr + ok, lq, mask=inpool)
        tl.debug_barrier()
        if ACC == tl.float32:  # noqa: SIM300 - one sort of (order-preserving bits of log q, position) keys
            bits = (lq + 0.0).to(tl.uint32, bitcast=True)  # + 0.0: -0.0 ties with 0.0
            mono = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
            keys = (tl.where(inpool, mono, 0).to(tl.uint64) << 32) | (KP - 1 - ok).to(tl.uint64)
            best = (KP - 1 - (tl.sort(keys, descending=True) & 0xFFFFFFFF)).to(
                tl.int32
            )  # positions, best first
            put = ok < KEEP
            vi = tl.load(sa_ptr + best, mask=put, other=0.0)
            tl.store(clq_ptr + n * KEEP + ok, vi.to(tl.float64), mask=put)
            tl.store(ctok_ptr + n * KEEP + ok, tl.load(pid_ptr + d * K + best, mask=put, other=0), mask=put)
        else:  # float64: rank by counting, BR pool tokens a time
            for i0 in tl.range(0, K, BR, loop_unroll_factor=UNROLL):
                ii = i0 + tl.arange(0, BR)
                vi = tl.load(sa_ptr + ii, mask=ii < K, other=0.0)
                tie = (lq[None, :] == vi[:, None]) & (ok[None, :] < ii[:, None])
                rk = tl.sum((((lq[None, :] > vi[:, None]) | tie) & inpool[None, :]).to(tl.int32), axis=1)
                put = (ii < K) & (rk < KEEP)
                tl.store(clq_ptr + n * KEEP + rk, vi.to(tl.float64), mask=put)
                tl.store(ctok_ptr + n * KEEP + rk, tl.load(pid_ptr + d * K + ii, mask=put, other=0), mask=put)
        tl.store(key_ptr + n, score_n + tl.max(lq, axis=0).to(tl.float64))
        tl.store(valid_ptr + n, (live & (depth < D)).to(tl.int32))
        if not ROOT:
            tl.store(order_ptr + n, 2 * n)


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
) -> DeviceGrowth:
    """:func:`repro.drafters.weaver_growth.grow_on_device`'s tree from ``budget + 1`` launches of one
    kernel (module docstring). Capture-safe; CUDA tensors, or CPU ones under TRITON_INTERPRET=1.

    Launch options (speed only, never the tree): ``num_warps`` of the one program, ``tile`` the
    elements of one loaded block (weights: tile / in-width rows a time; pool: tile / hidden rows; the
    ranking: tile / pool rows), ``unroll`` the loops' unroll factor."""
    w, cfg = weaver, weaver.config
    dev, dt = rows.device, w.dtype
    depth, k = pool_ids.shape
    n, keep = budget + 1, min(k, budget)
    np_, dmp, ip, kp = _p2(n), _p2(cfg.d_model), _p2(cfg.intermediate_size), _p2(k)
    hp = _p2(cfg.target_hidden_size)
    acc = torch.float64 if dt == torch.float64 else torch.float32
    tile = max(min(tile, max(dmp, ip, hp) * max(dmp, ip, hp)), dmp, ip, hp, kp)  # elements per loaded block
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
        "sw": torch.empty(5 * dmp + 3 * ip + hp + kp, dtype=dt, device=dev),
        "sa": torch.empty(kp, dtype=acc, device=dev),
    }
    weights = [
        w.token_proj.weight, w.input_layernorm.weight, w.q_proj.weight, w.k_proj.weight, w.v_proj.weight,
        w.o_proj.weight, w.post_attention_layernorm.weight, w.mlp.gate_proj.weight, w.mlp.up_proj.weight,
        w.mlp.down_proj.weight, w.norm.weight, w.out_proj.weight,
    ]  # fmt: skip
    pool_emb = embedding[pool_ids]  # [D, K, H]: read in place by every node (no dependent gather)
    inputs = [root, base, embedding.contiguous(), pool_emb, pool_logits.contiguous(), pool_ids.contiguous()]
    consts = dict(
        N=n, NP=np_, KEEP=keep, D=depth, K=k, KP=kp, H=cfg.target_hidden_size, HP=hp,
        DM=cfg.d_model, DMP=dmp, NH=cfg.num_heads, HD=cfg.head_dim, I=cfg.intermediate_size, IP=ip,
        TILE=tile, BP=max(1, min(kp, tile // hp)), BR=max(1, min(kp, tile // kp)),
        ACC=tl.float64 if acc == torch.float64 else tl.float32, DT=_tl_dtype(dt),
        UNROLL=unroll if unroll > 1 else None, num_warps=num_warps,
    )  # fmt: skip
    args = [*state.values(), *inputs, *[p.contiguous() for p in weights]]
    for node in range(n):
        _node_kernel[(1,)](*args, node, cfg.rms_norm_eps, ROOT=node == 0, SCORE=node < budget, **consts)
    return DeviceGrowth(state["tokens"], state["parents"], state["scores"])


def _tl_dtype(dtype: torch.dtype) -> tl.dtype:
    return {torch.float64: tl.float64, torch.float32: tl.float32, torch.bfloat16: tl.bfloat16,
            torch.float16: tl.float16}[dtype]  # fmt: skip
