"""Kernel benchmarks of GDN tree verification, accepted-state recovery and commit + verify steps.

Every row draws fresh random inputs (bf16-representable q/k/v, L2-normalised q/k, g <= 0,
beta in (0, 1), random S0), runs the method once and compares its output with the float64
reference on those same inputs (‖out - ref‖ / ‖ref‖); only a row within its precision's
tolerance is timed, a row over it is marked FAIL. Timing: median of do_bench (``us``) and of
CUDA-graph replays over several input sets (``us_graph``), see :mod:`repro.bench.timing`.

Cost model (``bytes_min``: each input read once, each output written once; ``flops``), with
n tree nodes, L tokens over all root-to-leaf paths, N paths (leaves), d the accepted depth,
e the q/k/v element size (2 for bf16, 4 for fp32), g/beta/state/factors in fp32:

- io(t) = t (2 H dk e + HV dv e + 2 HV 4): q, k, v, g, beta of t tokens; S = HV dv dk 4.
- tree_fused, tree_split (the two-phase kernel; its scratch not counted), tree_blocked (three launches, T
  explicit: repro.gdn.triton_tree.tree_gdn_blocked; scratch not counted), tree_torch, hybrid / hybrid_torch
  (SpecLA's chain + masked-remainder schedule, repro.gdn.hybrid_schedule; Triton / torch): io(n) + n^2
  (ancestor mask) + S, writes o (n HV dv e), delta (n HV dv 4) and G (n HV 4); flops HV wy(n),
  where the masked WY form costs wy(n) = 3 n^2 dk (K K^T, T (beta e^G K), Q K^T; triangular)
  + 2 n^2 dv (T (beta V), P Delta) + n^3 / 3 (the triangular solve) + 4 n dk dv (W S0^T, Q S0^T);
  rate of its dtype.
- per_branch_recurrent: io(L) + N S (each path starts from S0) + 8 (N + 1) (cu_seqlens),
  writes o (L HV dv e); flops 7 dk dv HV per token (decay, S k, rank-1 update, S q), fp32 rate.
- prefill_flattened: the same bytes; flops HV sum over paths of chunk(len), where
  chunk(l) = sum over 64-token chunks c of wy(c), plus 2 c dk dv for each state hand-off; bf16.
- chain_recurrent / chain_chunk: io(n) + S, writes o; flops as the two above with L = n.
- chain group (one chain of T tokens from S0, S never written): per_branch_recurrent (fla's recurrence
  over the chain's one branch; the baseline), chain_chunk (fla's chunk kernel), tree_fused / tree_split /
  tree_blocked (the project's tree kernels), chain_verify (repro.gdn.chain.verify_chain: the one of those
  its table picks for T and the shape) and chain_torch (its torch reference, float32): each its own
  method's cost; chain_verify and chain_torch those of chain_chunk (the cheapest exact form: io(T) + S,
  writes o; chunked WY flops at the bf16 rate, the fp32 rate for chain_torch).
- per_token_states: k, v, g, beta of n tokens + S + 8 n (parents), writes n S;
  flops 5 dk dv HV per node (decay, S k, rank-1 update), fp32 rate.
- commit_closed_form (torch), commit_closed_form_fused (Triton, repro.gdn.triton_commit: reads every
  node's rows) and commit_path_fused (reads the path's rows only; commit_path_fused_old: the same kernel
  at the earlier settings, triton_commit.OLD_PATH_TILES, not in the default grid): d HV (dv + dk + 1) 4
  (delta, k, G rows of the path) + S, writes S; flops HV (2 d dk dv + 2 dk dv), fp32 rate. The Triton
  commits run in place on their own copy of S0 (earlier runs, e.g. results/2026-11-30-h200-kernels-2,
  also copied S0 inside the timed call: ~1 us more). ``_conv`` rows add the conv-history commit (W = 4,
  C = 2 H dk + HV dv, bf16: 2 (W-1) C 2 bytes): a second launch after the old kernel, the same launch for
  the path one. commit_path_indexed (+ ``_conv``; ``_rank1_conv``: its rank-1 contraction, not in the
  default grid): the path commit reading the path from a path index (triton_commit.write_path_index,
  written once per step for every layer, so outside the timing as replay's gathered inputs are).
- step_* (one speculative step of one layer: commit the previous step's accepted path of depth d, then
  verify the T-node tree from the committed state; bf16 q/k/v, the verification at --bf16-precision):
  tree_fused's bytes and flops + the path's rows + one more S (written); the floor of the fused step.
  step_replay_fla: fla's recurrence over the path (inputs gathered outside the timing), then the tree
  kernel; step_closed_form_fused / step_path_fused: the two Triton commits, then the tree kernel (in these
  three, the one the static decoder picks for the shape and tree size, repro.gdn.chain.select_tree_kernel:
  split at SpecLA's, at Weaver's split for 65-256 nodes, else fused);
  step_delayed_fused: the tree kernel with the pending commit applied to the state it loads (one launch);
  step_delayed_split: the same in tree_split's first phase, beside the key work (two launches, no separate
  commit);
  ``_indexed`` (step_delayed_split_indexed in the grid): the pending path read from a path index (written at
  the previous step's commit, outside the timing; PendingCommit.path), as the static decoder does;
  step_torch: the reference (apply_pending + tree_gdn, float32).
- commit_replay_fla: io(d) + S, writes o (d HV dv e) and S; flops 7 d dk dv HV, fp32 rate.
- commit_snapshot: reads and writes one state (2 S); no flops.

floor_us = max(bytes_min / copy bandwidth, flops / matmul rate), both measured on the device.
"""

from __future__ import annotations

import importlib
import itertools
import math
import os
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
import yaml

from repro.bench.shapes import SHAPES, LayerShape, deepest_path, depths, flatten_paths, make_tree
from repro.bench.timing import TimerConfig, graph_us, measure_ceilings, median_us, timer_name
from repro.errors import ConfigError, describe
from repro.gdn import reference as gdn
from repro.reporting.rundir import Run, RunKind, fields_parser
from repro.tree import Tree

TOLERANCE = {"bf16": 1e-2, "fp32": 1e-4}  # relative error vs float64 (see the device METHOD notes)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CHUNK = 64  # fla's chunk size
MAX_GRAPH_SETS = 16  # input sets a CUDA graph cycles through (enough to spill L2 for small cases)

# (method, dtype) rows per group; the first row of each group is the speedup baseline
VERIFY_ROWS = [
    ("per_branch_recurrent", "bf16"),
    ("tree_fused", "bf16"),
    ("tree_split", "bf16"),
    ("tree_blocked", "bf16"),
    ("hybrid", "bf16"),
    ("tree_fused", "fp32"),
    ("tree_torch", "fp32"),
    ("hybrid_torch", "fp32"),
    ("prefill_flattened", "bf16"),
    ("per_token_states", "bf16"),
]
# chain verification: the project's chain verifier vs each candidate it chooses from (same chain, same S0)
CHAIN_ROWS = [
    ("per_branch_recurrent", "bf16"),
    ("chain_chunk", "bf16"),
    ("tree_fused", "bf16"),
    ("tree_split", "bf16"),
    ("tree_blocked", "bf16"),
    ("chain_verify", "bf16"),
    ("chain_torch", "fp32"),
]
CHAIN_SIZES = [16, 32, 64, 128, 256]
RECOVERY_ROWS = [
    ("commit_replay_fla", "bf16"),
    ("commit_replay_fla_conv", "bf16"),
    ("commit_closed_form", "fp32"),
    ("commit_closed_form_fused", "fp32"),
    ("commit_path_fused", "fp32"),
    ("commit_closed_form_fused_conv", "fp32"),
    ("commit_path_fused_conv", "fp32"),
    ("commit_path_indexed", "fp32"),
    ("commit_path_indexed_conv", "fp32"),
    ("commit_snapshot", "fp32"),
]
CONV_BASELINE = "commit_replay_fla_conv"  # the baseline of the recovery rows that commit the conv history
# one decode step's GDN work: commit the previous step's accepted path, then verify the new tree
STEP_ROWS = [
    ("step_replay_fla", "bf16"),
    ("step_closed_form_fused", "bf16"),
    ("step_path_fused", "bf16"),
    ("step_delayed_fused", "bf16"),
    ("step_delayed_split", "bf16"),
    ("step_delayed_split_indexed", "bf16"),
    ("step_torch", "fp32"),
]
GROUP_ROWS = {"verify": VERIFY_ROWS, "recovery": RECOVERY_ROWS, "step": STEP_ROWS, "chain": CHAIN_ROWS}


