"""The chain verifier of fla_sd (SpecLA's FLA-SD baseline) on the static decoder and its graphs.

What a user of flash-linear-attention gets for speculative decoding of a draft chain: the GDN layers
verify the chain with fla's stock ``chunk_gated_delta_rule`` from the committed state (read, never
written; the kernel's final state is dropped), and the commit runs the accepted tokens again through
fla's ``fused_recurrent_gated_delta_rule``. Attention layers are the tree verify's (a chain's ancestor
mask is the causal mask).

A :class:`ChainSlot` is a :class:`~repro.models.static.TreeSlot` whose tree is a chain, padded as
every slot is (root-level token-0 nodes after the real ones). The chunk kernel reads the slot's
nodes as one chain of the slot's size: nodes after the real ones cannot change the real nodes'
outputs in a causal chain, and the attention layers' ancestor mask isolates the pads. Padding never
enters the commit: the accepted path ends at a real node (``set_accepted`` checks it against the
real chain; the device accept never enters a root-level pad), and the replay masks every step past
the path's length.

The commit is :meth:`StaticDecoder.commit` with strategy ``replay``: the backend's recurrence
(:func:`repro.gdn.backends.recurrent_function`, fla's fused kernel with the triton backend) over
the slot's full length, the steps past the accepted length identity steps (g = beta = 0, exact: the
state is unchanged bit for bit). The accepted length stays a device scalar, so one commit graph per
slot size serves every accepted length and the device accept needs no host read; the price is a
recurrence over ``size`` steps instead of the accepted ones (one launch per layer either way).
"""

from __future__ import annotations

import importlib.util

import torch

from repro.errors import ConfigError
from repro.gdn.backends import ChainFn, chain_function
from repro.gdn.reference import TreeFactors
from repro.models.static import StaticDecoder, TreeSlot
from repro.tree import Tree


def chain_evaluator(kernel: str, device: torch.device) -> ChainFn:
    """The backend's chain evaluator for a decoder on ``kernel``: fla's chunk kernel on CUDA with the
    triton backend when fla is installed, the torch chunked form (:func:`~repro.gdn.reference.chunk_gdn`)
    otherwise (CPU, Triton's interpreter)."""
    fla = kernel == "triton" and device.type == "cuda" and importlib.util.find_spec("fla") is not None
    return chain_function("triton" if fla else "reference", device)


class ChainSlot(TreeSlot):
    """A slot of ``size`` chain nodes verified by the backend's chain evaluator (see the module)."""

    verifier = "chain"

    def __init__(
        self, decoder: StaticDecoder, size: int, capture: tuple[int, ...] = (), derive: bool = False
    ) -> None:
        self.evaluate = chain_evaluator(decoder.kernel, decoder.device)
        super().__init__(decoder, size, capture=capture, derive=derive)

    def set_tree(self, tree: Tree, pad: bool = False) -> None:
        """Copy a chain of ``size`` nodes (``pad``: up to ``size``, padded as every slot pads)."""
        if not tree.is_chain:
            raise ConfigError("a chain slot verifies chains only; use a tree slot for trees")
        super().set_tree(tree, pad=pad)

    def core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        scale: float,
    ) -> tuple[torch.Tensor, TreeFactors]:
        """A GDN layer's verify of the chain from ``state`` (untouched): the outputs [T, HV, d_v] and
        the factors the replay commit reads (v, g, beta; the keys travel in GDNSaved). q, k [T, H, d_k]."""
        o, _ = self.evaluate(q[None], k[None], v[None], g[None], beta[None], state[None], scale)
        empty = v.new_empty(0)
        return o[0], TreeFactors(empty, g.new_empty(0), empty, v, g, beta)
