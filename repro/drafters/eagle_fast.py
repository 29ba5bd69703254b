"""The EAGLE drafter's forward and distributions on few launches: the fast path of
:class:`~repro.drafters.static_eagle.StaticEagleDrafter` (``fast``), pinned to the eager
:class:`~repro.drafters.eagle.EagleDraftModel` it replaces (tests/drafters/test_eagle_fast.py).

The matmuls go through the static decoder's wrappers of :mod:`repro.gdn.triton_linear`
(:func:`~repro.models.static_layers.normed_linear`, :func:`~repro.models.static_layers.plus_linear`,
:func:`~repro.models.static_layers.fused_mlp_block`), their glue fused in, with the constants made once:

- ``fc(cat(embed(ids), features))`` = ``token_rows[ids] + features @ W_f^T``: fc's embedding half is
  folded into a table ``embedding @ W_e^T`` [V, hidden] (one gather a forward; the table costs one LM
  head of memory), its feature half takes the table rows as the residual of
  :func:`~repro.gdn.triton_linear.linear_residual`; a drafted row's features are its parent's prediction
  as it is (one target layer) instead of a repeat.
- Per layer: input norm + q|k|v stacked (one launch); rotary on q and k from a table of every position
  made once per buffer size (cos and the signed sin, ``x cos + roll(x) sin_signed``: the same products as
  ``apply_rope``), the keys and values written at the rows' slots and the masked softmax attention in one
  launch (:func:`~repro.drafters.eagle_attention.rope_attend`, ``fused_attention``: under the interpreter,
  on CUDA with ``eagle_attention.CUDA_DEFAULT``, never for float64); else (float64, the reference)
  rotary (3 launches, the table read once per forward), the KV writes (2) and :func:`attend` with the
  additive mask built once per forward (5, 7 in half precision, 3 for one row); o_proj + residual (1),
  post norm + gate|up + SiLU * up (1), down + residual (1).
- The distributions: the target's final norm + LM head in one launch, then the softmax.

Which variant (:func:`~repro.drafters.fast_rules.triton_linears`): up to GEMV_ROWS rows (a chain level: 1; a
tree level: ``topk``; the LM head of a frontier) the GEMV kernels at every width (half precision won there
on the target side); more rows (the step's block of committed rows, up to TILED_ROWS) the row-tiled kernels
up to ``row_tiled_width`` (default :data:`~repro.models.graphed.SMALL_WIDTH`), cuBLAS (with the Triton
RMSNorm and SiLU * up) above it, where the row-tiled linears lost on the target side.

Launches (aten ops that launch work + Triton launches; the tiny family's drafter layout, one layer reading
one target layer, counted on CPU by tests/drafters/test_eagle_fast.py):

=======================================  ======  =====================  ===========  ==========
what                                     before  eager (glue per step)  fast, eager  fast
                                                                        attention
=======================================  ======  =====================  ===========  ==========
a tree level's forward (4 rows)          65      60                     19           8
its distributions (norm, head, softmax)  9       9                      2            2
the proposal call, chain k = 6           451     422                    135          79
the proposal call, tree depth 6, topk 4  629     576 (486)              289 (199)    (133; 80)
=======================================  ======  =====================  ===========  ==========

(before: the static drafter whose levels each made their own mask, positions, slots, chain ancestors and a
tree level's candidate indices and own-slot mask; it now makes them once a step, or once per buffer size, on
both paths.) A fast level is 2 aten ops (the mask's cat, the token rows' gather) and 6 Triton launches (fc,
q|k|v, :func:`~repro.drafters.eagle_attention.rope_attend`, o_proj, gate|up, down); with the eager attention
glue 14 aten ops (the mask's cat, two gathers, the additive mask, rotary 3, the two KV writes, attention 5)
and 5 Triton launches. The rest of a proposal is the drafting glue (top-k, scores, the tree's selection): in
parentheses, with the tree glue of :mod:`repro.drafters.static_eagle` cut from 157 to 67 launches (its
``TreeGrowth`` buffers; ``legacy_glue`` keeps the old one). After the parentheses: with every level of the
tree glue in one launch and the final selection in one (:mod:`repro.drafters.frontier_kernels`, the
fast path).

Why the attention has its own kernel: :func:`~repro.gdn.triton_attention.attention_tree` /
``attention_decode`` always apply q/k RMSNorm (EAGLE's Llama layer has none) and see the cache only as
rows ``[0, length)`` plus the new rows (EAGLE's drafted ancestors sit in fixed slots after the committed
rows), so :mod:`repro.drafters.eagle_attention` takes the rows' mask over the whole buffer instead.

Rounding: the kernels accumulate in float32 (float64 for float64 data) and round once, fc's sum is split
in two, bf16 norms are not rounded between the norm and the matmul, and the fused attention keeps its
scores in float32 (``attend`` rounds them to bf16 in bf16), so float32 distributions agree with the eager
drafter's to ~1e-6 (the same proposals unless two candidates tie to that precision) and bf16 to bf16
accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from repro.drafters.attention import HALF, marginals
from repro.drafters.eagle_attention import fused_attention_default, rope_attend
from repro.drafters.fast_rules import rotary_rows, signed_rotary, triton_linears
from repro.models.graphed import SMALL_WIDTH, GraphedTarget
from repro.models.hybrid import HybridLM
from repro.models.static_layers import fused_mlp_block, normed_linear, plus_linear, stacked_rows

if TYPE_CHECKING:
    from repro.drafters.eagle import EagleDraftModel, EagleLayer


@dataclass
class LayerWeights:
    """One drafter layer's constants: q|k|v stacked, the norm scales and gate|up stacked (the fields that
    :func:`~repro.models.static_layers.fused_mlp_block` reads are ``post_norm`` and ``gate_up``)."""

    qkv: torch.Tensor  # [(H + 2 KV) hd, hidden]
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, hidden]
    folded: dict[str, torch.Tensor] = field(default_factory=dict)  # none: the drafter's rows scale x

    @classmethod
    def of(cls, layer: EagleLayer) -> LayerWeights:
        a, mlp = layer.self_attn, layer.mlp
        return cls(
            stacked_rows([a.q_proj, a.k_proj, a.v_proj]),
            layer.input_layernorm.weight.detach(),
            layer.post_attention_layernorm.weight.detach(),
            stacked_rows([mlp.gate_proj, mlp.up_proj]),
        )


class _Glue(NamedTuple):
    """What a forward's layers share: the eager path's cos, sin [T, 1, hd] and additive mask (None on the
    kernel's path, which reads the table at ``positions`` and ``mask`` itself) and the rows' slots."""

    cos: torch.Tensor | None
    sin: torch.Tensor | None
    bias: torch.Tensor | None
    positions: torch.Tensor
    mask: torch.Tensor
    slots: torch.Tensor


class FastEagle:
    """The fast forward of ``model`` drafting for ``target`` (weights copied when built): see the module
    docstring. ``rope_rows``: positions the rotary table holds (:meth:`set_rope_rows` to grow it);
    ``fused_attention`` (default: ``eagle_attention.fused_attention_default``: under the interpreter, on
    CUDA with ``eagle_attention.CUDA_DEFAULT``, never for float64): the layers' attention on
    ``eagle_attention.rope_attend`` (one launch; ``counters``: its split counters), else
    :func:`eager_tables` and :func:`rope_attend_eager`."""

    @torch.no_grad()
    def __init__(
        self,
        model: EagleDraftModel,
        target: HybridLM | GraphedTarget,
        rope_rows: int,
        row_tiled_width: int = SMALL_WIDTH,
    ) -> None:
        cfg = model.config
        self.model, self.cfg = model, cfg
        self.row_tiled_width = row_tiled_width
        hidden = cfg.hidden_size
        w_e, w_f = model.fc.weight[:, :hidden], model.fc.weight[:, hidden:]
        self.token_rows = (target.model.embed_tokens.weight @ w_e.t()).contiguous()  # [V, hidden]
        self.fc_features = nn.Linear(w_f.shape[1], hidden, bias=False, device=model.device, dtype=model.dtype)
        self.fc_features.weight.copy_(w_f)
        self.fc_features.requires_grad_(False)
        self.weights = [LayerWeights.of(layer) for layer in model.layers]
        norm = target.model.norm
        self.final_scale, self.final_eps = norm.scale().detach().clone(), norm.eps
        self.head = target.lm_head
        self.zero = torch.zeros((), dtype=model.dtype, device=model.device)
        self.blocked = torch.full((), float("-inf"), dtype=model.dtype, device=model.device)
        self.fused_attention = fused_attention_default(model.dtype, model.device, cfg.head_dim)
        self.counters = torch.zeros(cfg.num_key_value_heads, dtype=torch.int32, device=model.device)
        self.set_rope_rows(rope_rows)

    def set_rope_rows(self, rows: int) -> None:
        """The rotary table [rows, 2, hd]: cos and the signed sin (-sin | sin) of positions 0 .. rows - 1,
        the values ``rotary_tables`` gives (angles in float64)."""
        cfg = self.cfg
        self.rope = signed_rotary(
            *rotary_rows(rows, cfg.head_dim, cfg.rope_theta, self.model.dtype, self.model.device)
        )

    def gemv(self, rows: int) -> bool:
        """Whether ``rows`` rows take the Triton linears (else cuBLAS): see the module docstring."""
        return triton_linears(rows, self.cfg.hidden_size, self.row_tiled_width)

    def forward(
        self,
        ids: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """Predictions [T, hidden] of T rows (next-token ``ids`` [T], ``features`` [T, F], ``positions``
        [T]) written into the static buffers ``kv`` (per layer [1, KV, S, hd]) at ``slots`` [T], each row
        attending to the buffer rows of ``mask`` [T, S] (bool, True = visible): what
        ``EagleDraftModel.forward(..., past=kv, mask=mask, slots=slots)`` returns."""
        n = ids.shape[0]
        gemv = self.gemv(n)
        x = plus_linear(self.token_rows.index_select(0, ids), features, self.fc_features, gemv)
        if self.fused_attention:  # the rotary table read, the mask applied and the KV written in the kernel
            glue = _Glue(None, None, None, positions, mask, slots)
        else:
            groups = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
            tables = eager_tables(self.rope, positions, mask, groups, self.zero, self.blocked)
            glue = _Glue(*tables, positions, mask, slots)
        for layer, w, (keys, values) in zip(self.model.layers, self.weights, kv):
            x = self._layer(layer, w, x, keys[0], values[0], glue, gemv)
        return x

    def _layer(
        self, layer: EagleLayer, w: LayerWeights, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
        glue: _Glue, gemv: bool,
    ) -> torch.Tensor:  # fmt: skip
        a = layer.self_attn
        heads, kv_heads, hd = a.heads, a.kv_heads, a.head_dim
        qkv = normed_linear(x, w.input_norm, layer.input_layernorm.eps, w.qkv, None, gemv)
        shape = (heads, kv_heads, hd)
        if glue.bias is None:
            pos, mask, slots = glue.positions, glue.mask, glue.slots
            out = rope_attend(qkv, self.rope, pos, keys, values, mask, slots, *shape, self.counters)
        else:
            out = rope_attend_eager(qkv, glue.cos, glue.sin, keys, values, glue.bias, glue.slots, *shape)
        x = plus_linear(x, out, a.o_proj, gemv)
        return fused_mlp_block(layer, w, x, gemv)  # type: ignore[arg-type] - reads post_norm, gate_up

    def probs(self, preds: torch.Tensor) -> torch.Tensor:
        """The drafter distributions [n, V] after rows with predictions ``preds`` [n, hidden]:
        ``EagleDrafter._probs``."""
        head = self.head
        gemv = self.gemv(preds.shape[0])
        logits = normed_linear(preds, self.final_scale, self.final_eps, head.weight, head.bias, gemv)
        return marginals(logits)


def eager_tables(
    rope: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, groups: int, zero: torch.Tensor,
    blocked: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """What the eager attention glue makes once per forward: cos, sin [T, 1, hd] (the signed rotary table
    ``rope`` [rows, 2, hd] at ``positions``) and the additive mask [T groups, S] (rows: (row, query head of
    the group); ``zero`` where ``mask`` [T, S] is True, else ``blocked`` (-inf), 0-d tensors)."""
    n = mask.shape[0]
    rows = rope.index_select(0, positions)
    visible = mask[:, None].expand(n, groups, mask.shape[-1])
    return rows[:, None, 0], rows[:, None, 1], torch.where(visible, zero, blocked).view(n * groups, -1)


def rope_attend_eager(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
    bias: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int, hd: int,
) -> torch.Tensor:  # fmt: skip
    """The eager reference of :func:`~repro.drafters.eagle_attention.rope_attend` (tables of
    :func:`eager_tables`): rotary on q and k (``apply_rope``'s products), the rotated keys and the values
    written into ``keys``/``values`` [KV, S, hd] at ``slots`` (2 ``index_copy_``), :func:`attend`."""
    n = qkv.shape[0]
    qk = qkv[:, : (heads + kv_heads) * hd].view(n, heads + kv_heads, hd)
    rot = torch.addcmul(qk * cos, qk.roll(hd // 2, -1), sin)  # rotate_half(x) sin = roll(x) sin_signed
    keys.index_copy_(1, slots, rot[:, heads:].transpose(0, 1))
    values.index_copy_(1, slots, qkv[:, (heads + kv_heads) * hd :].view(n, kv_heads, hd).transpose(0, 1))
    return attend(rot[:, :heads], keys, values, bias)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + bias) v for q [n, H, hd] (any strides), keys/values [KV, S, hd] (query
    head h reads key head h // (H // KV)) and the additive mask ``bias`` [n H // KV, S] (rows: (row, query
    head of the group); 0 or -inf). The softmax runs in float32 for half inputs (as
    :func:`~repro.drafters.attention.grouped_attention`). Returns [n, H hd]."""
    n, heads, hd = q.shape
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    qg = q.reshape(n, kv_heads, groups, hd).transpose(0, 1).reshape(kv_heads, n * groups, hd)
    scores = torch.baddbmm(bias, qg, keys.transpose(1, 2), alpha=hd**-0.5)
    p = torch.softmax(scores.float() if scores.dtype in HALF else scores, dim=-1).to(values.dtype)
    out = torch.bmm(p, values)  # [KV, n groups, hd]
    return out.view(kv_heads, n, groups, hd).transpose(0, 1).reshape(n, heads * hd)
