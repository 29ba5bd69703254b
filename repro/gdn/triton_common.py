"""Helpers shared by the Triton kernels of :mod:`repro.gdn`: arithmetic dtype, power-of-two tiles,
rounding and SiLU device functions, programmatic dependent launch.

Programmatic dependent launch (:func:`dependent_launch`, on by default; compute capability 9.0 and later,
never in the interpreter): a kernel that takes a ``PDL`` constexpr starts with :func:`pdl_start`
(``griddepcontrol.launch_dependents``, then ``griddepcontrol.wait``) and is launched with
``launch_pdl=use_pdl(device)`` (:func:`pdl_args`), so that the next launch of the stream (in a CUDA
graph too) is scheduled while this one drains and the gap between back-to-back kernels is hidden. The
wait returns once the kernel before it has completed and its writes are visible, so nothing that kernel
writes may be read before it; constant operands (weights) may be (``early_weights``: the GEMV kernels
load their first weight tile before it; off by default, measured slower, as were L2 prefetches of the
weights there: results/2026-12-03-h200-l2-prefetch). A kernel launched with
``launch_pdl`` must wait before it reads its inputs: the two go together (:func:`use_pdl` for both).
Results are bitwise those of a plain launch.

Where the next launch is released (``trigger``, :data:`TRIGGERS`): "start" at every kernel's start,
"exit" at its exit (no explicit trigger: the launch still overlaps the kernel's drain and memory flush),
"gemv" at the start of the GEMVs and at the exit of the rest, and "auto" (the default) at the start
except in a multi-row verification (:func:`verify_launches`, the tree kernels), whose kernels release at
their exit. An early release lets the next kernel's CTAs be placed on the SMs while this one runs, where
they wait for it; measured on the H200 (results/2026-12-02-h200-pdl-release/scripts/pdl), that helps the
decode step (GDN-1.3B 1163 -> 1113 us, plain -> start) and hurts verification (GDN-1.3B verify of 33
nodes 1931 -> 2276 us; SpecLA's split tree kernel 24.7 -> 35.6 us), where exit costs nothing against
plain launches (1936 us, 24.2 us): the waiting CTAs take SM slots that the latency-bound kernels' programs
would have spread over. The kernel's ``PDL`` constexpr says which (:func:`pdl_args`: 0 plain, 1 released
at the start, 2 at the exit).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from repro.grid import ld


def interpreting() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1): the kernels then run on CPU tensors."""
    return bool(triton.knobs.runtime.interpret)


def acc_dtype(dtype: torch.dtype) -> tl.dtype:
    """Arithmetic dtype of the kernels: float64 for float64 data, else float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def pow2(x: int) -> int:
    """The smallest power of two >= x."""
    return triton.next_power_of_2(int(x))


def check_factor_shapes(
    state: torch.Tensor, delta: torch.Tensor, k: torch.Tensor, gate_cum: torch.Tensor
) -> None:
    """A commit's state (contiguous float32, float64 for the interpreter's exactness tests) and factors
    (delta [n, HV, d_v], k [n, HV, d_k], gate_cum [n, HV]) agree."""
    hv, dv, dk = state.shape
    n = delta.shape[0]
    if state.dtype not in (torch.float32, torch.float64) or not state.is_contiguous():
        raise ValueError(f"state must be contiguous float32, got {state.dtype}")
    if delta.shape != (n, hv, dv) or k.shape != (n, hv, dk) or gate_cum.shape != (n, hv):
        raise ValueError(
            f"factors do not match the state [{hv}, {dv}, {dk}]: delta {tuple(delta.shape)}, "
            f"k {tuple(k.shape)}, gate_cum {tuple(gate_cum.shape)}"
        )


def check_factors(
    state: torch.Tensor, delta: torch.Tensor, k: torch.Tensor, gate_cum: torch.Tensor, ancestors: torch.Tensor
) -> torch.Tensor:
    """Validate a commit's operands; returns the ancestor mask as contiguous uint8 (a view of a bool one)."""
    check_factor_shapes(state, delta, k, gate_cum)
    n = delta.shape[0]
    if ancestors.shape != (n, n):
        raise ValueError(f"ancestors must be [n, n] = {(n, n)}, got {tuple(ancestors.shape)}")
    return (
        ancestors.contiguous().view(torch.uint8) if ancestors.dtype == torch.bool else ancestors.contiguous()
    )


TRIGGERS = ("auto", "start", "exit", "gemv")


