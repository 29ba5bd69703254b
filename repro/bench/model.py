"""`repro bench model`: full-model decode and verify cost at the papers' model shapes, random weights.

Shapes (random bf16 weights built on the device; :data:`MODEL_SHAPES`):

- ``gdn-1.3b``: pure GDN, flash-linear-attention ``GatedDeltaNetForCausalLM`` at SpecLA's target size:
  24 layers, hidden 2048, 8 heads with d_k = d_v = 256 (h_v = 8, expand_v = 1), conv 4, output gate,
  SwiGLU with fla's hidden_ratio 4 (intermediate 5632), vocab 32000, untied (1.47B parameters).
  Sources: SpecLA (h_v = 8, d_k = d_v = 256, conv 4); fla 0.6.0 ``GatedDeltaNetConfig`` defaults
  (hidden 2048, head_dim 256, hidden_ratio 4, conv_size 4, vocab 32000, untied); 24 layers as
  fla-hub/delta_net-1.3B-100B's config.json (hidden 2048, vocab 32000). fla's own 1B training config
  (configs/gated_deltanet_1B.json in fla-org/flame) has 21 layers of 6 heads with expand_v 2: not the
  paper's layer shape.
- ``qwen3.6-27b``: Qwen3.5/3.6-27B text model: 64 layers = 48 GDN + 16 gated attention (every 4th),
  hidden 5120, GDN 16 key / 48 value heads of d_k = d_v = 128, attention 24 heads / 4 KV heads of 256
  with partial rotary 0.25 (rope_theta 1e7), intermediate 17408, vocab 248320, untied (26.9B).
  Source: the Qwen3_5Config text_config of Qwen3.5-27B as quoted in public code (several repositories
  agree on every number above).
- ``tiny``: the embedded default's architecture (CPU tests).

Measured per shape (CUDA: CUDA graphs of :class:`repro.models.static.StaticDecoder` steps; CPU: eager
rows only, for the plumbing), after one prefill of ``context`` random tokens through HybridLM:

- ``decode``: AR ms/token and tokens/s; the graph (the fused Triton glue of
  :mod:`repro.gdn.triton_decode` where the decoder uses the triton kernels) vs the graph of the unfused
  glue (``static_graph_unfused``, same run: the fusion's speedup is the ratio of the two rows) vs the
  graph of the fused decoder with its matmuls on the GEMV kernels of :mod:`repro.gdn.triton_linear`
  (``static_graph_gemv``, CUDA only: norms, SiLU * up and residuals fused into the matmuls;
  ``static_graph_gemv_core``: the same around the separate decode core instead of the fused decode layer
  kernel) vs the
  eager static step vs HybridLM's own per-sequence verify+commit; floor = (weights read once + GDN
  state read/write + KV read) / copy bw.
- ``verify``: verify latency vs tree size T (best-first draft trees, :func:`repro.bench.shapes.draft_tree`),
  and its ratio to the decode graph.
- ``step``: a draft-free step at T = ``step_nodes`` whose deepest path carries the target's own
  greedy tokens: host-side tree upload, verify, verify with per-node states (snapshot), device
  acceptance vs TargetMatch on the host, the three commits, the fused verify+accept+commit graph,
  the host read-back, the same step eager (python/host overhead = eager - graph), HybridLM's step,
  and the GDN core kernels alone.
- ``compiled`` (``--compile``): decode and verify(step_nodes) graphs with the per-layer glue under
  ``torch.compile``.

Every row is checked before it is timed: the timed callable's output on the prefilled state against
HybridLM (reference GDN path) on the same state and tree (``rel_err``: logits; ``state_err``: the
committed state), and for graphs against the eager static call (``rel_err_eager``). A row over
tolerance (or not finite) is FAIL and not timed. Layers executed (GDN and attention) are counted in
the timed decoder on the checking call.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from repro.bench.kernels import _versions, rel_err, wy_flops
from repro.bench.shapes import draft_tree, flatten_paths
from repro.bench.timing import TimerConfig, measure_ceilings, median_us, timer_name
from repro.errors import describe
from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights, tiny_config
from repro.models.graphs import count_ops
from repro.models.hybrid import HybridLM
from repro.models.state import ModelState
from repro.models.static import StaticDecoder, TreeSlot
from repro.reporting.rundir import Run, RunKind, fields_parser
from repro.tree import Tree

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
# vs HybridLM: bf16 compares two different bf16 paths through a random deep model (bf16 vs float32 of
# the same weights from the same state differs by 5-10% at 24-64 layers), so its gate only catches
# gross errors; graphs vs the eager static call must agree closely in every dtype.
TOLERANCE = {"bf16": 0.5, "fp32": 1e-3, "fp64": 1e-10}
TOLERANCE_EAGER = {"bf16": 1e-2, "fp32": 1e-5, "fp64": 1e-10}
TARGET_RATIO = 1.2  # verify(step_nodes) <= 1.2x the decode step at gdn-1.3b (issue 13)
TARGET_FLOOR = {"gdn-1.3b": 0.80, "qwen3.6-27b": 0.88}  # AR decode's share of the floor (issue 13)
CORE_CALLS = 16  # GDN core rows: calls per graph replay
COMPILE_MIN_S = 45.0  # compiled rows start only with this much of the shape's budget left

COLUMNS = [
    "shape", "group", "method", "T", "accepted", "dtype", "status", "reason", "rel_err", "state_err",
    "rel_err_eager", "top1", "tol", "us", "tokens_per_s", "floor_us", "floor_frac", "x_decode", "layers_gdn",
    "layers_attn", "kernels", "kernel_busy_us", "kernels_by_group", "aten_ops", "bytes_min", "flops",
    "context", "timer", "seed",
]  # fmt: skip


def gdn_1p3b() -> HybridConfig:
    return HybridConfig.from_fla_dict(
        {
            "model_type": "gated_deltanet",
            "hidden_size": 2048,
            "num_hidden_layers": 24,
            "num_heads": 8,
            "head_dim": 256,
            "expand_v": 1.0,
            "conv_size": 4,
            "use_gate": True,
            "hidden_ratio": 4,
            "vocab_size": 32000,
            "tie_word_embeddings": False,
            "norm_eps": 1e-6,
        }
    )


def qwen36_27b() -> HybridConfig:
    return HybridConfig.from_qwen35_dict(
        {
            "vocab_size": 248320,
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "num_hidden_layers": 64,
            "full_attention_interval": 4,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "num_attention_heads": 24,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
        }
    )


MODEL_SHAPES: dict[str, Callable[[], HybridConfig]] = {
    "gdn-1.3b": gdn_1p3b,
    "qwen3.6-27b": qwen36_27b,
    "tiny": tiny_config,
}


@dataclass
class ModelBenchConfig:
    """What to run: shapes, dtype, context, tree sizes, the step size, options, the time budget."""

    shapes: list[str] = field(default_factory=lambda: ["gdn-1.3b", "qwen3.6-27b"])
    dtype: str = "bf16"
    context: int = 512
    sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    step_nodes: int = 64
    step_commit: str = "closed_form"  # the commit strategy of the fused step rows (step_graph, step_eager)
    compile: bool = True
    seed: int = 0
    time_budget_s: float | None = None
    timer: TimerConfig = field(default_factory=TimerConfig)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bench": "model",
            "shapes": {s: MODEL_SHAPES[s]().to_dict() for s in self.shapes},
            "dtype": self.dtype,
            "context": self.context,
            "sizes": self.sizes,
            "step_nodes": self.step_nodes,
            "step_commit": self.step_commit,
            "compile": self.compile,
            "seed": self.seed,
            "time_budget_s": self.time_budget_s,
            "timer": vars(self.timer),
            "tolerance": TOLERANCE,
            "tolerance_graph_vs_eager": TOLERANCE_EAGER,
            "tree": "draft_tree(T, seed, max_depth=16, branching=4, alpha=0.15), random tokens",
        }


def build_model(config: HybridConfig, device: torch.device, dtype: torch.dtype, seed: int) -> HybridLM:
    """HybridLM with seeded random weights created on ``device`` in ``dtype`` (no host copy)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = HybridLM(config)
    finally:
        torch.set_default_dtype(before)
    return init_random_weights(model, seed).eval().requires_grad_(False)


