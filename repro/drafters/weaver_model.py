"""The Weaver (DFlash-TfM) adapter network and its config.

Parametrisation. ``E`` is the target's (frozen) input embedding, ``f`` the target features that
DFlash reads (the concatenated outputs of its ``target_layer_ids`` layers) of the last committed
token, i.e. the token before the pending root; ``g_d`` and ``l_d`` are DFlash's final hidden states
and logits of block row d, ``P_d`` its top-K pool there. A node n at depth d-1 with token t_n owns
one sequence element, the slot that predicts its children at depth d:

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
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from repro.drafters.attention import HALF, grouped_attention
from repro.drafters.dflash_model import DFlashConfig
from repro.drafters.layers import DraftRMSNorm
from repro.errors import CheckpointError
from repro.models.hybrid import HybridLM
from repro.models.layers import MLP

ARCHITECTURE = "WeaverAdapter"
KV = tuple[torch.Tensor, torch.Tensor]  # keys, values [B, heads, S, head_dim]


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
