"""A static decoder's per-layer arithmetic: HybridLM's layers regrouped to launch fewer kernels a step.

:class:`repro.models.static.StaticDecoder` runs every layer through these functions; the fast drafters
(:mod:`repro.drafters.dflash_fast`, :mod:`repro.drafters.eagle_fast`) reuse them on their own layers.

- The constants, built once per decoder (:class:`GDNWeights`, :class:`AttentionWeights`): the input
  projections stacked into one matrix (GDN: q|k|v, z, a, b; attention: q, k, v; :func:`stacked_rows`:
  the model's own weights become views of it, so that the weights are held once), gate constants and
  norm scales precomputed, and (:func:`fold_weights`) the norm scales folded into the normed matrices
  for the row-tiled linears.
- The torch glue around the GDN / attention cores (:func:`gdn_prologue`, :func:`gdn_epilogue`,
  :func:`attention_prologue`, :func:`attention_core`, :func:`attention_epilogue`; q and k share one L2
  norm, the residual adds ride on the output matmuls): the reference path on CPU, and what
  ``compile=True`` wraps in ``torch.compile`` (:func:`compiled_glue`).
- The fused layers on the Triton kernels (:func:`fused_gdn_layer`, :func:`fused_decode_gdn`,
  :func:`fused_decode_attention`, :func:`fused_verify_attention`, :func:`fused_mlp_block`,
  :func:`normed_linear`): with ``gemv`` the matmuls run on :mod:`repro.gdn.triton_linear`'s GEMV and
  row-tiled kernels, the norms, SiLU * up and residual adds fused in.
- What a layer reads and leaves: its static buffers (:class:`GDNBuffers`, :class:`AttentionBuffers`) and
  what a verify saves for the commit (:class:`GDNSaved`, :class:`AttentionSaved`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from repro.gdn import reference as gdn
from repro.gdn.reference import TreeFactors
from repro.gdn.triton_attention import write_context_kv  # noqa: F401 - DFlash's fast ingest reads it here
from repro.models.layers import (
    Attention,
    DecoderLayer,
    GatedDeltaNet,
    apply_rotary,
    gdn_gates,
    l2norm,
    rms_norm,
)

# a GDN layer's verify (fuse_verify, row-tiled rows) runs its output gated norm inside the out_proj's
# row-tiled launch (triton_linear.gated_linear_residual): one launch a layer fewer (the separate gated norm:
# 6 launches, 9.1 us of a 33-node tiny-qwen35 verify, results/2026-12-04-h200-derive-rows/callCH/verify-
# kernels). Off: the A/B on the H200 (scripts/gpu/routes-ab.py gated_out_proj,
# results/2026-12-05-h200-prepare-per-loop) took the 33-node verify from 0.240 to 0.285 ms; tested in the
# interpreter
GATED_OUT_PROJ = False


# ---------------------------------------------------------------------- buffers


@dataclass
class GDNBuffers:
    recurrent: torch.Tensor  # [HV, dv, dk], float32 (float64 models: float64)
    conv: torch.Tensor  # [W-1, C], model dtype


@dataclass
class AttentionBuffers:
    keys: torch.Tensor  # [H_kv, max_len + max_nodes, hd]; rows >= length are masked
    values: torch.Tensor


@dataclass
class GDNSaved:
    """What verify leaves per GDN layer for commit."""

    conv_inputs: torch.Tensor  # [T, C]
    k: torch.Tensor  # [T, H, dk] key heads in the kernel dtype (replay)
    factors: TreeFactors


@dataclass
class AttentionSaved:
    k: torch.Tensor  # [T, H_kv, hd], rotary applied
    v: torch.Tensor


class NodeMasks(Protocol):
    """What a verify's attention reads of a slot's tree (:class:`repro.models.static.TreeSlot` has it)."""

    depth: torch.Tensor  # [n] int64, 1 for root-level nodes
    ancestors: torch.Tensor  # bool [n, n], ancestor-or-self


# ------------------------------------------------------------------------- per-layer glue


@dataclass
class GDNWeights:
    """A GDN layer's constants, built once per decoder so that a step launches fewer kernels: the four
    input projections stacked into one matrix (one matmul instead of four), the conv taps, the gate
    constants and the norm scales (1 + w of zero-centred norms)."""

    in_proj: torch.Tensor  # [C + V_z + 2 HV, d]: in_proj_qkv, in_proj_z (V_z = 0 without it), in_proj_a, _b
    sizes: list[int]
    taps: torch.Tensor  # [C, W], the conv weight flipped: taps[:, r] multiplies the r-th predecessor
    neg_decay: torch.Tensor  # -exp(A_log) [HV] in the gate dtype (the state dtype)
    dt_bias: torch.Tensor
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor | None = None  # [2 I, d]: the MLP's gate_proj and up_proj stacked (fused decoders)
    folded: dict[str, torch.Tensor] = field(default_factory=dict)  # fold_weights': "in_proj", "gate_up"

    @classmethod
    def of(cls, layer: DecoderLayer, dtype: torch.dtype, stack_mlp: bool = False) -> GDNWeights:
        m: GatedDeltaNet = layer.linear_attn
        projs = [m.in_proj_qkv, m.in_proj_z, m.in_proj_a, m.in_proj_b]
        sizes = [0 if p is None else p.out_features for p in projs]
        stacked = stacked_rows([p for p in projs if p is not None])
        neg_decay, dt_bias = m.gate_constants(dtype)
        return cls(
            stacked, sizes, m.conv1d.weight[:, 0].flip(1).contiguous(), neg_decay, dt_bias,
            layer.input_layernorm.scale(), layer.post_attention_layernorm.scale(),
            stacked_mlp(layer, stack_mlp),
        )  # fmt: skip


@dataclass
class AttentionWeights:
    """An attention layer's constants: q/k/v projections stacked (one matmul), norm scales."""

    qkv: torch.Tensor  # [q_out + 2 H_kv hd, d]
    bias: torch.Tensor | None
    sizes: list[int]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor | None = None
    folded: dict[str, torch.Tensor] = field(default_factory=dict)  # fold_weights': "qkv", "gate_up"

    @classmethod
    def of(cls, layer: DecoderLayer, stack_mlp: bool = False) -> AttentionWeights:
        a: Attention = layer.self_attn
        projs = [a.q_proj, a.k_proj, a.v_proj]
        bias = torch.cat([p.bias for p in projs]) if a.q_proj.bias is not None else None
        return cls(
            stacked_rows(projs), bias, [p.out_features for p in projs], a.q_norm.scale(),
            a.k_norm.scale(), layer.input_layernorm.scale(), layer.post_attention_layernorm.scale(),
            stacked_mlp(layer, stack_mlp),
        )  # fmt: skip


