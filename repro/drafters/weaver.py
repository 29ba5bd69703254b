"""Weaver (DFlash-TfM): an autoregressive residual adapter over DFlash's top-K candidate pool.

One DFlash pass gives, for the block ``[root, MASK x (T - 1)]``, final hidden states ``g_d`` and
logits ``l_d`` of rows d = 1..T-1 (row d predicts draft depth d). Pool ``P_d`` = the top-K tokens
of ``l_d`` (K capped by the vocabulary). Weaver scores the children of every tree node with one
causal transformer layer over the node's root-to-node path (the network:
:mod:`repro.drafters.weaver_model`).

Tree growth (:class:`WeaverDrafter`, :mod:`repro.drafters.weaver_growth`): best-first on the
cumulative log-probability of a path under the q's, until ``budget`` draft nodes, in Weaver steps of
``width`` nodes (the paper's w, 2..8): a step takes the ``width`` best frontier candidates and one
batched forward (a tree attention mask over the cached keys/values of ancestors) scores them; width 1
is the exact best-first tree. Depth is capped at T-1. On the host (the reference) candidates wait in
a heap (a parent's next-ranked child is pushed when one is taken, as in DDTree). On the device the
same tree grows with fixed shapes and no host read (on CUDA one fused Triton kernel per step), in one
CUDA graph with the pool selection (:class:`GrowthStep`).

Checkpoint: a directory with ``config.json`` (``architectures: ["WeaverAdapter"]`` and the
:class:`~repro.drafters.weaver_model.WeaverConfig` fields) and ``model.safetensors`` (the
:class:`~repro.drafters.weaver_model.WeaverModel` parameter names).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from repro.drafters.attention import marginals
from repro.drafters.base import DraftContext, Proposal
from repro.drafters.dflash import DFlashDrafter
from repro.drafters.dflash_model import DFlashDraftModel
from repro.drafters.pool import top_k_pool
from repro.drafters.weaver_growth import DeviceGrowth, Growth, greedy_path, grow, grow_on_device
from repro.drafters.weaver_model import WeaverConfig, WeaverModel
from repro.errors import ConfigError
from repro.models.family import resolve_checkpoint
from repro.models.graphed import GraphedTarget, LaunchedStep
from repro.models.hybrid import HybridLM, Verification
from repro.models.loading import assign_weights, read_json_config, write_checkpoint
from repro.tree import MAX_TREE_NODES, DeviceTree

WEIGHTS_FILE = "model.safetensors"


# ----- checkpoints -----


def save_weaver(model: WeaverModel, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (weights in ``dtype``, default the model's)."""
    return write_checkpoint(model, path, dtype, weights_file=WEIGHTS_FILE)


def read_weaver_config(path: Path) -> WeaverConfig:
    return WeaverConfig.from_dict(read_json_config(path, "Weaver"), str(path / "config.json"))


def load_weaver(
    path: str | Path, dflash: DFlashDraftModel | None = None, target: HybridLM | None = None
) -> WeaverModel:
    """Load a Weaver adapter (in its saved dtype); with ``dflash`` and ``target``, check it fits them."""
    path = resolve_checkpoint(path, "Weaver adapter")
    cfg = read_weaver_config(path)
    if dflash is not None and target is not None:
        cfg.check_fits(dflash.config, target)
    with torch.device("meta"):
        model = WeaverModel(cfg)
    stored = assign_weights(model, path, "Weaver")
    return model.to(dtype=stored).eval()