class PdlMode(NamedTuple):
    """One entry of :func:`dependent_launch`'s stack."""

    enabled: bool
    early_weights: bool
    trigger: str  # one of TRIGGERS


def _env_mode(value: str) -> PdlMode:
    """REPRO_PDL: "0" off (A/B runs of whole commands), "1" or a trigger name (:data:`TRIGGERS`) on."""
    if value == "0":
        return PdlMode(False, False, "auto")
    trigger = "auto" if value == "1" else value
    if trigger not in TRIGGERS:
        raise ValueError(f"REPRO_PDL must be 0, 1 or one of {TRIGGERS}, got {value!r}")
    return PdlMode(True, False, trigger)


# dependent_launch's stack; the bottom is the default: on, "auto" release, without early weight loads
# (measured slower: GDN-1.3B decode 1117 -> 1213 us, results/2026-12-02-h200-pdl-slots/scripts/pdl)
_pdl: list[PdlMode] = [_env_mode(os.environ.get("REPRO_PDL", "1"))]


@contextlib.contextmanager
def dependent_launch(
    enabled: bool = True, early_weights: bool = False, trigger: str = "auto"
) -> Iterator[None]:
    """Within the block, the kernels that support it use programmatic dependent launch (module
    docstring) where the device supports it; ``early_weights``: the GEMV kernels load their first weight
    tile before the wait; ``trigger``: where each kernel releases the next launch (:data:`TRIGGERS`).
    Capture a CUDA graph inside the block to keep the choice."""
    if trigger not in TRIGGERS:
        raise ValueError(f"trigger must be one of {TRIGGERS}, got {trigger!r}")
    _pdl.append(PdlMode(enabled, early_weights, trigger))
    try:
        yield
    finally:
        _pdl.pop()


def use_pdl(device: torch.device) -> bool:
    """Whether a launch on ``device`` now is a programmatic dependent one (its ``PDL`` constexpr and
    ``launch_pdl``): on, on CUDA, compute capability 9.0 or later, not in the interpreter."""
    if not _pdl[-1].enabled or interpreting() or device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0)


def early_weights(device: torch.device) -> bool:
    """Whether a dependent GEMV launch on ``device`` now loads its first weight tile before the wait."""
    return use_pdl(device) and _pdl[-1].early_weights


_verifying: list[bool] = [False]  # verify_launches' stack


@contextlib.contextmanager
def verify_launches() -> Iterator[None]:
    """Within the block, launches belong to a multi-row verification (the "auto" trigger releases the
    next launch at their exit)."""
    _verifying.append(True)
    try:
        yield
    finally:
        _verifying.pop()


def pdl_args(device: torch.device, gemv: bool = False, verify: bool = False) -> dict[str, int | bool]:
    """A launch's programmatic-dependent-launch arguments: the kernel's ``PDL`` (0 plain, 1 the next
    launch released at this kernel's start, 2 at its exit; module docstring) and ``launch_pdl``.
    ``gemv``: the launch is a GEMV's; ``verify``: a verification kernel's (as inside
    :func:`verify_launches`)."""
    if not use_pdl(device):
        return {"PDL": 0, "launch_pdl": False}
    trigger = _pdl[-1].trigger
    if trigger == "auto":
        early = not (verify or _verifying[-1])
    else:
        early = trigger == "start" or (trigger == "gemv" and gemv)
    return {"PDL": 1 if early else 2, "launch_pdl": True}


H200_SMS = 132  # the SM count assumed off CUDA (launch heuristics, ahead-of-time compiles)


@functools.cache
def sm_count(device: torch.device) -> int:
    """The device's SM count (a host property, asked once per device: no sync); H200_SMS off CUDA."""
    if device.type != "cuda":
        return H200_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """A dependent kernel's start (PDL 1: let the next launch be scheduled; PDL 1 or 2: wait for the
    previous kernel's completion and writes)."""
    if PDL == 1:
        gdc_launch_dependents()
    if PDL:
        gdc_wait()


@triton.jit
def round_to(x, ptr):
    """x in the element type of ``ptr`` (round to nearest even when narrowing floats)."""
    if ptr.dtype.element_ty == tl.float32 or ptr.dtype.element_ty == tl.float64:
        return x.to(ptr.dtype.element_ty)
    return x.to(ptr.dtype.element_ty, fp_downcast_rounding="rtne")