def fold_weights(w: GDNWeights | AttentionWeights) -> None:
    """Fill ``w.folded`` with the layer's normed matrices, the norm scales folded into their columns
    (:func:`~repro.gdn.triton_linear.fold_norm`): what a verify's row-tiled linears read (one dot a K
    chunk instead of the scaled row's hi + lo parts)."""
    from repro.gdn.triton_linear import fold_norm

    name, first = ("in_proj", w.in_proj) if isinstance(w, GDNWeights) else ("qkv", w.qkv)
    w.folded = {name: fold_norm(first, w.input_norm)}
    if w.gate_up is not None:
        w.folded["gate_up"] = fold_norm(w.gate_up, w.post_norm)


def fold_head(weight: torch.Tensor, norm_scale: torch.Tensor) -> torch.Tensor:
    """An LM head with the final norm's scale folded into its columns
    (:func:`~repro.gdn.triton_linear.fold_norm`), for a row-tiled ``normed_linear(folded=)``."""
    from repro.gdn.triton_linear import fold_norm

    return fold_norm(weight, norm_scale)


def stacked_mlp(layer: DecoderLayer, stack: bool) -> torch.Tensor | None:
    """The MLP's gate_proj and up_proj weights stacked [2 I, d] (one matmul; :func:`stacked_rows`), or
    None."""
    return stacked_rows([layer.mlp.gate_proj, layer.mlp.up_proj]) if stack else None


def stacked_rows(linears: Sequence[torch.nn.Linear]) -> torch.Tensor:
    """The linears' weights stacked along their rows, [sum of out_features, in_features], one matmul's
    matrix, with each weight rebound to its rows of it (a view: same values, so the model computes as
    before). The weights are then held once, not twice: a copy of a Qwen3.6-27B target's stacked input
    projections and gate|up (~25 GB in bf16) beside its 54 GB would not fit an 80 GB card. Weights that
    already lie consecutively in one storage (a decoder built earlier from the same model) are viewed,
    not copied again."""
    weights = [lin.weight for lin in linears]
    first = weights[0]
    rows = sum(w.shape[0] for w in weights)
    if _consecutive(weights):
        return (
            first.detach()
            .new_empty(0)
            .set_(first.untyped_storage(), first.storage_offset(), (rows, first.shape[1]))
        )
    with torch.no_grad():
        stacked = torch.cat(weights)
    start = 0
    for w in weights:
        w.data = stacked[start : start + w.shape[0]]
        start += w.shape[0]
    return stacked


