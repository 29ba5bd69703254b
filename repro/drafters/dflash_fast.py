"""The DFlash drafter's step on few launches: the fast path of
:class:`~repro.drafters.static_dflash.StaticDFlash` (``fast``), pinned to the eager
:class:`~repro.drafters.dflash_model.DFlashDraftModel` it replaces (tests/drafters/test_dflash_fast.py).

The matmuls go through the static decoder's wrappers of :mod:`repro.gdn.triton_linear`
(:mod:`repro.models.static_layers`: :func:`~repro.models.static_layers.normed_linear`,
:func:`~repro.models.static_layers.fused_verify_attention`, which also calls
:func:`~repro.models.static_layers.plus_linear` and :func:`~repro.models.static_layers.fused_mlp_block`),
their glue fused in, with the constants made once (weights copied when built):

- Ingest of the accepted rows: fc (one matmul), then hidden_norm and every draft layer's k and v
  projections in one launch (the k|v weights of all layers stacked), then one
  :func:`~repro.gdn.triton_attention.write_context_kv` launch for every layer's k_norm, rotary (the
  attention kernel's cos|sin table of every position, made once per buffer size: the products of
  :func:`~repro.drafters.layers.apply_rope`, in float32 and rounded once) and the key and value writes
  into StaticDFlash's stacked buffers.
- The block ``[root, MASK x (T-1)]``, per layer: input norm + q|k|v (one launch), then the whole attention
  in one :func:`~repro.gdn.triton_attention.attention_tree` launch, which is exactly DFlash's block
  attention: q/k RMSNorm times the scale (DFlash's q_norm / k_norm), rotary over the full head dim in
  ``rotate_half`` style from the cos|sin table at positions ``length + depth - 1`` (depth = 1..T: the
  block's positions), query head h on key head h // (H / KV), scale hd^-1/2, softmax over the context
  rows [0, length) and the block's own keys (made in the kernel from q|k|v; an all-ones "ancestor" mask:
  every block row sees the whole block). The block's keys and values are not written into the buffers
  (the eager path writes them past ``length``, where no later step reads them). Then o_proj + residual
  (1) and post norm + gate|up + SiLU * up (1), down + residual (1).
- The distributions: the final norm + LM head in one launch, the softmax, the top-k. Weaver's path
  (``probs=False``) needs the final-normed rows themselves: there the norm is one Triton RMSNorm
  (:meth:`FastDFlash.final_norm`) and the LM head a matmul, and the root's feature one copy
  (:func:`~repro.drafters.ingest_kernels.last_feature`).

Which variant (:func:`~repro.drafters.fast_rules.triton_linears`): up to GEMV_ROWS rows (a short prefill
chunk written eagerly) the GEMV kernels at any width; more rows (the block's T, a step's path padded to T)
the row-tiled kernels up to ``row_tiled_width`` (default :data:`~repro.models.graphed.SMALL_WIDTH`), cuBLAS
with the Triton RMSNorm and SiLU * up above it, where the row-tiled linears lost on the target side, and for
more than TILED_ROWS rows (a long prefill chunk). The attention kernel runs at every width.

Launches (aten ops that launch work + Triton launches; the tiny family's drafter layout: one layer, 4 / 2
heads, two feature layers, block 16, counted on CPU by tests/drafters/test_dflash_fast.py):

=================================================  =====  ====  ===============
what                                               eager  fast  fast: aten + Triton
=================================================  =====  ====  ===============
the step: ingest (16 rows) + block + marginals     124    14    3 + 11
the step: block + marginals (nothing to ingest)    83     9     2 + 7
Weaver's step: ingest + block (rows, logits)       126    14    2 + 12
=================================================  =====  ====  ===============

A fast block is 7 Triton launches (the block's input rows,
:func:`~repro.drafters.ingest_kernels.block_rows`; per layer q|k|v, attention, o_proj, gate|up, down; the
final norm + LM head) and 2 aten ops (the softmax, the top-k; on CUDA the top-k is a Triton launch,
:func:`~repro.models.topk_kernels.row_topk`). An ingest (a path padded
to the block's 16 rows, as steps pad it) is 5 launches with two feature layers, whatever the layer count:
the rows' gather, feature write, positions and length (one launch per feature layer,
:func:`~repro.drafters.ingest_kernels.gather_features`; 7 aten ops before), fc, the k|v launch, the context
keys and values (one kernel; 13 aten ops before: k_norm 6, rotary 5, two writes).
Weaver's rows add the final RMSNorm (1) and the root's feature into ``tail`` (1). Each more layer
adds 5 Triton launches to the fast step (8 launches on cuBLAS, above ``row_tiled_width``) and 70 aten
ops to the eager one (55 in the block, 15 in the ingest: a two-layer step is 194 eager, 19 fast).

Rounding: the kernels accumulate in float32 (float64 for float64 data) and round once, and norms are not
rounded before their matmul, so float32 block states and logits agree with the eager drafter's to ~1e-6
relative (the same proposals unless two candidates tie to that precision) and bf16 ones to bf16 accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from repro.drafters.dflash_model import DFlashDraftModel, DFlashLayer
from repro.drafters.fast_rules import rotary_rows, triton_linears
from repro.models.graphed import SMALL_WIDTH
from repro.models.static_layers import (
    AttentionBuffers,
    AttentionWeights,
    fold_head,
    fold_weights,
    fused_verify_attention,
    normed_linear,
    stacked_rows,
    triton_rms_norm,
    write_context_kv,
)

# The block's normed matrices (q|k|v, gate|up, the LM head) with the norm scales folded into their columns
# where the block runs on the row-tiled kernels, as the target's verify does (static.FOLD_NORMS). On since
# routes-ab's A/B on the H200 (results/2026-12-04-h200-derive-rows/callCF): the DFlash draft stage 0.065 ->
# 0.062 ms a step (chain), 0.069 -> 0.065 (DDTree), 0.389 -> 0.382 (DFlash-TfM, with Weaver's growth)
FOLD_NORMS = True


@dataclass
class AttentionView:
    """What :func:`~repro.models.static_layers.fused_verify_attention` reads of a target attention module,
    taken from a :class:`~repro.drafters.dflash_model.DFlashAttention` (no output gate)."""

    q_norm: nn.Module
    k_norm: nn.Module
    o_proj: nn.Linear
    num_heads: int
    output_gate: bool = False


@dataclass
class LayerView:
    """A DFlash layer as :func:`~repro.models.static_layers.fused_verify_attention` reads a decoder layer."""

    self_attn: AttentionView
    input_layernorm: nn.Module
    post_attention_layernorm: nn.Module
    mlp: nn.Module

    @classmethod
    def of(cls, layer: DFlashLayer) -> LayerView:
        a = layer.self_attn
        view = AttentionView(a.q_norm, a.k_norm, a.o_proj, a.heads)
        return cls(view, layer.input_layernorm, layer.post_attention_layernorm, layer.mlp)


@dataclass
class BlockSlot:
    """The tree slot fields the attention kernel reads, for the block: node i at depth i + 1 (position
    ``length + i``), every node "an ancestor" of every other (the block attends to itself whole)."""

    depth: torch.Tensor  # [T] int64
    ancestors: torch.Tensor  # [T, T] uint8, all ones


def layer_weights(layer: DFlashLayer) -> AttentionWeights:
    """One layer's constants: q|k|v and gate|up stacked, the norm scales."""
    a, mlp = layer.self_attn, layer.mlp
    projs = (a.q_proj, a.k_proj, a.v_proj)
    return AttentionWeights(
        stacked_rows(projs), None, [p.out_features for p in projs],
        a.q_norm.weight.detach(), a.k_norm.weight.detach(), layer.input_layernorm.weight.detach(),
        layer.post_attention_layernorm.weight.detach(), stacked_rows([mlp.gate_proj, mlp.up_proj]),
    )  # fmt: skip


