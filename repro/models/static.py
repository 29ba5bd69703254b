"""Static-buffer decoding of a :class:`HybridLM`: fixed shapes, counters on the device, capturable.

A :class:`StaticDecoder` keeps one sequence's committed state in preallocated buffers: per GDN layer
the float32 (float64 for a float64 model) recurrent state and the conv history, per attention layer
keys and values of ``max_len + max_nodes`` rows, and the committed length as a device tensor. Its
steps read their inputs from device buffers and never read a device value on the host, never
branch on one, and allocate the same shapes on every call, so each can be captured once in a CUDA
graph (:mod:`repro.models.graphs`) and replayed:

- :meth:`StaticDecoder.decode_step`: one token (``decoder.token``) folded into the state; the GDN
  layers run the recurrence (with ``fused=True``, the default with the Triton kernels, one Triton
  kernel per layer for conv, norms, gates and the step, :mod:`repro.gdn.triton_decode`; unfused,
  fla's ``fused_recurrent_gated_delta_rule`` on CUDA; the reference
  :func:`~repro.gdn.reference.recurrent_gdn` elsewhere), attention reads the static KV under a
  length mask and appends at the length.
- :meth:`StaticDecoder.verify`: every node of a :class:`TreeSlot`'s tree (a fixed node count; the
  tokens, parents, ancestor mask, depths and conv gather index are input buffers), state untouched.
  GDN layers use a Triton tree kernel on CUDA (the one-launch "fused" or the two-phase "split", picked
  by :func:`select_tree_kernel` unless ``tree_kernel`` forces one), :func:`~repro.gdn.reference.tree_gdn`
  elsewhere.
- SpecLA's delayed commit (``delayed``, on slots made with a ``parity``): the commit updates the conv
  histories, attention rows and length as always but only records the accepted path in its parity's
  stash (:class:`PendingSet`: the verification wrote its factors there); the next verification, on a
  slot of the other parity, folds that path into the GDN states before it verifies from them, inside
  the Triton tree kernel (``pending=``, a float32 state) or in torch before it
  (:func:`~repro.gdn.reference.apply_pending`), so no commit launch touches the states.
  :meth:`StaticDecoder.flush` folds a pending commit in at once (what every other reader of the states
  needs first: decode steps, other strategies, export; :class:`repro.models.graphed.GraphedTarget`
  tracks when); :meth:`StaticDecoder.load` drops it with the old state.
- :meth:`StaticDecoder.accept`: greedy longest match on the device (the same path and bonus as
  :class:`repro.decoding.acceptance.TargetMatch` at temperature 0); :meth:`StaticDecoder.commit`: the
  accepted path (ending at the slot's ``node``) folded into the buffers by ``snapshot`` (per-node
  states from verify), ``replay`` (the recurrence over the path, padded to the slot's max depth
  with identity steps g = beta = 0) or ``closed_form`` (the tree factors, masked to the path). With
  the Triton kernels (float32 state) a closed-form commit is one launch per GDN layer for the state and
  the conv history together, reading only the accepted path's rows
  (:func:`~repro.gdn.triton_commit.commit_path_indexed`, through :func:`~repro.gdn.backends.commit_function`;
  the path is written once per commit as a path index, :func:`~repro.gdn.triton_commit.write_path_index`,
  and every layer reads it: ``indexed_commit``, False for the earlier per-layer gather, commit_path_fused);
  the other strategies commit the conv history with one fused kernel (:mod:`repro.gdn.triton_commit`).
  ``stacked_commit`` (a constructor flag, off by default): the GDN layers' states and conv histories are
  views of one stacked buffer each, a tree slot's verify writes every layer's factors and conv inputs into
  stacked buffers (:class:`StackedFactors`), and the closed-form commit of every GDN layer (state and conv
  history) is one launch over the stack, as is a delayed commit's :meth:`~StaticDecoder.flush`
  (the indexed commit cost 6.1-6.3 us per layer at SpecLA's shape, stacked over 8 layers 1.3-1.5:
  results/2026-12-01-h200-verify-glue).

The layer arithmetic is HybridLM's (its modules and helpers), regrouped to launch fewer kernels per
step (:mod:`repro.models.static_layers`: stacked projections, precomputed gate constants and norm
scales, the residual adds on the output matmuls); the rotary tables and attention masks are made once
per step. On CPU in
float64 every step agrees with ``HybridLM.verify`` / ``commit`` to rounding
(tests/models/test_static_decoder.py, which also pins the ops per layer and checks every step with
:class:`repro.models.graphs.CaptureCheck`). On CUDA the GDN kernels take the model's dtype (bf16:
Triton dots in "tf32") where HybridLM's layer upcasts q/k/v to float32, so bf16 results agree to bf16
accuracy, not bitwise.

``fused=True`` (the default with the triton kernels) replaces the glue by the Triton kernels of
:mod:`repro.gdn.triton_decode` (:func:`~repro.models.static_layers.fused_gdn_layer`,
:func:`~repro.models.static_layers.fused_mlp_block`; the MLP's gate and up projections stacked into one
matrix): a decode GDN layer is then 9 launches (RMSNorm, in_proj,
the decode core, gated norm + conv shift, out_proj addmm, RMSNorm, gate|up, SiLU * up, down addmm),
attention layers use the same RMSNorm and MLP kernels. ``fused=False`` keeps the torch glue (the
reference path on CPU, the "before" row of ``repro bench model``).

``gemv=True`` (needs ``fused=True``) runs the decode step's matmuls on the GEMV kernels of
:mod:`repro.gdn.triton_linear`, the glue around them fused in: the input norm into the stacked
in_proj (attention: q|k|v), the residual into out_proj / o_proj and down_proj, the post norm and SiLU * up
into the stacked gate|up, the final norm into the LM head. A decode GDN layer is then 6 launches
(norm + in_proj, decode core, gated norm + conv shift, out_proj + residual, norm + gate|up + SiLU * up,
down + residual).

``fuse_verify`` (needs ``fused``; by default on with ``gemv``) runs verify's matmuls, the same glue
fused in, on the row-tiled variant of those kernels (slots of up to 256 nodes,
:data:`~repro.gdn.triton_linear.MAX_VERIFY_ROWS`; larger ones keep cuBLAS): per layer the four matmuls
become four Triton launches and the two RMSNorm and the SiLU * up launches go, the final norm rides on
the LM head: 25 launches fewer a verify of the tiny-qwen35 layout (149 -> 124 when this was written;
tests/models/test_fused_verify.py).

``fuse_decode`` (needs ``fused``; by default on with ``gemv``) runs the decode step on fewer kernels
still (:meth:`StaticDecoder._fused_decode`): per GDN layer the decode core, its gated norm and the conv
history shift in one kernel (:func:`~repro.gdn.triton_decode.gdn_decode_layer`; 5 launches a layer with
``gemv``), per attention layer the q/k norms, rotary, the KV write, softmax attention and the output gate
in one (:func:`~repro.gdn.triton_attention.attention_decode`, rotary table made once; 5 a layer with
``gemv``, 34 before: 28 aten ops and 6 Triton launches), the per-step rotary tables and masks (10 aten
ops) are gone, and the final norm + LM head with the argmax into ``pick`` and the length's advance take
two launches (:func:`~repro.gdn.triton_linear.norm_linear_argmax`; 5 before). The tiny-qwen35 layout's
decode step (6 GDN, 2 attention layers) is then 43 launches, 120 before (tests/gdn/test_fused_decode.py).
``fuse_decode=False`` keeps the old decode step for measurement.

``fuse_tree_attention`` (needs ``fused``; by default on with it, for head dims up to 256) runs verify's
attention layers the same way (:func:`~repro.models.static_layers.fused_verify_attention`): per layer the
q/k norms, rotary at the nodes' positions, softmax over the cache rows and each node's ancestors and
the output gate in one kernel (:func:`~repro.gdn.triton_attention.attention_tree`, which also returns
the nodes' rotated keys for the commit), beside the unchanged projections; the per-step masks and rotary
tables are then not made. ``fuse_tree_attention=False`` keeps the torch glue (about 35 launches a layer)
for measurement.

``fuse_bookkeeping`` (on with the Triton kernels; ``FUSE_BOOKKEEPING`` sets the default) runs what surrounds
the forward on :mod:`repro.models.slot_kernels`, one launch each: a deriving slot's depths, ancestor mask,
conv gather index and first-sibling flags (~65 torch ops in the verify graph before), the greedy accept (the
argmax stays torch), the accepted path's ``result``, each attention layer's commit of the path's keys and
values, and the length's advance: a greedy accept + path + commit of the tiny-qwen35 layout takes 9 launches
instead of 45 (tests/models/test_slot_kernels.py). False keeps the torch ops, the reference on CPU.

``compile=True`` wraps the per-layer glue around the GDN/attention cores (norms, projections,
conv, gates, MLP) in ``torch.compile`` so that the elementwise chains fuse into few kernels; the
cores and every buffer write stay outside the compiled regions. Inductor compiles in this process
(``compile_threads = 1`` unless TORCHINDUCTOR_COMPILE_THREADS says otherwise): no worker pool to start
on the device machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from repro.errors import ConfigError
from repro.gdn import reference as gdn
from repro.gdn.backends import (
    TREE_KERNELS,
    check_backend,
    commit_function,
    default_backend,
    recurrent_function,
    tree_function,
)
from repro.gdn.chain import select_tree_kernel
from repro.gdn.reference import PendingCommit, TreeFactors
from repro.gdn.triton_common import verify_launches
from repro.models.config import GDN
from repro.models.graphs import generation_stream
from repro.models.hybrid import COMMIT_STRATEGIES, HybridLM
from repro.models.layers import DecoderLayer, GatedDeltaNet, rms_norm, rotary_tables
from repro.models.state import AttentionLayerState, GDNLayerState, ModelState
from repro.models.static_layers import (
    GLUE,
    AttentionBuffers,
    AttentionSaved,
    AttentionWeights,
    GDNBuffers,
    GDNSaved,
    GDNWeights,
    compiled_glue,
    fold_head,
    fold_weights,
    fused_decode_attention,
    fused_decode_gdn,
    fused_gdn_layer,
    fused_verify_attention,
    normed_linear,
)
from repro.tree import DeviceTree, Tree, ancestor_matrix, conv_gather_index_np, first_occurrences

if TYPE_CHECKING:
    from repro.gdn.triton_persistent import PersistentGDN


# ------------------------------------------------------------------------- per-layer glue
def persistent_layers(dec: StaticDecoder) -> PersistentGDN:
    """The stacked constants of a pure-GDN decoder's layers for its persistent decode launch
    (:mod:`repro.gdn.triton_persistent`), over its stacked states and conv histories. The projection
    matrices are stacked once; each layer's GDNWeights and the model's own out_proj and down_proj weights
    become views of the stacks (the model keeps its values, the device keeps one copy)."""
    from repro.gdn.triton_decode import GDNDims
    from repro.gdn.triton_persistent import PersistentGDN

    assert dec.gdn_states is not None and dec.gdn_conv is not None
    layers = dec.layers
    mixers: list[GatedDeltaNet] = [lay.linear_attn for lay in layers]
    ws = [w for w in dec.weights if isinstance(w, GDNWeights)]
    eps = {lay.input_layernorm.eps for lay in layers} | {lay.post_attention_layernorm.eps for lay in layers}
    consts = {(m.beta_scale, m.norm.eps, m.in_proj_z is not None, m.conv1d.bias is not None) for m in mixers}
    if len(eps) != 1 or len(consts) != 1:
        raise ConfigError("persistent=True needs every layer's norms and gates alike (one launch's)")
    beta_scale, norm_eps, has_z, has_bias = consts.pop()

    def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([t.detach() for t in tensors]).contiguous()

    with torch.no_grad():
        in_proj, gate_up = stacked([w.in_proj for w in ws]), stacked([w.gate_up for w in ws])
        out_proj = stacked([m.out_proj.weight for m in mixers])
        down = stacked([lay.mlp.down_proj.weight for lay in layers])
        for j, (w, m, lay) in enumerate(zip(ws, mixers, layers)):
            w.in_proj, w.gate_up = in_proj[j], gate_up[j]
            m.out_proj.weight.data = out_proj[j]
            lay.mlp.down_proj.weight.data = down[j]
        m0 = mixers[0]
        return PersistentGDN(
            in_norm=stacked([w.input_norm for w in ws]), in_proj=in_proj, taps=stacked([w.taps for w in ws]),
            conv_bias=stacked([m.conv1d.bias for m in mixers]) if has_bias else None,
            neg_decay=stacked([w.neg_decay for w in ws]), dt_bias=stacked([w.dt_bias for w in ws]),
            norm_weight=stacked([m.norm.weight for m in mixers]), out_proj=out_proj,
            post_norm=stacked([w.post_norm for w in ws]), gate_up=gate_up, down=down, states=dec.gdn_states,
            history=dec.gdn_conv, conv_index=dec.decode_slot.conv_index,
            dims=GDNDims(m0.num_k_heads, m0.num_v_heads, m0.head_k_dim, m0.head_v_dim), has_z=has_z,
            beta_scale=beta_scale, eps=eps.pop(), norm_eps=norm_eps,
        )  # fmt: skip


def decode_head(dec: StaticDecoder, x: torch.Tensor) -> torch.Tensor:
    """Final norm and LM head of a decode step, its argmax into ``dec.pick`` and the length moved on:
    two launches with ``gemv`` (:func:`~repro.gdn.triton_linear.norm_linear_argmax`), else the Triton
    RMSNorm, the matmul, argmax, the copy and the length's add and clamp."""
    head, eps = dec.model.lm_head, dec.model.model.norm.eps
    if dec.gemv:
        from repro.gdn.triton_linear import norm_linear_argmax

        return norm_linear_argmax(
            x, dec.final_norm, eps, head.weight, head.bias, dec.pick, advance=(dec.length, dec.max_len)
        )
    logits = normed_linear(x, dec.final_norm, eps, head.weight, head.bias, False)
    dec.pick.copy_(logits[0].argmax(-1, keepdim=True))
    dec.length.add_(1).clamp_(max=dec.max_len)
    return logits