def baseline_of(group: str, method: str) -> str:
    """The method a row's speedup is measured against: its group's first row; for a recovery row that also
    commits the conv history (``*_conv``), token replay plus the same conv-history commit."""
    if group == "recovery" and method.endswith("_conv"):
        return CONV_BASELINE
    return GROUP_ROWS[group][0][0]


PRECISION_METHODS = {
    "tree_fused",
    "tree_split",
    "tree_blocked",
    "hybrid",
    "chain_verify",
    *(m for m, _ in STEP_ROWS if m != "step_torch"),
}
CONV_WIDTH = 4  # the GDN models' short-conv width (conv history of 3 rows)
QUICK_SIZES = [4, 8]
QUICK_DEPTHS = [2, 4]

COLUMNS = [
    "shape", "group", "kind", "T", "depth", "leaves", "flat_len", "method", "dtype", "precision", "status",
    "reason", "rel_err", "tol", "us", "us_graph", "graph_sets", "floor_us", "floor_bound", "x_floor",
    "x_floor_graph", "baseline", "speedup", "speedup_graph", "paper_us", "paper_speedup", "paper_ref",
    "prior_us", "bytes_min", "flops", "timer", "seed",
]  # fmt: skip

Fn = Callable[[], torch.Tensor]


# ------------------------------------------------------------------------------ cases, inputs


@dataclass
class Case:
    """One benchmark tree of one layer shape on one device (plus the accepted path, for recovery)."""

    shape: LayerShape
    kind: str
    parents: list[int]
    device: torch.device
    accepted: list[int] | None = None
    precision: str = "ieee"  # tree_fused's float32 dot precision for this row

    @property
    def n(self) -> int:
        return len(self.parents)

    @cached_property
    def paths(self) -> list[list[int]]:
        return flatten_paths(self.parents)

    @property
    def depth(self) -> int:
        return max(depths(self.parents))

    @property
    def flat_len(self) -> int:
        return sum(len(p) for p in self.paths)

    @cached_property
    def tree(self) -> Tree:
        return Tree(torch.zeros(self.n, dtype=torch.long), torch.tensor(self.parents))

    @cached_property
    def ancestors(self) -> torch.Tensor:
        return self.tree.ancestor_mask.to(self.device)

    @cached_property
    def parents_t(self) -> torch.Tensor:
        return torch.tensor(self.parents, dtype=torch.int32, device=self.device)

    @cached_property
    def flat_index(self) -> torch.Tensor:
        return torch.tensor([i for p in self.paths for i in p], dtype=torch.long, device=self.device)

    @cached_property
    def cu_seqlens_cpu(self) -> torch.Tensor:
        return torch.tensor([0] + [len(p) for p in self.paths], dtype=torch.long).cumsum(0)

    @cached_property
    def cu_seqlens(self) -> torch.Tensor:
        return self.cu_seqlens_cpu.to(self.device)

    @cached_property
    def chunk_indices(self) -> torch.Tensor:
        """fla's varlen chunk table, built once from host lengths (no sync inside a graph capture)."""
        from fla.ops.utils.index import prepare_chunk_indices

        return prepare_chunk_indices(self.cu_seqlens, CHUNK, cu_seqlens_cpu=self.cu_seqlens_cpu)


