"""EAGLE: a feature-level autoregressive drafter on the target's hidden states (EAGLE-1/2 style).

The drafter is ``num_hidden_layers`` (default 1) Llama-style decoder layers (RMSNorm, causal
self-attention with rotary at absolute positions, SwiGLU MLP) with no embedding or LM head of its
own. Its input row at position t is ``fc(cat(embed(token_{t+1}), f_t))``: the target's embedding
of the next token beside f_t, the target's feature at t (the concatenated outputs of the target
layers ``target_layer_ids``; default: the last decoder layer, before the final norm). The layer
stack's output ``pred_t`` predicts the last layer's feature at t+1, and the target's own final
norm and LM head turn it into the logits of token t+2. Drafting continues autoregressively: a
drafted token's row takes the drafter's predicted feature in place of the target's (repeated in
every slot when features come from several target layers: only the last layer's is predicted).

Checkpoint: ``config.json`` in EAGLE's convention (a Llama config with
``architectures: ["EagleDraftModel"]`` and ``eagle_config.{target_layer_ids,
target_hidden_size}``) and ``model.safetensors`` with EAGLE's names ``fc.weight``,
``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``
and ``layers.{i}.{input,post_attention}_layernorm.weight``. EAGLE-1 skips the input norm of
layer 0; here every layer has it (one layer type, as in EAGLE-3), and ``fc`` has no bias.

:class:`EagleDrafter` adapts a model to the engine's Drafter protocol: a chain of ``k`` argmax
drafts, or an EAGLE-2 dynamic tree (:class:`DynamicTree`) returned in ``Proposal.tree``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from repro.drafters.attention import ProjectedAttention, grouped_attention, marginals
from repro.drafters.base import DraftContext, Proposal
from repro.drafters.features import FeatureCache
from repro.drafters.layers import DraftLayer, apply_rope, init_draft_weights, rotary_tables
from repro.errors import CheckpointError, ConfigError
from repro.models.family import resolve_checkpoint
from repro.models.hybrid import HybridLM, Verification
from repro.models.loading import assign_weights, read_json_config, weight_names, write_checkpoint
from repro.tree import MAX_TREE_NODES, Sparse, Tree

ARCHITECTURE = "EagleDraftModel"
WEIGHTS_FILE = "model.safetensors"
KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, KV, C, D]
PROPOSAL_SUPPORT = 1024  # tokens kept per node's recorded conditional (all when the vocabulary is smaller)


@dataclass
class EagleConfig:
    """Shapes of an EAGLE drafter and the target features it reads."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: list[int]
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.num_hidden_layers < 1:
            raise CheckpointError(f"num_hidden_layers={self.num_hidden_layers} must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise CheckpointError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.hidden_size != self.target_hidden_size:
            raise CheckpointError(
                f"hidden_size={self.hidden_size} must equal eagle_config.target_hidden_size="
                f"{self.target_hidden_size} (predicted features go through the target's head)"
            )
        if not self.target_layer_ids or min(self.target_layer_ids) < 0:
            raise CheckpointError(f"eagle_config.target_layer_ids={self.target_layer_ids} must be >= 0 ids")

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features beside the token embedding."""
        return len(self.target_layer_ids) * self.target_hidden_size

    def to_dict(self) -> dict[str, Any]:
        """EAGLE's config.json: a Llama config plus ``eagle_config``."""
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "tie_word_embeddings": False,
            "eagle_config": {
                "target_layer_ids": list(self.target_layer_ids),
                "target_hidden_size": self.target_hidden_size,
            },
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> EagleConfig:
        """Parse EAGLE's config.json; a one-line CheckpointError for what this drafter cannot run."""
        archs = raw.get("architectures") or []
        if ARCHITECTURE not in archs:
            raise CheckpointError(unsupported_format(raw, where) or f"{where} is not an {ARCHITECTURE} "
                                  f"checkpoint (architectures={archs})")  # fmt: skip
        rope = raw.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise CheckpointError(f"{where}: unsupported rope_scaling {rope!r} (only default rotary)")
        if raw.get("attention_bias"):
            raise CheckpointError(f"{where}: attention_bias=true is not supported")
        if raw.get("hidden_act", "silu") not in ("silu", "swish"):
            raise CheckpointError(f"{where}: unsupported hidden_act {raw.get('hidden_act')!r} (only silu)")
        eagle = raw.get("eagle_config")
        if not isinstance(eagle, dict):
            raise CheckpointError(f"{where} lacks the eagle_config object of an EAGLE drafter")
        try:
            heads = int(raw["num_attention_heads"])
            return cls(
                hidden_size=int(raw["hidden_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
                head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
                intermediate_size=int(raw["intermediate_size"]),
                vocab_size=int(raw["vocab_size"]),
                target_layer_ids=[int(i) for i in eagle["target_layer_ids"]],
                target_hidden_size=int(eagle["target_hidden_size"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(raw.get("rope_theta", 10000.0)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            )
        except KeyError as exc:
            raise CheckpointError(f"{where} lacks {exc.args[0]!r} needed for an EAGLE drafter") from None
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: bad value ({exc})") from None


EAGLE3_NAMES = ("d2t", "t2d", "lm_head.weight")  # EAGLE-3's draft-vocabulary maps and its own head


def unsupported_format(
    raw: dict[str, Any], where: str, names: set[str] | frozenset[str] = frozenset()
) -> str | None:
    """One line saying which known EAGLE format ``raw`` (config.json) or weight ``names`` are, and why
    this drafter cannot run it; None for the supported layout (or an unknown one)."""
    archs = [str(a) for a in raw.get("architectures") or []]
    own = sorted(n for n in names if n in EAGLE3_NAMES)
    if any("Eagle3" in a for a in archs) or "draft_vocab_size" in raw or own:
        what = f"weights {', '.join(own)}" if own else f"architectures={archs}"
        return (
            f"{where}: an EAGLE-3 checkpoint ({what}: its own LM head over a draft vocabulary with "
            "d2t/t2d maps) is not supported; repro's EAGLE drafter predicts features read through the "
            "target's head (train one with `repro train eagle`)"
        )
    if archs and all(a.startswith("LlamaForCausalLM") for a in archs) and "eagle_config" not in raw:
        return (
            f"{where}: an original EAGLE-1/2 checkpoint (architectures={archs}, fc with bias, own "
            "embed_tokens) is not supported; repro loads the EagleDraftModel layout (docs/usage.md)"
        )
    return None


def misfit(cfg: EagleConfig, target: HybridLM) -> str | None:
    """Why a drafter of ``cfg`` cannot draft for ``target`` (None when it can)."""
    tc = target.config
    if cfg.target_hidden_size != tc.hidden_size:
        return f"it reads features of width {cfg.target_hidden_size}, the target's are {tc.hidden_size}"
    if cfg.vocab_size != tc.vocab_size:
        return f"its vocabulary has {cfg.vocab_size} tokens, the target's {tc.vocab_size}"
    bad = [i for i in cfg.target_layer_ids if i >= tc.num_hidden_layers]
    if bad:
        return f"target_layer_ids {bad} are outside the target's {tc.num_hidden_layers} layers"
    return None


# ----- the network -----


class EagleAttention(ProjectedAttention):
    """Causal self-attention (grouped KV heads, rotary) over cached rows plus the new rows."""

    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Output [B, T, hidden] and the new rows' keys/values [B, KV, T, D].

        ``mask`` (bool, True = visible, broadcastable to [B, heads, T, C + T]); None = causal:
        every new row sees all C cached rows and the new rows up to itself. ``slots`` ([T] row
        indices): ``past`` are static buffers [B, KV, S, D]; the new rows are written into them at
        ``slots`` and attend over all S rows through ``mask`` ([T, S], required).
        """
        b, t, _ = x.shape
        q = apply_rope(self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if slots is not None:
            assert past is not None and mask is not None, "static rows need the buffers and a mask"
            past[0].index_copy_(2, slots, k)
            past[1].index_copy_(2, slots, v)
            return self.o_proj(grouped_attention(q, past[0], past[1], mask)), (k, v)
        keys, values = (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)) if past else (k, v)
        c = keys.shape[2] - t
        if mask is None:
            mask = torch.ones(t, c + t, dtype=torch.bool, device=x.device).tril(c)
        return self.o_proj(grouped_attention(q, keys, values, mask)), (k, v)


class EagleLayer(DraftLayer):
    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__(EagleAttention(cfg), cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, kv = self.self_attn(self.input_layernorm(x), cos, sin, past, mask, slots)
        x = x + out
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class EagleDraftModel(nn.Module):
    """The EAGLE drafter network (parameter names as EAGLE's checkpoints).

    Shapes are batch-first: next-token ids [B, T], target features [B, T, feature_size], absolute
    positions [B, T] of the features.
    """

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.hidden_size + config.feature_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList(EagleLayer(config) for _ in range(config.num_hidden_layers))

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def forward(
        self,
        next_ids: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        embedding: torch.Tensor,
        past: KVCache | None = None,
        mask: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """Predicted next features [B, T, hidden] and, per layer, the new rows' keys/values.

        Row t is ``fc(cat(embedding[next_ids[t]], features[t]))`` at ``positions[t]``; ``past``
        holds cached rows' keys/values, ``mask`` and ``slots`` (static buffers) are as in
        :meth:`EagleAttention.forward`.
        """
        x = self.fc(torch.cat([F.embedding(next_ids, embedding), features], dim=-1))
        cos, sin = rotary_tables(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        new: KVCache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, past[i] if past else None, mask, slots)
            new.append(kv)
        return x, new

    def draft_features(self, pred: torch.Tensor) -> torch.Tensor:
        """The feature row of a drafted token: its predicted feature, once per target layer."""
        return pred.repeat(*([1] * (pred.dim() - 1)), len(self.config.target_layer_ids))

    @staticmethod
    def compute_logits(pred: torch.Tensor, target: HybridLM) -> torch.Tensor:
        """Token logits of predicted features: the target's final norm and LM head."""
        return target.lm_head(target.model.norm(pred))


# ----- checkpoints -----


def save_eagle(model: EagleDraftModel, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in EAGLE's layout (weights in ``dtype``,
    default the model's)."""
    return write_checkpoint(model, path, dtype, "torch_dtype", WEIGHTS_FILE)


def load_eagle(
    path: str | Path,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    target: HybridLM | None = None,
) -> EagleDraftModel:
    """Load an EAGLE drafter (weights keep their dtype unless ``dtype`` is given); with ``target``,
    refuse one whose shapes do not fit it."""
    path = resolve_checkpoint(path, "EAGLE drafter")
    cfg = EagleConfig.from_dict(read_json_config(path, "EAGLE"), str(path / "config.json"))
    if why := unsupported_format({}, f"EAGLE checkpoint {path}", weight_names(path)):
        raise CheckpointError(why)
    if target is not None and (why := misfit(cfg, target)):
        raise CheckpointError(f"EAGLE checkpoint {path} does not fit the target: {why}")
    with torch.device("meta"):
        model = EagleDraftModel(cfg)
    stored = assign_weights(model, path, "EAGLE")
    return model.to(device=device, dtype=dtype or stored).eval()


def random_eagle_for(
    target: HybridLM, seed: int = 0, num_layers: int = 1, target_layer_ids: list[int] | None = None
) -> EagleDraftModel:
    """A seeded, untrained EAGLE drafter shaped for ``target`` (its dtype and device).

    Widths and heads follow the target's attention layers; features default to the target's last
    decoder layer.
    """
    tc = target.config
    cfg = EagleConfig(
        hidden_size=tc.hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        head_dim=tc.head_dim,
        intermediate_size=tc.intermediate_size,
        vocab_size=tc.vocab_size,
        target_layer_ids=list(target_layer_ids or [tc.num_hidden_layers - 1]),
        target_hidden_size=tc.hidden_size,
        rms_norm_eps=tc.rms_norm_eps,
        rope_theta=tc.rope_theta,
    )
    if why := misfit(cfg, target):
        raise ConfigError(f"cannot build an EAGLE drafter for this target: {why}")
    model = init_draft_weights(EagleDraftModel(cfg), seed)
    return model.to(device=target.device, dtype=target.dtype).eval()


# ----- the Drafter protocol -----


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 dynamic-tree settings with SpecLA's confidence pruning.

    Each depth expands the ``topk`` best frontier nodes (by cumulative drafter log-probability)
    into their ``topk`` most probable children; a child whose drafter probability given its parent
    is below ``tau`` (SpecLA's confidence margin) is dropped. After at most ``depth`` levels, the
    ``budget`` best draft nodes (ancestors first on ties) form the tree; expansion stops early once
    no deeper node could enter the best ``budget`` (a path's score never rises with depth).
    """

    budget: int
    topk: int = 4
    tau: float = 0.0
    depth: int = 6

    def __post_init__(self) -> None:
        if not 1 <= self.budget < MAX_TREE_NODES:
            raise ConfigError(
                f"tree budget must lie in [1, {MAX_TREE_NODES - 1}] draft nodes, got {self.budget}"
            )
        if self.topk < 1:
            raise ConfigError(f"tree topk must be >= 1, got {self.topk}")
        if not 0.0 <= self.tau < 1.0:
            raise ConfigError(f"tree tau must lie in [0, 1), got {self.tau}")
        if self.depth < 1:
            raise ConfigError(f"tree depth must be >= 1, got {self.depth}")


@dataclass
class _Node:
    token: int
    parent: int  # index into the node list; -1 = the root (the pending token)
    score: float  # cumulative log-probability of the path


class EagleDrafter:
    """Drafts with an EAGLE model on the target features of committed tokens.

    Features are cached by absolute position (:class:`FeatureCache`), and so are the drafter's
    own keys/values of the rows of committed tokens: row t needs f_t and token t+1, so after each
    step the rows up to the pending token are computed once, with real features only. Drafted
    rows live only while one proposal is being built, so rejected positions never enter the cache.

    Chain mode (``tree`` None): ``k`` argmax drafts; ``candidates[d]`` are the top-``width``
    tokens at depth d+1 and ``probs`` the drafter's distributions. Tree mode: an EAGLE-2 dynamic
    tree (:class:`DynamicTree`) in ``Proposal.tree``, grown with one drafter forward per depth
    (all frontier nodes together under a tree attention mask); ``tree.proposals`` holds every inner
    node's drafter conditional (:func:`sparse_rows`), the distribution its top-k children came from.
    """

    def __init__(
        self,
        model: EagleDraftModel,
        target: HybridLM,
        k: int = 4,
        width: int = 1,
        tree: DynamicTree | None = None,
    ) -> None:
        if why := misfit(model.config, target):
            raise ConfigError(f"EAGLE drafter does not fit the target: {why}")
        if k < 1:
            raise ConfigError(f"EAGLE draft length k must be >= 1, got {k}")
        if not 1 <= width <= target.config.vocab_size:
            raise ConfigError(f"EAGLE width must lie in [1, {target.config.vocab_size}], got {width}")
        self.model = model.to(device=target.device, dtype=target.dtype).eval()
        self.target = target
        self.k, self.width, self.tree = k, width, tree
        self.capture_layers: tuple[int, ...] = tuple(model.config.target_layer_ids)
        self.begin([], None)

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        m = self.model
        self.store = FeatureCache(
            "EAGLE", self.capture_layers, m.config.target_hidden_size, m.dtype, m.device
        )
        self.kv: KVCache = []  # keys/values of the committed rows 0..rows-1
        self.rows = 0
        self._prompt = list(prompt_ids)
        self._pred = torch.zeros(0)  # the last committed row's prediction
        self._pending = -1  # the token that row read (the pending one)

    def _ingest(self, ver: Verification, path: list[int]) -> None:
        start = self.store.ingest(ver, path)
        if start is not None and start < self.rows:  # rows from `start` on read replaced features
            self.rows = start

    def observe_prefill(self, verification: Verification) -> None:
        """Cache the features of one prefill chunk (every node of its chain is committed); after the
        prompt's last chunk, the drafter's own prefill: the committed rows that read prompt tokens only
        (:meth:`_prompt_rows`), timed with the prompt's prefill as a serving engine runs the draft
        model's extend with the target's, not in the first decode step."""
        self._ingest(verification, list(range(verification.tree.size)))
        self._prompt_rows()

    @torch.no_grad()
    def _prompt_rows(self) -> None:
        """Once every prompt feature is cached: rows 0..c-2 (c prompt tokens; row t reads token t + 1, so
        the last row waits for the first new token)."""
        c = self.store.count
        if c == len(self._prompt) and self.rows < c - 1:
            self._extend(self._prompt, c - 1)

    @torch.no_grad()
    def _context(self, tokens: list[int]) -> torch.Tensor:
        """Bring the committed rows up to date; the last one's predicted feature [hidden].

        ``tokens`` are all tokens so far (the last is pending); row t reads ``tokens[t + 1]``.
        """
        c = self.store.count
        if self.rows == c and tokens[c] != self._pending:  # the last row read another pending token
            self.rows = c - 1
        if self.rows == c:
            return self._pred
        self._pred, self._pending = self._extend(tokens, c), tokens[c]
        return self._pred

    def _extend(self, tokens: list[int], end: int) -> torch.Tensor:
        """Rows rows..end-1 (row t reads ``tokens[t + 1]`` and feature t) appended to the committed
        keys/values; the last one's prediction [hidden]."""
        r = self.rows
        m = self.model
        ids = torch.tensor(tokens[r + 1 : end + 1], device=m.device)[None]
        positions = torch.arange(r, end, device=m.device)[None]
        past = [(k[:, :, :r], v[:, :, :r]) for k, v in self.kv] if r else None
        pred, new = m(ids, self.store.rows[r:end][None], positions, self._embedding, past)
        self.kv = _append(past, new) if past else new
        self.rows = end
        return pred[0, -1]

    @property
    def _embedding(self) -> torch.Tensor:
        return self.target.model.embed_tokens.weight

    def _probs(self, preds: torch.Tensor) -> torch.Tensor:
        """Drafter distributions [n, V] of the tokens after rows with predictions ``preds`` [n, hidden]."""
        return marginals(self.model.compute_logits(preds, self.target))

    def _start_drafting(self) -> None:
        """Forget the previous proposal's drafted rows (they never enter the committed cache)."""
        self._draft_kv: KVCache = []
        self._anc = torch.zeros(0, 0, dtype=torch.bool, device=self.model.device)

    def _draft_rows(
        self, tokens: list[int], parent_preds: torch.Tensor, parent_rows: list[int], depth: int
    ) -> torch.Tensor:
        """Rows of drafted tokens at ``depth`` (>= 1) in one forward; their predictions [n, hidden].

        ``parent_rows`` index earlier drafted rows, numbered in the order they were drafted (-1:
        the parent is the pending token, whose prediction comes from the last committed row). Each
        row sees every committed row, its drafted ancestors and itself.
        """
        m, dev = self.model, self.model.device
        n, d = len(tokens), self._anc.shape[0]
        c = self.rows
        anc = torch.zeros(n, d, dtype=torch.bool, device=dev)
        for i, p in enumerate(parent_rows):
            if p >= 0:
                anc[i] = self._anc[p]
                anc[i, p] = True
        eye = torch.eye(n, dtype=torch.bool, device=dev)
        mask = torch.cat([torch.ones(n, c, dtype=torch.bool, device=dev), anc, eye], dim=1)
        past = _append(self.kv, self._draft_kv) if self._draft_kv else self.kv
        ids = torch.tensor(tokens, device=dev)[None]
        positions = torch.full((1, n), c - 1 + depth, device=dev)
        pred, new = m(ids, m.draft_features(parent_preds)[None], positions, self._embedding, past, mask)
        self._draft_kv = _append(self._draft_kv, new) if self._draft_kv else new
        grown = torch.zeros(d + n, d + n, dtype=torch.bool, device=dev)
        grown[:d, :d] = self._anc
        grown[d:, :d] = anc
        self._anc = grown
        return pred[0]

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.verification is not None:
            self._ingest(ctx.verification, list(ctx.accepted_path))
        self.store.expect(len(ctx.prompt_ids) + len(ctx.output_ids) - 1)
        root_pred = self._context(list(ctx.prompt_ids) + list(ctx.output_ids))
        self._start_drafting()
        if self.tree is None:
            return self._chain(root_pred)
        return self._grow(ctx.output_ids[-1], root_pred, self.tree)

    def _chain(self, pred: torch.Tensor) -> Proposal:
        rows, candidates = [], []
        row = -1
        for depth in range(1, self.k + 1):
            probs = self._probs(pred[None])[0]
            top = torch.topk(probs, self.width).indices.tolist()
            rows.append(probs)
            candidates.append(top)
            if depth < self.k:
                pred = self._draft_rows([top[0]], pred[None], [row], depth)[0]
                row += 1
        return Proposal(candidates, torch.stack(rows))

    def _grow(self, root_token: int, root_pred: torch.Tensor, spec: DynamicTree) -> Proposal:
        nodes: list[_Node] = []
        # frontier: (node index or -1 for the root, its drafted row or -1, its prediction, its score)
        frontier_nodes, frontier_rows, preds, scores = [-1], [-1], root_pred[None], [0.0]
        conditionals: dict[int, Sparse] = {}  # expanded node (-1: the root) -> its drafter conditional
        next_row = 0  # drafted rows are numbered in drafting order
        for depth in range(1, spec.depth + 1):
            probs = self._probs(preds)
            conditionals.update(zip(frontier_nodes, sparse_rows(probs)))
            top_p, top_ids = torch.topk(probs, min(spec.topk, self.model.config.vocab_size), dim=-1)
            children: list[int] = []
            for f, (ps, ids) in enumerate(zip(top_p.tolist(), top_ids.tolist())):
                for p, tok in zip(ps, ids):
                    if p >= spec.tau and p > 0.0:
                        children.append(len(nodes))
                        nodes.append(_Node(tok, frontier_nodes[f], scores[f] + math.log(p)))
            if not children or depth == spec.depth:
                break
            beam = sorted(children, key=lambda i: (-nodes[i].score, i))[: spec.topk]
            if len(nodes) >= spec.budget:
                kth = sorted(nd.score for nd in nodes)[-spec.budget]
                if nodes[beam[0]].score <= kth:  # no descendant can enter the best `budget`
                    break
            where = {node: f for f, node in enumerate(frontier_nodes)}
            parent_f = [where[nodes[i].parent] for i in beam]
            preds = self._draft_rows(
                [nodes[i].token for i in beam], preds[parent_f], [frontier_rows[f] for f in parent_f], depth
            )
            frontier_nodes, frontier_rows = beam, list(range(next_row, next_row + len(beam)))
            next_row += len(beam)
            scores = [nodes[i].score for i in beam]
        keep = sorted(sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, i))[: spec.budget])
        index = {old: new + 1 for new, old in enumerate(keep)}
        index[-1] = 0
        inner = {nodes[i].parent for i in keep}
        props = [conditionals[-1] if -1 in inner else None] + [
            conditionals[i] if i in inner else None for i in keep
        ]
        tree = Tree(
            [root_token] + [nodes[i].token for i in keep],
            [-1] + [index[nodes[i].parent] for i in keep],
            tuple(props),
        )
        return Proposal(_greedy_path(tree, [nodes[i].score for i in keep]), tree=tree)


def sparse_rows(probs: torch.Tensor, support: int = PROPOSAL_SUPPORT) -> list[Sparse]:
    """Per row of ``probs`` [n, V], the distribution as a sparse float64 (ids, probs) pair: every
    token when V <= ``support`` (the ids shared), else the ``support`` most probable ones (their
    drafter probabilities as they are: the tail's mass is not recorded)."""
    if probs.shape[-1] <= support:
        ids = torch.arange(probs.shape[-1])
        return [(ids, row) for row in probs.to("cpu", torch.float64)]
    top_p, top_ids = torch.topk(probs, support, dim=-1)
    return list(zip(top_ids.cpu(), top_p.to("cpu", torch.float64)))


def _append(cache: KVCache, new: KVCache) -> KVCache:
    """Per layer, ``new`` keys/values appended after ``cache``'s along the row axis."""
    return [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(cache, new)]


def _greedy_path(tree: Tree, scores: list[float]) -> list[list[int]]:
    """Per depth, the children of the best node of the depth above, best first (the root's first)."""
    tokens = tree.tokens.tolist()
    out: list[list[int]] = []
    node = 0
    while kids := tree.children_of(node):
        kids = sorted(kids, key=lambda i: (-scores[i - 1], i))
        out.append([tokens[i] for i in kids])
        node = kids[0]
    return out