def _consecutive(weights: Sequence[torch.Tensor]) -> bool:
    """Whether the matrices are contiguous, of one width, dtype and storage, each one's rows right after
    the one before's."""
    first = weights[0]
    ptr = first.untyped_storage().data_ptr()
    for a, b in zip(weights, weights[1:]):
        if (
            not (a.is_contiguous() and b.is_contiguous())
            or b.shape[1:] != first.shape[1:]
            or b.dtype != first.dtype
        ):
            return False
        if b.untyped_storage().data_ptr() != ptr or b.storage_offset() != a.storage_offset() + a.numel():
            return False
    return first.dim() == 2 and first.is_contiguous()


def gdn_prologue(
    layer: DecoderLayer,
    w: GDNWeights,
    x: torch.Tensor,
    history: torch.Tensor,
    conv_index: torch.Tensor,
    kdt: torch.dtype,
) -> tuple[torch.Tensor | None, ...]:
    """Input norm, projections, tree conv, L2 norm and gates of a GDN layer (HybridLM's forward_tree).

    Returns (z or None, conv_inputs, q, k, v in ``kdt``, g, beta in the state dtype).
    """
    mixer: GatedDeltaNet = layer.linear_attn
    h = rms_norm(x, w.input_norm, layer.input_layernorm.eps)
    n = h.shape[0]
    conv_inputs, z, a, b = torch.split(F.linear(h, w.in_proj), w.sizes, dim=-1)
    mixed = gdn.gathered_short_conv(conv_inputs, history, w.taps, conv_index, mixer.conv1d.bias)
    sdt = w.neg_decay.dtype
    heads = mixer.num_k_heads
    qk = mixed[:, : 2 * mixer.key_dim].reshape(n, 2 * heads, mixer.head_k_dim)
    qk = l2norm(qk.to(sdt)).to(kdt)  # q and k heads in one go: per row, as HybridLM's two calls
    v = mixed[:, 2 * mixer.key_dim :].reshape(n, mixer.num_v_heads, mixer.head_v_dim).to(kdt)
    g, beta = gdn_gates(a.to(sdt), b, w.neg_decay, w.dt_bias, mixer.beta_scale)
    gate = z.reshape(n, mixer.num_v_heads, mixer.head_v_dim) if mixer.in_proj_z is not None else None
    return gate, conv_inputs, qk[:, :heads], qk[:, heads:], v, g, beta.to(sdt)


def plus_linear(
    x: torch.Tensor, y: torch.Tensor, linear: torch.nn.Linear, gemv: bool = False
) -> torch.Tensor:
    """x + linear(y), the residual add fused into the matmul (addmm) when the layer has no bias, or into
    the GEMV kernel (``gemv``: :func:`~repro.gdn.triton_linear.linear_residual`, decode steps, and verify
    with ``fuse_verify``)."""
    if gemv:
        from repro.gdn.triton_linear import linear_residual

        return linear_residual(y, linear.weight, x, linear.bias)
    return x + linear(y) if linear.bias is not None else torch.addmm(x, y, linear.weight.t())


