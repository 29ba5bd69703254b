"""What `repro bench kernels` times: the cases (a tree of one layer shape), their inputs, the method
builders, the float64 reference, ``rel_err`` and its tolerance, the cost model and the registry of methods.
Nothing here plans or runs rows (:mod:`repro.bench.kernels` does) or writes the table and report
(:mod:`repro.bench.kernels_report`).

Inputs: fresh random inputs per row (bf16-representable q/k/v, L2-normalised q/k, g <= 0, beta in (0, 1),
random S0), float64 numbers that every method's dtype holds exactly, so the float64 reference on those same
inputs is exact; a method's output is compared with it as ‖out - ref‖ / ‖ref‖ (:func:`rel_err`), within
its dtype's :data:`TOLERANCE`.

Cost model (``bytes_min``: each input read once, each output written once; ``flops``), with
n tree nodes, L tokens over all root-to-leaf paths, N paths (leaves), d the accepted depth,
e the q/k/v element size (2 for bf16, 4 for fp32), g/beta/state/factors in fp32:

- io(t) = t (2 H dk e + HV dv e + 2 HV 4): q, k, v, g, beta of t tokens; S = HV dv dk 4.
- tree_fused, tree_split (the two-phase kernel; its scratch not counted), tree_split_peel (the same with node
  0 solved before the row blocks: ``peel``), tree_blocked (three launches, T
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

floor_us = max(bytes_min / copy bandwidth, flops / matmul rate), both measured on the device
(:func:`repro.bench.kernels.measure`).

Where a two-launch form's time goes: tree_split and tree_split_peel also time their first launch alone in
CUDA graphs (``phase1_us_graph``: the key-only work, G, the masked A / P blocks and the diagonal inverses,
beside the state products), so phase 2 (the serial walk over the row blocks) and the launch between them
take the rest.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F

from repro.bench.shapes import LayerShape, depths, flatten_paths
from repro.gdn import reference as gdn
from repro.tree import Tree

TOLERANCE = {"bf16": 1e-2, "fp32": 1e-4}  # relative error vs float64 (see the device METHOD notes)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CHUNK = 64  # fla's chunk size
CONV_WIDTH = 4  # the GDN models' short-conv width (conv history of 3 rows)

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
    def tree_mask(self) -> torch.Tensor:
        """The mask as the engine's slots give it to the tree kernels (rows aligned above 65 nodes:
        :func:`repro.gdn.triton_tree.mask_rows`), made once, outside the timing."""
        return _triton_tree().mask_rows(self.ancestors)

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


def seed_of(*parts: object) -> int:
    """A deterministic 31-bit seed from the parts (``hash`` of a str is salted per process)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


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
    return lambda: fused(x.q, x.k, x.v, x.g, x.beta, x.state, case.tree_mask, s, precision=prec)[0]


def _split_call(case: Case, x: Inputs, **options: bool) -> Fn:
    split = _triton_tree().tree_gdn_split
    s, prec = case.shape.scale, case.precision
    return lambda: split(x.q, x.k, x.v, x.g, x.beta, x.state, case.tree_mask, s, precision=prec, **options)[0]


def build_tree_split(case: Case, x: Inputs) -> Fn:
    return _split_call(case, x)


def build_tree_split_peel(case: Case, x: Inputs) -> Fn:
    return _split_call(case, x, peel=True)


def build_tree_split_keys(case: Case, x: Inputs) -> Fn:
    """tree_split's phase 1 alone (its ``phase1_us_graph``; the output is not a verification)."""
    return _split_call(case, x, keys_only=True)


def build_tree_split_peel_keys(case: Case, x: Inputs) -> Fn:
    """tree_split_peel's phase 1 alone."""
    return _split_call(case, x, peel=True, keys_only=True)


def build_tree_blocked(case: Case, x: Inputs) -> Fn:
    blocked = _triton_tree().tree_gdn_blocked
    s = case.shape.scale
    prec = case.precision
    return lambda: blocked(x.q, x.k, x.v, x.g, x.beta, x.state, case.tree_mask, s, precision=prec)[0]


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
    s, prec, anc, mask = case.shape.scale, case.precision, case.ancestors, case.tree_mask
    split = select_tree_kernel(x.q.dtype, x.v.shape[1], case.n) == "split"
    engine_verify = tt.tree_gdn_split if split else tt.tree_gdn_fused
    if commit == "replay":
        idx = torch.tensor(case.accepted, dtype=torch.long, device=case.device)
        replay = _fla_call("recurrent", case, prev, idx, varlen=False, final=True)

        def run() -> torch.Tensor:
            return engine_verify(x.q, x.k, x.v, x.g, x.beta, replay()[0], mask, s, precision=prec)[0]

        return run
    if commit.endswith("_indexed"):  # the pending path as a path index (written at the commit: untimed)
        mod = importlib.import_module("repro.gdn.triton_commit")
        pending.path = mod.path_index_buffer(case.n, case.device)
        mod.write_path_index(case.ancestors, node, pending.path)
        commit = commit.removesuffix("_indexed")
    if commit in ("delayed", "delayed_split"):
        verify = tt.tree_gdn_split if commit == "delayed_split" else tt.tree_gdn_fused
        return lambda: verify(x.q, x.k, x.v, x.g, x.beta, state, mask, s, prec, pending=pending)[0]
    mod = importlib.import_module("repro.gdn.triton_commit")
    fn = mod.commit_path_fused if commit == "path" else mod.commit_closed_form_fused

    def run_commit() -> torch.Tensor:
        fn(state, f.delta, f.k, f.gate_cum, anc, node)
        return engine_verify(x.q, x.k, x.v, x.g, x.beta, state, mask, s, precision=prec)[0]

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


# the methods priced as one masked-WY tree verification (cost)
TREE_COST_METHODS = (
    "tree_fused",
    "tree_split",
    "tree_split_peel",
    "tree_blocked",
    "tree_torch",
    "hybrid",
    "hybrid_torch",
)


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
    if method in TREE_COST_METHODS:
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
    if method in ("commit_replay_fla", "commit_replay_fla_conv"):
        nbytes = io(d) + 2 * state + o(d) + (conv if method == "commit_replay_fla_conv" else 0)
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
    ``phase1``: for a two-launch form, its first launch alone, timed in CUDA graphs after the row
    (``phase1_us_graph``: where the row's time goes).
    """

    build: Callable[[Case, Inputs], Fn]
    output: str
    needs: str
    graphable: bool = True
    graph_note: str = ""
    phase1: Callable[[Case, Inputs], Fn] | None = None


METHODS: dict[str, Method] = {
    "tree_fused": Method(build_tree_fused, "nodes", "triton_tree"),
    "tree_split": Method(build_tree_split, "nodes", "triton_tree", phase1=build_tree_split_keys),
    "tree_split_peel": Method(
        build_tree_split_peel, "nodes", "triton_tree", phase1=build_tree_split_peel_keys
    ),
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
    "commit_replay_fla_conv": Method(build_commit_replay_fla_conv, "commit", "fla"),
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
