"""Weaver (DFlash-TfM): an autoregressive residual adapter over DFlash's top-K candidate pool.

One DFlash pass gives, for the block ``[root, MASK x (T - 1)]``, final hidden states ``g_d`` and
logits ``l_d`` of rows d = 1..T-1 (row d predicts draft depth d). Pool ``P_d`` = the top-K tokens
of ``l_d`` (K capped by the vocabulary). Weaver scores the children of every tree node with one
causal transformer layer over the node's root-to-node path.

Parametrisation. ``E`` is the target's (frozen) input embedding, ``f`` the target features that
DFlash reads (the concatenated outputs of its ``target_layer_ids`` layers) of the last committed
token, i.e. the token before the pending root. A node n at depth d-1 with token t_n owns one
sequence element, the slot that predicts its children at depth d:

    x_n = W_g g_d + W_e E[t_n] + W_f f                  (hidden_proj, token_proj, feature_proj)
    y_n = x_n + Attn(RMSNorm(x), over the elements of n's ancestors and n itself)
    h_n = RMSNorm(y_n + MLP(RMSNorm(y_n)))                  (one pre-norm layer, SwiGLU MLP)
    u_n = W_o h_n                                           (out_proj: d_model -> target hidden)
    score_n(t) = l_d[t] + <u_n, E[t]>     for t in P_d;  q_n = softmax over P_d of score_n

Attention has ``num_heads`` heads and no positional encoding (g_d already encodes the depth).
The residual ``<u_n, E[t]> = <h_n, W_o^T E[t]>`` is a per-token projection of the frozen
embedding evaluated on the K pool tokens only: no full-vocabulary matmul, and tokens outside
``P_d`` get probability 0 (never proposed). With ``W_o = 0``, ``q_n`` is DFlash's marginal at
depth d renormalised on the pool (how training starts).

Tree growth (:class:`WeaverDrafter`, :mod:`repro.drafters.weaver_growth`): best-first on the
cumulative log-probability of a path under the q's, until ``budget`` draft nodes, in Weaver steps of
``width`` nodes (the paper's w, 2..8): a step takes the ``width`` best frontier candidates and one
batched forward (a tree attention mask over the cached keys/values of ancestors) scores them; width 1
is the exact best-first tree. Depth is capped at T-1. On the host (the reference) candidates wait in
a heap (a parent's next-ranked child is pushed when one is taken, as in DDTree). On the device the
same tree grows with fixed shapes and no host read (on CUDA one fused Triton kernel per step), in one
CUDA graph with the pool selection.

Checkpoint: a directory with ``config.json`` (``architectures: ["WeaverAdapter"]`` and the
:class:`WeaverConfig` fields) and ``model.safetensors`` (the :class:`WeaverModel` parameter names).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from repro.drafters.attention import grouped_attention
from repro.drafters.base import DraftContext, Proposal
from repro.drafters.dflash import HALF, DFlashConfig, DFlashDrafter, DFlashDraftModel, DraftRMSNorm, marginals
from repro.drafters.pool import top_k_pool
from repro.drafters.weaver_growth import KV, Growth, GrowthStep, greedy_path, grow
from repro.errors import CheckpointError, ConfigError
from repro.models.family import resolve_checkpoint
from repro.models.graphed import GraphedTarget, LaunchedStep
from repro.models.hybrid import HybridLM, Verification
from repro.models.layers import MLP
from repro.models.loading import assign_weights, read_json_config, write_checkpoint
from repro.tree import MAX_TREE_NODES, DeviceTree

ARCHITECTURE = "WeaverAdapter"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class WeaverConfig:
    """Shapes of a Weaver adapter and of the DFlash drafter / target it was built for."""

    d_model: int
    num_heads: int
    intermediate_size: int
    pool_size: int
    block_size: int  # the DFlash drafter's block size
    vocab_size: int
    target_hidden_size: int
    target_feature_size: int  # DFlash's feature width: len(target_layer_ids) * target hidden size
    dflash_hidden_size: int
    rms_norm_eps: float = 1e-6
    extra: dict[str, Any] = field(default_factory=dict)  # other config.json keys, kept on save

    def __post_init__(self) -> None:
        sizes = {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}
        bad = [f"{k}={v}" for k, v in sizes.items() if v < 1]
        if bad:
            raise CheckpointError(f"Weaver config sizes must be >= 1 ({', '.join(bad)})")
        if self.d_model % self.num_heads:
            raise CheckpointError(f"d_model={self.d_model} is not a multiple of num_heads={self.num_heads}")
        if self.block_size < 2:
            raise CheckpointError(f"block_size={self.block_size} must be >= 2")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**self.extra, "architectures": [ARCHITECTURE], "model_type": "weaver", **own}

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> WeaverConfig:
        archs = raw.get("architectures") or []
        if ARCHITECTURE not in archs:
            raise CheckpointError(f"{where} is not a {ARCHITECTURE} checkpoint (architectures={archs})")
        names = [f.name for f in fields(cls) if f.name != "extra"]
        try:
            values = {n: raw[n] for n in names if n != "rms_norm_eps"}
            values = {n: int(v) for n, v in values.items()}
            cfg = cls(**values, rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)))
        except KeyError as exc:
            raise CheckpointError(f"{where} lacks {exc.args[0]!r} needed for a Weaver adapter") from None
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: bad value ({exc})") from None
        owned = set(names) | {"architectures", "model_type", "dtype"}
        cfg.extra = {k: v for k, v in raw.items() if k not in owned}
        return cfg

    def check_fits(self, dflash: DFlashConfig, target: HybridLM) -> None:
        """A one-line CheckpointError unless this adapter was shaped for ``dflash`` and ``target``."""
        tc = target.config
        want = {
            "vocab_size": (self.vocab_size, tc.vocab_size, "the target"),
            "target_hidden_size": (self.target_hidden_size, tc.hidden_size, "the target"),
            "target_feature_size": (self.target_feature_size, dflash.feature_size, "the DFlash drafter"),
            "dflash_hidden_size": (self.dflash_hidden_size, dflash.hidden_size, "the DFlash drafter"),
            "block_size": (self.block_size, dflash.block_size, "the DFlash drafter"),
        }
        for name, (mine, theirs, whose) in want.items():
            if mine != theirs:
                raise CheckpointError(f"Weaver adapter has {name}={mine} but {whose} has {theirs}")


class WeaverModel(nn.Module):
    """The adapter network (see the module docstring for the exact parametrisation)."""

    def __init__(self, config: WeaverConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.hidden_proj = nn.Linear(config.dflash_hidden_size, d, bias=False)
        self.token_proj = nn.Linear(config.target_hidden_size, d, bias=False)
        self.feature_proj = nn.Linear(config.target_feature_size, d, bias=False)
        self.input_layernorm = DraftRMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = DraftRMSNorm(d, config.rms_norm_eps)
        self.mlp = MLP(d, config.intermediate_size)
        self.norm = DraftRMSNorm(d, config.rms_norm_eps)
        self.out_proj = nn.Linear(d, config.target_hidden_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.out_proj.weight.dtype

    def embed(self, rows: torch.Tensor, parent_emb: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """Element inputs x [..., d_model] from DFlash rows, parent-token embeddings and root features."""
        return self.hidden_proj(rows) + self.token_proj(parent_emb) + self.feature_proj(feature)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.config.num_heads, self.config.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, past: KV | None = None) -> tuple[torch.Tensor, KV]:
        """Residual queries u [B, T, target hidden] of elements x [B, T, d_model], and their keys/values.

        ``mask`` (bool [B or 1, T, S + T], True = visible) says which of the ``past`` elements
        (S cached keys/values) and of the new ones each new element attends to.
        """
        b, t, _ = x.shape
        a = self.input_layernorm(x)
        q, k, v = self._heads(self.q_proj(a)), self._heads(self.k_proj(a)), self._heads(self.v_proj(a))
        keys = k if past is None else torch.cat([past[0], k], dim=2)
        values = v if past is None else torch.cat([past[1], v], dim=2)
        y = x + self.o_proj(grouped_attention(q, keys, values, mask[:, None]))
        h = self.norm(y + self.mlp(self.post_attention_layernorm(y)))
        return self.out_proj(h), (k, v)

    @staticmethod
    def pool_log_probs(u: torch.Tensor, pool_logits: torch.Tensor, pool_emb: torch.Tensor) -> torch.Tensor:
        """log q [..., K]: log-softmax over the pool of DFlash logits [..., K] plus <u, E[pool]>."""
        scores = pool_logits + torch.einsum("...h,...kh->...k", u, pool_emb)
        return F.log_softmax(scores.float() if scores.dtype in HALF else scores, dim=-1)


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
