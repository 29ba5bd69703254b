"""DFlash: a block drafter conditioned on target hidden states (z-lab checkpoint format).

The network is :class:`~repro.drafters.dflash_model.DFlashDraftModel`. Checkpoints use z-lab's layout so
that ``dflash.DFlashDraftModel.from_pretrained`` loads them: ``config.json`` (a Qwen3 config plus
``block_size``, ``num_target_layers`` and ``dflash_config.{target_layer_ids, mask_token_id}``) and
``model.safetensors`` with the names ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``layers.{i}.{input,post_attention}_layernorm.weight``, ``fc.weight``, ``hidden_norm.weight``,
``norm.weight``.

:class:`DFlashDrafter` adapts a model to the engine's Drafter protocol; it keeps the target
features (and each layer's context keys/values) of every committed token, keyed by position. On a
graphed target it drafts on static buffers and CUDA graphs instead (:mod:`repro.drafters.static_dflash`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from repro.drafters.attention import marginals
from repro.drafters.base import DraftContext, Proposal
from repro.drafters.dflash_model import DFlashConfig, DFlashDraftModel, KVCache, spread_target_layers
from repro.drafters.features import FeatureCache
from repro.drafters.layers import init_draft_weights
from repro.drafters.static_dflash import DEFAULT_MAX_LEN, StaticDFlash, TreeAfter
from repro.errors import ConfigError
from repro.models.family import resolve_checkpoint
from repro.models.graphed import GraphedTarget, GraphedVerification, LaunchedStep
from repro.models.hybrid import HybridLM, Verification
from repro.models.loading import assign_weights, read_json_config, write_checkpoint

WEIGHTS_FILE = "model.safetensors"


# ----- checkpoints -----


def save_dflash(model: DFlashDraftModel, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in z-lab's DFlash layout (weights in ``dtype``,
    default the model's)."""
    return write_checkpoint(model, path, dtype, weights_file=WEIGHTS_FILE)


def read_dflash_config(path: str | Path) -> DFlashConfig:
    """Parse ``path/config.json`` of a DFlash checkpoint, or raise a one-line CheckpointError."""
    path = Path(path)
    return DFlashConfig.from_dict(read_json_config(path, "DFlash"), str(path / "config.json"))