@triton.jit
def silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def load_tile(
    ptr, o_rows, o_k, m_k, stride, EVEN_K: tl.constexpr, ACC: tl.constexpr, CG: tl.constexpr = False
):
    """[len(o_rows), BK] elements ptr[o_rows * stride + o_k] in ACC (zero where m_k is off, unless EVEN_K).
    Vectors (x, a norm scale) are read as tiles with stride 0, in the weight tile's layout: broadcasting a
    1-D load instead would move it through shared memory with barriers on every K step. CG: L2 only
    (:func:`repro.grid.ld`: what another program of a persistent launch wrote)."""
    p = ptr + o_rows[:, None] * stride + o_k[None, :]
    if EVEN_K:
        if CG:
            return tl.load(p, cache_modifier=".cg").to(ACC)
        return tl.load(p).to(ACC)
    return ld(p, m_k[None, :], CG).to(ACC)


@triton.jit
def accepted_path(anc, node_ptr, n, NP: tl.constexpr):
    """The root-to-``node`` path, gathered on the device: (live, a, on_path, pos, length).

    ``node`` is read from the 1-element ``node_ptr`` (< 0: the empty path, live False); a = max(node, 0).
    ``anc`` row a (uint8 [n, n] ancestor-or-self mask, NP = pow2(n) columns loaded at once) marks the
    path's nodes (on_path, int32 [NP]); as nodes are in topological order, node j's position on the path
    is the number of path nodes before it (pos, a cumsum; valid where on_path); length = the path's
    number of nodes (a device value)."""
    node = tl.load(node_ptr)
    live = node >= 0
    a = tl.maximum(node, 0)
    o_n = tl.arange(0, NP)
    on_path = (tl.load(anc + a * n + o_n, mask=(o_n < n) & live, other=0) != 0).to(tl.int32)
    pos = tl.cumsum(on_path, axis=0) - 1
    length = tl.sum(on_path, axis=0)
    return live, a, on_path, pos, length