class FastDFlash:
    """The fast ingest and block forward of ``model`` for blocks of ``block_size`` rows (see the module
    docstring). ``rope_rows``: positions the rotary tables hold (:meth:`set_rope_rows` sizes them again:
    StaticDFlash does with its buffers)."""

    @torch.no_grad()
    def __init__(
        self,
        model: DFlashDraftModel,
        block_size: int,
        rope_rows: int = 0,
        row_tiled_width: int = SMALL_WIDTH,
        lm_head: nn.Module | None = None,
    ) -> None:
        cfg = model.config
        self.model, self.cfg, self.row_tiled_width = model, cfg, row_tiled_width
        self.views = [LayerView.of(layer) for layer in model.layers]
        self.weights = [layer_weights(layer) for layer in model.layers]
        self.fold = FOLD_NORMS and self.gemv(block_size)
        self._head: tuple[torch.Tensor, torch.Tensor] | None = None  # (an LM head's weight, it folded)
        if self.fold:
            for w in self.weights:
                fold_weights(w)
            if lm_head is not None:  # folded now, so that no step's trace differs by the fold
                self._folded_head(lm_head.weight)
        attn = [layer.self_attn for layer in model.layers]
        self.context_weight = torch.cat([a.k_proj.weight for a in attn] + [a.v_proj.weight for a in attn])
        self.k_scale = torch.stack([a.k_norm.weight.detach() for a in attn]).contiguous()  # [L, hd]
        self.k_eps = attn[0].k_norm.eps
        device = model.device
        self.slot = BlockSlot(
            torch.arange(1, block_size + 1, device=device),
            torch.ones(block_size, block_size, dtype=torch.uint8, device=device),
        )
        self.set_rope_rows(rope_rows)

    def set_rope_rows(self, rows: int) -> None:
        """The rotary table [rows, 2, hd] of positions 0 .. rows - 1, (cos, sin), for the attention and
        ingest kernels; the values ``rotary_tables`` gives (angles in float64)."""
        cfg = self.cfg
        cos, sin = rotary_rows(rows, cfg.head_dim, cfg.rope_theta, self.model.dtype, self.model.device)
        self.rope = torch.stack([cos, sin], dim=1).contiguous()

    def gemv(self, rows: int) -> bool:
        """Whether ``rows`` rows take the Triton linears (else cuBLAS): see the module docstring."""
        return triton_linears(rows, self.cfg.hidden_size, self.row_tiled_width)

    def ingest(
        self, rows: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Context keys/values of feature ``rows`` [n, F] at ``positions`` [n] written into the stacked
        buffers ``keys`` / ``values`` [L, KV, max_len, hd]: what ``DFlashDraftModel.context_kv`` gives."""
        m, n = self.model, rows.shape[0]
        norm = m.hidden_norm
        kv = normed_linear(
            F.linear(rows, m.fc.weight), norm.weight, norm.eps, self.context_weight, None, self.gemv(n)
        )
        write_context_kv(kv, positions, self.k_scale, self.k_eps, self.rope, keys, values)

    def block(
        self, x: torch.Tensor, length: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
    ) -> torch.Tensor:
        """Hidden states [T, hidden] before the final norm of the block rows ``x`` [T, hidden] (embedded) at
        positions ``length`` (a device scalar) .. + T - 1 over the context rows [0, length) of the buffers
        ``keys`` / ``values`` (per layer [1, KV, max_len, hd]; not written)."""
        gemv = self.gemv(x.shape[0])
        length = length.view(1)
        for view, w, k, v in zip(self.views, self.weights, keys, values):
            buf = AttentionBuffers(k[0], v[0])
            x, _ = fused_verify_attention(view, w, buf, x, self.rope, length, self.slot, gemv)  # type: ignore[arg-type]
        return x

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The final-normed rows of ``h`` [n, hidden] (one Triton RMSNorm; Weaver reads them)."""
        norm = self.model.norm
        return triton_rms_norm(h, norm.weight, norm.eps)

    def logits(self, h: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """``compute_logits(norm(h), lm_head)`` of rows ``h`` [n, hidden], the final norm on the head."""
        norm = self.model.norm
        bias = getattr(lm_head, "bias", None)
        gemv = self.gemv(h.shape[0])
        folded = self._folded_head(lm_head.weight) if self.fold and gemv else None
        logits = normed_linear(h, norm.weight, norm.eps, lm_head.weight, bias, gemv, folded)
        return self.model.shape_logits(logits)

    def _folded_head(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` (the target's LM head) with this drafter's final norm scale folded in, made once."""
        if self._head is None or self._head[0] is not weight:
            self._head = (weight, fold_head(weight, self.model.norm.weight.detach()))
        return self._head[1]