def mlp_block(layer: DecoderLayer, post_norm: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x + MLP(post-attention norm of x)."""
    h = rms_norm(x, post_norm, layer.post_attention_layernorm.eps)
    return plus_linear(x, layer.mlp.gated(h), layer.mlp.down_proj)


def gdn_epilogue(
    layer: DecoderLayer, w: GDNWeights, x: torch.Tensor, o: torch.Tensor, z: torch.Tensor | None
) -> torch.Tensor:
    """Gated output norm, output projection, residual, MLP block."""
    mixer: GatedDeltaNet = layer.linear_attn
    o = mixer.norm(o.to(x.dtype), z).reshape(o.shape[0], mixer.value_dim)
    return mlp_block(layer, w.post_norm, plus_linear(x, o, mixer.out_proj))


def attention_prologue(
    layer: DecoderLayer,
    w: AttentionWeights,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = rms_norm,
    gemv: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Input norm, q/k/v projections, q/k norms and rotary (HybridLM's Attention.forward_tree; the
    rotary tables of the step's positions are made once per step). ``norm``: the RMSNorm function
    (the fused decoder passes the Triton one); ``gemv``: the input norm and projections in one
    :func:`~repro.gdn.triton_linear.norm_linear` (decode steps).

    Returns (q [n, H, hd], gate [n, H hd] or an empty tensor, k, v [n, H_kv, hd]).
    """
    attn: Attention = layer.self_attn
    n = x.shape[0]
    if gemv:
        from repro.gdn.triton_linear import norm_linear

        qkv = norm_linear(
            x, w.input_norm, layer.input_layernorm.eps, w.qkv, w.bias, folded=w.folded.get("qkv")
        )
    else:
        qkv = F.linear(norm(x, w.input_norm, layer.input_layernorm.eps), w.qkv, w.bias)
    q, k, v = torch.split(qkv, w.sizes, dim=-1)
    gate = q[:, :0]
    if attn.output_gate:
        q, gate = q.reshape(n, attn.num_heads, 2 * attn.head_dim).chunk(2, dim=-1)
        gate = gate.reshape(n, -1)
    q = norm(q.reshape(n, attn.num_heads, attn.head_dim), w.q_norm, attn.q_norm.eps)
    k = norm(k.reshape(n, attn.num_kv_heads, attn.head_dim), w.k_norm, attn.k_norm.eps)
    v = v.reshape(n, attn.num_kv_heads, attn.head_dim)
    return apply_rotary(q, cos, sin), gate, apply_rotary(k, cos, sin), v


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    prefix_blocked: torch.Tensor,
    tree_blocked: torch.Tensor,
) -> torch.Tensor:
    """Softmax attention of n nodes over the static prefix rows and their ancestors.

    q [n, H, hd]; k, v [n, H_kv, hd]; keys, values [H_kv, rows, hd]; ``prefix_blocked`` [rows] (rows at
    or past the length) and ``tree_blocked`` [group n, n] (not an ancestor, per query head of a key
    head's group) are masked out. Query heads are grouped per key head (no copies of the cache).
    Returns [n, H hd].
    """
    n, heads, hd = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qg = q.view(n, kv_heads, group, hd).permute(1, 2, 0, 3).reshape(kv_heads, group * n, hd)
    scale = hd**-0.5
    s_prefix = (qg @ keys.transpose(1, 2)) * scale  # [H_kv, group n, rows]
    s_tree = (qg @ k.permute(1, 2, 0)) * scale  # [H_kv, group n, n]
    s_prefix = s_prefix.masked_fill(prefix_blocked, float("-inf"))
    s_tree = s_tree.masked_fill(tree_blocked, float("-inf"))
    scores = torch.cat([s_prefix, s_tree], dim=-1)
    p = torch.softmax(scores.float() if scores.dtype == torch.float16 else scores, dim=-1).to(q.dtype)
    rows = keys.shape[1]
    out = p[..., :rows] @ values + p[..., rows:] @ v.transpose(0, 1)  # [H_kv, group n, hd]
    return out.view(kv_heads, group, n, hd).permute(2, 0, 1, 3).reshape(n, heads * hd)


def attention_epilogue(
    layer: DecoderLayer,
    w: AttentionWeights,
    x: torch.Tensor,
    out: torch.Tensor,
    gate: torch.Tensor,
    gemv: bool = False,
) -> torch.Tensor:
    """Output gate, output projection, residual, MLP block (the fused one when the MLP is stacked;
    ``gemv``: o_proj and the MLP on the GEMV kernels)."""
    attn: Attention = layer.self_attn
    if attn.output_gate:
        out = out * torch.sigmoid(gate)
    x = plus_linear(x, out, attn.o_proj, gemv)
    return mlp_block(layer, w.post_norm, x) if w.gate_up is None else fused_mlp_block(layer, w, x, gemv)


def fused_mlp_block(
    layer: DecoderLayer, w: GDNWeights | AttentionWeights, x: torch.Tensor, gemv: bool = False
) -> torch.Tensor:
    """x + MLP(post-attention norm of x) in four launches: Triton RMSNorm, the stacked gate|up matmul,
    Triton SiLU(gate) * up, the down projection with the residual (addmm). ``gemv`` (decode steps):
    two, :func:`~repro.gdn.triton_linear.norm_gate_up` and the down projection with the residual."""
    from repro.gdn import triton_decode as fused

    assert w.gate_up is not None
    eps = layer.post_attention_layernorm.eps
    if gemv:
        from repro.gdn.triton_linear import norm_gate_up

        act = norm_gate_up(x, w.post_norm, eps, w.gate_up, folded=w.folded.get("gate_up"))
    else:
        act = fused.silu_mul(F.linear(fused.rms_norm(x, w.post_norm, eps), w.gate_up))
    return plus_linear(x, act, layer.mlp.down_proj, gemv)