@dataclass
class Inputs:
    """One layer's inputs: q, k [n, H, dk]; v [n, HV, dv]; g, beta [n, HV]; S0 [HV, dv, dk]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    state: torch.Tensor

    def to(self, dtype: str | torch.dtype) -> Inputs:
        """q/k/v in ``dtype``; g, beta and S0 stay float32 (all float64 for the reference)."""
        dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
        low = torch.float64 if dt == torch.float64 else torch.float32
        return Inputs(
            self.q.to(dt), self.k.to(dt), self.v.to(dt), self.g.to(low), self.beta.to(low), self.state.to(low)
        )


def make_inputs(shape: LayerShape, n: int, seed: int, device: torch.device) -> Inputs:
    """Fresh random float64 inputs whose q/k/v are bf16 numbers and g/beta/S0 float32 numbers.

    So every method (bf16 or fp32) sees exactly these values and the float64 reference is exact.
    """
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64

    def bf16(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(f64)

    def fp32(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32).to(f64)

    q = bf16(F.normalize(torch.randn(n, shape.h, shape.dk, generator=gen, dtype=f64), dim=-1))
    k = bf16(F.normalize(torch.randn(n, shape.h, shape.dk, generator=gen, dtype=f64), dim=-1))
    v = bf16(torch.randn(n, shape.hv, shape.dv, generator=gen, dtype=f64))
    rate = 0.05 + 0.8 * torch.rand(1, shape.hv, generator=gen, dtype=f64)  # weak and strong decays
    g = fp32(-torch.rand(n, shape.hv, generator=gen, dtype=f64) * rate)
    beta = fp32(torch.rand(n, shape.hv, generator=gen, dtype=f64).clamp(0.02, 0.98))
    state = fp32(torch.randn(shape.hv, shape.dv, shape.dk, generator=gen, dtype=f64))
    return Inputs(*(t.to(device) for t in (q, k, v, g, beta, state)))


# ------------------------------------------------------------------------------------ methods


def _fla() -> Any:
    return importlib.import_module("fla.ops.gated_delta_rule")


def _triton_tree() -> Any:
    return importlib.import_module("repro.gdn.triton_tree")


def _flat(x: Inputs, idx: torch.Tensor) -> Inputs:
    """Tokens gathered along ``idx`` with a leading batch dim of 1 (fla's varlen layout), contiguous."""
    return Inputs(*(t[idx][None].contiguous() for t in (x.q, x.k, x.v, x.g, x.beta)), x.state)


def _fla_call(op: str, case: Case, x: Inputs, idx: torch.Tensor | None, varlen: bool, final: bool) -> Fn:
    """A closure over one fla call on the tokens ``idx`` (all tokens when None), S0 per sequence.

    State layout: repro's [HV, dv, dk] is fla's ``state_v_first=True`` ([N, HV, V, K]). Returns
    the outputs o [1, L, HV, dv], or the final state when ``final``.
    """
    fla = _fla()
    t = _flat(x, idx if idx is not None else torch.arange(case.n, device=case.device))
    nseq = len(case.paths) if varlen else 1
    s0 = x.state[None].expand(nseq, *x.state.shape).contiguous()
    kw: dict[str, Any] = dict(
        scale=case.shape.scale, initial_state=s0, output_final_state=final, state_v_first=True
    )
    if varlen:
        kw["cu_seqlens"] = case.cu_seqlens
    if op == "chunk":
        if varlen:
            kw.update(cu_seqlens_cpu=case.cu_seqlens_cpu, chunk_indices=case.chunk_indices)
        fn = fla.chunk_gated_delta_rule
        return lambda: fn(t.q, t.k, t.v, t.g, t.beta, **kw)[1 if final else 0]
    fn = fla.fused_recurrent_gated_delta_rule  # its 5th-7th positional arguments are gk, gv, beta
    return lambda: fn(t.q, t.k, t.v, g=t.g, beta=t.beta, **kw)[1 if final else 0]


def build_tree_fused(case: Case, x: Inputs) -> Fn:
    fused = _triton_tree().tree_gdn_fused
    s = case.shape.scale
    prec = case.precision
    return lambda: fused(x.q, x.k, x.v, x.g, x.beta, x.state, case.ancestors, s, precision=prec)[0]


def build_tree_split(case: Case, x: Inputs) -> Fn:
    split = _triton_tree().tree_gdn_split
    s = case.shape.scale
    prec = case.precision
    return lambda: split(x.q, x.k, x.v, x.g, x.beta, x.state, case.ancestors, s, precision=prec)[0]


def build_tree_blocked(case: Case, x: Inputs) -> Fn:
    blocked = _triton_tree().tree_gdn_blocked
    s = case.shape.scale
    prec = case.precision
    return lambda: blocked(x.q, x.k, x.v, x.g, x.beta, x.state, case.ancestors, s, precision=prec)[0]


def build_hybrid(case: Case, x: Inputs, kernel: str | None = None) -> Fn:
    """SpecLA's hybrid schedule (:mod:`repro.gdn.hybrid_schedule`); the plan is built outside the timing."""
    hybrid = importlib.import_module("repro.gdn.hybrid_schedule")
    plan, s = hybrid.plan_hybrid(case.parents, case.device), case.shape.scale
    prec = case.precision
    return lambda: hybrid.hybrid_gdn(
        x.q, x.k, x.v, x.g, x.beta, x.state, plan, s, kernel=kernel, precision=prec
    )[0]


def build_hybrid_torch(case: Case, x: Inputs) -> Fn:
    return build_hybrid(case, x, kernel="reference")


def build_tree_torch(case: Case, x: Inputs) -> Fn:
    return lambda: gdn.tree_gdn(x.q, x.k, x.v, x.g, x.beta, x.state, case.ancestors, case.shape.scale)[0]


def build_per_branch_recurrent(case: Case, x: Inputs) -> Fn:
    return _fla_call("recurrent", case, x, case.flat_index, varlen=True, final=False)


def build_prefill_flattened(case: Case, x: Inputs) -> Fn:
    return _fla_call("chunk", case, x, case.flat_index, varlen=True, final=False)


def build_per_token_states(case: Case, x: Inputs) -> Fn:
    states = _triton_tree().tree_states_fused
    return lambda: states(x.k, x.v, x.g, x.beta, x.state, case.parents_t)


def build_chain_recurrent(case: Case, x: Inputs) -> Fn:
    return _fla_call("recurrent", case, x, None, varlen=False, final=False)


def build_chain_chunk(case: Case, x: Inputs) -> Fn:
    return _fla_call("chunk", case, x, None, varlen=False, final=False)


def build_chain_verify(case: Case, x: Inputs) -> Fn:
    verify = importlib.import_module("repro.gdn.chain").verify_chain
    s, prec = case.shape.scale, case.precision
    return lambda: verify(x.q, x.k, x.v, x.g, x.beta, x.state, s, precision=prec)


def build_chain_torch(case: Case, x: Inputs) -> Fn:
    verify = importlib.import_module("repro.gdn.chain").verify_chain
    return lambda: verify(x.q, x.k, x.v, x.g, x.beta, x.state, case.shape.scale, method="reference")


def _factors(case: Case, x: Inputs, snapshots: bool) -> gdn.TreeFactors:
    """Verification factors of the whole tree (pure torch, float32), computed outside the timing, each
    contiguous as the engine's buffers are (the reference returns delta as a view: a Triton commit would
    copy it inside every timed call)."""
    q, k, v = x.q.float(), x.k.float(), x.v.float()
    f = gdn.tree_gdn(q, k, v, x.g, x.beta, x.state, case.ancestors, case.shape.scale, snapshots)[1]
    f.delta, f.k, f.gate_cum = (t.contiguous() for t in (f.delta, f.k, f.gate_cum))
    return f


def build_commit_closed_form(case: Case, x: Inputs) -> Fn:
    f, path = _factors(case, x, snapshots=False), case.accepted
    return lambda: gdn.commit_closed_form(x.state, f, path)


def _conv_operands(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(history [W-1, C], conv inputs [n, C], gather index [n, W]) of the layer's q|k|v conv, bf16."""
    sh, gen = case.shape, torch.Generator().manual_seed(case.n)
    c = 2 * sh.h * sh.dk + sh.hv * sh.dv
    history = torch.randn(CONV_WIDTH - 1, c, generator=gen).to(case.device, torch.bfloat16)
    inputs = torch.randn(case.n, c, generator=gen).to(case.device, torch.bfloat16)
    return history, inputs, gdn.conv_gather_index(case.tree.parents, CONV_WIDTH).to(case.device)


def _fused_commit(case: Case, x: Inputs, kernel: str, conv: bool) -> Fn:
    """A Triton commit (repro.gdn.triton_commit) of the accepted path, in place on its own copy of S0
    (the path end read from a device tensor); ``conv``: the conv-history commit too (the old kernel: a
    second launch; the path kernel: the same launch)."""
    mod = importlib.import_module("repro.gdn.triton_commit")
    f, path = _factors(case, x, snapshots=False), case.accepted
    assert path
    node = torch.tensor([path[-1]], device=case.device)
    state = x.state.clone()
    ops = (f.delta, f.k, f.gate_cum, case.ancestors, node)
    hist, inputs, index = _conv_operands(case) if conv else (None, None, None)

    tiles = mod.OLD_PATH_TILES if kernel == "path_old" else {}
    if kernel.startswith("indexed"):  # the path index: written once per step (outside the timing)
        index = mod.path_index_buffer(case.n, case.device)
        mod.write_path_index(case.ancestors, node, index)
        mode = kernel.partition("_")[2] or "dot"

        def run_indexed() -> torch.Tensor:
            conv_ops = (hist, inputs) if conv else None
            mod.commit_path_indexed(state, f.delta, f.k, f.gate_cum, index, conv=conv_ops, mode=mode)
            return state

        return run_indexed

    def run() -> torch.Tensor:
        if kernel.startswith("path"):
            mod.commit_path_fused(state, *ops, conv=(hist, inputs, index) if conv else None, **tiles)
        else:
            mod.commit_closed_form_fused(state, *ops)
            if conv:
                mod.commit_conv_fused(hist, inputs, index, node)
        return state

    return run


def build_commit_closed_form_fused(case: Case, x: Inputs) -> Fn:
    return _fused_commit(case, x, "closed_form", conv=False)


def build_commit_path_fused(case: Case, x: Inputs) -> Fn:
    return _fused_commit(case, x, "path", conv=False)


def build_commit_path_fused_old(case: Case, x: Inputs) -> Fn:
    return _fused_commit(case, x, "path_old", conv=False)


def build_commit_path_indexed(case: Case, x: Inputs) -> Fn:
    return _fused_commit(case, x, "indexed", conv=False)


def build_commit_path_indexed_conv(case: Case, x: Inputs) -> Fn:
    return _fused_commit(case, x, "indexed", conv=True)


def build_commit_path_indexed_rank1_conv(case: Case, x: Inputs) -> Fn:
    return _fused_commit(case, x, "indexed_rank1", conv=True)


def build_commit_closed_form_fused_conv(case: Case, x: Inputs) -> Fn:
    return _fused_commit(case, x, "closed_form", conv=True)


def build_commit_path_fused_conv(case: Case, x: Inputs) -> Fn:
    return _fused_commit(case, x, "path", conv=True)


def previous_inputs(case: Case) -> Inputs:
    """The previous step's inputs (float64) of a step row: the same tree, its own seed, S0 = the step's."""
    return make_inputs(case.shape, case.n, seed_of("previous", case.shape.name, case.n), case.device)


def _step(case: Case, x: Inputs, commit: str) -> Fn:
    """Commit the previous step's accepted path into a copy of S0 (``commit``: replay with fla's recurrence,
    the Triton closed forms, or "delayed": inside the verification), then verify the case's tree from it
    (at the row's precision; the delayed rows name their kernel, the others take the static decoder's
    choice for the shape). Returns o of the new tree."""
    from repro.gdn.chain import select_tree_kernel

    tt = _triton_tree()
    prev = previous_inputs(case).to(x.q.dtype)
    prev.state = x.state
    f = _factors(case, prev, snapshots=False)
    node = torch.tensor([case.accepted[-1]], device=case.device)
    pending = gdn.PendingCommit(f.delta, f.k, f.gate_cum, case.ancestors, node)
    state = x.state.clone()
    s, prec, anc = case.shape.scale, case.precision, case.ancestors
    split = select_tree_kernel(x.q.dtype, x.v.shape[1], case.n) == "split"
    engine_verify = tt.tree_gdn_split if split else tt.tree_gdn_fused
    if commit == "replay":
        idx = torch.tensor(case.accepted, dtype=torch.long, device=case.device)
        replay = _fla_call("recurrent", case, prev, idx, varlen=False, final=True)

        def run() -> torch.Tensor:
            return engine_verify(x.q, x.k, x.v, x.g, x.beta, replay()[0], anc, s, precision=prec)[0]

        return run
    if commit.endswith("_indexed"):  # the pending path as a path index (written at the commit: untimed)
        mod = importlib.import_module("repro.gdn.triton_commit")
        pending.path = mod.path_index_buffer(case.n, case.device)
        mod.write_path_index(case.ancestors, node, pending.path)
        commit = commit.removesuffix("_indexed")
    if commit in ("delayed", "delayed_split"):
        verify = tt.tree_gdn_split if commit == "delayed_split" else tt.tree_gdn_fused
        return lambda: verify(x.q, x.k, x.v, x.g, x.beta, state, anc, s, prec, pending=pending)[0]
    mod = importlib.import_module("repro.gdn.triton_commit")
    fn = mod.commit_path_fused if commit == "path" else mod.commit_closed_form_fused

    def run_commit() -> torch.Tensor:
        fn(state, f.delta, f.k, f.gate_cum, anc, node)
        return engine_verify(x.q, x.k, x.v, x.g, x.beta, state, anc, s, precision=prec)[0]

    return run_commit


def build_step_replay_fla(case: Case, x: Inputs) -> Fn:
    return _step(case, x, "replay")


def build_step_closed_form_fused(case: Case, x: Inputs) -> Fn:
    return _step(case, x, "closed_form")


def build_step_path_fused(case: Case, x: Inputs) -> Fn:
    return _step(case, x, "path")


def build_step_delayed_fused(case: Case, x: Inputs) -> Fn:
    return _step(case, x, "delayed")


def build_step_delayed_split(case: Case, x: Inputs) -> Fn:
    return _step(case, x, "delayed_split")


def build_step_delayed_fused_indexed(case: Case, x: Inputs) -> Fn:
    return _step(case, x, "delayed_indexed")


def build_step_delayed_split_indexed(case: Case, x: Inputs) -> Fn:
    return _step(case, x, "delayed_split_indexed")


def build_step_torch(case: Case, x: Inputs) -> Fn:
    """The reference step: reference.apply_pending, then reference.tree_gdn (float32)."""
    prev = previous_inputs(case).to(torch.float32)
    prev.state = x.state
    f = _factors(case, prev, snapshots=False)
    node = torch.tensor([case.accepted[-1]], device=case.device)
    pending = gdn.PendingCommit(f.delta, f.k, f.gate_cum, case.ancestors, node)
    state = x.state.clone()

    def run() -> torch.Tensor:
        gdn.apply_pending(state, pending)
        return gdn.tree_gdn(x.q, x.k, x.v, x.g, x.beta, state, case.ancestors, case.shape.scale)[0]

    return run


def build_commit_snapshot(case: Case, x: Inputs) -> Fn:
    f, path = _factors(case, x, snapshots=True), case.accepted
    return lambda: gdn.commit_snapshot(x.state, f, path)


def build_commit_replay_fla(case: Case, x: Inputs) -> Fn:
    idx = torch.tensor(case.accepted, dtype=torch.long, device=case.device)
    return _fla_call("recurrent", case, x, idx, varlen=False, final=True)


def build_commit_replay_fla_conv(case: Case, x: Inputs) -> Fn:
    """Token replay of the accepted path, then the conv-history commit (the project's conv kernel, the
    path end read from a device tensor): what replay costs an engine that must also commit the conv."""
    mod = importlib.import_module("repro.gdn.triton_commit")
    replay = build_commit_replay_fla(case, x)
    hist, inputs, index = _conv_operands(case)
    node = torch.tensor([case.accepted[-1]], device=case.device)

    def run() -> torch.Tensor:
        state = replay()
        mod.commit_conv_fused(hist, inputs, index, node)
        return state

    return run


# --------------------------------------------------------------------------------- cost model


def wy_flops(n: int, dk: int, dv: int) -> float:
    """Flops of the masked WY form for n tokens, one value head (module docstring)."""
    return 3 * n * n * dk + 2 * n * n * dv + n**3 / 3 + 4 * n * dk * dv


def chunk_flops(length: int, dk: int, dv: int, chunk: int = CHUNK) -> float:
    """Flops of chunked GDN over one sequence: wy per chunk plus the state hand-offs."""
    sizes = [min(chunk, length - s) for s in range(0, length, chunk)]
    return sum(wy_flops(c, dk, dv) for c in sizes) + sum(2 * c * dk * dv for c in sizes[:-1])


def cost(method: str, dtype: str, case: Case) -> tuple[int, float, str]:
    """(bytes_min, flops, rate key "bf16"/"fp32") of one call (module docstring)."""
    sh, n = case.shape, case.n
    e = 2 if dtype == "bf16" else 4
    state = sh.hv * sh.dv * sh.dk * 4

    def io(t: int) -> int:
        return t * (2 * sh.h * sh.dk * e + sh.hv * sh.dv * e + 2 * sh.hv * 4)

    def o(t: int) -> int:
        return t * sh.hv * sh.dv * e

    rec = 7 * sh.dk * sh.dv * sh.hv  # flops per token of the recurrence
    if method in ("tree_fused", "tree_split", "tree_blocked", "tree_torch", "hybrid", "hybrid_torch"):
        nbytes = io(n) + n * n + state + o(n) + n * sh.hv * (sh.dv + 1) * 4
        return nbytes, sh.hv * wy_flops(n, sh.dk, sh.dv), dtype
    if method in ("per_branch_recurrent", "prefill_flattened"):
        L, N = case.flat_len, len(case.paths)
        nbytes = io(L) + N * state + 8 * (N + 1) + o(L)
        if method == "per_branch_recurrent":
            return nbytes, float(L * rec), "fp32"
        return nbytes, sh.hv * sum(chunk_flops(len(p), sh.dk, sh.dv) for p in case.paths), "bf16"
    if method == "chain_recurrent":
        return io(n) + state + o(n), float(n * rec), "fp32"
    if method in ("chain_chunk", "chain_verify", "chain_torch"):
        rate = "fp32" if method == "chain_torch" else "bf16"
        return io(n) + state + o(n), sh.hv * chunk_flops(n, sh.dk, sh.dv), rate
    if method == "per_token_states":
        kvgb = n * (sh.h * sh.dk * e + sh.hv * sh.dv * e + 2 * sh.hv * 4)
        return kvgb + state + 8 * n + n * state, float(n * 5 * sh.dk * sh.dv * sh.hv), "fp32"
    d = len(case.accepted or [])
    conv = 2 * (CONV_WIDTH - 1) * (2 * sh.h * sh.dk + sh.hv * sh.dv) * 2  # bf16 history read and written
    path_rows = d * sh.hv * (sh.dv + sh.dk + 1) * 4  # delta, k, G of the path
    if method.startswith("commit_closed_form") or method.startswith("commit_path"):
        nbytes = path_rows + 2 * state + (conv if method.endswith("_conv") else 0)
        return nbytes, float(sh.hv * (2 * d + 2) * sh.dk * sh.dv), "fp32"
    if method.startswith(
        "step_"
    ):  # the tree's verification plus the path's rows; S0 read once, S written once
        t_bytes, t_flops, _ = cost("tree_fused", "bf16", case)
        return t_bytes + path_rows + state, t_flops + sh.hv * (2 * d + 2) * sh.dk * sh.dv, "bf16"
    if method in ("commit_replay_fla", CONV_BASELINE):
        nbytes = io(d) + 2 * state + o(d) + (conv if method == CONV_BASELINE else 0)
        return nbytes, float(d * rec), "fp32"
    if method == "commit_snapshot":
        return 2 * state, 0.0, "fp32"
    raise KeyError(f"no cost model for method {method!r}")


# ----------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Method:
    """A benchmarked method: how to build its closure and what its output is compared with.

    ``output``: "nodes" (o per node, [n, HV, dv]), "flat" (o over the flattened paths),
    "states" (state after every node), "commit" (state after the accepted path) or "step" (o per node
    of the tree verified from the state after the previous step's accepted path).
    ``needs``: "torch" (runs anywhere), "fla" or "triton_tree" (CUDA only).
    """

    build: Callable[[Case, Inputs], Fn]
    output: str
    needs: str
    graphable: bool = True
    graph_note: str = ""


METHODS: dict[str, Method] = {
    "tree_fused": Method(build_tree_fused, "nodes", "triton_tree"),
    "tree_split": Method(build_tree_split, "nodes", "triton_tree"),
    "tree_blocked": Method(build_tree_blocked, "nodes", "triton_tree"),
    "tree_torch": Method(build_tree_torch, "nodes", "torch", False, "not graph-timed (reference path)"),
    "hybrid": Method(build_hybrid, "nodes", "triton_tree"),
    "hybrid_torch": Method(build_hybrid_torch, "nodes", "torch", False, "not graph-timed (reference path)"),
    "per_branch_recurrent": Method(build_per_branch_recurrent, "flat", "fla"),
    "prefill_flattened": Method(build_prefill_flattened, "flat", "fla"),
    "per_token_states": Method(build_per_token_states, "states", "triton_tree"),
    "chain_recurrent": Method(build_chain_recurrent, "nodes", "fla"),
    "chain_chunk": Method(build_chain_chunk, "nodes", "fla"),
    "chain_verify": Method(build_chain_verify, "nodes", "triton_tree"),
    "chain_torch": Method(build_chain_torch, "nodes", "torch", False, "not graph-timed (reference path)"),
    "commit_closed_form": Method(
        build_commit_closed_form, "commit", "torch", False, "not capturable (host-to-device path index copy)"
    ),
    "commit_closed_form_fused": Method(build_commit_closed_form_fused, "commit", "triton_tree"),
    "commit_path_fused": Method(build_commit_path_fused, "commit", "triton_tree"),
    "commit_path_fused_old": Method(build_commit_path_fused_old, "commit", "triton_tree"),
    "commit_closed_form_fused_conv": Method(build_commit_closed_form_fused_conv, "commit", "triton_tree"),
    "commit_path_fused_conv": Method(build_commit_path_fused_conv, "commit", "triton_tree"),
    "commit_path_indexed": Method(build_commit_path_indexed, "commit", "triton_tree"),
    "commit_path_indexed_conv": Method(build_commit_path_indexed_conv, "commit", "triton_tree"),
    "commit_path_indexed_rank1_conv": Method(build_commit_path_indexed_rank1_conv, "commit", "triton_tree"),
    "commit_replay_fla": Method(build_commit_replay_fla, "commit", "fla"),
    CONV_BASELINE: Method(build_commit_replay_fla_conv, "commit", "fla"),
    "commit_snapshot": Method(build_commit_snapshot, "commit", "torch"),
    "step_replay_fla": Method(build_step_replay_fla, "step", "fla"),
    "step_closed_form_fused": Method(build_step_closed_form_fused, "step", "triton_tree"),
    "step_path_fused": Method(build_step_path_fused, "step", "triton_tree"),
    "step_delayed_fused": Method(build_step_delayed_fused, "step", "triton_tree"),
    "step_delayed_split": Method(build_step_delayed_split, "step", "triton_tree"),
    "step_delayed_fused_indexed": Method(build_step_delayed_fused_indexed, "step", "triton_tree"),
    "step_delayed_split_indexed": Method(build_step_delayed_split_indexed, "step", "triton_tree"),
    "step_torch": Method(build_step_torch, "step", "torch", False, "not graph-timed (reference path)"),
}


def unavailable(needs: str, device: torch.device) -> str | None:
    """Why a method with these needs cannot run here, or None."""
    if needs == "torch":
        return None
    if device.type != "cuda":
        return "needs CUDA"
    module = {"fla": "fla.ops.gated_delta_rule", "triton_tree": "repro.gdn.triton_tree"}[needs]
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure makes the method unavailable
        return f"cannot import {module}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def reference(output: str, case: Case, x64: Inputs) -> torch.Tensor:
    """The float64 answer a method's output is compared with."""
    state = x64.state
    if output in ("commit", "step"):
        p = case.accepted or []
        src = previous_inputs(case) if output == "step" else x64
        state = gdn.recurrent_gdn(
            src.q[p], src.k[p], src.v[p], src.g[p], src.beta[p], x64.state, case.shape.scale
        )[1]
        if output == "commit":
            return state
    o, f = gdn.tree_gdn(
        x64.q,
        x64.k,
        x64.v,
        x64.g,
        x64.beta,
        state,
        case.ancestors,
        case.shape.scale,
        keep_snapshots=output == "states",
    )
    if output == "states":
        assert f.snapshots is not None
        return f.snapshots
    return o[case.flat_index] if output == "flat" else o


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out - ref‖ / ‖ref‖ in float64 (NaN or inf when out is not finite)."""
    diff = out.reshape(ref.shape).to(torch.float64) - ref
    return float(diff.norm() / ref.norm().clamp_min(1e-300))


# ------------------------------------------------------------------------------ baselines yaml


def baselines_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "baselines"


def paper_numbers(root: Path | None = None) -> dict[tuple, dict[str, Any]]:
    """Published and prior numbers keyed by (shape, group, kind, method, dtype, T or None).

    From baselines/weaver.yaml (Table 1 / Fig. 5, B200), specla.yaml (microbenchmark ranges,
    H100) and related.yaml (stock fla kernels measured earlier on the project's H200: prior_us).
    Missing files give an empty table.
    """
    root = root or baselines_dir()

    def load(name: str) -> dict[str, Any]:
        path = root / name
        return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}

    out: dict[tuple, dict[str, Any]] = {}

    def put(key: tuple, **vals: Any) -> None:
        out.setdefault(key, {}).update(vals)

    kern = load("weaver.yaml").get("gdn_tree_verify_kernel", {})
    ref = f"baselines/weaver.yaml gdn_tree_verify_kernel ({kern.get('ref', '')}, B200)"
    for r in kern.get("rows", []):
        t = r["tree_nodes"]
        put(
            ("weaver", "verify", "draft", "tree_fused", "bf16", t),
            paper_us=r["tree_kernel_us"],
            paper_speedup=f"{r['speedup']:g}",
            paper_ref=ref,
        )
        put(
            ("weaver", "verify", "draft", "per_branch_recurrent", "bf16", t),
            paper_us=r["per_branch_recurrent_us"],
            paper_ref=ref,
        )
    for m in load("specla.yaml").get("microbenchmarks", []):
        recovery = ("recovery", "draft", "commit_closed_form_fused", "fp32")
        key = {
            "tree_verify_vs_root_to_leaf_replay": ("verify", "draft", "tree_fused", "bf16"),
            "accepted_state_recovery_vs_token_replay": recovery,
        }.get(m.get("metric"))
        if key:
            put(
                ("specla", *key, None),
                paper_speedup=f"{m['low']:g}-{m['high']:g}",
                paper_ref=f"baselines/specla.yaml {m['metric']} ({m.get('ref', '')}, H100)",
            )
    prior = load("related.yaml").get("gpu_baselines_h200_fla_0_6_0", {})
    names = {"27b_gdn": "weaver", "1.3b_gdn": "specla"}
    cols = {  # on a chain, fla's recurrence is the per-branch baseline (one branch)
        "fused_recurrent_chain_us": ("chain", "chain", "per_branch_recurrent"),
        "chunk_chain_us": ("chain", "chain", "chain_chunk"),
        "per_branch_tree_us": ("verify", "draft", "per_branch_recurrent"),
    }
    for r in prior.get("rows", []):
        for col, (group, kind, method) in cols.items():
            if col in r and r["shape"] in names:
                put((names[r["shape"]], group, kind, method, "bf16", r["T"]), prior_us=r[col])
    return out


def lookup_paper(table: dict[tuple, dict[str, Any]], key: tuple) -> dict[str, Any]:
    """The entry for the key with its T, merged over the T-independent entry (T None)."""
    return {**table.get((*key[:-1], None), {}), **table.get(key, {})}


# ----------------------------------------------------------------------------------- the grid


@dataclass
class BenchConfig:
    """What to measure: shapes, verification sizes and recovery depths per shape, tree kinds."""

    shapes: list[str] = field(default_factory=lambda: ["weaver", "specla"])
    sizes: dict[str, list[int]] = field(
        default_factory=lambda: {
            "weaver": [16, 32, 64, 128, 256],
            "specla": [16, 32, 64, 128],
            "tiny-qwen35": [17, 33, 65],
        }
    )
    chain_sizes: dict[str, list[int]] = field(
        default_factory=lambda: {"weaver": CHAIN_SIZES, "specla": CHAIN_SIZES, "tiny-qwen35": CHAIN_SIZES}
    )  # the chain group's lengths
    kinds: list[str] = field(default_factory=lambda: ["draft", "chain"])
    depths: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    recovery_nodes: int = 128
    step_nodes: int = 64  # the step rows' tree (SpecLA's T = 64) and previous accepted depths
    step_depths: list[int] = field(default_factory=lambda: [2, 4, 8])
    bf16_precision: str = "tf32"  # tree_fused's float32 dots with bf16 inputs (fp32 rows: "ieee")
    seed: int = 0
    quick: bool = False
    budget_s: float | None = None  # rows not started within this many seconds are recorded as skipped
    groups: list[str] | None = None  # only these row groups (verify, recovery, step, chain); None: all
    methods: list[str] | None = None  # only these methods (each block's baseline kept); None: all
    timer: TimerConfig = field(default_factory=TimerConfig)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bench": "kernels",
            "shapes": {s: vars(SHAPES[s]) for s in self.shapes},
            "sizes": self.sizes,
            "chain_sizes": self.chain_sizes,
            "kinds": self.kinds,
            "depths": self.depths,
            "recovery_nodes": self.recovery_nodes,
            "step_nodes": self.step_nodes,
            "step_depths": self.step_depths,
            "bf16_precision": self.bf16_precision,
            "seed": self.seed,
            "quick": self.quick,
            "budget_s": self.budget_s,
            "groups": self.groups,
            "methods": self.methods,
            "timer": vars(self.timer),
            "tolerance": TOLERANCE,
            "tree": "draft_tree(n, seed, max_depth=16, branching=4, alpha=0.15) or chain",
            "max_graph_sets": MAX_GRAPH_SETS,
        }


@dataclass(frozen=True)
class RowSpec:
    shape: str
    group: str  # verify | recovery | step | chain
    kind: str
    T: int
    method: str
    dtype: str
    accepted: int | None = None


def block_deadline(budget_s: float, blocks: list[tuple[str, str]], block: tuple[str, str]) -> float:
    """Seconds into the run after which a (group, shape) block's rows are no longer started: the budget is
    shared evenly by the blocks in plan order, and a block may use what the blocks before it left unspent
    (so one slow group or shape cannot starve the rest of a side-by-side run)."""
    return budget_s * (blocks.index(block) + 1) / len(blocks)


def plan(cfg: BenchConfig) -> list[RowSpec]:
    """Every row, the most telling first (tree verification, recovery, steps, then chains; see ``budget_s``),
    of ``groups`` and ``methods`` when given.

    Each (shape, group, kind, T[, depth]) block starts with its baseline (kept whatever ``methods`` says).
    """
    rows: list[RowSpec] = []
    for kind in [k for k in cfg.kinds if k != "chain"]:
        for shape in cfg.shapes:
            rows += [
                RowSpec(shape, "verify", kind, t, m, d) for t in cfg.sizes[shape] for m, d in VERIFY_ROWS
            ]
    for shape in cfg.shapes:
        for depth in cfg.depths:
            rows += [
                RowSpec(shape, "recovery", "draft", cfg.recovery_nodes, m, d, depth) for m, d in RECOVERY_ROWS
            ]
    step_nodes = min(cfg.step_nodes, cfg.recovery_nodes) if cfg.quick else cfg.step_nodes
    step_depths = cfg.depths if cfg.quick else cfg.step_depths
    for shape in cfg.shapes:
        for depth in step_depths:
            rows += [RowSpec(shape, "step", "draft", step_nodes, m, d, depth) for m, d in STEP_ROWS]
    if "chain" in cfg.kinds:
        for shape in cfg.shapes:
            sizes = cfg.chain_sizes.get(shape, cfg.sizes[shape])
            rows += [RowSpec(shape, "chain", "chain", t, m, d) for t in sizes for m, d in CHAIN_ROWS]
    chosen = set(METHODS) if cfg.methods is None else set(cfg.methods)
    kept = chosen | {baseline_of(r.group, r.method) for r in rows if r.method in chosen}
    kept |= {table[0][0] for table in GROUP_ROWS.values()}
    return [r for r in rows if (cfg.groups is None or r.group in cfg.groups) and r.method in kept]


def check_selection(groups: list[str] | None, methods: list[str] | None) -> None:
    """One-line ConfigError for a group or method the bench does not have."""
    for group in groups or []:
        if group not in GROUP_ROWS:
            raise ConfigError(f"unknown row group {group!r}: choose from {', '.join(GROUP_ROWS)}")
    known = {m for table in GROUP_ROWS.values() for m, _ in table}
    for method in methods or []:
        if method not in known:
            raise ConfigError(f"unknown method {method!r}: choose from {', '.join(sorted(known))}")


def seed_of(*parts: object) -> int:
    """A deterministic 31-bit seed from the parts (``hash`` of a str is salted per process)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def make_case(spec: RowSpec, cfg: BenchConfig, device: torch.device) -> Case:
    """The tree of a row: the same tree for every method of one (shape, kind, T).

    Recovery rows use the first tree of a fixed seed sequence that is at least max(cfg.depths) deep,
    so that every accepted depth is cut from the same deepest path.
    """
    need = (
        1 if spec.accepted is None else spec.accepted if spec.group == "step" else max(cfg.depths, default=1)
    )
    for attempt in range(100):
        parents = make_tree(spec.kind, spec.T, seed_of("tree", spec.kind, spec.T, cfg.seed, attempt))
        if max(depths(parents)) >= need:
            break
    accepted = deepest_path(parents, spec.accepted) if spec.accepted is not None else None
    precision = "ieee" if spec.dtype == "fp32" else cfg.bf16_precision
    return Case(SHAPES[spec.shape], spec.kind, parents, device, accepted, precision)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def graph_sets(device: torch.device, nbytes: int) -> int:
    """Input sets a graph cycles through so that one cycle moves at least 3x the L2 size."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(1, min(MAX_GRAPH_SETS, math.ceil(3 * l2 / max(nbytes, 1))))


def measure(
    spec: RowSpec, cfg: BenchConfig, device: torch.device, ceilings: dict[str, Any], skip: str | None = None
) -> dict[str, Any]:
    """One row: build, check against float64, time (or record why not, e.g. ``skip``)."""
    seed = seed_of(spec, cfg.seed)
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(
        shape=spec.shape,
        group=spec.group,
        kind=spec.kind,
        T=spec.T,
        method=spec.method,
        dtype=spec.dtype,
        tol=TOLERANCE[spec.dtype],
        timer=timer_name(device),
        seed=seed,
        reason="",
    )
    method = METHODS[spec.method]
    try:
        case = make_case(spec, cfg, device)
        row.update(
            precision=case.precision if spec.method in PRECISION_METHODS else None,
            depth=spec.accepted if spec.group in ("recovery", "step") else case.depth,
            leaves=len(case.paths),
            flat_len=case.flat_len,
        )
        nbytes, flops, rate = cost(spec.method, spec.dtype, case)
        t_bytes = nbytes / (ceilings["copy_GBps"] * 1e3)
        t_flops = flops / (ceilings[f"{rate}_TFLOPs"] * 1e6)
        row.update(
            bytes_min=nbytes,
            flops=flops,
            floor_us=max(t_bytes, t_flops),
            floor_bound="bytes" if t_bytes >= t_flops else "flops",
        )
        why = skip or unavailable(method.needs, device)
        if why:
            row.update(status="skipped", reason=why)
            return row
        with torch.no_grad():
            x64 = make_inputs(case.shape, case.n, seed, device)
            fn = method.build(case, x64.to(spec.dtype))
            out = fn()
            _sync(device)
            err = rel_err(out, reference(method.output, case, x64))
            row["rel_err"] = err
            del out
            if not err <= row["tol"]:  # NaN fails too
                row.update(status="FAIL", reason=f"rel err {err:.2e} > tol {row['tol']:.0e}: not timed")
                return row
            row["us"] = median_us(fn, device, cfg.timer)
            row["status"] = "ok"
            if device.type == "cuda" and method.graphable:
                sets = graph_sets(device, nbytes)
                fns = [fn] + [
                    method.build(case, make_inputs(case.shape, case.n, seed + i, device).to(spec.dtype))
                    for i in range(1, sets)
                ]
                try:
                    row["us_graph"] = graph_us(fns, device, cfg.timer, row["us"])
                    row["graph_sets"] = sets
                except Exception as exc:  # noqa: BLE001 - a failed capture is recorded, the row stays
                    _sync(device)
                    row["reason"] = f"graph capture failed: {describe(exc)}"
            elif method.graph_note and device.type == "cuda":
                row["reason"] = method.graph_note
    except Exception as exc:  # noqa: BLE001 - one broken method must not stop the table
        row.update(status="error", reason=describe(exc))
        print(f"== {spec}: error", file=sys.stderr)
        traceback.print_exc()  # the whole story goes to the log; the record keeps one line
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _block(row: dict[str, Any]) -> tuple:
    """The rows a speedup compares: same shape, group, tree and (recovery, step) accepted depth."""
    return (
        row["shape"],
        row["group"],
        row["kind"],
        row["T"],
        row["depth"] if row["group"] in ("recovery", "step") else 0,
    )


def derive(row: dict[str, Any], rows: Iterable[dict[str, Any]], paper: dict[tuple, dict[str, Any]]) -> None:
    """Fill ratio to floor, speedup vs the block's baseline (the group's first row) and the paper columns."""
    for col, src in (("x_floor", "us"), ("x_floor_graph", "us_graph")):
        if row[src] is not None and row["floor_us"]:
            row[col] = row[src] / row["floor_us"]
    row["baseline"] = baseline_of(row["group"], row["method"])
    base = [o for o in rows if _block(o) == _block(row) and o["method"] == row["baseline"]]
    for col, src in (("speedup", "us"), ("speedup_graph", "us_graph")):
        if base and base[0][src] is not None and row[src]:
            row[col] = base[0][src] / row[src]
    key = (row["shape"], row["group"], row["kind"], row["method"], row["dtype"], row["T"])
    row.update(lookup_paper(paper, key))


# ------------------------------------------------------------------------------------ the run


def default_out_dir() -> Path:
    return Path("results") / f"bench-kernels-{datetime.now(timezone.utc):%Y-%m-%d}"


def run_bench(
    cfg: BenchConfig,
    out_dir: str | Path,
    figures_dir: str | Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> pd.DataFrame:
    """Measure every row of the plan; write records.jsonl (as rows come), manifest, report, table, figures.

    CPU, or ``cfg.quick``: the CPU device, the perf_counter timer; methods that need CUDA are
    recorded as skipped. Returns the table.
    """
    from repro.reporting.records import build_manifest
    from repro.reporting.rundir import RunDir

    out_dir = Path(out_dir)
    device = torch.device("cuda" if torch.cuda.is_available() and not cfg.quick else "cpu")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    manifest = build_manifest(cfg.as_dict(), seed=cfg.seed)
    with RunDir(out_dir, manifest, kind=KIND) as run:  # refuses an existing run before measuring
        ceilings = measure_ceilings(device, cfg.timer, quick=device.type != "cuda")
        bench_device = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        run.update_manifest(bench_device=bench_device, ceilings=ceilings)
        paper = paper_numbers()
        rows: list[dict[str, Any]] = []
        start = time.monotonic()
        specs = plan(cfg)
        blocks = list(dict.fromkeys((s.group, s.shape) for s in specs))
        for spec in specs:
            over = cfg.budget_s is not None and time.monotonic() - start > block_deadline(
                cfg.budget_s, blocks, (spec.group, spec.shape)
            )
            skip = (
                f"time budget of {cfg.budget_s:g} s spent (the {spec.shape} {spec.group} rows' share)"
                if over
                else None
            )
            row = measure(spec, cfg, device, ceilings, skip)
            derive(row, rows + [row], paper)
            rows.append(row)
            run.append(row)
            if progress:
                progress(row)
        run.write_report(figures_dir if figures_dir is not None else out_dir / "figures")
    return pd.DataFrame(rows, columns=COLUMNS)


def build_report(run: Run, figures_dir: Path | None) -> str:
    """table.csv, figures (in ``figures_dir``) and report.md of a bench-kernels run, from its records."""
    table = pd.DataFrame(run.records, columns=COLUMNS)
    run.write("table.csv", table.to_csv(index=False))
    figs = write_figures(table, figures_dir) if figures_dir is not None else {}
    text = report_markdown(
        table, run.manifest, run.path, {k: os.path.relpath(v, run.path) for k, v in figs.items()}
    )
    run.write("report.md", text)
    return text


# ----------------------------------------------------------------------------- report, figures

REPORT_COLUMNS = [
    "kind", "T", "depth", "leaves", "method", "dtype", "precision", "status", "rel_err", "us", "us_graph",
    "floor_us", "x_floor_graph", "x_floor", "speedup", "speedup_graph", "paper_us", "paper_speedup",
    "prior_us",
]  # fmt: skip
FORMATS = {
    "rel_err": "{:.1e}", "us": "{:.1f}", "us_graph": "{:.1f}", "floor_us": "{:.2f}", "x_floor": "{:.1f}",
    "x_floor_graph": "{:.1f}", "speedup_graph": "{:.2f}x", "paper_us": "{:.1f}", "prior_us": "{:g}",
}  # fmt: skip


def report_markdown(
    table: pd.DataFrame, manifest: dict[str, Any], out_dir: Path, figures: dict[str, str]
) -> str:
    """report.md's text: environment, ceilings, a table per (shape, group), rows not timed, the cost model."""
    from repro.reporting.report import markdown_table

    c = manifest.get("ceilings", {})
    lines = [
        f"# Kernel benchmarks: {out_dir.name}",
        "",
        f"- device: {manifest.get('bench_device')} ({manifest.get('device')})",
        f"- git sha: {manifest.get('git_sha')}; versions: "
        + ", ".join(f"{k} {v}" for k, v in manifest.get("versions", {}).items()),
        f"- timer: {c.get('timer')}; measured copy bandwidth {c.get('copy_GBps', math.nan):.0f} GB/s"
        f" (read + write), matmul bf16 {c.get('bf16_TFLOPs', math.nan):.1f} TFLOP/s,"
        f" fp32 {c.get('fp32_TFLOPs', math.nan):.2f} TFLOP/s",
        f"- {len(table)} rows: " + ", ".join(f"{k} {v}" for k, v in table["status"].value_counts().items()),
        "",
    ]
    titles = {
        "verify": "Verification (us per layer call)",
        "recovery": "Accepted-state recovery (depth = accepted)",
        "step": "Commit the previous path + verify the tree (depth = previous accepted)",
        "chain": "Chain verification (T = chain length; chain_verify = repro.gdn.chain's choice)",
    }
    for shape, group in itertools.product(dict.fromkeys(table["shape"]), titles):
        part = table[(table["shape"] == shape) & (table["group"] == group)]
        if part.empty:
            continue
        sh = SHAPES[shape]
        lines += [f"## {shape} (H={sh.h}, HV={sh.hv}, dk={sh.dk}, dv={sh.dv}): {titles[group]}", ""]
        lines += [markdown_table(part[REPORT_COLUMNS].reset_index(drop=True), FORMATS), ""]
    for name, path in figures.items():
        lines += [f"![{name}]({path})", ""]
    untimed = table[table["status"] != "ok"]
    if len(untimed):
        lines += ["## Rows not timed", ""]
        for r in untimed[untimed["status"] != "skipped"].itertuples():
            where = f"depth={r.depth}" if r.group in ("recovery", "step") else r.kind
            lines.append(f"- {r.status}: {r.shape} {where} T={r.T} {r.method} ({r.dtype}): {r.reason}")
        for reason, part in untimed[untimed["status"] == "skipped"].groupby("reason", sort=False):
            methods = ", ".join(dict.fromkeys(part["method"]))
            lines.append(f"- skipped ({reason}): {len(part)} rows of {methods}")
        lines.append("")
    notes = table[(table["status"] == "ok") & (table["reason"].fillna("") != "")]
    if len(notes):
        lines += ["## Notes", ""]
        lines += sorted({f"- {r.method}: {r.reason}" for r in notes.itertuples()})
        lines.append("")
    lines += ["## Definitions", "", DEFINITIONS, ""]
    return "\n".join(lines)


DEFINITIONS = """\
- us: median of triton do_bench (device events around each call, L2 flushed before each);
  us_graph: median over replays of one CUDA graph cycling through graph_sets input sets (so that
  one cycle moves at least 3x the L2), per call. CPU runs: a perf_counter loop (plumbing only).
- rel_err: ‖out - ref‖ / ‖ref‖ against the float64 reference (repro.gdn.reference) on the same
  inputs; tolerance 1e-2 for bf16 q/k/v, 1e-4 for fp32; a row over it is FAIL and not timed.
- precision (tree_fused): the Triton kernel's float32 dot mode; bf16 rows use --bf16-precision
  (default tf32), fp32 rows "ieee".
- floor_us = max(bytes_min / measured copy bandwidth, flops / measured matmul rate of the method's
  arithmetic); counts: repro/bench/kernels.py module docstring. x_floor_graph = us_graph / floor_us
  (the CUDA-graph time, the one to read; "-" where no graph was timed, e.g. CPU runs); x_floor =
  us / floor_us (the do_bench time per call, which at these sizes includes the launch and host overhead
  that the graph removes).
- speedup: the block's baseline us / this row's us; speedup_graph: the same with us_graph (verification:
  per_branch_recurrent on the same tree; recovery: commit_replay_fla on the same accepted path, and for the
  *_conv rows, which commit the conv history too, commit_replay_fla_conv (the same replay plus the
  project's conv-history commit kernel); step:
  step_replay_fla, same tree and depth; chain: per_branch_recurrent, fla's recurrence over the same chain).
- per-branch and prefill baselines get their flattened, per-path inputs and S0 copies prepared
  outside the timing (in their favour); recovery factors and snapshots are made outside the timing.
- paper_us / paper_speedup: the papers' numbers (their GPUs: Weaver B200, SpecLA H100); prior_us:
  stock fla kernels measured earlier on the project's H200 (baselines/related.yaml, another tree)."""


def _log2_ticks(ax: Any, values: pd.Series) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted({int(v) for v in values.dropna()})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def write_figures(table: pd.DataFrame, folder: Path) -> dict[str, Path]:
    """kernel_tree_vs_branch.png (verification us vs T on draft trees, paper B200 points), recovery.png and
    chain.png (chain verification us vs T)."""
    from matplotlib.figure import Figure

    from repro.reporting.figures import _save

    ok = table[table["status"] == "ok"]
    out: dict[str, Path] = {}
    shapes = list(dict.fromkeys(table["shape"]))
    verify = ok[(ok["group"] == "verify") & (ok["kind"] == "draft")]
    if len(verify):
        fig = Figure(figsize=(5.5 * len(shapes), 4.4), layout="constrained")
        for ax, shape in zip(fig.subplots(1, len(shapes), squeeze=False)[0], shapes):
            part = verify[verify["shape"] == shape]
            colors: dict[str, str] = {}
            for (method, dtype), g in part.groupby(["method", "dtype"], sort=False):
                g = g.sort_values("T")
                main = method in ("tree_fused", "per_branch_recurrent") and dtype == "bf16"
                style = dict(marker="o", lw=2 if main else 1, alpha=1 if main else 0.6)
                line = ax.plot(g["T"], g["us"], label=f"{method} ({dtype})", **style)[0]
                colors.setdefault(method, line.get_color())
                if g["us_graph"].notna().any():
                    ax.plot(g["T"], g["us_graph"], ls="--", color=line.get_color(), alpha=0.6)
            mine = table[
                (table["shape"] == shape) & (table["group"] == "verify") & (table["kind"] == "draft")
            ]
            for method, g in mine[mine["paper_us"].notna()].groupby("method", sort=False):
                ax.plot(g["T"], g["paper_us"], ls="none", marker="*", ms=12, color=colors.get(method),
                        label=f"paper (B200): {method}")  # fmt: skip
            _log2_ticks(ax, mine["T"])
            ax.set_yscale("log")
            ax.set_xlabel("tree nodes T")
            ax.set_ylabel("us per layer (dashed: CUDA graph)")
            ax.set_title(f"{shape}: tree verification")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="x-small")
        out["tree vs per-branch verification"] = _save(fig, folder / "kernel_tree_vs_branch.png")
    rec = ok[ok["group"] == "recovery"]
    if len(rec):
        fig = Figure(figsize=(5.5 * len(shapes), 4.4), layout="constrained")
        for ax, shape in zip(fig.subplots(1, len(shapes), squeeze=False)[0], shapes):
            for method, g in rec[rec["shape"] == shape].groupby("method", sort=False):
                g = g.sort_values("depth")
                line = ax.plot(g["depth"], g["us"], marker="o", label=method)[0]
                if g["us_graph"].notna().any():
                    ax.plot(g["depth"], g["us_graph"], ls="--", color=line.get_color(), alpha=0.6)
            _log2_ticks(ax, rec["depth"])
            ax.set_xlabel("accepted depth")
            ax.set_ylabel("us per layer (dashed: CUDA graph)")
            ax.set_title(f"{shape}: accepted-state recovery")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
        out["accepted-state recovery"] = _save(fig, folder / "recovery.png")
    chains = ok[ok["group"] == "chain"]
    if len(chains):
        fig = Figure(figsize=(5.5 * len(shapes), 4.4), layout="constrained")
        for ax, shape in zip(fig.subplots(1, len(shapes), squeeze=False)[0], shapes):
            mine = chains[chains["shape"] == shape]
            for (method, dtype), g in mine.groupby(["method", "dtype"], sort=False):
                g = g.sort_values("T")
                times = g["us_graph"].fillna(g["us"])  # graph-timed where the method was captured
                ax.plot(g["T"], times, marker="o", lw=2 if method == "chain_verify" else 1,
                        label=f"{method} ({dtype})")  # fmt: skip
            _log2_ticks(ax, chains["T"])
            ax.set_yscale("log")
            ax.set_xlabel("chain length T")
            ax.set_ylabel("us per layer (CUDA graph where timed)")
            ax.set_title(f"{shape}: chain verification")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
        out["chain verification"] = _save(fig, folder / "chain.png")
    return out


KIND = RunKind(
    "bench-kernels",
    fields_parser("shape", "group", "kind", "T", "method", "dtype", "status"),
    build_report,
    ("report.md", "table.csv"),
)