def decode_rope(dec: StaticDecoder) -> torch.Tensor:
    """The cos|sin table [rows, 2, rot] of every position the decoder's attention layers can take."""
    from repro.gdn.triton_attention import rotary_table

    attn = next(lay.self_attn for lay in dec.layers if lay.layer_type != GDN)
    return rotary_table(attn.inv_freq, dec.max_len + dec.max_nodes, dec.dtype, dec.device)


# the default of StaticDecoder.fuse_bookkeeping on the Triton kernels (False: the torch ops, for an A/B)
FUSE_BOOKKEEPING = True
# with fuse_bookkeeping: TreeSlot.set_device_tree copies a device tree by one kernel, not stream copies.
# Off: with GraphedBestFirst's aliased roots it made no route faster (routes-ab, results/2026-12-04-h200-
# derive-rows/callCK: device ms a step DDTree 0.341 vs 0.338 on stream copies, chain DFlash 0.285 vs 0.278)
KERNEL_TREE_COPY = False
# the default of StaticDecoder.fold_norms with fuse_verify (False: the scaled rows, for an A/B)
FOLD_NORMS = True
# where select_tree_kernel picks the split form for a slot of 2^k + 1 nodes, 16 <= 2^k <= 64 (a root and a
# power-of-two budget), take it with node 0 solved before the row blocks ("split_peel"): the other 2^k rows
# then fill whole 32-row blocks. On an H100 (results/2026-12-06-h100-peel-root/callGI, bf16, CUDA graphs) it
# wins at 33 and 65 nodes in every shape (65: Weaver 18.9 vs 29.1 us, SpecLA 13.5 vs 18.4, the tiny family
# 9.6 vs 12.3); not at 129, where with the slot's aligned mask (results/2026-12-06-h100-aligned-mask, callGL)
# it wins at Weaver's shape only (38.6 vs 49.8 us; SpecLA 28.0 vs 27.6, tiny 25.7 vs 19.3). Off: in bf16 the
# changed arithmetic order moves greedy ties, so the routes' tokens differ from the default's, and the routes
# A/B gained little (routes-ab's peel_root variant, callGF and callGK: device ms a step 0.314 -> 0.309).
PEEL_ROOT = False


def peels_root(nodes: int) -> bool:
    """Whether a slot of ``nodes`` nodes is one that :data:`PEEL_ROOT` moves to "split_peel": 2^k + 1 with
    16 <= 2^k <= 64."""
    return 16 < nodes <= 65 and (nodes - 1) & (nodes - 2) == 0


DELAYED = "delayed"  # SpecLA's delayed commit: the closed form, folded in by the next verification
STATIC_STRATEGIES = (*COMMIT_STRATEGIES, DELAYED)


def check_static_strategy(name: str) -> str:
    """``name`` if the static decoder commits by it: HybridLM's three strategies or ``delayed``."""
    if name not in STATIC_STRATEGIES:
        raise ConfigError(f"unknown commit strategy {name!r}: choose one of {', '.join(STATIC_STRATEGIES)}")
    return name


@dataclass
class PendingSet:
    """One of the two stashes of SpecLA's delayed commit (:meth:`StaticDecoder.commit` with ``delayed``).

    A verification on a slot of parity p writes its factors here (rows [0, size) of ``rows``, per GDN
    layer); its delayed commit records the accepted path: the slot's ancestor mask in the top-left block
    of ``ancestors`` (the rest of its rows False) and the path's last node in ``node`` (-1: nothing
    pending). The next verification (parity 1 - p) folds that path into the states from here while it
    writes its own factors into the other stash: the two never alias.
    """

    delta: dict[int, torch.Tensor]  # per GDN layer [rows, HV, d_v]
    k: dict[int, torch.Tensor]  # [rows, HV, d_k]
    gate_cum: dict[int, torch.Tensor]  # [rows, HV]
    ancestors: torch.Tensor  # bool [rows, rows]
    node: torch.Tensor  # [1] int64
    path: torch.Tensor  # int32 [rows + 1]: node's path index (written with it; write_path_index)
    stacked: StackedFactors | None = None  # stacked_commit: the per-layer tensors are views of these

    @property
    def rows(self) -> int:
        return self.ancestors.shape[0]

    def pending(self, layer: int, indexed: bool = False) -> PendingCommit:
        """The pending commit of GDN layer ``layer`` (views: nothing copied); ``indexed``: with the path
        index (``path``, written with ``node`` by the delayed commit) for the Triton kernels to read."""
        i = layer
        path = self.path if indexed else None
        return PendingCommit(self.delta[i], self.k[i], self.gate_cum[i], self.ancestors, self.node, path)


