"""A pure-GDN decoder's layers for one decode token in one persistent Triton launch (:func:`decode_layers`).

At the GDN-1.3B shape a decode step on separate kernels (six a layer: the norm and in_proj GEMV, the GDN
core, the gated norm, out_proj with the residual, the norm and gate|up with SiLU * up, down with the
residual) streams ~30 us of weights a layer in ~46 us: every launch pays a ramp and a drain of a few us
on matrices of 8-46 MB, and neither dependent launch nor early weight loads or L2 prefetches closed it
(results/2026-12-02-h200-pdl-slots, results/2026-12-03-h200-l2-prefetch). Here P co-resident programs
walk every layer once, with a grid barrier (:func:`~repro.grid.grid_sync`) between the five
stages of a layer, which pass vectors through global scratch:

0. ``proj = in_proj (x / rms(x) * in_norm)`` (the conv inputs q|k|v, z, a, b);
1. the GDN core of every (value head, d_v tile): conv + SiLU, q / k L2 norms, gates, one recurrent step
   of that state tile in place, ``o`` (float32; :func:`~repro.gdn.triton_decode.decode_tile`, the same
   code as the separate decode kernel);
2. ``x += out_proj y`` with ``y = GatedRMSNorm(o, z)`` built per K chunk (a chunk lies in one head: the
   head's 1 / rms from its d_v values of ``o``; y rounded to x's dtype as the separate path rounds it),
   and the conv history moved on by the token's conv inputs (each program a block of channels: every
   read of the history in stage 1 precedes it);
3. ``act = SiLU(g) * u``, ``[g; u] = gate_up (x / rms(x) * post_norm)``;
4. ``x += down act``.

Each matrix stage splits its output rows into blocks of ``BN`` rows: program p takes blocks p, p + P,
...; a block walks K in ``BK`` steps with a [BN, BK] float32 accumulator reduced once after the loop,
vectors loaded as tiles in the weight tile's layout (as :mod:`repro.gdn.triton_linear`'s GEMV kernels;
norm factors in the epilogue), each output rounded once. A value never depends on P (the same block
computes it whichever program owns it), so a staged run (one launch a stage and layer, no barriers:
:func:`decode_layers` ``staged``, the CPU interpreter's way, where programs run one after another and a
barrier would wait forever) gives the same bits as the persistent one. Loads of what another program
wrote in the launch (x, proj, o, act) are plain loads ordered by the barrier's acquire (L2-only ``.cg``
without :attr:`PersistentConfig.cached_vectors`). The launch's barrier counter is zeroed
before it (one memset); a barrier that polls past ``spin_cap`` sets the sticky error flag
(:attr:`PersistentGDN.error`, nonzero: the step's results are not to be trusted) instead of hanging.
P is at most SMs x the compiled kernel's resident CTAs (:func:`~repro.grid.resident_ctas`):
every program must be on an SM at once.

Measured on an H200 at GDN-1.3B (bf16, CUDA graphs of 50 steps, scripts/gpu/persistent.py,
results/2026-12-03-h200-persistent-decode): **slower than the separate kernels**, 1408 us a token at the
best of nine configurations against 1115 (59% of the weight floor there). Where the time goes (stage
masks, every barrier kept): the 120 barriers alone 167 us (1.39 us each: about what a dependent launch's
gap costs, so one launch a step saves nothing by itself); in_proj 10.1 us a layer, gate|up 12.7, down 8.2
(each ~1.2 us *faster* than its separate GEMV launch); the core 6.5 (separate ~5); out_proj with the
gated norm 11.7 (separate 6.7: the norm's per-chunk reduction and SiLU are recomputed for every row of
a block's broadcast tile). Defaults are the best measured settings: 4 warps (352 programs, 3 a SM; 8
warps leave one a SM: 1850 us), L1-cached vectors (1574 -> 1424 us), d_v tiles of 16; volatile-load
polls lost (1424 -> 1535). Closing the gap needs less than a grid barrier between stages (flags per row
block, the next stage's first weight tiles loaded before the wait) and the gated norm computed once;
until then StaticDecoder keeps ``persistent`` off.

The embedding row before and the final norm and LM head after stay separate launches
(:class:`repro.models.static.StaticDecoder`, ``persistent``). Semantics: those of the separate fused path
(:func:`repro.models.static_layers.fused_gdn_layer` on the GEMV kernels), float32 results to ~1e-6; bf16 ones
to bf16 rounding (summation orders differ).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import triton
import triton.language as tl

from repro.errors import ConfigError
from repro.gdn.triton_common import acc_dtype, load_tile, pow2, round_to, silu
from repro.gdn.triton_decode import GDNDims, _shift_history, decode_tile
from repro.grid import grid_sync, held_programs, ld

STAGES = 5  # a layer's stages between grid barriers (module docstring)
_STAGES = tl.constexpr(STAGES)  # the same, as the kernel reads it
SPIN_CAP = 1 << 22  # polls of a grid barrier before the error flag is set


@dataclass(frozen=True)
class PersistentConfig:
    """Launch options (speed only: a value never depends on them beyond summation order, and never on
    ``programs``): (rows, K columns) per block of in_proj, out_proj, gate|up and down; the core's d_v
    tile; warps; programs (None: SMs x resident CTAs, at most the most blocks of any stage);
    ``cached_vectors``: the vectors another program wrote read through L1 (plain loads: the barrier's
    acquire orders them after the writes) instead of L2 only; ``load_poll``: the barrier polls with
    volatile loads, then one acquire, instead of acquire atomics
    (:func:`~repro.grid.grid_sync`)."""

    in_tile: tuple[int, int] = (32, 256)
    out_tile: tuple[int, int] = (16, 256)
    gate_up_tile: tuple[int, int] = (16, 256)
    down_tile: tuple[int, int] = (8, 1024)
    block_v: int = 16
    num_warps: int = 4
    programs: int | None = None
    cached_vectors: bool = True
    load_poll: bool = False

    def __post_init__(self) -> None:
        sizes = [*self.in_tile, *self.out_tile, *self.gate_up_tile, *self.down_tile]
        sizes += [self.block_v, self.num_warps]
        if any(v < 1 or v & (v - 1) for v in sizes):
            raise ConfigError(f"PersistentConfig: tiles, block_v and num_warps must be powers of two: {self}")
        if self.programs is not None and self.programs < 1:
            raise ConfigError(f"PersistentConfig.programs must be positive, got {self.programs}")

    def fitted(self, d_v: int) -> PersistentConfig:
        """This configuration for heads of ``d_v`` values: the core's tile at most pow2(d_v), out_proj's K
        step at most the largest power of two dividing d_v (a chunk of y lies in one head)."""
        out_tile = (self.out_tile[0], min(self.out_tile[1], d_v & -d_v))
        return replace(self, block_v=min(self.block_v, pow2(d_v)), out_tile=out_tile)


@dataclass
class PersistentGDN:
    """A pure-GDN decoder's constants stacked over its L layers (views [l] are layer l's), its state
    buffers and the launch's scratch. Shapes: in_norm, post_norm [L, D]; in_proj [L, N1, D] (N1 = C +
    V_z + 2 HV: conv inputs, z, a, b); taps [L, C, W]; conv_bias [L, C] or None; neg_decay, dt_bias
    [L, HV]; norm_weight [L, d_v] (the gated norm's); out_proj [L, D, HV d_v]; gate_up [L, 2 I, D];
    down [L, D, I]; states [L, HV, d_v, d_k] (float32); history [L, W-1, C]; conv_index [1, W]."""

    in_norm: torch.Tensor
    in_proj: torch.Tensor
    taps: torch.Tensor
    conv_bias: torch.Tensor | None
    neg_decay: torch.Tensor
    dt_bias: torch.Tensor
    norm_weight: torch.Tensor
    out_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    states: torch.Tensor
    history: torch.Tensor
    conv_index: torch.Tensor
    dims: GDNDims
    has_z: bool
    beta_scale: float
    eps: float  # the input and post-attention RMSNorms'
    norm_eps: float  # the gated norm's
    config: PersistentConfig = field(default_factory=PersistentConfig)
    spin_cap: int = SPIN_CAP

    def __post_init__(self) -> None:
        L, n1, d = self.in_proj.shape
        h, hv, dk, dv = self.dims
        c = self.dims.conv_dim
        if n1 != c + (hv * dv if self.has_z else 0) + 2 * hv:
            raise ConfigError(f"in_proj has {n1} rows; the dims {self.dims} need {c} + z + {2 * hv}")
        if self.gate_up.shape[1] % 2 or self.gate_up.shape[2] != d or self.down.shape[1:] != (
            d, self.gate_up.shape[1] // 2
        ):  # fmt: skip
            raise ConfigError("gate_up must be [L, 2 I, D] and down [L, D, I]")
        if self.states.dtype != torch.float32 or self.states.shape != (L, hv, dv, dk):
            raise ConfigError(f"states must be float32 [L, HV, d_v, d_k] = {(L, hv, dv, dk)}")
        big = max(n1 * d, self.gate_up.shape[1] * d, d * hv * dv)
        if L * big >= 2**31:
            raise ConfigError("a stacked matrix over 2^31 elements: the kernel's offsets are int32")
        self.config = self.config.fitted(dv)
        dev, dt = self.in_proj.device, self.in_proj.dtype
        self.x_dtype = dt
        self.proj = torch.zeros(n1, dtype=dt, device=dev)
        self.o = torch.zeros(hv * dv, dtype=torch.float32, device=dev)
        self.act = torch.zeros(self.gate_up.shape[1] // 2, dtype=dt, device=dev)
        # [0] the barrier counter (zeroed before every launch), [1] the sticky error flag
        self.sync = torch.zeros(2, dtype=torch.int32, device=dev)

    def configure(self, config: PersistentConfig) -> None:
        """Launch with ``config`` (fitted to the heads) from now on; capture graphs after it."""
        self.config = config.fitted(self.dims.d_v)

    @property
    def layers(self) -> int:
        return self.in_proj.shape[0]

    @property
    def error(self) -> torch.Tensor:
        """The sticky barrier error flag ([1] int32 on the device; 0: every barrier of every launch met)."""
        return self.sync[1:]

    def blocks(self) -> int:
        """The most row blocks (or core tiles) of any stage: more programs than this would idle."""
        cfg, (_, hv, _, dv) = self.config, self.dims
        d, n1, i = self.in_proj.shape[2], self.in_proj.shape[1], self.down.shape[2]
        rows = [(n1, cfg.in_tile), (d, cfg.out_tile), (i, cfg.gate_up_tile), (d, cfg.down_tile)]
        return max(hv * triton.cdiv(dv, cfg.block_v), *(triton.cdiv(n, tile[0]) for n, tile in rows))


# ----------------------------------------------------------------------------------- device functions


@triton.jit
def _rstd(x_ptr, eps, D: tl.constexpr, DP: tl.constexpr, CG: tl.constexpr, ACC: tl.constexpr):
    """1 / rms(x) of the vector x [D] (written in this launch)."""
    o = tl.arange(0, DP)
    x = ld(x_ptr + o, o < D, CG).to(ACC)
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)


@triton.jit
def _norm_rows(x_ptr, scale_ptr, w_ptr, out_ptr, eps, nprog, N: tl.constexpr, D: tl.constexpr,
               DP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GATE_UP: tl.constexpr, CG: tl.constexpr,
               ACC: tl.constexpr):  # fmt: skip
    """out = W (x / rms(x) * scale) over this program's row blocks; GATE_UP: W is [2 N, D] = [gate; up]
    and out = SiLU(gate rows) * up rows."""
    EVEN: tl.constexpr = D % BK == 0
    rstd = _rstd(x_ptr, eps, D, DP, CG, ACC)
    for blk in range(tl.program_id(0), tl.cdiv(N, BN), nprog):
        o_n = blk * BN + tl.arange(0, BN)
        o_w = tl.minimum(o_n, N - 1)  # past N: the last row again (never stored)
        zero_n = o_n * 0
        a = tl.zeros([BN, BK], dtype=ACC)
        u = tl.zeros([BN, BK], dtype=ACC)
        for k0 in range(0, D, BK):
            o_k = k0 + tl.arange(0, BK)
            m_k = o_k < D
            v = load_tile(x_ptr, zero_n, o_k, m_k, 0, EVEN, ACC, CG)
            v *= load_tile(scale_ptr, zero_n, o_k, m_k, 0, EVEN, ACC)
            a += load_tile(w_ptr, o_w, o_k, m_k, D, EVEN, ACC) * v
            if GATE_UP:
                u += load_tile(w_ptr + N * D, o_w, o_k, m_k, D, EVEN, ACC) * v
        y = tl.sum(a, axis=1) * rstd
        if GATE_UP:
            y = silu(y) * (tl.sum(u, axis=1) * rstd)
        tl.store(out_ptr + o_n, round_to(y, out_ptr), mask=o_n < N)


@triton.jit
def _residual_rows(x_ptr, w_ptr, v_ptr, z_ptr, gnw_ptr, gn_eps, nprog, N: tl.constexpr, K: tl.constexpr,
                   BN: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr, HAS_Z: tl.constexpr,
                   DV: tl.constexpr, DVP: tl.constexpr, CG: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """x += W v over this program's row blocks (W [N, K]). GATED: v = GatedRMSNorm(o, z) with o = v_ptr
    (float32 [K = HV d_v]), built per K chunk (BK divides d_v: one head a chunk), rounded to x's dtype."""
    EVEN: tl.constexpr = K % BK == 0
    for blk in range(tl.program_id(0), tl.cdiv(N, BN), nprog):
        o_n = blk * BN + tl.arange(0, BN)
        o_w = tl.minimum(o_n, N - 1)
        zero_n = o_n * 0
        a = tl.zeros([BN, BK], dtype=ACC)
        for k0 in range(0, K, BK):
            o_k = k0 + tl.arange(0, BK)
            m_k = o_k < K
            v = load_tile(v_ptr, zero_n, o_k, m_k, 0, EVEN, ACC, CG)
            if GATED:
                head = k0 // DV
                o_h = tl.arange(0, DVP)
                oh = ld(v_ptr + head * DV + o_h, o_h < DV, CG).to(ACC)
                v = v / tl.sqrt(tl.sum(oh * oh, axis=0) / DV + gn_eps)
                v *= load_tile(gnw_ptr, zero_n, o_k % DV, m_k, 0, EVEN, ACC)
                if HAS_Z:
                    v *= silu(load_tile(z_ptr, zero_n, o_k, m_k, 0, EVEN, ACC, CG))
                v = round_to(v, x_ptr).to(ACC)
            a += load_tile(w_ptr, o_w, o_k, m_k, K, EVEN, ACC) * v
        y = tl.sum(a, axis=1) + ld(x_ptr + o_w, o_n < N, CG).to(ACC)
        tl.store(x_ptr + o_n, round_to(y, x_ptr), mask=o_n < N)


@triton.jit(do_not_specialize=["layer0", "n_layers", "nprog", "stages", "barriers"])
def _layers_kernel(
    x_ptr, in_norm_ptr, in_w_ptr, proj_ptr, hist_ptr, taps_ptr, bias_ptr, idx_ptr, nd_ptr, dtb_ptr, state_ptr,
    o_ptr, gnw_ptr, out_w_ptr, post_ptr, gu_ptr, act_ptr, down_ptr, sync_ptr, eps, gn_eps, scale, beta_scale,
    layer0, n_layers, nprog, stages, barriers,
    D: tl.constexpr, DP: tl.constexpr, N1: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
    DV: tl.constexpr, W: tl.constexpr, I: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_Z: tl.constexpr,
    BN1: tl.constexpr, BK1: tl.constexpr, BN3: tl.constexpr, BK3: tl.constexpr, BN4: tl.constexpr,
    BK4: tl.constexpr, BN5: tl.constexpr, BK5: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,
    DKP: tl.constexpr, DVP: tl.constexpr, HP: tl.constexpr,
    SPIN: tl.constexpr, LOAD_POLL: tl.constexpr, CG: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """Layers layer0 .. layer0 + n_layers of one decode token on ``nprog`` programs (module docstring):
    the stages in the bitmask ``stages`` (bit s: stage s), a grid barrier after each stage if ``barriers``
    (one binary for persistent and staged launches: run-time branches, and the launch scalars not
    specialized, so that the values 1 and multiples of 16 that staged launches and :func:`device_slots`'s
    warm-up pass compile no other binary)."""
    C: tl.constexpr = 2 * H * DK + HV * DV
    V: tl.constexpr = HV * DV
    HIST: tl.constexpr = W - 1
    NVB: tl.constexpr = (DV + BV - 1) // BV
    pid = tl.program_id(0)
    for j in range(0, n_layers):
        lay = layer0 + j
        b = j * _STAGES  # barriers passed before this layer
        hist_l = hist_ptr + lay * (HIST * C)
        if (stages >> 0) & 1:
            _norm_rows(x_ptr, in_norm_ptr + lay * D, in_w_ptr + lay * (N1 * D), proj_ptr, eps, nprog, N1, D,
                       DP, BN1, BK1, False, CG, ACC)  # fmt: skip
        if barriers:
            grid_sync(sync_ptr, sync_ptr + 1, (b + 1) * nprog, SPIN, LOAD_POLL)
        if (stages >> 1) & 1:
            for item in range(pid, HV * NVB, nprog):
                decode_tile(proj_ptr, hist_l, taps_ptr + lay * (C * W), bias_ptr + lay * C, idx_ptr,
                            nd_ptr + lay * HV, dtb_ptr + lay * HV, state_ptr + lay * (V * DK), o_ptr, scale,
                            beta_scale, item // NVB, item % NVB, H, HV, DK, DV, W, N1 - 2 * HV, DKP, BV,
                            HAS_BIAS, ACC, CG)  # fmt: skip
        if barriers:
            grid_sync(sync_ptr, sync_ptr + 1, (b + 2) * nprog, SPIN, LOAD_POLL)
        if (stages >> 2) & 1:
            _residual_rows(x_ptr, out_w_ptr + lay * (D * V), o_ptr, proj_ptr + C, gnw_ptr + lay * DV, gn_eps,
                           nprog, D, V, BN3, BK3, True, HAS_Z, DV, DVP, CG, ACC)  # fmt: skip
            if HIST > 0:
                for cb in range(pid, tl.cdiv(C, BC), nprog):
                    chan = cb * BC + tl.arange(0, BC)
                    _shift_history(hist_l, proj_ptr, chan, chan < C, C, HIST, HP, CG)
        if barriers:
            grid_sync(sync_ptr, sync_ptr + 1, (b + 3) * nprog, SPIN, LOAD_POLL)
        if (stages >> 3) & 1:
            _norm_rows(x_ptr, post_ptr + lay * D, gu_ptr + lay * (2 * I * D), act_ptr, eps, nprog, I, D, DP,
                       BN4, BK4, True, CG, ACC)  # fmt: skip
        if barriers:
            grid_sync(sync_ptr, sync_ptr + 1, (b + 4) * nprog, SPIN, LOAD_POLL)
        if (stages >> 4) & 1:
            _residual_rows(x_ptr, down_ptr + lay * (D * I), act_ptr, act_ptr, gnw_ptr, gn_eps, nprog, D, I,
                           BN5, BK5, False, False, DV, DVP, CG, ACC)  # fmt: skip
        if barriers:
            grid_sync(sync_ptr, sync_ptr + 1, (b + 5) * nprog, SPIN, LOAD_POLL)


# ------------------------------------------------------------------------------------------- host


def _args(pg: PersistentGDN, x: torch.Tensor) -> tuple[list, dict]:
    h, hv, dk, dv = pg.dims
    L, n1, d = pg.in_proj.shape
    cfg = pg.config
    args = [
        x, pg.in_norm, pg.in_proj, pg.proj, pg.history, pg.taps,
        pg.conv_bias if pg.conv_bias is not None else pg.taps, pg.conv_index, pg.neg_decay, pg.dt_bias,
        pg.states, pg.o, pg.norm_weight, pg.out_proj, pg.post_norm, pg.gate_up, pg.act, pg.down, pg.sync,
        float(pg.eps), float(pg.norm_eps), dk**-0.5, float(pg.beta_scale),
    ]  # fmt: skip
    consts = dict(
        D=d, DP=pow2(d), N1=n1, H=h, HV=hv, DK=dk, DV=dv, W=pg.taps.shape[2], I=pg.down.shape[2],
        HAS_BIAS=pg.conv_bias is not None, HAS_Z=pg.has_z, BN1=cfg.in_tile[0], BK1=cfg.in_tile[1],
        BN3=cfg.out_tile[0], BK3=cfg.out_tile[1], BN4=cfg.gate_up_tile[0], BK4=cfg.gate_up_tile[1],
        BN5=cfg.down_tile[0], BK5=cfg.down_tile[1], BV=cfg.block_v, BC=min(128, pow2(pg.dims.conv_dim)),
        DKP=pow2(dk), DVP=pow2(dv), HP=pow2(max(1, pg.taps.shape[2] - 1)), ACC=acc_dtype(x.dtype),
        SPIN=pg.spin_cap, LOAD_POLL=cfg.load_poll, CG=not cfg.cached_vectors, num_warps=cfg.num_warps,
    )  # fmt: skip
    return args, consts


ALL_STAGES = (1 << STAGES) - 1
_SLOTS: dict[tuple, int] = {}  # (device, launch constants) -> programs the device holds at once


def device_slots(pg: PersistentGDN, x: torch.Tensor) -> int:
    """SMs x :func:`~repro.grid.resident_ctas` of the binary (compiled once per device and
    constants)."""
    args, consts = _args(pg, x)
    dev = x.device
    key = (dev, tuple(sorted((k, repr(v)) for k, v in consts.items())))
    if key not in _SLOTS:
        binary = _layers_kernel.warmup(*args, 0, pg.layers, 2, ALL_STAGES, 1, grid=(2,), **consts)
        binary._init_handles()
        _SLOTS[key] = held_programs(binary, consts["num_warps"], dev)
    return _SLOTS[key]


def programs_for(pg: PersistentGDN, x: torch.Tensor) -> int:
    """P: the configured count, else the most blocks of any stage; on CUDA clamped to what the device holds
    at once (staged launches too: the same programs, so the same bits); 3 in the CPU interpreter (programs
    run one by one there)."""
    want = pg.config.programs or (3 if x.device.type != "cuda" else pg.blocks())
    if x.device.type != "cuda":
        return want
    return max(1, min(want, device_slots(pg, x)))


def decode_layers(
    pg: PersistentGDN, x: torch.Tensor, staged: bool | None = None, stages: int = ALL_STAGES
) -> None:
    """Every layer of one decode token: ``x`` [1, D] (the embedded token, contiguous, in the weights' dtype)
    becomes the last layer's output in place; states and conv histories move on by the token.

    ``staged`` (default: off CUDA): one launch a stage and layer over the same programs and binary, no
    barriers (the CPU interpreter's way; on CUDA a check of the persistent launch: the same bits).
    ``stages`` (a bitmask, persistent launches; diagnostics only: any other than :data:`ALL_STAGES` leaves
    wrong results): the stages that run, every barrier kept (0: the barriers' own cost). Capture-safe."""
    if x.dtype != pg.x_dtype or x.numel() != pg.in_proj.shape[2] or not x.is_contiguous():
        raise ConfigError(f"x must be one contiguous row of {pg.in_proj.shape[2]} {pg.x_dtype}")
    cuda = x.device.type == "cuda"
    staged = (not cuda) if staged is None else staged
    p = programs_for(pg, x)
    args, consts = _args(pg, x)
    if staged:
        for lay in range(pg.layers):
            for stage in range(STAGES):
                _layers_kernel[(p,)](*args, lay, 1, p, 1 << stage, 0, **consts)
        return
    if not cuda:
        raise ConfigError("a persistent launch (grid barriers) needs CUDA; the interpreter runs staged")
    pg.sync[:1].zero_()
    _layers_kernel[(p,)](*args, 0, pg.layers, p, stages, 1, **consts)