def fused_gdn_layer(
    layer: DecoderLayer,
    w: GDNWeights,
    x: torch.Tensor,
    buf: GDNBuffers,
    conv_index: torch.Tensor,
    core: Callable[..., tuple[torch.Tensor, TreeFactors]] | None,
    kernel_dtype: torch.dtype,
    gemv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, TreeFactors | None]:
    """A GDN layer on the fused Triton kernels (:mod:`repro.gdn.triton_decode`).

    ``core`` None: decode one token (the state and conv history updated in place); else verify n nodes
    with ``core(q, k, v, g, beta)`` -> (o, factors), state untouched. ``gemv``: the matmuls on the
    GEMV kernels of :mod:`repro.gdn.triton_linear` (norms, SiLU * up and residuals fused in).
    Returns (x after the layer, the conv inputs [n, C], k [n, H, d_k] or None, factors or None).
    """
    from repro.gdn import triton_decode as fused

    m: GatedDeltaNet = layer.linear_attn
    dims = fused.GDNDims(m.num_k_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim)
    if gemv:
        from repro.gdn.triton_linear import norm_linear

        proj = norm_linear(
            x, w.input_norm, layer.input_layernorm.eps, w.in_proj, folded=w.folded.get("in_proj")
        )
    else:
        proj = F.linear(fused.rms_norm(x, w.input_norm, layer.input_layernorm.eps), w.in_proj)
    conv_inputs = proj[:, : w.sizes[0]]
    z = proj[:, w.sizes[0] : w.sizes[0] + w.sizes[1]] if m.in_proj_z is not None else None
    gates = (w.neg_decay, w.dt_bias, m.beta_scale)
    if core is None:
        o = fused.gdn_decode_step(
            proj, buf.conv, w.taps, m.conv1d.bias, conv_index, *gates, buf.recurrent, m.head_k_dim**-0.5, dims
        )
        y = fused.gated_norm(o[None], m.norm.weight, m.norm.eps, z, x.dtype, shift=(buf.conv, conv_inputs))
        k, factors = None, None
    else:
        q, k, v, g, beta = fused.gdn_tree_prologue(
            proj, buf.conv, w.taps, m.conv1d.bias, conv_index, *gates, dims, kernel_dtype
        )
        o, factors = core(q, k, v, g, beta)
        if gemv and GATED_OUT_PROJ and _gated_rows(o.shape[0], m.out_proj):
            from repro.gdn.triton_linear import gated_linear_residual

            x = gated_linear_residual(o, z, m.norm.weight, m.norm.eps, m.out_proj.weight, x)
            return fused_mlp_block(layer, w, x, gemv), conv_inputs, k, factors
        y = fused.gated_norm(o, m.norm.weight, m.norm.eps, z, x.dtype)
    return fused_mlp_block(layer, w, plus_linear(x, y, m.out_proj, gemv), gemv), conv_inputs, k, factors


def _gated_rows(n: int, out_proj: torch.nn.Linear) -> bool:
    """Whether a verify of ``n`` rows takes the row-tiled launch that :data:`GATED_OUT_PROJ` fuses into."""
    from repro.gdn.triton_linear import MAX_ROWS, MAX_VERIFY_ROWS, form_for

    return out_proj.bias is None and MAX_ROWS < n <= MAX_VERIFY_ROWS and form_for(n) == "dot"


def normed_linear(
    x: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    gemv: bool,
    folded: torch.Tensor | None = None,
) -> torch.Tensor:
    """rms_norm(x) @ weight^T (+ bias): one GEMV kernel (``gemv``; ``folded``: the weight with the scale
    folded in, for the row-tiled form) or the Triton RMSNorm and a matmul."""
    if gemv:
        from repro.gdn.triton_linear import norm_linear

        return norm_linear(x, scale, eps, weight, bias, folded=folded)
    from repro.gdn import triton_decode as fused

    return F.linear(fused.rms_norm(x, scale, eps), weight, bias)