@triton.jit
def path_rows_update(
    acc, m0, on_path, pos, length, g_end, delta, k, gate_cum, hv, o_v, o_k,
    HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr, NP: tl.constexpr, BM: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """``acc`` [BV, BK] + sum over path positions [m0, m0 + BM) of ``exp(g_end - G_j) delta_j[o_v]
    k_j[o_k]^T`` (positions past ``length`` weigh 0), the path given as :func:`accepted_path` gives it:
    each position's node found by a one-hot reduce over the NP nodes, then :func:`gathered_rows_update`."""
    o_n = tl.arange(0, NP)
    o_m = m0 + tl.arange(0, BM)
    hit = (on_path[None, :] != 0) & (pos[None, :] == o_m[:, None])  # [BM, NP]: one hit per valid row
    idx = tl.sum(tl.where(hit, o_n[None, :], 0), axis=1)
    return gathered_rows_update(
        acc, idx, o_m < length, g_end, delta, k, gate_cum, hv, o_v, o_k, HV, DV, DK, DOT
    )


@triton.jit
def gathered_rows_update(
    acc, idx, m_m, g_end, delta, k, gate_cum, hv, o_v, o_k,
    HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """``acc`` [BV, BK] + sum over the block's rows (nodes ``idx`` [BM], live where ``m_m``) of
    ``exp(g_end - G_j) delta_j[o_v] k_j[o_k]^T``: one gathered [BM, BV] block of delta rows and one
    [BM, BK] block of key rows, loaded at once. DOT: the contraction as one exact ("ieee") dot (BV, BK,
    BM >= 16); else as broadcast products summed over the block (any tile; exact float arithmetic too)."""
    acc_t = acc.dtype
    rows = idx * HV + hv
    g_m = tl.load(gate_cum + rows, mask=m_m, other=0.0).to(acc_t)
    m_v = o_v < DV
    m_k = o_k < DK
    d = tl.load(delta + rows[:, None] * DV + o_v[None, :], mask=m_m[:, None] & m_v[None, :], other=0.0)
    kt = tl.load(k + rows[:, None] * DK + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)
    w = tl.where(m_m, tl.exp(tl.where(m_m, g_end - g_m, 0.0)), 0.0)
    dw = d.to(acc_t) * w[:, None]
    if DOT:
        acc += tl.dot(tl.trans(dw), kt.to(acc_t), input_precision="ieee")
    else:
        acc += tl.sum(dw[:, :, None] * kt.to(acc_t)[:, None, :], axis=0)
    return acc


@triton.jit
def indexed_rows_update(
    acc, m0, path, cap, length, g_end, delta, k, gate_cum, hv, o_v, o_k,
    HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr, BM: tl.constexpr, MODE: tl.constexpr,
):  # fmt: skip
    """:func:`path_rows_update` for a path given as a path index
    (:func:`repro.gdn.triton_commit.write_path_index`: ``path[0]`` = its length, ``path[1 + r]`` = the
    node r steps above its end, r < ``cap``, the index's capacity): positions [m0, m0 + BM) read their nodes
    straight from ``path`` (masked by the capacity, not the length: no load waits on another but the rows
    on the index), no reduce. MODE 0: the block gathered at once and contracted by
    :func:`gathered_rows_update` (1: as a dot); MODE 2: BM rank-1 updates in straight-line code (each row's
    loads in the layouts the tile needs: no shared memory, no barrier)."""
    if MODE == 2:
        acc_t = acc.dtype
        m_v = o_v < DV
        m_k = o_k < DK
        for j in tl.static_range(BM):
            live = m0 + j < length
            row = tl.load(path + 1 + m0 + j, mask=m0 + j < cap, other=0) * HV + hv
            g = tl.load(gate_cum + row, mask=live, other=0.0).to(acc_t)
            d = tl.load(delta + row * DV + o_v, mask=m_v & live, other=0.0).to(acc_t)
            kt = tl.load(k + row * DK + o_k, mask=m_k & live, other=0.0).to(acc_t)
            w = tl.where(live, tl.exp(tl.where(live, g_end - g, 0.0)), 0.0)
            acc += (d * w)[:, None] * kt[None, :]
    else:
        o_m = m0 + tl.arange(0, BM)
        idx = tl.load(path + 1 + o_m, mask=o_m < cap, other=0)
        acc = gathered_rows_update(
            acc, idx, o_m < length, g_end, delta, k, gate_cum, hv, o_v, o_k, HV, DV, DK, MODE == 1
        )
    return acc


@triton.jit
def commit_path_tile(
    s, delta, k, gate_cum, anc, node_ptr, n, hv, o_v, o_k,
    HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr, NP: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """The closed-form commit of one [BV, BK] state tile ``s`` (value rows ``o_v``, key columns ``o_k``
    of value head ``hv``) along the root-to-``node`` path: ``exp(G_a) s + sum_j exp(G_a - G_j) delta_j
    k_j^T`` over the path's nodes j only (a = node, read from the 1-element ``node_ptr``; node < 0: the
    empty path, ``s`` unchanged).

    The path is gathered on the device (:func:`accepted_path`); the loop runs ceil(path length / BM)
    times over blocks of BM path rows (:func:`path_rows_update`; a device value: the grid and every shape
    stay static). Arithmetic in ``s``'s dtype, dots in exact "ieee" (the state persists).
    """
    acc_t = s.dtype
    live, a, on_path, pos, length = accepted_path(anc, node_ptr, n, NP)
    g_end = tl.where(live, tl.load(gate_cum + a * HV + hv).to(acc_t), 0.0)
    acc = tl.zeros_like(s)
    for m0 in range(0, length, BM):
        acc = path_rows_update(acc, m0, on_path, pos, length, g_end, delta, k, gate_cum, hv, o_v, o_k,
                               HV, DV, DK, NP, BM, True)  # fmt: skip
    return tl.exp(g_end) * s + acc


@triton.jit
def commit_indexed_tile(
    s, live, delta, k, gate_cum, path, cap, hv, o_v, o_k,
    HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr, BM: tl.constexpr, MODE: tl.constexpr,
):  # fmt: skip
    """:func:`commit_path_tile` along a path given as a path index (``path``: its length, then its nodes
    from the end up, ``cap`` >= 1 of them at most; :func:`indexed_rows_update`): the length, the end node
    and the first block's nodes in one round trip, the path's rows and the end's gate in the next.
    ``live`` False (or length 0): ``s`` unchanged."""
    length = tl.where(live, tl.load(path), 0)
    a = tl.load(path + 1)  # unmasked (cap >= 1): it need not wait for the length
    g_end = tl.where(length > 0, tl.load(gate_cum + a * HV + hv, mask=length > 0, other=0.0).to(s.dtype), 0.0)
    acc = indexed_rows_update(tl.zeros_like(s), 0, path, cap, length, g_end, delta, k, gate_cum, hv, o_v,
                              o_k, HV, DV, DK, BM, MODE)  # fmt: skip
    for m0 in range(BM, length, BM):  # paths deeper than BM
        acc = indexed_rows_update(acc, m0, path, cap, length, g_end, delta, k, gate_cum, hv, o_v, o_k,
                                  HV, DV, DK, BM, MODE)  # fmt: skip
    return tl.exp(g_end) * s + acc