def random_weaver_for(
    dflash: DFlashDraftModel,
    target: HybridLM,
    seed: int = 0,
    d_model: int = 64,
    heads: int = 4,
    intermediate_size: int | None = None,
    pool_size: int = 512,
    zero_residual: bool = False,
) -> WeaverModel:
    """A seeded, untrained adapter shaped for ``dflash`` and ``target`` (the target's dtype and device).

    Matrices are fan-in scaled normals, norm weights near 1; ``zero_residual`` zeroes ``out_proj``
    so that Weaver starts as DFlash's marginals renormalised on the pool (training's init).
    """
    dc = dflash.config
    cfg = WeaverConfig(
        d_model=d_model,
        num_heads=heads,
        intermediate_size=intermediate_size or 2 * d_model,
        pool_size=pool_size,
        block_size=dc.block_size,
        vocab_size=target.config.vocab_size,
        target_hidden_size=target.config.hidden_size,
        target_feature_size=dc.feature_size,
        dflash_hidden_size=dc.hidden_size,
        rms_norm_eps=dc.rms_norm_eps,
    )
    model = WeaverModel(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        if zero_residual:
            model.out_proj.weight.zero_()
    return model.to(device=target.device, dtype=target.dtype).eval()


# ----- the device growth step -----


class GrowthStep:
    """Weaver's propose after the DFlash block, on static inputs: pool top-``pool``, DFlash marginals,
    device growth in steps of ``width`` nodes. With ``graphs`` one CUDA graph (captured on the first
    call), else eager.

    ``fused``: grow with :func:`repro.drafters.growth_kernels.grow_fused` (one Triton launch per step,
    on the programs ``growth_kernels.device_programs`` picks from the shapes and the SM count) instead
    of :func:`grow_on_device`; default (None): on CUDA when Triton is importable and the adapter's
    shapes fit that many programs (``growth_kernels.fits``). True on CPU needs TRITON_INTERPRET=1 (one
    program there).

    ``__call__(root, rows, logits, feature)`` copies the inputs in (device to device; the root token
    by a fill, or a copy when it is a [1] device tensor) and returns (growth, marginals [D, V]); with
    graphs these are the graph's static outputs, valid until the next call. (A graph per input buffers
    that read the DFlash step's outputs in place, saving the three copies, measured slower on the H200:
    the draft stage's host time grew, likely from growth graphs captured inside the timed decode for
    each new DFlash graph; results/2026-12-02-h200-host-path.)
    """

    def __init__(
        self,
        weaver: WeaverModel,
        embedding: torch.Tensor,
        budget: int,
        pool: int,
        graphs: bool,
        fused: bool | None = None,
        width: int = 1,
    ) -> None:
        self.weaver, self.embedding, self.budget, self.width = weaver, embedding, budget, width
        self.pool, self.graphs, self.fused = pool, graphs, fused
        self.inputs: list[torch.Tensor] = []
        self.call: Callable[[], Any] | None = None

    def _step(self) -> tuple[DeviceGrowth, torch.Tensor]:
        root, rows, logits, feature = self.inputs
        pool_logits, pool_ids = top_k_pool(logits, self.pool)
        grow_fn = grow_on_device
        if self.fused:
            from repro.drafters.growth_kernels import grow_fused as grow_fn
        growth = grow_fn(
            self.weaver,
            self.embedding,
            self.budget,
            root,
            rows,
            pool_logits,
            pool_ids,
            feature,
            width=self.width,
        )
        return growth, marginals(logits)

    def __call__(
        self, root: int | torch.Tensor, rows: torch.Tensor, logits: torch.Tensor, feature: torch.Tensor
    ) -> tuple[DeviceGrowth, torch.Tensor]:
        given = (rows, logits, feature)
        if self.call is None or any(a.shape != b.shape for a, b in zip(self.inputs[1:], given)):
            self.inputs = [torch.zeros(1, dtype=torch.long, device=rows.device)] + [t.clone() for t in given]
            self.call = None
        if isinstance(root, torch.Tensor):  # on the device (a pipelined step's bonus): copied
            self.inputs[0].copy_(root)
        else:
            self.inputs[0].fill_(root)
        for buf, t in zip(self.inputs[1:], given):
            buf.copy_(t)
        if self.call is None:
            if self.fused is None:
                pool = min(self.pool, logits.shape[-1])
                self.fused = _fused_fits(self.weaver, self.budget, pool, rows.device, self.width)
            from repro.models.graphs import graph_call

            self.call = graph_call(self._step, rows.device, self.graphs)
        return self.call()


def _fused_fits(weaver: WeaverModel, budget: int, pool: int, device: torch.device, width: int) -> bool:
    """Whether :class:`GrowthStep` grows with the fused kernel by default: CUDA, Triton importable, the
    adapter's shapes within ``growth_kernels.fits`` on the programs ``grow_fused`` will launch."""
    if device.type != "cuda":
        return False
    try:
        from repro.drafters.growth_kernels import device_programs, fits
    except ImportError:
        return False
    return fits(
        weaver.config, budget, pool, device_programs(weaver.config, budget, pool, device, width=width)
    )


# ----- the Drafter protocol -----


def grown_proposal(probs: torch.Tensor, tree: DeviceTree) -> Proposal:
    """A proposal whose tree was grown on the device: its ``candidates`` (the greedy path, first child
    per level) are read from the tree on first use, a sync that nothing on the device path makes."""
    return Proposal(probs=probs, tree=tree, read=lambda: [[t] for t in greedy_path(tree.to_tree())])


class WeaverDrafter:
    """DFlash marginals and hidden states, then a Weaver-grown best-first tree (``Proposal.tree``).

    The wrapped :class:`DFlashDrafter` keeps the target features of committed tokens and runs the
    block; ``pool`` (default: the adapter's ``pool_size``) is K, ``width`` the nodes one Weaver step
    takes and scores (the paper's w), ``budget`` the draft nodes of the tree (the root excluded).

    ``device_growth`` (default: when the drafter's target is a :class:`GraphedTarget`) grows the tree
    on the device (:mod:`repro.drafters.weaver_growth`): pool top-K, marginals and growth run as one
    CUDA graph on CUDA (eagerly elsewhere, or with ``graphs=False``) with no host read (on CUDA the
    growth is one Triton kernel per step, :mod:`repro.drafters.growth_kernels`), and the
    proposal's tree is a :class:`DeviceTree` of ``budget + 1`` nodes (root-level padding nodes with
    token 0 where the pools hold fewer); ``fused`` is :class:`GrowthStep`'s (None:
    the fused kernel on CUDA where it fits). Otherwise :meth:`grow`, the host
    reference, grows a :class:`Tree` of the real nodes.
    """

    def __init__(
        self,
        weaver: WeaverModel,
        dflash: DFlashDrafter,
        budget: int,
        width: int = 4,
        pool: int | None = None,
        device_growth: bool | None = None,
        graphs: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        weaver.config.check_fits(dflash.model.config, dflash.target)
        if dflash.block_size > weaver.config.block_size:
            raise ConfigError(
                f"block_size {dflash.block_size} exceeds the Weaver adapter's {weaver.config.block_size}"
            )
        if not 1 <= budget < MAX_TREE_NODES:
            raise ConfigError(f"tree budget must lie in [1, {MAX_TREE_NODES - 1}] draft nodes, got {budget}")
        if width < 1:
            raise ConfigError(f"Weaver expansion width must be >= 1, got {width}")
        self.pool = weaver.config.pool_size if pool is None else int(pool)
        if self.pool < 1:
            raise ConfigError(f"pool size must be >= 1, got {self.pool}")
        self.dflash, self.target = dflash, dflash.target
        self.weaver = weaver.to(device=self.target.device, dtype=self.target.dtype).eval()
        self.budget, self.width = budget, width
        self.capture_layers: tuple[int, ...] = dflash.capture_layers
        graphed = isinstance(self.target, GraphedTarget)
        self.device_growth = graphed if device_growth is None else device_growth
        if graphs is None:
            graphs = self.target.device.type == "cuda" and getattr(self.target, "graphs", True)
        emb = self.target.model.embed_tokens.weight
        self.step = GrowthStep(self.weaver, emb, budget, self.pool, graphs, fused, width)

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        self.dflash.begin(prompt_ids, reference_ids)

    def observe_prefill(self, verification: Verification) -> None:
        self.dflash.observe_prefill(verification)

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> Proposal:
        hidden, logits = self.dflash.block_rows(ctx)
        feature = self.dflash.root_feature()
        if self.device_growth:
            growth, probs = self.step(ctx.output_ids[-1], hidden, logits, feature)
            return grown_proposal(probs, growth.tree)
        pool_logits, pool_ids = top_k_pool(logits, self.pool)
        growth = self.grow(ctx.output_ids[-1], hidden, pool_logits, pool_ids, feature)
        return Proposal([[t] for t in growth.greedy], marginals(logits), growth.tree)

    def pipelines(self) -> bool:
        """Whether :meth:`propose_after` can run: device growth on a DFlash drafter that pipelines."""
        return self.device_growth and self.dflash.pipelines()

    @torch.no_grad()
    def propose_after(self, step: LaunchedStep) -> Proposal:
        """:meth:`propose` after a launched, unread ``step``: the DFlash block on its device result
        (:meth:`DFlashDrafter.block_rows_after`), the tree grown below its bonus on the device."""
        hidden, logits = self.dflash.block_rows_after(step)
        growth, probs = self.step(step.root, hidden, logits, self.dflash.root_feature())
        return grown_proposal(probs, growth.tree)

    def settle(self, accepted: int) -> None:
        """The read length of the path :meth:`propose_after` ingested (the DFlash drafter's count)."""
        self.dflash.settle(accepted)

    @torch.no_grad()
    def grow(
        self,
        root: int,
        rows: torch.Tensor,
        pool_logits: torch.Tensor,
        pool_ids: torch.Tensor,
        feature: torch.Tensor,
    ) -> Growth:
        """The best-first tree below ``root`` from DFlash rows [D, hidden] and pools [D, K], on the
        host (the reference: :func:`repro.drafters.weaver_growth.grow`)."""
        embedding = self.target.model.embed_tokens.weight
        w = self.weaver
        return grow(w, embedding, self.budget, self.width, root, rows, pool_logits, pool_ids, feature)