@dataclass
class StackedFactors:
    """Every GDN layer's verify outputs for the commit in stacked buffers (``stacked_commit``): GDN layer
    j's are the views [j], so the verify writes them per layer and the closed-form commit of all layers
    is one launch over the stack (:func:`~repro.gdn.triton_commit.commit_path_indexed`)."""

    delta: torch.Tensor  # [L_gdn, rows, HV, d_v], the tree kernels' factor dtype
    k: torch.Tensor  # [L_gdn, rows, HV, d_k]
    gate_cum: torch.Tensor  # [L_gdn, rows, HV]
    conv_inputs: torch.Tensor | None = None  # [L_gdn, rows, C], model dtype (slots; not the stashes)

    def views(self, layers: list[int]) -> tuple[dict[int, torch.Tensor], ...]:
        """(delta, k, gate_cum) per decoder layer index (``layers``: the GDN layers' indices, in stack
        order) as views (PendingSet's per-layer dicts)."""
        return tuple({i: t[j] for j, i in enumerate(layers)} for t in (self.delta, self.k, self.gate_cum))


class TreeSlot:
    """Input buffers of one fixed tree size (``size`` nodes, at most ``max_depth`` deep) and what
    verify saved for accept and commit (the tensors of the last verify run on the slot).

    The inputs (tokens, parents, depths, conv gather index, ancestor mask, first-sibling flags) are
    views of one device byte buffer, filled from one host buffer (pinned on CUDA) by one copy per
    :meth:`set_tree`. ``derive``: only tokens and parents are inputs (:meth:`set_tree` uploads those,
    :meth:`set_device_tree` copies a :class:`~repro.tree.DeviceTree`'s on the device) and
    :meth:`StaticDecoder.verify` derives the rest with fixed-shape ops (:meth:`derive`, inside the
    verify graph). ``capture``: layers whose outputs [size, d] verify leaves in ``hidden`` (the
    tensors the forward made: no copy, so a graph's replays rewrite them in place).
    ``result`` (after :meth:`StaticDecoder.accepted_path`): what the host reads of a greedy step.

    ``parity`` (0 or 1; None: an ordinary slot): a slot of SpecLA's delayed commit. Its verify first
    folds the pending commit of the other parity's stash into the GDN states (:class:`PendingSet`) and
    writes its factors into its own parity's stash; :meth:`StaticDecoder.commit` with ``delayed`` then
    records the accepted path there instead of updating the states. Steps alternate parities.

    With CUDA graphs, capture verify's graph first and replay it once: accept and commit graphs
    captured after it read that graph's outputs, which every replay of it rewrites in place.
    """

    verifier = "tree"  # GDN layers by the tree kernel (chain slots: repro.models.static_chain)

    def __init__(
        self,
        decoder: StaticDecoder,
        size: int,
        max_depth: int | None = None,
        snapshots: bool = False,
        capture: tuple[int, ...] = (),
        derive: bool = False,
        parity: int | None = None,
    ):
        if size < 1 or size > decoder.max_nodes:
            raise ConfigError(f"tree size {size} is outside 1..{decoder.max_nodes} (the decoder's max_nodes)")
        if parity not in (None, 0, 1) or (parity is not None and (snapshots or self.verifier != "tree")):
            raise ConfigError("a delayed-commit slot (parity 0 or 1) is a tree slot without snapshots")
        self.size = size
        self.max_depth = min(max_depth or size, size)
        self.snapshots = snapshots
        self.parity = parity
        if parity is not None:
            decoder.ensure_pending(size)
        self.capture = tuple(capture)
        self.width = decoder.conv_width
        dev = decoder.device
        ints = 8 * size * (3 + self.width)
        nbytes = ints + size * size + size
        self._device_bytes = torch.zeros(nbytes, dtype=torch.uint8, device=dev)
        pinned = dev.type == "cuda"
        self._host_bytes = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pinned)
        self._copied: Any = None  # the last upload's CUDA event: the host buffer is reused after it
        self._stream = generation_stream(dev)
        longs = self._device_bytes[:ints].view(torch.long)
        flags = self._device_bytes[ints:].view(torch.bool)
        self.tokens, self.parents = longs[:size], longs[size : 2 * size]
        self.depth = longs[2 * size : 3 * size]
        self.conv_index = longs[3 * size :].view(size, self.width)
        self.ancestors = flags[: size * size].view(size, size)
        self.first = flags[size * size :]
        host = self._host_bytes.numpy()
        self._host_longs = host[:ints].view(np.int64)
        self._host_flags = host[ints:].view(np.bool_)
        self.node = torch.zeros(1, dtype=torch.long, device=dev)  # the accepted path's last node
        # stacked_commit: the GDN layers' factors and conv inputs in stacked buffers (a delayed slot's
        # factors go to its parity's stash instead; a chain slot commits by replay)
        stacked = decoder.stacked_commit and self.verifier == "tree" and parity is None
        self.stack = decoder.stacked_factors(size, conv=True) if stacked else None
        # the path index of the Triton path commit (StaticDecoder.indexed_commit), written once per commit
        self.path_index = torch.zeros(size + 1, dtype=torch.int32, device=dev)
        self.bonus = torch.zeros(1, dtype=torch.long, device=dev)
        # [path length, bonus, path nodes by depth (max_depth), their tokens] (the graphed target reads it)
        self.result = torch.zeros(2 + 2 * self.max_depth, dtype=torch.long, device=dev)
        # the GDN tree kernels' copy of the mask with aligned rows (repro.gdn.triton_tree.mask_rows: 129
        # nodes), refreshed by each verify, so that no layer's call copies it; None: the mask itself serves
        self.gdn_rows: torch.Tensor | None = None
        if self.verifier == "tree" and decoder.tree_kernel_at(size) is not None:
            from repro.gdn.triton_tree import aligned_mask  # Triton is optional: imported here

            self.gdn_rows = aligned_mask(size, dev)
        self.derive_inputs = derive
        self.accept_fused = False  # a slot of the graphed target's fused verify + acceptance graphs
        self._decoder = decoder
        self._rows = torch.arange(size, device=dev)
        self.logits: torch.Tensor | None = None
        self.hidden: dict[int, torch.Tensor] = {}
        self.saved: list[GDNSaved | AttentionSaved | None] = [None] * decoder.num_layers
        self.tree: Tree | DeviceTree | None = None
        self._held_parents: torch.Tensor | None = None  # the constant parents held (set_device_tree)
        parents = [-1 if i % self.max_depth == 0 else i - 1 for i in range(size)]
        self.set_tree(Tree(torch.zeros(size, dtype=torch.long), torch.tensor(parents)))
        if derive:
            self.derive()

    @property
    def gdn_mask(self) -> torch.Tensor:
        """The ancestor mask the GDN tree kernels read: the aligned copy where the slot keeps one."""
        return self.ancestors if self.gdn_rows is None else self.gdn_rows

    def set_tree(self, tree: Tree, pad: bool = False) -> None:
        """Copy a tree of exactly ``size`` nodes into the input buffers (one host-to-device copy).

        ``pad``: a smaller tree is padded with extra root-level nodes (parent -1, token 0); the
        ancestor mask isolates them from the real nodes, whose logits stay what they are unpadded,
        and :meth:`StaticDecoder.accept` never walks into them (they hang off no accepted node).
        """
        n = tree.size
        if n != self.size and not (pad and n < self.size):
            bound = "up to " if pad else ""
            raise ConfigError(f"this slot verifies {self.verifier}s of {bound}{self.size} nodes, got {n}")
        size, width = self.size, self.width
        self._held_parents = None  # the upload writes the parents
        if self._copied is not None:
            self._copied.synchronize()  # the previous upload has left the host buffer
        longs, flags = self._host_longs, self._host_flags
        tokens, parents = longs[:size], longs[size : 2 * size]
        tokens[n:], parents[n:] = 0, -1
        tokens[:n] = tree.tokens.numpy()
        parents[:n] = tree.parents.numpy()
        if self.derive_inputs:
            deepest = int(tree.depth.max()) if self.max_depth < size else 0
            if deepest > self.max_depth:
                raise ConfigError(f"tree depth {deepest} exceeds the slot's max_depth {self.max_depth}")
            self._upload(16 * size)
            self.tree = tree
            return
        ancestors, depth = ancestor_matrix(parents)
        deepest = int(depth[:n].max())
        if deepest > self.max_depth:
            raise ConfigError(f"tree depth {deepest} exceeds the slot's max_depth {self.max_depth}")
        longs[2 * size : 3 * size] = depth
        longs[3 * size :] = conv_gather_index_np(parents, width).reshape(-1)
        flags[: size * size] = ancestors.reshape(-1)
        flags[size * size :] = first_occurrences(parents, tokens)
        self._upload(self._host_bytes.numel())
        self.tree = tree

    def _upload(self, nbytes: int) -> None:
        """The first ``nbytes`` of the host buffer to the device (asynchronous from pinned memory)."""
        self._device_bytes[:nbytes].copy_(self._host_bytes[:nbytes], non_blocking=True)
        if self._device_bytes.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record(self._stream)

    def set_device_tree(self, tree: DeviceTree) -> None:
        """Copy a device tree of up to ``size`` nodes into tokens and parents on the device (no host
        read; padded as :meth:`set_tree` pads); needs ``derive``. Its depth is not checked on the host:
        slots that take device trees are as deep as they are large. Constant parents
        (``tree.constant_parents``) that this slot took last are not copied again. With the decoder's
        ``fuse_bookkeeping`` the copy and padding are one kernel
        (:func:`~repro.models.slot_kernels.copy_tree`)."""
        n = tree.size
        if not self.derive_inputs or n > self.size:
            raise ConfigError(f"a device tree of {n} nodes needs a deriving slot of >= {n} nodes")
        fresh = tree.parents is not self._held_parents  # held: the same n, its padding in place
        if self._decoder.fuse_bookkeeping and KERNEL_TREE_COPY:  # one kernel (slot_kernels.copy_tree)
            from repro.models.slot_kernels import copy_tree

            copy_tree(self.tokens, self.parents, tree.tokens, tree.parents, copy_parents=fresh)
        else:
            self.tokens[:n].copy_(tree.tokens)
            if n < self.size:
                self.tokens[n:].zero_()
            if fresh:
                self.parents[:n].copy_(tree.parents)
                if n < self.size:
                    self.parents[n:].fill_(-1)
        self._held_parents = tree.parents if tree.constant_parents else None
        self.tree = tree

    def derive(self) -> None:
        """Depths, ancestor mask, conv gather index and first-sibling flags from tokens and parents on
        the device, with fixed-shape ops: the ancestor mask is the reflexive-transitive closure of the
        parent relation by repeated squaring of its 0/1 matrix (float32 products of 0/1 entries are
        exact), enough squarings for paths of ``max_depth`` nodes. Equal to :meth:`set_tree`'s host
        tensors (tests/models/test_static_decoder.py)."""
        rows, parents, tokens = self._rows, self.parents, self.tokens
        reach = ((rows[:, None] == rows[None, :]) | (parents[:, None] == rows[None, :])).float()
        for _ in range(max(self.max_depth - 2, 0).bit_length()):
            reach = (reach @ reach).clamp_(max=1.0)
        ancestors = reach > 0
        self.ancestors.copy_(ancestors)
        self.depth.copy_(ancestors.sum(-1))
        self.conv_index.copy_(gdn.conv_gather_index(parents, self.width))
        twin = (parents[:, None] == parents[None, :]) & (tokens[:, None] == tokens[None, :])
        self.first.copy_(~(twin & (rows[None, :] < rows[:, None])).any(-1))

    def set_accepted(self, path: list[int]) -> None:
        """Commit this root-to-node path next (host to device)."""
        assert isinstance(self.tree, Tree), "set_accepted walks a host tree"
        if not path or self.tree.path_to(path[-1]) != list(path):
            raise ConfigError(f"accepted nodes {path} are not a root-to-node path of the slot's tree")
        self.node.fill_(path[-1])

    def accepted(self) -> tuple[list[int], int]:
        """(path, bonus token) of the last :meth:`StaticDecoder.accept` (reads the device)."""
        assert isinstance(self.tree, Tree), "accepted walks a host tree"
        return self.tree.path_to(int(self.node)), int(self.bonus)