def load_dflash(
    path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> DFlashDraftModel:
    """Load a z-lab-format DFlash drafter (weights keep their dtype unless ``dtype`` is given)."""
    path = resolve_checkpoint(path, "DFlash drafter")
    cfg = read_dflash_config(path)
    with torch.device("meta"):
        model = DFlashDraftModel(cfg)
    stored = assign_weights(model, path, "DFlash")
    return model.to(device=device, dtype=dtype or stored).eval()


def random_dflash_for(
    target: HybridLM,
    seed: int = 0,
    num_layers: int = 1,
    block_size: int = 16,
    target_layer_ids: list[int] | None = None,
    mask_token_id: int | None = None,
    num_features: int = 2,
) -> DFlashDraftModel:
    """A seeded, untrained DFlash drafter shaped for ``target`` (its dtype and device).

    Widths and heads follow the target's attention layers; features come from ``num_features``
    target layers (:func:`spread_target_layers`) unless ``target_layer_ids`` is given; the mask
    token defaults to the last vocabulary id (the byte tokenizer's ``<|mask|>``).
    """
    tc = target.config
    layers = tc.num_hidden_layers
    cfg = DFlashConfig(
        hidden_size=tc.hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        head_dim=tc.head_dim,
        intermediate_size=tc.intermediate_size,
        vocab_size=tc.vocab_size,
        num_target_layers=layers,
        target_layer_ids=list(target_layer_ids or spread_target_layers(layers, num_features)),
        mask_token_id=tc.vocab_size - 1 if mask_token_id is None else mask_token_id,
        block_size=block_size,
        rms_norm_eps=tc.rms_norm_eps,
        rope_theta=tc.rope_theta,
    )
    model = init_draft_weights(DFlashDraftModel(cfg), seed)
    return model.to(device=target.device, dtype=target.dtype).eval()


# ----- the Drafter protocol -----


def check_fits(cfg: DFlashConfig, target: HybridLM) -> None:
    """A one-line ConfigError unless a drafter of ``cfg`` can read ``target``'s states and vocabulary."""
    tc = target.config
    if cfg.hidden_size != tc.hidden_size or cfg.num_target_layers != tc.num_hidden_layers:
        raise ConfigError(
            f"DFlash drafter was made for a {cfg.num_target_layers}-layer target of width "
            f"{cfg.hidden_size}; this target has {tc.num_hidden_layers} layers of width {tc.hidden_size}"
        )
    if not 0 <= cfg.mask_token_id < tc.vocab_size:
        raise ConfigError(f"DFlash mask_token_id {cfg.mask_token_id} is outside the target vocabulary")


class DFlashDrafter:
    """Drafts one block per step with a DFlash model on the target's captured hidden states.

    The target features of committed tokens are cached by absolute position: prefill chunks
    arrive through :meth:`observe_prefill` (the engine calls it for every chunk), later tokens
    from the accepted path of each step's verification (``ctx.verification.hidden``). Each
    draft layer's context keys/values are extended with the new rows only. ``propose`` runs the
    block ``[pending root, MASK x (block_size - 1)]`` at positions P..P+block_size-1 (P =
    committed tokens) and returns the top-``top_k`` tokens and the marginals per depth.

    ``static``: draft on :class:`~repro.drafters.static_dflash.StaticDFlash` (static buffers of
    ``max_len`` positions, one CUDA graph per step on CUDA, no host sync). None (the default): on from
    the start when ``target`` is a :class:`~repro.models.graphed.GraphedTarget`; else switched on within a
    generation once a verification comes from one (the features cached so far are moved over); on a
    HybridLM target the eager path above runs, the reference the static one is tested against.
    ``max_len``: the static buffers' first size in positions (doubled when a step needs more); ``fast``:
    their block forward on the Triton kernels (:mod:`repro.drafters.dflash_fast`; default: with graphs,
    unless float64).
    """

    builds_trees_after = True  # propose_after takes a device tree builder, run in its step's graph

    def __init__(
        self,
        model: DFlashDraftModel,
        target: HybridLM,
        block_size: int | None = None,
        top_k: int = 1,
        static: bool | None = None,
        max_len: int = DEFAULT_MAX_LEN,
        fast: bool | None = None,
    ) -> None:
        cfg, tc = model.config, target.config
        check_fits(cfg, target)
        self.block_size = int(block_size or cfg.block_size)
        if self.block_size < 2:
            raise ConfigError(f"DFlash block_size must be >= 2, got {self.block_size}")
        if not 1 <= top_k <= tc.vocab_size:
            raise ConfigError(f"DFlash top_k must lie in [1, {tc.vocab_size}], got {top_k}")
        self.model = model.to(device=target.device, dtype=target.dtype).eval()
        self.target = target
        self.top_k = top_k
        self.capture_layers: tuple[int, ...] = tuple(cfg.target_layer_ids)
        self.static, self.max_len, self.fast = static, max_len, fast
        self._static: StaticDFlash | None = None
        self.begin([], None)

    @property
    def committed(self) -> int:
        """Number of leading positions whose target features are cached."""
        return self._static.count if self.on_static else self.store.count

    @property
    def features(self) -> torch.Tensor:
        """Target features of the committed tokens, [committed, feature_size]."""
        return self._static.features if self.on_static else self.store.rows

    @property
    def on_static(self) -> bool:
        """Whether this generation drafts on the static buffers."""
        return self._static is not None and self._static_now

    def _static_buffers(self) -> StaticDFlash:
        if self._static is None:
            embedding = self.target.model.embed_tokens.weight
            self._static = StaticDFlash(
                self.model,
                embedding,
                self.target.lm_head,
                self.block_size,
                self.top_k,
                self.max_len,
                fast=self.fast,
            )
        return self._static

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        m = self.model
        self.store = FeatureCache("DFlash", self.capture_layers, m.config.hidden_size, m.dtype, m.device)
        self.kv: KVCache = []
        # auto mode on a graphed target: static from the start (the first step's marginals then lie in a
        # graph's output, which the tree builders' graphs read in place, not in a new tensor per prompt)
        self._static_now = bool(self.static) or (
            self.static is None and isinstance(self.target, GraphedTarget)
        )
        if self._static_now:
            self._static_buffers().reset()

    def _switch(self, ctx: DraftContext) -> bool:
        """Whether to draft on the static buffers now; on a graphed target's first verification (auto
        mode) the features cached so far move there."""
        if not self._static_now and self.static is None and isinstance(ctx.verification, GraphedVerification):
            self._static_buffers().adopt(self.store.rows, self.kv)
            self.store.reset()
            self.kv = []
            self._static_now = True
        return self.on_static

    @torch.no_grad()
    def _ingest(self, ver: Verification, path: list[int]) -> None:
        """Cache features of the accepted ``path`` (root first) and their context keys/values."""
        start = self.store.ingest(ver, path)
        if start is None:
            return
        rows = self.store.rows[start:]
        positions = torch.arange(start, start + rows.shape[0], device=rows.device)[None]
        new = self.model.context_kv(rows[None], positions)
        if self.kv:
            self.kv = [
                (torch.cat([k[:, :, :start], nk], dim=2), torch.cat([v[:, :, :start], nv], dim=2))
                for (k, v), (nk, nv) in zip(self.kv, new)
            ]
        else:
            self.kv = new

    def observe_prefill(self, verification: Verification) -> None:
        """Cache the hidden states of one prefill chunk (every node of its chain is committed)."""
        path = list(range(verification.tree.size))
        if self.on_static:
            self._static_buffers().ingest(verification, path)
        else:
            self._ingest(verification, path)

    @torch.no_grad()
    def block_inputs(self, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache the previous step's accepted features; the next block's ids and positions [1, T].

        The block is ``[pending root, MASK x (block_size - 1)]`` at positions P..P+block_size-1
        (P = committed tokens, whose features are all cached after this call).
        """
        if ctx.verification is not None:
            self._ingest(ctx.verification, list(ctx.accepted_path))
        expected = len(ctx.prompt_ids) + len(ctx.output_ids) - 1
        self.store.expect(expected)
        mask = self.model.config.mask_token_id
        device = self.model.device
        block = torch.tensor([[ctx.output_ids[-1]] + [mask] * (self.block_size - 1)], device=device)
        positions = torch.arange(expected, expected + self.block_size, device=device)[None]
        return block, positions

    @torch.no_grad()
    def block_rows(self, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Final hidden states [T-1, hidden] and logits [T-1, V] of block rows 1..T-1 (row d drafts
        depth d), after caching the previous step's accepted features. On the static buffers they are
        the step graph's static outputs: valid until the next ``block_rows`` or ``propose``."""
        if self._switch(ctx):
            rows, logits = self._static_buffers().step(ctx, probs=False)
            return rows, logits
        block, positions = self.block_inputs(ctx)
        hidden = self.model.block_hidden(self.kv, block, positions, self.target.model.embed_tokens.weight)
        rows = hidden[0, 1:]
        return rows, self.model.compute_logits(rows, self.target.lm_head)

    def pipelines(self) -> bool:
        """Whether this drafter can draft after a launched, unread step (:meth:`propose_after`): on a
        graphed target, static buffers not turned off."""
        return isinstance(self.target, GraphedTarget) and self.static is not False

    def _after(self, step: LaunchedStep, probs: bool, tree: TreeAfter | None = None) -> tuple[Any, ...]:
        if not self._switch(DraftContext([], [], step.verification)):
            raise ValueError("drafting after a launched step needs the static buffers (pipelines())")
        return self._static_buffers().step_after(step.verification, step.result, step.depth, probs, tree)

    @torch.no_grad()
    def propose_after(self, step: LaunchedStep, tree: TreeAfter | None = None) -> Proposal:
        """:meth:`propose` after ``step``, launched on the graphed target and not read yet: the accepted path
        and the block's root (the bonus) are read on the device (:meth:`StaticDFlash.step_after`); the
        host learns the path's length through :meth:`settle`, after its read. ``tree``: a device tree
        builder (root, marginals, top-k ids) -> DeviceTree run in the same graph, its tree in the
        proposal's ``tree`` (rooted at the bonus)."""
        if tree is None:
            _, probs, top = self._after(step, probs=True)
            return Proposal(probs=probs, top_ids=top)
        _, probs, top, built = self._after(step, True, tree)
        return Proposal(probs=probs, top_ids=top, tree=built)

    @torch.no_grad()
    def block_rows_after(self, step: LaunchedStep) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`block_rows` after a launched, unread ``step`` (:meth:`propose_after`)."""
        rows, logits = self._after(step, probs=False)
        return rows, logits

    def settle(self, accepted: int) -> None:
        """The length of the path a :meth:`propose_after` ingested, once the host has read it."""
        self._static_buffers().settle(accepted)

    def root_feature(self) -> torch.Tensor:
        """The last committed token's target features [F] (the next tree root's parent token); on the static
        buffers the device copy a step without marginals wrote (no host count needed)."""
        return self._static_buffers().tail[0] if self.on_static else self.features[-1]

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> Proposal:
        """The marginals and top-``top_k`` ids per depth; on the static buffers both stay on the device
        (no host sync) and are valid until the next step."""
        if self._switch(ctx):
            _, probs, top = self._static_buffers().step(ctx, probs=True)
            return Proposal(probs=probs, top_ids=top)
        _, logits = self.block_rows(ctx)
        probs = marginals(logits)
        return Proposal(probs=probs, top_ids=torch.topk(probs, self.top_k, dim=-1).indices)