def triton_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * scale`` over the last dim in one launch (:func:`repro.gdn.triton_decode.rms_norm`)."""
    from repro.gdn import triton_decode

    return triton_decode.rms_norm(x, scale, eps)


def fused_decode_gdn(
    layer: DecoderLayer, w: GDNWeights, buf: GDNBuffers, x: torch.Tensor, conv_index: torch.Tensor, gemv: bool
) -> torch.Tensor:
    """A GDN layer's decode step (state and conv history in place): input norm + in_proj, the core with
    its gated norm and the history shift in one kernel (:func:`~repro.gdn.triton_decode.gdn_decode_layer`),
    out_proj + residual, the MLP block (:func:`fused_mlp_block`)."""
    from repro.gdn import triton_decode as fused

    m: GatedDeltaNet = layer.linear_attn
    dims = fused.GDNDims(m.num_k_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim)
    proj = normed_linear(x, w.input_norm, layer.input_layernorm.eps, w.in_proj, None, gemv)
    y = fused.gdn_decode_layer(
        proj, buf.conv, w.taps, m.conv1d.bias, conv_index, w.neg_decay, w.dt_bias, m.beta_scale,
        buf.recurrent, m.head_k_dim**-0.5, dims, m.norm.weight, m.norm.eps, m.in_proj_z is not None, x.dtype,
    )  # fmt: skip
    return fused_mlp_block(layer, w, plus_linear(x, y, m.out_proj, gemv), gemv)


def fused_decode_attention(
    layer: DecoderLayer,
    w: AttentionWeights,
    buf: AttentionBuffers,
    x: torch.Tensor,
    rope: torch.Tensor,
    length: torch.Tensor,
    gemv: bool,
) -> torch.Tensor:
    """An attention layer's decode step (the token's key and value written at ``length``): input norm +
    q|k|v, the core in one kernel (:func:`~repro.gdn.triton_attention.attention_decode`: q/k norms,
    rotary, softmax over the cache and the token, output gate), o_proj + residual, the MLP block."""
    from repro.gdn.triton_attention import attention_decode

    a: Attention = layer.self_attn
    qkv = normed_linear(x, w.input_norm, layer.input_layernorm.eps, w.qkv, w.bias, gemv)
    out = attention_decode(
        qkv, w.q_norm, w.k_norm, (a.q_norm.eps, a.k_norm.eps), rope, buf.keys, buf.values, length,
        a.num_heads, a.output_gate,
    )  # fmt: skip
    return fused_mlp_block(layer, w, plus_linear(x, out, a.o_proj, gemv), gemv)


def fused_verify_attention(
    layer: DecoderLayer,
    w: AttentionWeights,
    buf: AttentionBuffers,
    x: torch.Tensor,
    rope: torch.Tensor,
    length: torch.Tensor,
    slot: NodeMasks,
    gemv: bool,
) -> tuple[torch.Tensor, AttentionSaved]:
    """An attention layer's verify of the slot's nodes (the cache untouched): input norm + q|k|v, the core
    in one kernel (:func:`~repro.gdn.triton_attention.attention_tree`: q/k norms, rotary at the nodes'
    positions, softmax over the cache and the node's ancestors, output gate), o_proj + residual, the MLP
    block. Returns x after the layer and the nodes' keys and values for :meth:`StaticDecoder.commit`."""
    from repro.gdn.triton_attention import attention_tree

    a: Attention = layer.self_attn
    qkv = normed_linear(x, w.input_norm, layer.input_layernorm.eps, w.qkv, w.bias, gemv, w.folded.get("qkv"))
    out, k, v = attention_tree(
        qkv, w.q_norm, w.k_norm, (a.q_norm.eps, a.k_norm.eps), rope, buf.keys, buf.values, length,
        slot.depth, slot.ancestors, a.num_heads, a.output_gate,
    )  # fmt: skip
    return fused_mlp_block(layer, w, plus_linear(x, out, a.o_proj, gemv), gemv), AttentionSaved(k, v)


GLUE: dict[str, Callable[..., Any]] = {
    "gdn_prologue": gdn_prologue,
    "gdn_epilogue": gdn_epilogue,
    "attention_prologue": attention_prologue,
    "attention_core": attention_core,
    "attention_epilogue": attention_epilogue,
}
_COMPILED: dict[str, Callable[..., Any]] = {}


def compiled_glue() -> dict[str, Callable[..., Any]]:
    """The glue functions wrapped in ``torch.compile`` (once per process; compiled at the first call of
    each shape: one decode and one verify size cost two compiles per function)."""
    if not _COMPILED:
        import torch._inductor.config as inductor_config

        if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
            inductor_config.compile_threads = 1
        _COMPILED.update({name: torch.compile(fn, dynamic=False) for name, fn in GLUE.items()})
    return _COMPILED