# --------------------------------------------------------------------------------- decoder


class StaticDecoder:
    """One sequence's decoding state in static buffers, with capturable decode/verify/accept/commit."""

    def __init__(
        self,
        model: HybridLM,
        max_len: int,
        max_nodes: int = 256,
        kernel: str | None = None,
        precision: str | None = None,
        compile: bool = False,
        fused: bool | None = None,
        gemv: bool = False,
        tree_kernel: str | None = None,
        fuse_decode: bool | None = None,
        fuse_verify: bool | None = None,
        fuse_tree_attention: bool | None = None,
        tree_attention_decode: bool = False,
        stacked_commit: bool = False,
        persistent: bool = False,
        fold_norms: bool | None = None,
    ) -> None:
        """``stacked_commit``: every GDN layer's recurrent state and conv history are views [j] of one
        stacked buffer (``gdn_states`` [L_gdn, HV, d_v, d_k], ``gdn_conv`` [L_gdn, W-1, C]), each tree
        slot's verify writes its factors and conv inputs into stacked buffers (:class:`StackedFactors`,
        views per layer) and the closed-form commit of a float32 state on Triton is one
        :func:`~repro.gdn.triton_commit.commit_path_indexed` launch over the stack (states and conv
        histories; the path index written once, whatever ``indexed_commit`` says), as is a delayed
        commit's :meth:`flush`; the other strategies, the delayed commit's conv histories and the torch
        commits stay per layer (on the views). Needs GDN layers of one shape.

        ``tree_kernel`` (triton only): force the "fused" or "split" tree kernel for verify; None picks
        by :func:`select_tree_kernel` (kernel dtype, value heads and each slot's size: :meth:`tree_kernel_at`;
        ``self.tree_kernel`` is the choice outside the size window). ``fuse_decode`` (needs ``fused``):
        decode steps on :meth:`_fused_decode`'s kernels; None: with ``gemv`` (the half-precision, small
        width decoders of :class:`~repro.models.graphed.GraphedTarget`); the attribute may be set before
        the decode graph is captured (False: the old decode path, for measurement). ``fuse_verify`` (needs
        ``fused``): verify's matmuls on the row-tiled kernels of :mod:`repro.gdn.triton_linear` (slots of
        up to :data:`~repro.gdn.triton_linear.MAX_VERIFY_ROWS` nodes; larger ones keep cuBLAS); None: with
        ``gemv`` (the same rule); settable before the verify graphs are captured, as ``fuse_decode``.
        ``fold_norms``: those row-tiled linears read copies of the normed matrices (in_proj, q|k|v,
        gate|up, the LM head) with the norm scales folded into their columns (:func:`fold_weights`, made
        here: x enters the dots as it is), instead of scaling x in every K step; None: with
        ``fuse_verify`` (and :data:`FOLD_NORMS`) where a slot can take them (``max_nodes`` above
        :data:`~repro.gdn.triton_linear.MAX_ROWS`: a decoder of smaller slots reads its weights on the GEMV
        kernel alone, and the copies it would never read, ~24 GB at the Qwen3.6-27B shape, did not fit an
        80 GB card beside the weights); False: the scaled rows (for measurement).
        ``fuse_tree_attention`` (needs ``fused``): verify's attention layers each in one kernel
        (:func:`fused_verify_attention`); None: on in the fused decoder when the kernel takes the head
        dim (at most :data:`~repro.gdn.triton_attention.TREE_ATTENTION_MAX_HEAD_DIM`; any tree size);
        the attribute may be set before the verify graph is captured (False: the torch glue).
        ``tree_attention_decode`` (needs ``fuse_tree_attention``): a decode step that does not take the
        fused decode kernels (``fuse_decode`` off) runs its attention layers through the same tree kernel
        (one node) and writes the token's key and value into the cache, instead of the torch glue
        (~27 launches a layer); off by default until measured (``repro bench model`` row
        ``static_graph_gemv_core_tree``); settable before the decode graph is captured.

        ``persistent`` (a pure-GDN model on the fused Triton decoder, float32 states): a decode step runs
        every layer in one persistent launch (:mod:`repro.gdn.triton_persistent`; the embedding row and the
        LM head stay separate), on states and conv histories stacked as with ``stacked_commit``; the
        layers' projection weights are stacked once and the model's own parameters become views of the
        stacks (no second copy). Decode steps then skip ``fuse_decode``. Off by default: measured slower
        than the separate kernels at GDN-1.3B (1408 vs 1115 us a token on an H200; the module's docstring)."""
        self.model = model
        cfg = model.config
        dev, dt = model.device, model.dtype
        self.device, self.dtype = dev, dt
        self.kernel = kernel or default_backend(dev, dt)
        self.fused = (self.kernel == "triton" and not compile) if fused is None else fused
        if self.fused and compile:
            raise ConfigError("fused=True replaces the compiled glue: choose fused or compile")
        if self.fused and self.kernel != "triton":
            raise ConfigError("fused=True needs the triton GDN kernels (kernel='triton')")
        if gemv and not self.fused:
            raise ConfigError(
                "gemv=True runs inside the fused decoder: it needs fused=True (kernel='triton')"
            )
        self.gemv = gemv
        if fuse_decode and not self.fused:
            raise ConfigError("fuse_decode=True runs inside the fused decoder: it needs fused=True")
        self.fuse_decode = gemv if fuse_decode is None else fuse_decode
        if fuse_verify and not self.fused:
            raise ConfigError("fuse_verify=True runs inside the fused decoder: it needs fused=True")
        self.fuse_verify = gemv if fuse_verify is None else fuse_verify
        check_backend(self.kernel, dev, interpreter=True, dtype=dt)
        if max_len < 1 or max_nodes < 1:
            raise ConfigError(f"max_len and max_nodes must be positive, got {max_len} and {max_nodes}")
        self.max_len, self.max_nodes = max_len, max_nodes
        self.state_dtype = torch.float64 if dt == torch.float64 else torch.float32
        low = dt in (torch.bfloat16, torch.float16) and self.kernel == "triton"
        self.kernel_dtype = dt if low else self.state_dtype
        self.precision = precision or ("tf32" if low else "ieee")
        if tree_kernel is not None and (self.kernel != "triton" or tree_kernel not in TREE_KERNELS):
            raise ConfigError(
                f"tree_kernel={tree_kernel!r}: choose one of {', '.join(TREE_KERNELS)}, with kernel='triton'"
            )
        self.tree_kernel: str | None = None  # the Triton tree kernel of verify (None: reference backend)
        if self.kernel == "triton":
            heads = cfg.linear_num_value_heads
            self.tree_kernel = tree_kernel or select_tree_kernel(self.kernel_dtype, heads)
        self._tree = tree_function(self.kernel, dev, interpreter=True, kernel=self.tree_kernel or "fused")
        self._tree_forced = tree_kernel is not None
        # closed-form commits of a float32 state on Triton: state and conv history in one path-rows launch
        self._path_commit = None
        if self.kernel == "triton" and self.state_dtype == torch.float32:
            self._path_commit = commit_function(self.kernel, dev, interpreter=True)
        # the path commit reads the accepted path from a path index written once per commit for every layer
        # (the slot's or stash's ``path_index``, repro.gdn.triton_commit.write_path_index), not from the
        # ancestor row in every layer's every program; False (set before capture): the earlier kernel
        self.indexed_commit = True
        # the slot's derived inputs, greedy accept, accepted path, attention rows' commit and the length's
        # advance on the one-launch kernels of repro.models.slot_kernels (False, set before capture: the torch
        # ops, ~70 small launches a greedy step, for measurement)
        self.fuse_bookkeeping = FUSE_BOOKKEEPING and self.kernel == "triton"
        self._recurrent = recurrent_function(self.kernel)
        self.glue = compiled_glue() if compile else GLUE
        self.layers: list[DecoderLayer] = list(model.model.layers)
        self.num_layers = len(self.layers)
        self.conv_width = cfg.linear_conv_kernel_dim
        rows = max_len + max_nodes
        with torch.no_grad():  # copies of the weights read at construction (the stacked projections)
            self.weights = [
                GDNWeights.of(lay, dt, self.fused)
                if lay.layer_type == GDN
                else AttentionWeights.of(lay, self.fused)
                for lay in self.layers
            ]
            self.final_norm = model.model.norm.scale()
            if fold_norms is None and self.fuse_verify:
                from repro.gdn.triton_linear import MAX_ROWS

                fold_norms = FOLD_NORMS and max_nodes > MAX_ROWS
            self.fold_norms = bool(fold_norms)
            self.folded_head: torch.Tensor | None = None
            if self.fold_norms:
                if not self.fused:
                    raise ConfigError("fold_norms=True is for the fused decoder's row-tiled verify")
                for w in self.weights:
                    fold_weights(w)
                self.folded_head = fold_head(model.lm_head.weight, self.final_norm)
        self.has_attention = any(lay.layer_type != GDN for lay in self.layers)
        self.fuse_tree_attention = self._tree_attention_flag(fuse_tree_attention)
        if tree_attention_decode and not self.fuse_tree_attention:
            raise ConfigError("tree_attention_decode needs the tree attention kernel (fuse_tree_attention)")
        self.tree_attention_decode = tree_attention_decode
        self.gdn_layers = [i for i, lay in enumerate(self.layers) if lay.layer_type == GDN]
        self.stacked_commit = stacked_commit
        if persistent:
            self._check_persistent(fuse_decode)
            self.fuse_decode = False
        self.persistent = persistent
        self.gdn_states, self.gdn_conv = self._gdn_stacks()
        self.buffers: list[GDNBuffers | AttentionBuffers] = []
        for i, layer in enumerate(self.layers):
            if layer.layer_type == GDN:
                m = layer.linear_attn
                j = self.gdn_layers.index(i)
                self.buffers.append(
                    GDNBuffers(
                        torch.zeros(
                            m.num_v_heads, m.head_v_dim, m.head_k_dim, dtype=self.state_dtype, device=dev
                        )
                        if self.gdn_states is None
                        else self.gdn_states[j],
                        torch.zeros(m.conv_size - 1, m.conv_dim, dtype=dt, device=dev)
                        if self.gdn_conv is None
                        else self.gdn_conv[j],
                    )
                )
            else:
                a = layer.self_attn
                self.buffers.append(
                    AttentionBuffers(
                        *(torch.zeros(a.num_kv_heads, rows, a.head_dim, dtype=dt, device=dev) for _ in "kv")
                    )
                )
        self.length = torch.zeros(1, dtype=torch.long, device=dev)
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.pick = torch.zeros(1, dtype=torch.long, device=dev)  # decode_pick's argmax
        self.rows = torch.arange(rows, device=dev)
        self.decode_slot = TreeSlot(self, 1)
        self.rope = decode_rope(self) if self.fused and self.has_attention else None
        self.layer_calls = {"linear_attention": 0, "full_attention": 0}
        self.pending_sets: list[PendingSet] = []  # the delayed commit's two stashes (ensure_pending)
        self.persistent_gdn = persistent_layers(self) if persistent else None

    def _check_persistent(self, fuse_decode: bool | None) -> None:
        """A ConfigError unless the persistent decode launch takes this decoder."""
        if not self.fused or self.has_attention or not self.gdn_layers or self.state_dtype != torch.float32:
            raise ConfigError(
                "persistent=True takes a pure-GDN model on the fused Triton decoder with float32 states"
            )
        if fuse_decode:
            raise ConfigError("persistent=True replaces the fused decode kernels: leave fuse_decode off")

    def _gdn_shape(self) -> tuple[int, int, int, int, int]:
        """(HV, d_v, d_k, W-1, C) of the GDN layers; a ConfigError for stacked buffers when they differ."""
        shapes = {
            (m.num_v_heads, m.head_v_dim, m.head_k_dim, m.conv_size - 1, m.conv_dim)
            for m in (self.layers[i].linear_attn for i in self.gdn_layers)
        }
        if len(shapes) != 1:
            raise ConfigError(f"stacked_commit needs GDN layers of one shape, got {sorted(shapes)}")
        return shapes.pop()

    def _gdn_stacks(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """With ``stacked_commit`` or ``persistent`` (and GDN layers): the stacked recurrent states and conv
        histories whose views [j] are GDN layer j's buffers (allocated once: graphs keep their addresses)."""
        if not (self.stacked_commit or self.persistent) or not self.gdn_layers:
            return None, None
        hv, dv, dk, hist, c = self._gdn_shape()
        n = len(self.gdn_layers)
        states = torch.zeros(n, hv, dv, dk, dtype=self.state_dtype, device=self.device)
        return states, torch.zeros(n, hist, c, dtype=self.dtype, device=self.device)

    def stacked_factors(self, rows: int, conv: bool) -> StackedFactors | None:
        """Stacked verify outputs of every GDN layer for ``rows`` nodes (``conv``: with the conv inputs),
        or None without ``stacked_commit`` or GDN layers. The factors in the tree kernels' dtype (float32
        on Triton, the state dtype on the reference)."""
        if self.gdn_states is None:
            return None
        hv, dv, dk, _, c = self._gdn_shape()
        n, dev = len(self.gdn_layers), self.device
        dt = torch.float32 if self.kernel == "triton" else self.state_dtype
        return StackedFactors(
            torch.zeros(n, rows, hv, dv, dtype=dt, device=dev),
            torch.zeros(n, rows, hv, dk, dtype=dt, device=dev),
            torch.zeros(n, rows, hv, dtype=dt, device=dev),
            torch.zeros(n, rows, c, dtype=self.dtype, device=dev) if conv else None,
        )

    @property
    def _stacked_path(self) -> bool:
        """Whether closed-form commits and flushes run as one stacked Triton launch."""
        return self.gdn_states is not None and self._path_commit is not None

    def _tree_attention_flag(self, forced: bool | None) -> bool:
        """``fuse_tree_attention`` resolved: forced on needs the fused decoder and a head dim the kernel
        takes; None: on exactly then."""
        if not self.fused:
            if forced:
                raise ConfigError("fuse_tree_attention=True runs inside the fused decoder: needs fused=True")
            return False
        from repro.gdn.triton_attention import TREE_ATTENTION_MAX_HEAD_DIM

        head_dim = self.model.config.head_dim
        fits = head_dim <= TREE_ATTENTION_MAX_HEAD_DIM
        if forced and not fits:
            raise ConfigError(
                f"fuse_tree_attention=True: head_dim {head_dim} exceeds the tree attention kernel's "
                f"{TREE_ATTENTION_MAX_HEAD_DIM}"
            )
        return fits if forced is None else forced

    # ------------------------------------------------------------------ host-side state I/O

    def load(self, state: ModelState) -> None:
        """Copy a HybridLM state (e.g. after ``model.prefill``) into the buffers."""
        if state.position > self.max_len:
            raise ConfigError(
                f"state holds {state.position} tokens; this decoder's max_len is {self.max_len}"
            )
        for buf, s in zip(self.buffers, state.layers):
            if isinstance(buf, GDNBuffers):
                assert isinstance(s, GDNLayerState)
                buf.recurrent.copy_(s.recurrent)
                buf.conv.copy_(s.conv)
            else:
                assert isinstance(s, AttentionLayerState)
                n = s.keys.shape[0]
                buf.keys.zero_()  # rows past the length are masked, but must stay finite (0 * NaN)
                buf.values.zero_()
                buf.keys[:, :n].copy_(s.keys.transpose(0, 1))
                buf.values[:, :n].copy_(s.values.transpose(0, 1))
        self.length.fill_(state.position)
        for stash in self.pending_sets:  # a new state: nothing of the old one is pending
            stash.node.fill_(-1)

    def export(self) -> ModelState:
        """The buffers as a HybridLM state (copies; reads the length from the device); a pending
        delayed commit is folded in first."""
        for parity in range(len(self.pending_sets)):
            self.flush(parity)
        n = int(self.length)
        layers: list[GDNLayerState | AttentionLayerState] = []
        for buf in self.buffers:
            if isinstance(buf, GDNBuffers):
                layers.append(GDNLayerState(buf.recurrent.clone(), buf.conv.clone()))
            else:
                layers.append(
                    AttentionLayerState(
                        buf.keys[:, :n].transpose(0, 1).clone(), buf.values[:, :n].transpose(0, 1).clone()
                    )
                )
        return ModelState(layers, n)

    def set_token(self, token: int) -> None:
        """The token :meth:`decode_step` folds in next (host to device)."""
        self.token.fill_(token)

    # ------------------------------------------------------------------- capturable steps

    @torch.no_grad()
    def decode_step(self) -> torch.Tensor:
        """Fold ``self.token`` into the state; returns its logits [1, V] (the next token's; with
        ``fuse_decode`` their argmax is in ``self.pick`` too)."""
        if self.fuse_decode:
            return self._fused_decode()
        logits = self._forward(self.token, self.length, self.decode_slot, decode=True)
        self.length.add_(1).clamp_(max=self.max_len)
        return logits

    @torch.no_grad()
    def decode_pick(self) -> torch.Tensor:
        """:meth:`decode_step`, then its argmax into ``self.pick`` (greedy AR reads that alone)."""
        logits = self.decode_step()
        if not self.fuse_decode:  # the fused step has written it
            self.pick.copy_(logits[0].argmax(-1, keepdim=True))
        return logits

    def _fused_decode(self) -> torch.Tensor:
        """A decode step on the fused decode kernels: per GDN layer :func:`fused_decode_gdn` (5 launches
        with ``gemv``), per attention layer :func:`fused_decode_attention` (5), the final norm, LM head,
        argmax into ``self.pick`` and the length's advance in two (:func:`decode_head`); the embedding
        row is the one other launch."""
        x = self.model.model.embed_tokens(self.token)
        for layer, w, buf in zip(self.layers, self.weights, self.buffers):
            self.layer_calls[layer.layer_type] += 1
            if isinstance(buf, GDNBuffers):
                assert isinstance(w, GDNWeights)
                x = fused_decode_gdn(layer, w, buf, x, self.decode_slot.conv_index, self.gemv)
            else:
                assert isinstance(w, AttentionWeights) and self.rope is not None
                x = fused_decode_attention(layer, w, buf, x, self.rope, self.length, self.gemv)
        return decode_head(self, x)

    @torch.no_grad()
    def verify(self, slot: TreeSlot) -> torch.Tensor:
        """Logits [T, V] of every node of the slot's tree (first its derived inputs, on a deriving
        slot); the state is left untouched."""
        if slot.derive_inputs and self.fuse_bookkeeping:
            from repro.models.slot_kernels import derive_slot  # Triton is optional: imported here

            derive_slot(slot.tokens, slot.parents, slot.depth, slot.ancestors, slot.conv_index, slot.first)
        elif slot.derive_inputs:
            slot.derive()
        if slot.gdn_rows is not None:
            slot.gdn_rows.copy_(slot.ancestors)
        positions = self.length + slot.depth - 1
        with verify_launches():  # its kernels release the next launch at their exit (triton_common)
            slot.logits = self._forward(slot.tokens, positions, slot, decode=False)
        if slot.parity is not None:  # the other stash's pending commit is in the states now
            self.pending_sets[1 - slot.parity].node.fill_(-1)
        return slot.logits

    @torch.no_grad()
    def accept(self, slot: TreeSlot) -> None:
        """Greedy longest match from node 0 into ``slot.node`` and ``slot.bonus`` (on the device).

        A node is accepted when every node on its path below the root carries its parent's argmax
        token and is the first child of its parent with that token (TargetMatch's walk).
        """
        assert slot.logits is not None, "verify the slot first"
        if self.fuse_bookkeeping:
            from repro.models.slot_kernels import greedy_node
            from repro.models.topk_kernels import row_argmax

            choice = row_argmax(slot.logits)
            greedy_node(
                choice,
                slot.tokens,
                slot.parents,
                slot.first,
                slot.depth,
                slot.ancestors,
                slot.node,
                slot.bonus,
            )
            return
        choice = slot.logits.argmax(-1)
        ok = (slot.tokens == choice.index_select(0, slot.parents.clamp(min=0))) & (slot.parents >= 0)
        ok = (ok & slot.first) | (self.rows[: slot.size] == 0)
        accepted = ~(slot.ancestors & ~ok[None, :]).any(dim=-1)
        node = torch.where(accepted, slot.depth, 0).argmax().view(1)
        # index with the 1-element tensor: indexing with a 0-dim one (choice[node]) reads it on the host
        slot.node.copy_(node)
        slot.bonus.copy_(choice.index_select(0, node))

    def path_order(self, slot: TreeSlot, on_path: torch.Tensor) -> torch.Tensor:
        """The nodes of a root-to-node path (``on_path`` [T] bool) by depth, padded to ``max_depth``
        with node 0 (fixed shape: a scatter by depth, the off-path nodes into a dropped slot)."""
        depth = slot.max_depth
        where = torch.where(on_path, slot.depth - 1, depth)
        order = torch.zeros(depth + 1, dtype=torch.long, device=self.device)
        return order.scatter(0, where, self.rows[: slot.size])[:depth]

    @torch.no_grad()
    def accepted_path(self, slot: TreeSlot) -> None:
        """``slot.result`` = [path length, bonus, path nodes by depth, their tokens] of the path into
        ``slot.node`` (after :meth:`accept`): everything the host needs of a greedy step, one read."""
        node = slot.node
        if self.fuse_bookkeeping:
            from repro.models.slot_kernels import path_result

            path_result(node, slot.bonus, slot.tokens, slot.depth, slot.ancestors, slot.result)
            return
        order = self.path_order(slot, slot.ancestors.index_select(0, node)[0])
        depth = slot.max_depth
        slot.result[:1].copy_(slot.depth.index_select(0, node))
        slot.result[1:2].copy_(slot.bonus)
        slot.result[2 : 2 + depth].copy_(order)
        slot.result[2 + depth :].copy_(slot.tokens.index_select(0, order))

    @torch.no_grad()
    def commit(self, slot: TreeSlot, strategy: str = "replay") -> None:
        """Fold the path from the root to ``slot.node`` into the buffers (after :meth:`verify`).

        ``delayed`` (a slot with a parity): conv histories, attention rows and the length as always, but
        the GDN states' closed-form update is only recorded in the slot's stash (:class:`PendingSet`);
        the next verification on a slot of the other parity folds it in, or :meth:`flush` does."""
        check_static_strategy(strategy)
        if slot.verifier == "chain" and strategy != "replay":
            raise ConfigError(f"the chain verifier commits by replay only, not {strategy!r}")
        if strategy == "snapshot" and not slot.snapshots:
            raise ConfigError("snapshot commit needs a slot made with snapshots=True")
        delayed = strategy == DELAYED
        if delayed and slot.parity is None:
            raise ConfigError("a delayed commit needs a slot made with a parity (TreeSlot(parity=0 or 1))")
        node = slot.node
        fused = self.fuse_bookkeeping
        if fused:
            from repro.models import slot_kernels
        path_index = None
        stacked = strategy == "closed_form" and self._stacked_path and slot.stack is not None
        triton_gdn = delayed or (strategy == "closed_form" and self._path_commit is not None)
        on_path = path_len = None  # the torch commits': the path's mask [T] and its length [1]
        if not fused or (self.gdn_layers and not triton_gdn):
            on_path = slot.ancestors.index_select(0, node)[0]
            path_len = slot.depth.index_select(0, node)
        if stacked:  # every GDN layer's state and conv history in one launch
            self._commit_stacked(slot)
        elif strategy == "closed_form" and self._path_commit is not None:
            path_index = self._write_path_index(slot.ancestors, node, slot.path_index)
        for buf, saved in zip(self.buffers, slot.saved):
            if isinstance(buf, GDNBuffers) and stacked:
                continue
            elif isinstance(buf, GDNBuffers) and delayed:
                assert isinstance(saved, GDNSaved), "verify the slot first"
                self._commit_conv(buf, saved.conv_inputs, slot.conv_index, node)
            elif isinstance(buf, GDNBuffers) and strategy == "closed_form" and self._path_commit is not None:
                assert isinstance(saved, GDNSaved), "verify the slot first"
                f = saved.factors
                conv = (buf.conv, saved.conv_inputs, slot.conv_index)
                self._path_commit(
                    buf.recurrent, f.delta, f.k, f.gate_cum, slot.ancestors, node, conv=conv, path=path_index
                )
            elif isinstance(buf, GDNBuffers):
                assert isinstance(saved, GDNSaved), "verify the slot first"
                self._commit_conv(buf, saved.conv_inputs, slot.conv_index, node)
                assert on_path is not None and path_len is not None
                self._commit_gdn(buf, saved, slot, node, on_path, path_len, strategy)
            elif fused:
                assert isinstance(saved, AttentionSaved), "verify the slot first"
                args = (slot.ancestors, slot.depth, node, self.length)
                slot_kernels.commit_rows(buf.keys, buf.values, saved.k, saved.v, *args)
            else:
                assert isinstance(saved, AttentionSaved) and on_path is not None, "verify the slot first"
                dest = torch.where(
                    on_path, self.length + slot.depth - 1, self.max_len + self.rows[: slot.size]
                )
                buf.keys.index_copy_(1, dest, saved.k.transpose(0, 1))
                buf.values.index_copy_(1, dest, saved.v.transpose(0, 1))
        if delayed:
            assert slot.parity is not None
            stash = self.pending_sets[slot.parity]
            n = slot.size
            stash.ancestors[:n, :n].copy_(slot.ancestors)
            stash.ancestors[:n, n:].zero_()  # columns of a larger slot's earlier path: not on this one
            stash.node.copy_(node)
            if self._path_commit is not None:  # always with the node: a stash's index is its node's path
                from repro.gdn.triton_commit import write_path_index  # Triton is optional: imported here

                write_path_index(slot.ancestors, node, stash.path)
        if fused:
            slot_kernels.advance_length(self.length, slot.depth, node, self.max_len)
        else:
            assert path_len is not None
            self.length.add_(path_len).clamp_(max=self.max_len)

    def _commit_stacked(self, slot: TreeSlot) -> None:
        """The closed-form commit of every GDN layer (states and conv histories) from the slot's stacked
        factors: the path index once, then one :func:`~repro.gdn.triton_commit.commit_path_indexed`."""
        from repro.gdn.triton_commit import write_path_index

        assert slot.stack is not None and slot.stack.conv_inputs is not None and self.gdn_conv is not None
        assert self._path_commit is not None and all(slot.saved[i] is not None for i in self.gdn_layers), (
            "verify the slot first"
        )
        write_path_index(slot.ancestors, slot.node, slot.path_index)
        f = slot.stack
        conv = (self.gdn_conv, f.conv_inputs, slot.conv_index)
        path = slot.path_index
        state = self.gdn_states
        self._path_commit(state, f.delta, f.k, f.gate_cum, slot.ancestors, slot.node, conv=conv, path=path)

    def ensure_pending(self, rows: int) -> bool:
        """Make the delayed commit's two stashes (:class:`PendingSet`) for slots of up to ``rows`` nodes,
        or larger ones when they hold fewer (a commit pending in the old ones is flushed first); True when
        they were made: graphs that read the old ones must be captured again."""
        if self.pending_sets and self.pending_sets[0].rows >= rows:
            return False
        if rows > self.max_nodes:
            raise ConfigError(f"delayed-commit stashes of {rows} rows exceed max_nodes ({self.max_nodes})")
        for parity in range(len(self.pending_sets)):
            self.flush(parity)
        dev = self.device
        dt = torch.float32 if self.kernel == "triton" else self.state_dtype  # the tree kernels' factors
        gdn_layers = [(i, lay.linear_attn) for i, lay in enumerate(self.layers) if lay.layer_type == GDN]

        def per_layer(dims: Callable[[GatedDeltaNet], tuple[int, ...]]) -> dict[int, torch.Tensor]:
            return {i: torch.zeros(rows, *dims(m), dtype=dt, device=dev) for i, m in gdn_layers}

        def factors() -> tuple[tuple[dict[int, torch.Tensor], ...], StackedFactors | None]:
            stacked = self.stacked_factors(rows, conv=False)  # stacked_commit: views of one stack
            if stacked is not None:
                return stacked.views(self.gdn_layers), stacked
            delta = per_layer(lambda m: (m.num_v_heads, m.head_v_dim))
            k = per_layer(lambda m: (m.num_v_heads, m.head_k_dim))
            return (delta, k, per_layer(lambda m: (m.num_v_heads,))), None

        def stash() -> PendingSet:
            (delta, k, gate_cum), stacked = factors()
            return PendingSet(
                delta, k, gate_cum, torch.zeros(rows, rows, dtype=torch.bool, device=dev),
                torch.full((1,), -1, dtype=torch.long, device=dev),
                torch.zeros(rows + 1, dtype=torch.int32, device=dev), stacked,
            )  # fmt: skip

        self.pending_sets = [stash() for _ in range(2)]
        return True

    @torch.no_grad()
    def flush(self, parity: int) -> None:
        """Fold stash ``parity``'s pending commit into the GDN states now (nothing pending: unchanged);
        capturable. The path commit of the Triton kernels for a float32 state, the torch reference
        (:func:`~repro.gdn.reference.apply_pending`) otherwise."""
        stash = self.pending_sets[parity]
        if self._stacked_path and stash.stacked is not None:  # every GDN layer in one launch
            from repro.gdn.triton_commit import write_path_index

            write_path_index(stash.ancestors, stash.node, stash.path)
            f = stash.stacked
            assert self._path_commit is not None and self.gdn_states is not None
            self._path_commit(
                self.gdn_states, f.delta, f.k, f.gate_cum, stash.ancestors, stash.node, path=stash.path
            )
            stash.node.fill_(-1)
            return
        path_index = None
        if self._path_commit is not None:
            path_index = self._write_path_index(stash.ancestors, stash.node, stash.path)
        for i, buf in enumerate(self.buffers):
            if isinstance(buf, GDNBuffers):
                if self._path_commit is not None:
                    p = stash.pending(i)
                    self._path_commit(
                        buf.recurrent, p.delta, p.k, p.gate_cum, p.ancestors, p.node, path=path_index
                    )
                else:
                    gdn.apply_pending(buf.recurrent, stash.pending(i))
        stash.node.fill_(-1)

    def _write_path_index(
        self, ancestors: torch.Tensor, node: torch.Tensor, path: torch.Tensor
    ) -> torch.Tensor | None:
        """With ``indexed_commit``: the path to ``node`` into ``path`` (one launch, read by every GDN
        layer's path commit), returned; else None (each layer's commit gathers the path itself)."""
        if not self.indexed_commit:
            return None
        from repro.gdn.triton_commit import write_path_index

        write_path_index(ancestors, node, path)
        return path

    @torch.no_grad()
    def step(self, slot: TreeSlot, strategy: str = "replay") -> torch.Tensor:
        """verify, accept and commit in one go (one graph); returns the verify logits."""
        logits = self.verify(slot)
        self.accept(slot)
        self.commit(slot, strategy)
        return logits

    # --------------------------------------------------------------------------- internals

    def _forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, slot: TreeSlot, decode: bool
    ) -> torch.Tensor:
        glue = self.glue
        gemv = self.gemv if decode else self._verify_rows(slot)  # the triton_linear kernels, or cuBLAS
        norm = self._rms_norm()
        x = self.model.model.embed_tokens(tokens)
        if decode and self.persistent_gdn is not None:  # every layer in one launch
            from repro.gdn.triton_persistent import decode_layers

            decode_layers(self.persistent_gdn, x)
            self.layer_calls["linear_attention"] += self.num_layers
            return self._head(x, gemv)
        # every attention layer in one kernel (verify; decode too with tree_attention_decode)
        tree_attention = self.fuse_tree_attention and (not decode or self.tree_attention_decode)
        if self.has_attention and not tree_attention:  # shared by every attention layer: made once per step
            prefix_blocked = self.rows >= self.length
            attn = next(lay.self_attn for lay in self.layers if lay.layer_type != GDN)
            tree_blocked = ~slot.ancestors.repeat(attn.num_heads // attn.num_kv_heads, 1)
            cos, sin = rotary_tables(positions, attn.inv_freq, self.dtype)
        for i, (layer, w, buf) in enumerate(zip(self.layers, self.weights, self.buffers)):
            self.layer_calls[layer.layer_type] += 1
            if isinstance(buf, GDNBuffers) and self.fused:
                assert isinstance(w, GDNWeights)
                x = self._fused_gdn(i, layer, w, buf, x, slot, decode, gemv)
            elif tree_attention:
                assert (
                    isinstance(w, AttentionWeights)
                    and isinstance(buf, AttentionBuffers)
                    and self.rope is not None
                )
                x, saved = fused_verify_attention(layer, w, buf, x, self.rope, self.length, slot, gemv)
                if decode:  # the token's key and value into the cache at its position
                    buf.keys.index_copy_(1, self.length, saved.k.transpose(0, 1))
                    buf.values.index_copy_(1, self.length, saved.v.transpose(0, 1))
                else:
                    slot.saved[i] = saved
            elif isinstance(buf, GDNBuffers):
                assert isinstance(w, GDNWeights)
                z, conv_inputs, q, k, v, g, beta = glue["gdn_prologue"](
                    layer, w, x, buf.conv, slot.conv_index, self.kernel_dtype
                )
                scale = layer.linear_attn.head_k_dim**-0.5
                if decode:
                    o, new_state = self._recurrent(q, k, v, g, beta, buf.recurrent, scale)
                    buf.recurrent.copy_(new_state)
                    if buf.conv.shape[0]:  # the window moves by one token
                        buf.conv.copy_(torch.cat([buf.conv, conv_inputs.to(buf.conv.dtype)])[1:])
                else:
                    o, factors = self._gdn_core(i, slot, buf, q, k, v, g, beta, scale)
                    self._save_gdn(i, slot, conv_inputs, k, factors)
                x = glue["gdn_epilogue"](layer, w, x, o, z)
            else:
                assert isinstance(w, AttentionWeights)
                q, gate, k, v = glue["attention_prologue"](layer, w, x, cos, sin, norm, gemv)
                out = glue["attention_core"](q, k, v, buf.keys, buf.values, prefix_blocked, tree_blocked)
                if decode:
                    buf.keys.index_copy_(1, self.length, k.transpose(0, 1))
                    buf.values.index_copy_(1, self.length, v.transpose(0, 1))
                else:
                    slot.saved[i] = AttentionSaved(k, v)
                x = glue["attention_epilogue"](layer, w, x, out, gate, gemv)
            if not decode and i in slot.capture:  # the layer's output, kept (graph outputs are rewritten)
                slot.hidden[i] = x
        return self._head(x, gemv)

    def _rms_norm(self) -> Callable[..., torch.Tensor]:
        """The RMSNorm of this decoder's glue: the Triton kernel in the fused decoder, else torch's."""
        if self.fused:
            from repro.gdn import triton_decode

            return triton_decode.rms_norm
        return rms_norm

    def _head(self, x: torch.Tensor, gemv: bool) -> torch.Tensor:
        """The final norm and the LM head: logits [n, V]."""
        norm = self._rms_norm()
        head, eps = self.model.lm_head, self.model.model.norm.eps
        if gemv:
            from repro.gdn.triton_linear import norm_linear

            return norm_linear(x, self.final_norm, eps, head.weight, head.bias, folded=self.folded_head)
        return head(norm(x, self.final_norm, eps))

    def _verify_rows(self, slot: TreeSlot) -> bool:
        """Whether a verify of ``slot`` runs its matmuls on the row-tiled kernels (``fuse_verify``)."""
        if not self.fuse_verify:
            return False
        from repro.gdn.triton_linear import MAX_VERIFY_ROWS

        return slot.size <= MAX_VERIFY_ROWS

    def tree_kernel_at(self, nodes: int) -> str | None:
        """The Triton tree kernel a verify of ``nodes`` nodes runs: the forced one, else
        :func:`select_tree_kernel` for the size, its "split" as "split_peel" where :data:`PEEL_ROOT` says
        (None: the reference backend)."""
        if self.tree_kernel is None or self._tree_forced:
            return self.tree_kernel
        cfg = self.model.config
        dims = (cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        kernel = select_tree_kernel(self.kernel_dtype, cfg.linear_num_value_heads, nodes, dims)
        return "split_peel" if kernel == "split" and PEEL_ROOT and peels_root(nodes) else kernel

    def _tree_for(self, nodes: int) -> Callable[..., Any]:
        """The tree function of a verify of ``nodes`` nodes (:meth:`tree_kernel_at`)."""
        kernel = self.tree_kernel_at(nodes)
        if kernel is None or kernel == self.tree_kernel:
            return self._tree
        return tree_function(self.kernel, self.device, interpreter=True, kernel=kernel)

    def _gdn_core(
        self,
        i: int,
        slot: TreeSlot,
        buf: GDNBuffers,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: float,
    ) -> tuple[torch.Tensor, TreeFactors]:
        """A GDN layer's verify of the slot's nodes from the committed state (untouched): the tree
        kernel, or a chain slot's chain evaluator (fla's chunk kernel, :mod:`repro.models.static_chain`).
        A delayed-commit slot (layer ``i``) first folds the other stash's pending commit into the state
        (inside the Triton tree kernel for a float32 state, in torch before it otherwise) and writes its
        factors into its own stash."""
        if slot.verifier == "chain":
            return slot.core(q, k, v, g, beta, buf.recurrent, scale)  # type: ignore[attr-defined]
        if slot.parity is not None:
            mine, other = self.pending_sets[slot.parity], self.pending_sets[1 - slot.parity]
            pending: PendingCommit | None = other.pending(i, self.indexed_commit)
            if self._path_commit is None:
                gdn.apply_pending(buf.recurrent, other.pending(i))
                pending = None
            n = slot.size
            o = torch.empty(n, v.shape[1], v.shape[2], dtype=q.dtype, device=self.device)
            out = (o, mine.delta[i][:n], mine.gate_cum[i][:n], mine.k[i][:n])
            return self._tree_for(slot.size)(
                q, k, v, g, beta, buf.recurrent, slot.parents, slot.gdn_mask, scale, False,
                self.precision, pending=pending, out=out,
            )  # fmt: skip
        out = None
        if slot.stack is not None:  # stacked_commit: the factors into the slot's stack (views per layer)
            j = self.gdn_layers.index(i)
            o = torch.empty(slot.size, v.shape[1], v.shape[2], dtype=q.dtype, device=self.device)
            out = (o, slot.stack.delta[j], slot.stack.gate_cum[j], slot.stack.k[j])
        return self._tree_for(slot.size)(
            q, k, v, g, beta, buf.recurrent, slot.parents, slot.gdn_mask, scale, slot.snapshots,
            self.precision, out=out,
        )  # fmt: skip

    def _fused_gdn(
        self,
        i: int,
        layer: DecoderLayer,
        w: GDNWeights,
        buf: GDNBuffers,
        x: torch.Tensor,
        slot: TreeSlot,
        decode: bool,
        gemv: bool,
    ) -> torch.Tensor:
        """A GDN layer through :func:`fused_gdn_layer` (decode: in place, on the GEMV kernels with
        ``gemv``; verify: saves for commit)."""
        core = None
        if not decode:
            scale = layer.linear_attn.head_k_dim**-0.5

            def core(q, k, v, g, beta):  # noqa: ANN001, ANN202 - the verify core on this slot
                return self._gdn_core(i, slot, buf, q, k, v, g, beta, scale)

        x, conv_inputs, k, factors = fused_gdn_layer(
            layer, w, x, buf, slot.conv_index, core, self.kernel_dtype, gemv
        )
        if factors is not None:
            assert k is not None
            self._save_gdn(i, slot, conv_inputs, k, factors)
        return x

    def _save_gdn(
        self, i: int, slot: TreeSlot, conv_inputs: torch.Tensor, k: torch.Tensor, factors: TreeFactors
    ) -> None:
        """What GDN layer ``i``'s verify leaves for the commit (a stacked slot: its conv inputs copied
        into the stack, whose view it keeps)."""
        if slot.stack is not None and slot.stack.conv_inputs is not None:
            stacked = slot.stack.conv_inputs[self.gdn_layers.index(i)]
            stacked.copy_(conv_inputs)
            conv_inputs = stacked
        slot.saved[i] = GDNSaved(conv_inputs, k, factors)

    def _commit_conv(
        self, buf: GDNBuffers, conv_inputs: torch.Tensor, conv_index: torch.Tensor, node: torch.Tensor
    ) -> None:
        """The last W-1 conv inputs along the path to ``node``: its gather row without the oldest tap."""
        hist = buf.conv.shape[0]
        if hist == 0:
            return
        if self.kernel == "triton":
            from repro.gdn.triton_commit import commit_conv_fused

            commit_conv_fused(buf.conv, conv_inputs, conv_index, node)
            return
        idx = conv_index.index_select(0, node)[0, :hist].flip(0)
        buf.conv.copy_(torch.cat([buf.conv, conv_inputs.to(buf.conv.dtype)], dim=0)[idx])

    def _commit_gdn(
        self,
        buf: GDNBuffers,
        saved: GDNSaved,
        slot: TreeSlot,
        node: torch.Tensor,
        on_path: torch.Tensor,
        path_len: torch.Tensor,
        strategy: str,
    ) -> None:
        f = saved.factors
        state = buf.recurrent
        if strategy == "snapshot":
            assert f.snapshots is not None
            state.copy_(f.snapshots.index_select(0, node)[0])
        elif strategy == "closed_form":  # torch (Triton float32 states take commit()'s path commit)
            g_end = f.gate_cum.index_select(0, node)  # [1, HV]
            weights = (g_end - f.gate_cum).masked_fill(~on_path[:, None], float("-inf")).exp()  # [T, HV]
            update = torch.einsum("mh,mhv,mhk->hvk", weights, f.delta, f.k)
            state.copy_(g_end[0].exp()[:, None, None] * state + update)
        else:  # replay: the path's nodes by depth, padded with identity steps (g = beta = 0)
            depth = slot.max_depth
            order = self.path_order(slot, on_path)
            valid = (self.rows[:depth] < path_len)[:, None]
            k = saved.k[order]
            g = torch.where(valid, f.g[order], 0.0)
            beta = torch.where(valid, f.beta[order], 0.0)
            _, new_state = self._recurrent(k, k, f.v[order], g, beta, state, 0.0)
            state.copy_(new_state)