# ------------------------------------------------------------------------------- cost model


def weight_bytes(model: HybridLM) -> int:
    """Bytes of weights one decode step reads: every parameter once, one embedding row (the full
    table when it is tied to the LM head)."""
    emb = model.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not model.config.tie_word_embeddings:
        total -= (emb.shape[0] - 1) * emb.shape[1] * emb.element_size()
    return total


def step_cost(model: HybridLM, t: int, context: int) -> tuple[int, float]:
    """(bytes_min, flops) of one forward of t tree nodes at a context of ``context`` tokens.

    Bytes: weights (:func:`weight_bytes`), each GDN state read once and written once (decode) or read
    once with delta and G written per node (verify), the KV cache read, logits written. Flops: 2 per
    weight per token (no embedding), the masked WY form per GDN head (:func:`wy_flops`), attention
    scores and values over context + t keys.
    """
    cfg = model.config
    e = model.lm_head.weight.element_size()
    state = cfg.linear_num_value_heads * cfg.linear_value_head_dim * cfg.linear_key_head_dim * 4
    per_node = cfg.linear_num_value_heads * (cfg.linear_value_head_dim + 1) * 4
    gdn_bytes = 2 * state if t == 1 else state + t * per_node
    kv = 2 * context * cfg.num_key_value_heads * cfg.head_dim * e
    nbytes = (
        weight_bytes(model)
        + cfg.num_gdn_layers * gdn_bytes
        + cfg.num_attention_layers * kv
        + t * cfg.vocab_size * e
    )
    dense = sum(p.numel() for p in model.parameters()) - model.model.embed_tokens.weight.numel()
    if cfg.tie_word_embeddings:
        dense += model.model.embed_tokens.weight.numel()
    gdn_flops = cfg.linear_num_value_heads * wy_flops(t, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    attn_flops = 4 * t * (context + t) * cfg.num_attention_heads * cfg.head_dim
    flops = 2 * t * dense + cfg.num_gdn_layers * gdn_flops + cfg.num_attention_layers * attn_flops
    return nbytes, float(flops)


def floor_us(nbytes: int, flops: float, ceilings: dict[str, Any], dtype: str) -> float:
    rate = ceilings["bf16_TFLOPs" if dtype == "bf16" else "fp32_TFLOPs"]
    return max(nbytes / (ceilings["copy_GBps"] * 1e3), flops / (rate * 1e6))


# ------------------------------------------------------------------------------ one shape


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def state_error(got: ModelState, ref: ModelState) -> float:
    """Largest relative error over the layers' buffers (recurrent state, conv window, keys, values)."""
    if got.position != ref.position:
        return math.inf
    errs = [
        rel_err(getattr(a, f), getattr(b, f).double())
        for a, b in zip(got.layers, ref.layers)
        for f in vars(a)
        if getattr(b, f).numel()
    ]
    return max(errs, default=0.0)


def count_aten_ops(fn: Callable[[], Any]) -> int | None:
    """Aten ops of one eager call that launch work (:func:`repro.models.graphs.count_ops`); None if the
    count fails (it is optional)."""
    try:
        return count_ops(fn)
    except Exception:  # noqa: BLE001 - the count is optional
        return None


KERNEL_GROUPS = (  # (group, fragments of kernel names): the first group with a matching fragment wins
    ("persistent", ("_layers_kernel",)),  # every layer of a pure-GDN decode step (triton_persistent)
    # before gdn_core (_decode_kernel)
    ("attention", ("_attention_decode_kernel", "_attention_tree_kernel", "_attention_tree_combine")),
    (
        "gdn_core",
        (
            "_decode_kernel",
            "_decode_layer_kernel",
            "fused_recurrent",
            "_tree_verify_kernel",
            "_tree_states_kernel",
            "_tree_keys_kernel",
            "_tree_values_kernel",
            "_tree_inverse_kernel",
            "_tree_wy_kernel",
        ),
    ),
    ("commit", ("_closed_form_commit", "_conv_commit", "_path_commit", "_path_index", "_indexed_commit")),
    (
        "glue_triton",
        (
            "_rms_norm",
            "_gated_norm",
            "_silu_mul",
            "_tree_prologue",
            "_argmax_reduce",
        ),  # fmt: skip
    ),
    # the GEMV and row-tiled matmul kernels (repro.gdn.triton_linear), their norm / SiLU / residual fused in
    ("matmul_triton", ("_gemv", "_linear", "_rows_kernel", "_split_reduce")),
    ("matmul", ("gemm", "gemv", "nvjet", "cutlass", "sm90_", "xmma", "cublas", "splitk", "splitK")),
)


@dataclass
class KernelProfile:
    """CUDA kernels of one eager call: how many, their summed device time, and both per name group."""

    kernels: int
    busy_us: float
    groups: dict[str, tuple[int, float]]

    def summary(self) -> str:
        """The groups by descending time, as in: matmul 120x 700 us; gdn_core 24x 150 us."""
        parts = sorted(self.groups.items(), key=lambda kv: -kv[1][1])
        return "; ".join(f"{name} {n}x {us:.0f} us" for name, (n, us) in parts)


def kernel_group(name: str) -> str:
    """The :data:`KERNEL_GROUPS` group of a CUDA kernel name ("other" when none matches)."""
    for group, fragments in KERNEL_GROUPS:
        if any(f in name for f in fragments):
            return group
    return "other"


def profile_kernels(
    fn: Callable[[], Any], device: torch.device, key: Callable[[str], str] | None = None
) -> KernelProfile | None:
    """The CUDA kernels one call launches, with their device time (torch profiler; the call is run
    eagerly, so the gaps between kernels are not those of a graph replay), grouped by ``key`` of the
    kernel name (default :func:`kernel_group`); None off CUDA or when the profiler cannot tell."""
    key = key or kernel_group
    if device.type != "cuda":
        return None
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        fn()  # warm: compiles and allocations outside the profile
        _sync(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            _sync(device)
        groups: dict[str, tuple[int, float]] = {}
        for e in prof.events():
            if e.device_type != DeviceType.CUDA:
                continue
            n, us = groups.get(key(e.name), (0, 0.0))
            groups[key(e.name)] = (n + 1, us + e.time_range.elapsed_us())
        if not groups:
            return None
        return KernelProfile(sum(n for n, _ in groups.values()), sum(us for _, us in groups.values()), groups)
    except Exception:  # noqa: BLE001 - the profile is optional
        return None


def top1_agreement(logits: torch.Tensor, ref: torch.Tensor) -> float:
    """Fraction of rows whose argmax token equals the reference's."""
    return float((logits.argmax(-1).cpu() == ref.argmax(-1).cpu()).float().mean())


@dataclass
class Measured:
    """What a row's builder hands back: the callable to time and what its check found."""

    fn: Callable[[], Any]
    rel_err: float | None = None
    state_err: float | None = None
    rel_err_eager: float | None = None
    top1: float | None = None
    accepted: int | None = None
    layers: tuple[int, int] | None = None
    profile: KernelProfile | None = None
    calls: int = 1  # calls of the measured step per call of ``fn`` (us is per step)
    aten_ops: int | None = None
    note: str = ""
    failed: str = ""  # a check other than the error tolerances failed (the row is FAIL, not timed)
    graph: Any = None

    def logits(self, out: torch.Tensor, ref: torch.Tensor) -> Measured:
        """Record the logits' error and argmax agreement against HybridLM's."""
        self.rel_err, self.top1 = rel_err(out, ref.double()), top1_agreement(out, ref)
        return self


class ShapeBench:
    """One model shape on one device: the model, its prefilled state, decoders and the rows' builders."""

    def __init__(self, name: str, cfg: ModelBenchConfig, device: torch.device) -> None:
        self.name, self.cfg, self.device = name, cfg, device
        self.dtype = DTYPES[cfg.dtype]
        t0 = time.perf_counter()
        self.model = build_model(MODEL_SHAPES[name](), device, self.dtype, cfg.seed)
        self.config = self.model.config
        gen = torch.Generator().manual_seed(cfg.seed)
        self.prompt = torch.randint(0, self.config.vocab_size, (cfg.context,), generator=gen)
        self.state0, _ = self.model.prefill(self.prompt)
        self.max_nodes = max(cfg.sizes + [cfg.step_nodes])
        self.decoder = StaticDecoder(self.model, cfg.context + 256, self.max_nodes)
        self.compiled: StaticDecoder | None = None
        self.token = int(torch.randint(0, self.config.vocab_size, (), generator=gen))
        self.setup_s = time.perf_counter() - t0
        self._trees: dict[int, Tree] = {}
        self._ref_verify: dict[int, Any] = {}
        self._decode_ref: tuple[torch.Tensor, ModelState] | None = None

    # ---------------------------------------------------------------------- references

    def decode_ref(self) -> tuple[torch.Tensor, ModelState]:
        if self._decode_ref is None:
            ver = self.model.verify(self.state0, Tree.single(self.token))
            self._decode_ref = (ver.logits, self.model.commit(self.state0, ver, [0]))
        return self._decode_ref

    def tree(self, t: int) -> Tree:
        """The draft tree of size t (random tokens); at step_nodes its deepest path carries the
        target's greedy continuation from the root (so the accepted path is that path)."""
        if t not in self._trees:
            parents = draft_tree(t, self.cfg.seed + t)
            gen = torch.Generator().manual_seed(self.cfg.seed + 7 * t)
            tokens = torch.randint(0, self.config.vocab_size, (t,), generator=gen)
            tokens[0] = self.token
            if t == self.cfg.step_nodes:
                path = max(flatten_paths(parents), key=len)
                state, tok = self.state0, self.token
                for node in path[1:]:
                    ver = self.model.verify(state, Tree.single(tok))
                    state = self.model.commit(state, ver, [0])
                    tok = int(ver.logits[0].argmax())
                    tokens[node] = tok
            self._trees[t] = Tree(tokens, torch.tensor(parents))
        return self._trees[t]

    def verify_ref(self, t: int) -> Any:
        """HybridLM's verification of the size-t tree on the prefilled state (kept for the step size)."""
        if t in self._ref_verify:
            return self._ref_verify[t]
        ver = self.model.verify(self.state0, self.tree(t))
        if t == self.cfg.step_nodes:
            self._ref_verify[t] = ver
        return ver

    # ------------------------------------------------------------------------ helpers

    def _graph(self, fn: Callable[[], Any]) -> Any:
        """A CUDA graph of ``fn``; on CPU the eager call behind the same interface (plumbing runs)."""
        if self.device.type != "cuda":
            return _EagerCall(fn)
        from repro.models.graphs import GraphedCall

        return GraphedCall(fn, self.device)

    def _count(self, dec: StaticDecoder, fn: Callable[[], Any]) -> tuple[Any, tuple[int, int]]:
        before = dict(dec.layer_calls)
        out = fn()
        return out, (dec.layer_calls[GDN] - before[GDN], dec.layer_calls[ATTENTION] - before[ATTENTION])

    def _slot(self, dec: StaticDecoder, t: int, snapshots: bool = False) -> TreeSlot:
        tree = self.tree(t)
        slot = TreeSlot(dec, t, max_depth=int(tree.depth.max()), snapshots=snapshots)
        slot.set_tree(tree)
        return slot

    def _decoder(self, compiled: bool) -> StaticDecoder:
        """The shared decoder, or the compiled one (built once)."""
        if not compiled:
            return self.decoder
        if self.compiled is None:
            self.compiled = StaticDecoder(self.model, self.cfg.context + 256, self.max_nodes, compile=True)
        return self.compiled

    # ----------------------------------------------------------------------- builders

    def decode(self, method: str) -> Measured:
        ref_logits, ref_state = self.decode_ref()
        if method == "hybrid_eager":
            model, state0, tok = self.model, self.state0, self.token

            def hybrid() -> torch.Tensor:
                ver = model.verify(state0, Tree.single(tok))
                model.commit(state0, ver, [0])
                return ver.logits

            m = Measured(hybrid, layers=(self.config.num_gdn_layers, self.config.num_attention_layers))
            ver = model.verify(state0, Tree.single(tok))
            m.state_err = state_error(model.commit(state0, ver, [0]), ref_state)
            m.aten_ops = count_aten_ops(hybrid)
            return m.logits(ver.logits, ref_logits)
        compiled = method == "static_graph_compiled"
        if method == "static_graph_unfused":  # built for this row only (its stacked weights are copies)
            dec = StaticDecoder(self.model, self.cfg.context + 256, 1, fused=False)
        elif method == "static_graph_gemv":  # the same, the fused decoder with the GEMV kernels
            dec = StaticDecoder(self.model, self.cfg.context + 256, 1, fused=True, gemv=True)
        elif method == "static_graph_persistent":  # every layer in one persistent launch (pure GDN)
            dec = StaticDecoder(self.model, self.cfg.context + 256, 1, gemv=True, persistent=True)
        elif method.startswith("static_graph_gemv_core"):  # the GEMV kernels around the separate decode core
            dec = StaticDecoder(
                self.model, self.cfg.context + 256, 1, fused=True, gemv=True, fuse_decode=False,
                tree_attention_decode=method.endswith("_tree"),
            )  # fmt: skip
        else:
            dec = self._decoder(compiled)
        dec.load(self.state0)
        dec.set_token(self.token)
        eager, layers = self._count(dec, dec.decode_step)
        m = Measured(dec.decode_step, layers=layers).logits(eager, ref_logits)
        m.state_err = state_error(dec.export(), ref_state)
        if not compiled:  # (a dispatch mode around compiled code would only count the eager fallback)
            m.aten_ops = count_aten_ops(dec.decode_step)
        if method != "static_eager":
            eager = eager.clone()
            m.graph = self._graph(dec.decode_step)
            dec.load(self.state0)
            out = m.graph()
            m.logits(out, ref_logits)
            m.rel_err_eager = rel_err(out, eager.double())
            m.state_err = state_error(dec.export(), ref_state)
            m.fn = m.graph.replay
            m.profile = profile_kernels(dec.decode_step, self.device)
        return m

    def verify(self, method: str, t: int) -> Measured:
        ref = self.verify_ref(t)
        if method == "hybrid_eager":
            tree, model, state0 = self.tree(t), self.model, self.state0
            m = Measured(lambda: model.verify(state0, tree).logits)
            m.layers = (self.config.num_gdn_layers, self.config.num_attention_layers)
            return m.logits(ref.logits, ref.logits)
        dec = self._decoder(method == "static_graph_compiled")
        dec.load(self.state0)
        slot = self._slot(dec, t)
        eager, layers = self._count(dec, lambda: dec.verify(slot))
        m = Measured(lambda: dec.verify(slot), layers=layers).logits(eager, ref.logits)
        if method != "static_eager":
            eager = eager.clone()
            m.graph = self._graph(lambda: dec.verify(slot))
            out = m.graph()
            m.logits(out, ref.logits)
            m.rel_err_eager = rel_err(out, eager.double())
            m.fn = m.graph.replay
            if t == self.cfg.step_nodes:
                m.profile = profile_kernels(lambda: dec.verify(slot), self.device)
        if t == self.cfg.step_nodes and method != "static_graph_compiled":
            m.aten_ops = count_aten_ops(lambda: dec.verify(slot))
        return m

    def step(self, method: str) -> Measured:
        """The draft-free step's parts at T = step_nodes (see the module docstring).

        A commit graph reads what verify saved in the slot, so every graph here is captured after a
        graph of verify on the same slot (whose outputs stay at fixed addresses) and after that the
        slot is only replayed, never verified eagerly.
        """
        from repro.decoding.acceptance import TargetMatch

        t, dec, rule = self.cfg.step_nodes, self.decoder, TargetMatch(0.0, 0)
        tree, ref = self.tree(t), self.verify_ref(t)
        acc = rule.accept(tree, ref.logits, 0)
        dec.load(self.state0)
        if method == "set_tree":
            slot = self._slot(dec, t)
            return Measured(lambda: slot.set_tree(tree), accepted=len(acc.path))
        if method == "hybrid_step":
            model, state0 = self.model, self.state0

            def hybrid() -> None:
                ver = model.verify(state0, tree)
                model.commit(state0, ver, rule.accept(tree, ver.logits, 0).path)

            m = Measured(hybrid, accepted=len(acc.path))
            m.layers = (self.config.num_gdn_layers, self.config.num_attention_layers)
            return m.logits(ref.logits, ref.logits)
        strategy = {
            "commit_snapshot": "snapshot",
            "commit_closed_form": "closed_form",
            "commit_replay": "replay",
        }.get(method, self.cfg.step_commit)
        slot = self._slot(dec, t, snapshots=method in ("verify_snapshots", "commit_snapshot"))
        if method in ("step_graph", "step_eager"):
            fn = lambda: dec.step(slot, strategy)  # noqa: E731
            logits, layers = self._count(dec, fn)
            logits = logits.clone()
            m = Measured(fn, layers=layers)
            eager_state = self._check_step(m, slot, logits, ref, acc)
            m.aten_ops = count_aten_ops(fn)
            if method == "step_graph":
                m.graph = self._graph(fn)
                dec.load(self.state0)
                out = m.graph()
                self._check_step(m, slot, out, ref, acc)
                m.rel_err_eager = max(rel_err(out, logits.double()), state_error(dec.export(), eager_state))
                m.fn = m.graph.replay
                m.profile = profile_kernels(fn, self.device)
            return m
        logits = dec.verify(slot).clone()
        m = Measured(lambda: None, accepted=len(acc.path)).logits(logits, ref.logits)
        dec.accept(slot)
        self._agreement(m, slot, acc)
        if method == "readback":
            m.fn = slot.accepted
            return m
        if method == "accept_host":
            m.fn = lambda: rule.accept(tree, logits, 0)
            return m
        eager_state = None
        if method.startswith("commit"):
            slot.set_accepted(acc.path)
            dec.commit(slot, strategy)
            eager_state = dec.export()
            dec.load(self.state0)
        verify = self._graph(lambda: dec.verify(slot))
        out = verify()
        m.logits(out, ref.logits)
        m.rel_err_eager = rel_err(out, logits.double())
        m.graph, m.fn = verify, verify.replay
        if method == "accept_graph":
            accept = self._graph(lambda: dec.accept(slot))
            accept()
            self._agreement(m, slot, acc)
            m.aten_ops = count_aten_ops(lambda: dec.accept(slot))
            m.graph, m.fn = (verify, accept), accept.replay
        elif method.startswith("commit"):
            commit = self._graph(lambda: dec.commit(slot, strategy))
            dec.load(self.state0)
            slot.set_accepted(acc.path)
            commit()
            got = dec.export()
            m.state_err = state_error(got, self.model.commit(self.state0, ref, acc.path))
            m.rel_err_eager = max(m.rel_err_eager, state_error(got, eager_state))
            m.graph, m.fn = (verify, commit), commit.replay
        return m

    def _check_step(
        self, m: Measured, slot: TreeSlot, logits: torch.Tensor, ref: Any, acc: Any
    ) -> ModelState:
        """Errors of one verify+accept+commit: logits vs HybridLM's, and the state vs HybridLM's commit of
        the path this step accepted (the note says whether it is TargetMatch's on HybridLM's logits).
        Returns the committed state."""
        path, _ = slot.accepted()
        got = self.decoder.export()
        m.logits(logits, ref.logits)
        m.state_err = state_error(got, self.model.commit(self.state0, ref, path))
        m.accepted = len(path)
        self._agreement(m, slot, acc)
        return got

    @staticmethod
    def _agreement(m: Measured, slot: TreeSlot, acc: Any) -> None:
        """Note how the device acceptance compares with TargetMatch on the same logits (must be equal: a
        difference fails the row) and on HybridLM's (may differ where bf16 argmaxes differ)."""
        from repro.decoding.acceptance import TargetMatch

        assert slot.tree is not None and slot.logits is not None
        path, bonus = slot.accepted()
        own = TargetMatch(0.0, 0).accept(slot.tree, slot.logits.float().cpu(), 0)
        if (path, bonus) != (own.path, own.bonus):
            m.failed = (
                f"device acceptance {path} (bonus {bonus}) != TargetMatch on the same logits "
                f"{own.path} (bonus {own.bonus})"
            )
        if (path, bonus) == (acc.path, acc.bonus):
            m.note = f"device acceptance = TargetMatch on HybridLM ({len(path)} nodes)"
        else:
            m.note = (
                f"device acceptance = TargetMatch on the same logits ({len(path)} nodes); on HybridLM's "
                f"logits {len(acc.path)} (the two paths' argmaxes differ)"
            )

    def core(self, t: int) -> Measured:
        """The GDN core of one layer alone (decode: the recurrence; T > 1: the tree kernel), as a graph
        on inputs captured from layer 0 of the step's tree; per-layer us (x GDN layers in the report)."""
        dec = self.decoder
        dec.load(self.state0)
        slot = self._slot(dec, t) if t > 1 else dec.decode_slot
        layer = next(i for i, lay in enumerate(dec.layers) if lay.layer_type == GDN)
        x = self.model.model.embed_tokens(slot.tokens)
        buf = dec.buffers[layer]
        _, _, q, k, v, g, beta = dec.glue["gdn_prologue"](
            dec.layers[layer], dec.weights[layer], x, buf.conv, slot.conv_index, dec.kernel_dtype
        )
        scale = self.config.linear_key_head_dim**-0.5
        state = buf.recurrent
        if t == 1:
            fn = lambda: dec._recurrent(q, k, v, g, beta, state, scale)[0]  # noqa: E731
        else:
            tree = dec._tree_for(slot.size)  # the kernel the decoder's verify of this slot runs
            fn = lambda: tree(  # noqa: E731
                q, k, v, g, beta, state, slot.parents, slot.ancestors, scale, False, dec.precision
            )[0]
        from repro.gdn.reference import tree_gdn

        ref = tree_gdn(q.double(), k.double(), v.double(), g.double(), beta.double(), state.double(),
                       slot.ancestors, scale)[0]  # fmt: skip
        eager = fn().clone()
        m = Measured(fn, rel_err(eager, ref))
        m.graph = self._graph(fn)
        out = m.graph()
        m.rel_err, m.rel_err_eager = rel_err(out, ref), rel_err(out, eager.double())
        m.fn = m.graph.replay
        if self.device.type == "cuda":  # one replay of CORE_CALLS calls: the replay's launch cost shared
            m.graph = self._graph(lambda: [fn() for _ in range(CORE_CALLS)])
            m.fn, m.calls = m.graph.replay, CORE_CALLS
        return m


class _EagerCall:
    """GraphedCall's interface without a graph (CPU)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.output = fn()

    def replay(self) -> None:
        self.fn()

    def __call__(self) -> Any:
        return self.fn()


@dataclass(frozen=True)
class RowSpec:
    group: str  # decode | verify | step | core | compiled
    method: str
    T: int
    graph: bool  # needs CUDA graphs


def plan(
    cfg: ModelBenchConfig, compiled: bool = False, gemv: bool = False, persistent: bool = False
) -> list[RowSpec]:
    """Rows of one shape, the most telling first: the two targets (and the decode graphs of the unfused
    glue and, with ``gemv``, of the GEMV kernels; with ``persistent`` too, a pure-GDN model's, of the
    persistent decode launch), the verify curve, the step's graphs, the eager step and
    decode (host overhead), the compiled glue (``compiled``), the GDN cores, the host parts, HybridLM's
    own path."""
    s = cfg.step_nodes
    rows = [RowSpec("decode", "static_graph", 1, True), RowSpec("decode", "static_graph_unfused", 1, True)]
    if gemv:
        gemv_rows = ("static_graph_gemv", "static_graph_gemv_core", "static_graph_gemv_core_tree")
        rows += [RowSpec("decode", m, 1, True) for m in gemv_rows]
        if persistent:
            rows += [RowSpec("decode", "static_graph_persistent", 1, True)]
    rows += [RowSpec("verify", "static_graph", s, True)]
    rows += [RowSpec("verify", "static_graph", t, True) for t in cfg.sizes if t != s]
    steps = ["verify_snapshots", "accept_graph", "commit_replay", "commit_closed_form", "commit_snapshot"]
    rows += [RowSpec("step", m, s, True) for m in steps + ["step_graph"]]
    rows += [RowSpec("step", "step_eager", s, False), RowSpec("decode", "static_eager", 1, False)]
    if compiled:
        rows += [RowSpec("compiled", "static_graph_compiled", t, True) for t in (1, s)]
    rows += [RowSpec("core", "gdn_core", 1, True), RowSpec("core", "gdn_core", s, True)]
    rows += [RowSpec("step", m, s, False) for m in ("set_tree", "readback", "accept_host")]
    rows += [RowSpec("decode", "hybrid_eager", 1, False)]
    rows += [RowSpec("verify", m, s, False) for m in ("static_eager", "hybrid_eager")]
    rows += [RowSpec("step", "hybrid_step", s, False)]
    return rows


def measure(bench: ShapeBench, spec: RowSpec, ceilings: dict[str, Any], skip: str | None) -> dict[str, Any]:
    """One row: build, check against HybridLM (and the eager call), time; or record why not."""
    cfg = bench.cfg
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(
        shape=bench.name, group=spec.group, method=spec.method, T=spec.T, dtype=cfg.dtype, reason="",
        tol=TOLERANCE[cfg.dtype], context=cfg.context, timer=timer_name(bench.device), seed=cfg.seed,
    )  # fmt: skip
    if spec.group in ("decode", "verify", "compiled") or spec.method in (
        "step_graph",
        "step_eager",
        "hybrid_step",
    ):
        nbytes, flops = step_cost(bench.model, spec.T, cfg.context)
        row.update(bytes_min=nbytes, flops=flops, floor_us=floor_us(nbytes, flops, ceilings, cfg.dtype))
    if skip:
        row.update(status="skipped", reason=skip)
        return row
    m: Measured | None = None
    try:
        if spec.group == "decode" or (spec.group == "compiled" and spec.T == 1):
            m = bench.decode(spec.method)
        elif spec.group in ("verify", "compiled"):
            m = bench.verify(spec.method, spec.T)
        elif spec.group == "core":
            m = bench.core(spec.T)
        else:
            m = bench.step(spec.method)
        cpu = "CPU: run eagerly (no CUDA graphs)" if spec.graph and bench.device.type != "cuda" else ""
        row.update(
            rel_err=m.rel_err, state_err=m.state_err, rel_err_eager=m.rel_err_eager, top1=m.top1,
            accepted=m.accepted, aten_ops=m.aten_ops,
            reason="; ".join(x for x in (m.note, cpu) if x),
        )  # fmt: skip
        if m.layers:
            row.update(layers_gdn=m.layers[0], layers_attn=m.layers[1])
        if m.profile:
            row.update(
                kernels=m.profile.kernels,
                kernel_busy_us=m.profile.busy_us,
                kernels_by_group=m.profile.summary(),
            )
        errs = [e for e in (m.rel_err, m.state_err, m.rel_err_eager) if e is not None]
        if m.failed:
            row.update(status="FAIL", reason=f"{m.failed}: not timed")
            return row
        if any(not e <= row["tol"] for e in errs):  # NaN fails too
            row.update(
                status="FAIL", reason=f"error {max(errs):.2e} > tol {row['tol']:.0e}: not timed; {m.note}"
            )
            return row
        _sync(bench.device)
        row["us"] = median_us(m.fn, bench.device, cfg.timer) / m.calls
        row["status"] = "ok"
        if row["floor_us"]:
            row["floor_frac"] = row["floor_us"] / row["us"]
        if spec.T == 1 and spec.group in ("decode", "compiled"):
            row["tokens_per_s"] = 1e6 / row["us"]
    except Exception as exc:  # noqa: BLE001 - one broken row must not stop the table
        _sync_quietly(bench.device)
        row.update(status="error", reason=describe(exc))
        print(f"== {bench.name} {spec.group} {spec.method} T={spec.T}: error", file=sys.stderr)
        traceback.print_exc()  # the whole story goes to the log; the record keeps one line
    finally:
        if m is not None:
            m.graph = m.fn = None
        try:
            bench.decoder.load(bench.state0)
            if bench.device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - a broken device shows in the next rows
            row["reason"] = f"{row['reason']}; reset failed: {describe(exc)}"
    return row


def _sync_quietly(device: torch.device) -> None:
    with contextlib.suppress(Exception):  # the device error is already recorded
        _sync(device)


def derive(rows: list[dict[str, Any]]) -> None:
    """x_decode: each row's us over the same shape's decode graph (else eager) us."""
    for shape in {r["shape"] for r in rows}:
        mine = [r for r in rows if r["shape"] == shape]
        base = next(
            (r["us"] for m in ("static_graph", "static_eager") for r in mine
             if r["group"] == "decode" and r["method"] == m and r["us"]),
            None,
        )  # fmt: skip
        for r in mine:
            r["x_decode"] = r["us"] / base if base and r["us"] else None


# ---------------------------------------------------------------------------------- the run


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cuda"


def default_out_dir(device: torch.device) -> Path:
    return Path("results") / f"{datetime.now(timezone.utc):%Y-%m-%d}-{device_slug(device)}-model"


def run_model_bench(
    cfg: ModelBenchConfig,
    device: torch.device,
    out_dir: str | Path,
    figures_dir: str | Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> pd.DataFrame:
    """Every row of every shape; records.jsonl as rows come, manifest, and the report, table.csv and
    figure rewritten after each shape (so a run cut short still has them). Returns the table."""
    from repro.reporting.records import build_manifest
    from repro.reporting.rundir import RunDir

    out_dir = Path(out_dir)
    figures_dir = Path(figures_dir) if figures_dir is not None else out_dir / "figures"
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    manifest = build_manifest(cfg.as_dict(), seed=cfg.seed)
    manifest["versions"].update(_versions())
    with RunDir(out_dir, manifest, kind=KIND) as run:  # refuses an existing run before measuring
        start = time.monotonic()
        deadline = start + cfg.time_budget_s if cfg.time_budget_s is not None else math.inf
        ceilings = measure_ceilings(device, cfg.timer, quick=device.type != "cuda")
        bench_device = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        run.update_manifest(bench_device=bench_device, ceilings=ceilings, models={})
        rows: list[dict[str, Any]] = []
        for i, name in enumerate(cfg.shapes):
            # each shape gets an equal share of what is left; a shape that finishes early passes time on
            shape_deadline = time.monotonic() + (deadline - time.monotonic()) / (len(cfg.shapes) - i)
            bench, skip_all = None, None
            try:
                if time.monotonic() > deadline:
                    raise _Skip(f"time budget of {cfg.time_budget_s:g} s spent")
                bench = ShapeBench(name, cfg, device)
                run.update_manifest(models={**run.manifest["models"], name: _model_info(bench)})
            except _Skip as why:
                skip_all = str(why)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: record, go on
                skip_all = f"model setup failed: {describe(exc)}"
                traceback.print_exc()
            cuda = device.type == "cuda"  # the GEMV row needs the fused triton decoder: CUDA only
            pure_gdn = all(t == GDN for t in MODEL_SHAPES[name]().layer_types)  # the persistent launch's
            for spec in plan(cfg, compiled=cfg.compile and cuda, gemv=cuda, persistent=cuda and pure_gdn):
                left = shape_deadline - time.monotonic()
                skip = skip_all
                if skip is None and left < 0:
                    skip = f"time budget of {cfg.time_budget_s:g} s spent"
                elif skip is None and spec.group == "compiled" and left < COMPILE_MIN_S:
                    skip = f"less than {COMPILE_MIN_S:g} s of this shape's time budget left for compiling"
                row = measure(bench, spec, ceilings, skip) if bench else _skipped(name, spec, cfg, skip or "")
                rows.append(row)
                derive(rows)
                run.append(row)
                if progress:
                    progress(row)
            del bench
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            run.write_report(figures_dir)  # after each shape, so that a run cut short still has a report
    return pd.DataFrame(rows, columns=COLUMNS)


def build_report(run: Run, figures_dir: Path | None) -> str:
    """table.csv, the figure (in ``figures_dir``) and report.md of a bench-model run, from its records
    (x_decode is derived again over all rows)."""
    rows = [dict(r) for r in run.records]
    derive(rows)
    table = pd.DataFrame(rows, columns=COLUMNS)
    present = {k for r in rows for k in r}  # the table of a run of older code has only its columns
    run.write("table.csv", table[[c for c in COLUMNS if c in present or not rows]].to_csv(index=False))
    figs = write_figure(table, figures_dir) if figures_dir is not None else {}
    text = report_markdown(
        table, run.manifest, run.path, {k: os.path.relpath(v, run.path) for k, v in figs.items()}
    )
    run.write("report.md", text)
    return text


class _Skip(Exception):
    pass


def _skipped(name: str, spec: RowSpec, cfg: ModelBenchConfig, why: str) -> dict[str, Any]:
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(shape=name, group=spec.group, method=spec.method, T=spec.T, dtype=cfg.dtype, status="skipped",
               reason=why, tol=TOLERANCE[cfg.dtype], context=cfg.context, seed=cfg.seed)  # fmt: skip
    return row


def _model_info(bench: ShapeBench) -> dict[str, Any]:
    cfg = bench.config
    return {
        "layers": cfg.num_hidden_layers,
        "gdn_layers": cfg.num_gdn_layers,
        "attention_layers": cfg.num_attention_layers,
        "hidden": cfg.hidden_size,
        "parameters": sum(p.numel() for p in bench.model.parameters()),
        "weight_bytes_per_token": weight_bytes(bench.model),
        "setup_s": bench.setup_s,
        "kernel": bench.decoder.kernel,
        "fused": bench.decoder.fused,
        "kernel_dtype": str(bench.decoder.kernel_dtype),
        "precision": bench.decoder.precision,
    }


# ---------------------------------------------------------------------------- report, figure

REPORT_COLUMNS = [
    "method", "T", "accepted", "status", "rel_err", "state_err", "rel_err_eager", "top1", "us",
    "tokens_per_s", "floor_us", "floor_frac", "x_decode", "layers_gdn", "layers_attn", "kernels", "aten_ops",
]  # fmt: skip
FORMATS = {
    "rel_err": "{:.1e}", "state_err": "{:.1e}", "rel_err_eager": "{:.1e}", "top1": "{:.2f}", "us": "{:.1f}",
    "tokens_per_s": "{:.1f}", "floor_us": "{:.1f}", "floor_frac": "{:.0%}", "x_decode": "{:.2f}",
}  # fmt: skip
TITLES = {
    "decode": "AR decode (one token per step)",
    "verify": "Verify latency vs tree size T (draft trees)",
    "step": "Draft-free step at T = step_nodes (deepest path = the target's greedy tokens)",
    "core": "GDN core of one layer alone (x GDN layers below)",
    "compiled": "torch.compile'd glue (CUDA graphs)",
}


def _pick(
    table: pd.DataFrame, shape: str, group: str, method: str, t: int | None = None, column: str = "us"
) -> Any:
    """One row's value in ``column`` (the first matching row's; None where absent or empty)."""
    part = table[(table["shape"] == shape) & (table["group"] == group) & (table["method"] == method)]
    if t is not None:
        part = part[part["T"] == t]
    values = part[column].dropna()
    if not len(values):
        return None
    value = values.iloc[0]
    return value.item() if hasattr(value, "item") else value


def best_decode(table: pd.DataFrame, shape: str) -> pd.Series | None:
    """The fastest decode graph row of ``shape`` that passed its check (the decode the engine can run:
    cuBLAS, GEMV kernels or persistent), or None."""
    rows = table[
        (table["shape"] == shape)
        & (table["group"] == "decode")
        & (table["status"] == "ok")
        & table["method"].str.startswith("static_graph")
        & table["us"].notna()
    ]
    return rows.loc[rows["us"].idxmin()] if len(rows) else None


def targets(table: pd.DataFrame, shape: str, step_nodes: int) -> list[str]:
    """Issue 13's targets against the fastest decode graph (the verify ratio set for gdn-1.3b, the floor
    share for gdn-1.3b and qwen3.6-27b; both reported for every shape), met or missed and by how much."""
    best = best_decode(table, shape)
    verify = _pick(table, shape, "verify", "static_graph", step_nodes)
    share = TARGET_FLOOR.get(shape, TARGET_FLOOR["gdn-1.3b"])
    lines = ["| target | measured | verdict |", "|---|---|---|"]
    if best is not None and verify:
        decode, name = float(best["us"]), best["method"]
        ratio = verify / decode
        verdict = "met" if ratio <= TARGET_RATIO else f"missed by {ratio / TARGET_RATIO:.2f}x"
        lines.append(
            f"| verify({step_nodes}) <= {TARGET_RATIO}x decode "
            f"| {verify:.0f} us / {decode:.0f} us ({name}) = {ratio:.2f}x | {verdict} |"
        )
    else:
        lines.append(f"| verify({step_nodes}) <= {TARGET_RATIO}x decode | not measured | open |")
    if best is not None and pd.notna(best["floor_us"]):
        decode, floor, name = float(best["us"]), float(best["floor_us"]), best["method"]
        frac = floor / decode
        verdict = (
            "met" if frac >= share else f"missed: {frac:.0%} (needs {decode / floor * share:.2f}x faster)"
        )
        lines.append(
            f"| AR decode >= {share:.0%} of the weight-bandwidth floor "
            f"| {decode:.0f} us/token ({name}) vs floor {floor:.0f} us = {frac:.0%} | {verdict} |"
        )
    else:
        lines.append(f"| AR decode >= {share:.0%} of the weight-bandwidth floor | not measured | open |")
    return lines


def faster_or_slower(speedup: float) -> str:
    """A speedup as words: 1.25 -> "1.25x faster", 0.9 -> "1.11x slower"."""
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"


def _busy_line(table: pd.DataFrame, shape: str, group: str, method: str, t: int) -> list[str]:
    """Kernel time of one row's call by group (profiled eagerly) against the graph's time: the rest is
    the time between kernels (launch gaps, dependencies) under the graph."""
    us, busy = _pick(table, shape, group, method, t), _pick(table, shape, group, method, t, "kernel_busy_us")
    if us is None or busy is None:
        return []
    by_group = _pick(table, shape, group, method, t, "kernels_by_group")
    return [
        f"- {group} {method} (T={t}): {us:.0f} us per call; its kernels run {busy:.0f} us "
        f"({by_group}), so {us - busy:.0f} us ({(us - busy) / us:.0%}) pass between kernels under the graph."
    ]


def why_lines(table: pd.DataFrame, shape: str, step_nodes: int, info: dict[str, Any]) -> list[str]:
    """Where the time goes, from the rows alone: host overhead, kernels per step, GDN cores, fusion."""
    out = []

    def kernels_of(method: str) -> int | None:  # kernels per decode token of a decode row
        k = _pick(table, shape, "decode", method, 1, "kernels")
        return None if k is None else int(k)

    decode = _pick(table, shape, "decode", "static_graph", 1)
    eager = _pick(table, shape, "decode", "static_eager", 1)
    ops = _pick(table, shape, "decode", "static_graph", 1, "aten_ops")
    best = best_decode(table, shape)  # the decode of the targets' verdicts
    fastest = "static_graph" if best is None else str(best["method"])
    gdn = info.get("gdn_layers", 0)
    if decode and eager:
        out.append(
            f"- decode: eager {eager:.0f} us vs graph {decode:.0f} us: {eager - decode:.0f} us/token of "
            "python/host overhead removed by the graph."
        )
    kern = kernels_of(fastest)
    floor = _pick(table, shape, "decode", fastest, 1, "floor_us")
    if best is not None and kern and floor:
        excess = float(best["us"]) - floor
        out.append(
            f"- the fastest decode graph ({fastest}) runs {kern} kernels per token; above the floor it "
            f"spends {excess:.0f} us, {excess / kern:.2f} us per kernel."
        )
    decodes = dict.fromkeys(["static_graph", fastest])
    for group, method, t in (*(("decode", m, 1) for m in decodes), ("verify", "static_graph", step_nodes),
                             ("step", "step_graph", step_nodes)):  # fmt: skip
        out += _busy_line(table, shape, group, method, t)
    if ops is not None:
        n, layers = int(ops), info.get("layers")
        per_layer = f" (about {n / layers:.0f} per layer)" if layers else ""
        out.append(
            f"- decode step: {n} aten ops that launch work{per_layer}, counted by a dispatch "
            "mode on the eager call (device-independent; tests/models/test_static_decoder.py pins the CPU"
            " count)."
        )
    core1 = _pick(table, shape, "core", "gdn_core", 1)
    core_t = _pick(table, shape, "core", "gdn_core", step_nodes)
    verify = _pick(table, shape, "verify", "static_graph", step_nodes)
    if decode and core1:
        out.append(
            f"- fla's GDN recurrence alone (the unfused decoder's core): {core1:.1f} us/layer x {gdn} layers "
            f"= {core1 * gdn:.0f} us."
        )
    if verify and core_t and decode:
        out.append(
            f"- the GDN tree kernel alone at T={step_nodes}: {core_t:.1f} us/layer x {gdn} layers = "
            f"{core_t * gdn:.0f} us of verify's {verify:.0f} us (verify - decode = {verify - decode:.0f} us)."
        )

    def versus(new: str, new_us: float, old: str, old_us: float) -> tuple[str, str]:
        """("<new> us vs <old> us", "1.25x faster (k_new vs k_old kernels per token)")."""
        k_new, k_old = kernels_of(new), kernels_of(old)
        counts = f" ({k_new} vs {k_old} kernels per token)" if k_new and k_old else ""
        return f"{new_us:.0f} us vs {old_us:.0f} us", f"{faster_or_slower(old_us / new_us)}{counts}"

    unfused = _pick(table, shape, "decode", "static_graph_unfused", 1)
    if decode and unfused and info.get("fused"):
        times, speed = versus("static_graph", decode, "static_graph_unfused", unfused)
        out.append(f"- fused Triton glue: decode graph {times} unfused, {speed}.")
    gemv = _pick(table, shape, "decode", "static_graph_gemv", 1)
    if decode and gemv:
        times, speed = versus("static_graph_gemv", gemv, "static_graph", decode)
        out.append(
            "- GEMV kernels (norms, SiLU * up, residuals fused into the matmuls): decode graph "
            f"{times} with cuBLAS matmuls, {speed}."
        )
    comp = _pick(table, shape, "compiled", "static_graph_compiled", 1)
    if comp and decode:
        out.append(
            f"- with the glue under torch.compile the decode graph takes {comp:.0f} us "
            f"({faster_or_slower(decode / comp)} than the decode graph above)."
        )
    return out


def report_markdown(
    table: pd.DataFrame, manifest: dict[str, Any], out_dir: Path, figures: dict[str, str]
) -> str:
    """report.md's text: environment, per shape the targets, why, and one table per group; rows not timed."""
    from repro.reporting.report import markdown_table

    c = manifest.get("ceilings", {})
    cfg = manifest.get("config", {})
    step_nodes = int(cfg.get("step_nodes", 64))
    lines = [
        f"# Model benchmark: {out_dir.name}",
        "",
        f"- device: {manifest.get('bench_device')} ({manifest.get('device')})",
        f"- git sha: {manifest.get('git_sha')}; versions: "
        + ", ".join(f"{k} {v}" for k, v in manifest.get("versions", {}).items()),
        f"- timer: {c.get('timer')}; measured copy bandwidth {c.get('copy_GBps', math.nan):.0f} GB/s "
        f"(read + write), matmul bf16 {c.get('bf16_TFLOPs', math.nan):.1f} TFLOP/s",
        f"- weights: random {cfg.get('dtype')}; context {cfg.get('context')} tokens (HybridLM.prefill, "
        "copied into the static buffers); trees: best-first draft trees with random tokens",
        f"- {len(table)} rows: " + ", ".join(f"{k} {v}" for k, v in table["status"].value_counts().items()),
        "",
    ]
    for shape in dict.fromkeys(table["shape"]):
        info = manifest.get("models", {}).get(shape, {})
        lines += [f"## {shape}", ""]
        if info:
            lines += [
                f"What was timed: the full model, {info['layers']} layers executed per step = "
                f"{info['gdn_layers']} GDN + {info['attention_layers']} attention (counted in the timed "
                f"decoder: layers_gdn / layers_attn per row), hidden {info['hidden']}, "
                f"{info['parameters'] / 1e9:.2f}B parameters, "
                f"{info['weight_bytes_per_token'] / 1e9:.2f} GB of weights read per token; "
                f"GDN kernel {info['kernel']} ({info['kernel_dtype']}, "
                f"{info['precision']} dots).",
                "",
            ]
        lines += ["Targets (set for gdn-1.3b; shown for every shape):", ""]
        lines += targets(table, shape, step_nodes) + [""]
        why = why_lines(table, shape, step_nodes, info)
        if why:
            lines += ["Where the time goes:", ""] + why + [""]
        for group, title in TITLES.items():
            part = table[(table["shape"] == shape) & (table["group"] == group)]
            if part.empty:
                continue
            order = {m: i for i, m in enumerate(dict.fromkeys(part["method"]))}
            part = part.sort_values(["method", "T"], key=lambda c: c.map(order) if c.name == "method" else c)
            lines += [
                f"### {title}",
                "",
                markdown_table(part[REPORT_COLUMNS].reset_index(drop=True), FORMATS),
                "",
            ]
    for name, path in figures.items():
        lines += [f"![{name}]({path})", ""]
    untimed = table[table["status"] != "ok"]
    notes = table[(table["status"] == "ok") & (table["reason"].fillna("") != "")]
    if len(untimed) or len(notes):
        lines += ["## Rows not timed, and notes", ""]
        lines += [
            f"- {r.status}: {r.shape} {r.group} {r.method} T={r.T}: {r.reason}" for r in untimed.itertuples()
        ]
        lines += [f"- note: {r.shape} {r.group} {r.method}: {r.reason}" for r in notes.itertuples()]
        lines.append("")
    lines += ["## Definitions", "", DEFINITIONS, ""]
    return "\n".join(lines)


