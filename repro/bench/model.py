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
the timed decoder on the checking call. The run's table and report (targets, where the time goes, the
figure): :mod:`repro.bench.model_report`.
"""

from __future__ import annotations

import contextlib
import gc
import math
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

from repro.bench.kernel_methods import rel_err, wy_flops
from repro.bench.model_report import COLUMNS, KIND, derive
from repro.bench.shapes import draft_tree, flatten_paths
from repro.bench.timing import TimerConfig, measure_ceilings, time_calls, timer_name
from repro.errors import describe
from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights, tiny_config
from repro.models.graphs import count_ops
from repro.models.hybrid import HybridLM
from repro.models.state import ModelState
from repro.models.static import StaticDecoder, TreeSlot
from repro.tree import Tree

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
# vs HybridLM: bf16 compares two different bf16 paths through a random deep model (bf16 vs float32 of
# the same weights from the same state differs by 5-10% at 24-64 layers), so its gate only catches
# gross errors; graphs vs the eager static call must agree closely in every dtype.
TOLERANCE = {"bf16": 0.5, "fp32": 1e-3, "fp64": 1e-10}
TOLERANCE_EAGER = {"bf16": 1e-2, "fp32": 1e-5, "fp64": 1e-10}
CORE_CALLS = 16  # GDN core rows: calls per graph replay
COMPILE_MIN_S = 45.0  # compiled rows start only with this much of the shape's budget left


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
        timed = time_calls(m.fn, bench.device, cfg.timer)
        row.update(us=timed.us / m.calls, n_timed=timed.n, status="ok")
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
    from repro.reporting.rundir import RunDir, check_figures_dir

    out_dir = Path(out_dir)
    figures_dir = Path(figures_dir) if figures_dir is not None else out_dir / "figures"
    check_figures_dir(figures_dir, out_dir)  # bad input: refused before anything is written
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    manifest = build_manifest(cfg.as_dict(), seed=cfg.seed)
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