DEFINITIONS = """\
- us: median of triton do_bench (CUDA events around each call, L2 flushed before each) of one call:
  for *_graph rows one CUDA-graph replay of the static decoder's step (static_graph_unfused: the
  decoder with fused=False, the torch glue of repro.models.static around the GDN cores;
  static_graph_gemv: the fused decoder with gemv=True, its decode matmuls on repro.gdn.triton_linear's
  GEMV kernels with the norms, SiLU * up and residual adds fused in, and the fused decode layer kernel;
  static_graph_gemv_core: the same GEMV kernels around the separate decode core, fuse_decode=False;
  static_graph_gemv_core_tree: that, its attention layers on the tree attention kernel;
  static_graph_persistent, pure-GDN shapes: every layer in one persistent launch,
  repro.gdn.triton_persistent, the embedding and the LM head around it), for
  *_eager
  rows the same step run op by op from Python, for hybrid_* rows HybridLM's per-sequence
  verify/commit (the harness's current path). CPU runs: a perf_counter loop (plumbing only).
- rel_err: ||logits - HybridLM's|| / ||HybridLM's|| on the same prefilled state and tree (HybridLM
  with its reference GDN path); state_err: the same over the committed state's buffers after the
  commit (vs HybridLM.commit of the same path); rel_err_eager: a graph's output vs the eager static
  call's (commit rows: the graph-committed state vs HybridLM's). Tolerance per dtype (tol); bf16
  compares two different bf16 paths (the static GDN kernels take bf16 q/k/v with tf32 dots, HybridLM
  upcasts to float32), so its tolerance is loose and its errors are a measurement.
- floor_us = max(bytes_min / measured copy bandwidth, flops / measured matmul rate): weights read once
  per step (one embedding row; the LM head in full), each GDN state read and written (decode) or read
  with delta and G written per node (verify), the KV cache read, the logits written; 2 flops per
  weight per token plus the GDN WY form and attention. floor_frac = floor_us / us (the fraction of the
  weight-bandwidth floor reached); x_decode = us / the decode graph's us.
- layers_gdn / layers_attn: GDN and attention layers that the timed call executed (counted in the
  static decoder on the checking call; HybridLM rows: its config's layers, all run by its loop).
  kernels: CUDA kernels one call launches (torch profiler on the eager call the graph captures).
  aten_ops: aten ops of one eager call that launch work (views and allocations excluded; a dispatch
  mode, so CPU runs count too; Triton/fla kernels are not aten ops and are not in it).
- step rows: set_tree = host tree upload (tokens, parents, ancestor mask, depths, conv gather index);
  verify_snapshots = verify that also writes every node's state (what the snapshot commit needs);
  accept_graph = greedy acceptance on the device (every step row checks it against TargetMatch on the
  same logits: a difference fails the row; the note compares it with TargetMatch on HybridLM's
  logits, which bf16 argmaxes may make differ); accept_host = TargetMatch on the host (one device
  read per accepted level); commit_* = the commit strategies alone (replay runs the recurrence over
  the slot's max depth with identity padding); step_graph = verify + accept + commit (the config's
  step_commit, closed_form by default) in one graph; readback = reading the accepted node and bonus
  back; step_eager = step_graph's work op by op (python/host overhead = step_eager - step_graph);
  hybrid_step = HybridLM verify + TargetMatch + commit.
- core rows: the GDN core of one layer on that layer's real inputs (T=1: fla's fused recurrence,
  the unfused decoder's core; else the fused Triton tree kernel), timed as one graph of 16 calls
  (inputs warm in L2 after the first) and divided by 16, so the graph's own launch is shared.
- kernels_by_group / kernel_busy_us (decode, verify at step_nodes, step_graph): the call's CUDA
  kernels profiled once eagerly, their device time summed per name group (gdn_core, commit,
  glue_triton, matmul_triton: the GEMV / row-tiled kernels, matmul, other); us - kernel_busy_us is the
  time between kernels under the graph."""


def write_figure(table: pd.DataFrame, folder: Path) -> dict[str, Path]:
    """model_verify_vs_T.png: verify latency vs T (graph; eager dashed), the fastest decode step and the
    target ratio times it."""
    from matplotlib.figure import Figure

    from repro.reporting.figures import _save

    ok = table[(table["status"] == "ok") & (table["group"] == "verify")]
    shapes = list(dict.fromkeys(ok["shape"]))
    if not shapes:
        return {}
    fig = Figure(figsize=(5.5 * len(shapes), 4.4), layout="constrained")
    for ax, shape in zip(fig.subplots(1, len(shapes), squeeze=False)[0], shapes):
        for method, style in (("static_graph", "-"), ("static_eager", "--"), ("hybrid_eager", ":")):
            g = ok[(ok["shape"] == shape) & (ok["method"] == method)].sort_values("T")
            if len(g):
                ax.plot(g["T"], g["us"] / 1e3, ls=style, marker="o", label=f"verify ({method})")
        best = best_decode(table, shape)
        decode = float(best["us"]) if best is not None else _pick(table, shape, "decode", "static_eager", 1)
        if decode:
            ax.axhline(decode / 1e3, color="k", lw=1, label="decode step (fastest)")
            ax.axhline(TARGET_RATIO * decode / 1e3, color="k", lw=1, ls="--", label=f"{TARGET_RATIO}x decode")
        ts = sorted({int(t) for t in ok[ok["shape"] == shape]["T"]})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ts, [str(t) for t in ts])
        ax.minorticks_off()
        ax.set_xlabel("tree nodes T")
        ax.set_ylabel("ms per verify (whole model)")
        ax.set_title(f"{shape}: verify latency vs tree size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    return {"verify latency vs tree size": _save(fig, folder / "model_verify_vs_T.png")}


KIND = RunKind(
    "bench-model",
    fields_parser("shape", "group", "method", "T", "status"),
    build_report,
    ("report.md", "table.csv"),
)
