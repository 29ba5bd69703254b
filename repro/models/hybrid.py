"""The hybrid GDN language model and its decoding API: prefill, verify(tree), commit(path).

``verify`` evaluates every node of a draft tree against the committed state in one pass and
never mutates that state; ``commit`` folds an accepted root-to-node path into a new state with
one of three exact strategies (``snapshot``, ``replay``, ``closed_form``). The strategy is an
argument of each call (``verify(..., strategy=...)``, carried by the verification to ``commit``),
never state on the model: routes sharing one model cannot leak it into each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from repro.errors import ConfigError
from repro.gdn.backends import check_backend
from repro.models.config import HybridConfig
from repro.models.layers import AttentionVerification, DecoderLayer, GDNVerification, RMSNorm
from repro.models.state import AttentionLayerState, GDNLayerState, ModelState
from repro.tree import DeviceTree, Tree

COMMIT_STRATEGIES = ("snapshot", "replay", "closed_form")
VERIFIERS = ("tree", "chain")
PREFILL_CHUNK = 64


@dataclass
class Verification:
    """Per-node logits [n, V] (and captured hidden states) of one tree, plus commit data."""

    tree: Tree
    logits: torch.Tensor
    hidden: dict[int, torch.Tensor]
    layers: list[GDNVerification | AttentionVerification]
    position: int
    strategy: str = field(default="closed_form")
    verifier: str = field(default="tree")


class HybridLM(nn.Module):
    """A decoder of GDN and gated-attention layers, interleaved as ``config.layer_types`` says."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.model.layers = nn.ModuleList(DecoderLayer(config, t) for t in config.layer_types)
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_gdn_backend(self, name: str) -> HybridLM:
        """Evaluate GDN layers with ``reference`` (pure torch) or ``triton`` (fused CUDA kernels)."""
        check_backend(name, self.device, dtype=self.dtype)  # the name, the device and the dtype
        for layer in self.model.layers:
            if layer.layer_type == "linear_attention":
                layer.linear_attn.backend = name
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def empty_state(self) -> ModelState:
        return ModelState([layer.mixer.empty_state(self.dtype, self.device) for layer in self.model.layers])

    @torch.no_grad()
    def verify(
        self,
        state: ModelState,
        tree: Tree,
        capture: tuple[int, ...] = (),
        strategy: str = "closed_form",
        verifier: str = "tree",
    ) -> Verification:
        """Logits of every tree node given the committed state; the state is left untouched.

        ``strategy`` is how :meth:`commit` will fold the accepted path in (``snapshot`` makes
        verify keep per-node GDN states); the verification carries it to ``commit``.
        ``verifier="chain"`` (a chain only, commit ``replay``) is the stock path of a
        flash-linear-attention user: GDN layers run the backend's chunk form from the committed
        state without writing it, and the commit replays the accepted tokens through the backend's
        recurrence (fla's ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule`` on
        ``triton``, their torch references elsewhere); attention layers are as for trees.
        """
        check_strategy(strategy)
        check_verifier(verifier, strategy, tree)
        device = self.device
        positions = state.position + tree.depth.to(device) - 1
        logits, hidden, saved = self._tree_pass(
            state,
            tree.tokens.to(device),
            tree.parents.to(device),
            tree.ancestor_mask.to(device),
            positions,
            capture,
            strategy == "snapshot",
            verifier == "chain",
        )
        return Verification(tree, logits, hidden, saved, state.position, strategy, verifier)

    def forward_train(self, ids: torch.Tensor, capture: tuple[int, ...] = ()) -> torch.Tensor:
        """Teacher-forced logits [B, L, V] of sequences ``ids`` [B, L] from an empty state, with
        autograd on (see :meth:`forward_chain`)."""
        return self.forward_chain(ids, capture)[0]

    def forward_train_hidden(
        self, ids: torch.Tensor, capture: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Logits [B, L, V] and outputs [B, L, d] of the ``capture`` layers, differentiable."""
        logits, hidden, _ = self.forward_chain(ids, capture)
        return logits, hidden

    def forward_chain(
        self, ids: torch.Tensor, capture: tuple[int, ...] = (), state: ModelState | None = None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], list[GDNLayerState | AttentionLayerState]]:
        """Batched chains ``ids`` [B, L] after ``state`` (one shared by every row, or batched per row;
        None = empty).

        Returns logits [B, L, V], the ``capture`` layers' outputs [B, L, d] and each layer's
        batched final state. Row b equals ``verify(state, Tree.chain(ids[b]))`` (pinned in tests);
        GDN layers run the backend's chain evaluator (chunked WY form in torch, or fla's chunk
        kernel on CUDA) and attention layers one causal attention, so training and prefill are
        batched. Autograd follows the caller's mode.
        """
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ConfigError(f"forward_chain needs token ids [B, L] with L >= 1, got {tuple(ids.shape)}")
        ids = ids.to(self.device)
        start = 0 if state is None else state.position
        positions = torch.arange(start, start + ids.shape[1], device=self.device)
        x = self.model.embed_tokens(ids)
        hidden: dict[int, torch.Tensor] = {}
        finals: list[GDNLayerState | AttentionLayerState] = []
        for i, layer in enumerate(self.model.layers):
            layer_state = None if state is None else state.layers[i]
            h = layer.input_layernorm(x)
            if layer.layer_type == "linear_attention":
                out, final = layer.linear_attn.forward_chain(h, layer_state)
            else:
                out, final = layer.self_attn.forward_chain(h, layer_state, positions)
            finals.append(final)
            x = x + out
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in capture:
                hidden[i] = x
        return self.lm_head(self.model.norm(x)), hidden, finals

    def _tree_pass(
        self,
        state: ModelState,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        ancestors: torch.Tensor,
        positions: torch.Tensor,
        capture: tuple[int, ...],
        keep_snapshots: bool,
        chain: bool = False,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], list[GDNVerification | AttentionVerification]]:
        """The one evaluation of tree nodes against a state (autograd follows the caller's mode);
        ``chain``: GDN layers by the backend's chain form (the nodes are a chain)."""
        x = self.model.embed_tokens(tokens)
        hidden: dict[int, torch.Tensor] = {}
        saved: list[GDNVerification | AttentionVerification] = []
        for i, (layer, layer_state) in enumerate(zip(self.model.layers, state.layers)):
            h = layer.input_layernorm(x)
            if isinstance(layer_state, GDNLayerState):
                out, ver = layer.linear_attn.forward_tree(
                    h, layer_state, parents, ancestors, keep_snapshots, chain
                )
            else:
                out, ver = layer.self_attn.forward_tree(h, layer_state, positions, ancestors)
            saved.append(ver)
            x = x + out
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in capture:
                hidden[i] = x
        return self.lm_head(self.model.norm(x)), hidden, saved

    @torch.no_grad()
    def commit(self, state: ModelState, verification: Verification, path: list[int]) -> ModelState:
        """A new state with the accepted path (root-level node first) folded in, by the strategy
        the verification was made for (``verification.strategy``)."""
        if verification.position != state.position:
            raise ValueError("verification was computed against a different state")
        tree = verification.tree
        if path and tree.path_to(path[-1]) != list(path):
            raise ValueError(f"accepted nodes {path} are not a root-to-node path of the tree")
        layers: list[GDNLayerState | AttentionLayerState] = []
        for layer, layer_state, ver in zip(self.model.layers, state.layers, verification.layers):
            if isinstance(layer_state, GDNLayerState):
                layers.append(layer.linear_attn.commit(layer_state, ver, list(path), verification.strategy))
            else:
                layers.append(layer.self_attn.commit(layer_state, ver, list(path)))
        tokens = tree.tokens[list(path)].tolist() if path else []
        return ModelState(layers, state.position + len(path), state.committed_tokens + tokens)

    @torch.no_grad()
    def prefill(
        self,
        token_ids: list[int] | torch.Tensor,
        state: ModelState | None = None,
        capture: tuple[int, ...] = (),
        strategy: str = "closed_form",
    ) -> tuple[ModelState, Verification]:
        """Fold ``token_ids`` into ``state`` (a fresh one by default), in chains of 64 tokens
        committed with ``strategy``.

        Returns the new state and the verification of the last chunk (its last row holds the
        logits that predict the first generated token).
        """
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise ConfigError("cannot prefill an empty prompt")
        state = self.empty_state() if state is None else state
        ver = None
        for start in range(0, ids.numel(), PREFILL_CHUNK):
            chunk = Tree.chain(ids[start : start + PREFILL_CHUNK])
            ver = self.verify(state, chunk, capture, strategy)
            state = self.commit(state, ver, list(range(chunk.size)))
        assert ver is not None
        return state, ver


def check_verifier_name(verifier: str) -> str:
    """``verifier`` if both engines run it: ``tree`` (the tree kernels) or ``chain`` (fla_sd's stock
    chunk-form chain verify), else a one-line ConfigError."""
    if verifier not in VERIFIERS:
        raise ConfigError(f"unknown verifier {verifier!r}: choose one of {', '.join(VERIFIERS)}")
    return verifier


def check_verifier(verifier: str, strategy: str, tree: Tree | DeviceTree) -> str:
    """``verifier`` if it can verify ``tree`` and commit by ``strategy``, else a one-line ConfigError
    (a device tree's shape is not read on the host: the chain builders make chains)."""
    check_verifier_name(verifier)
    if verifier == "chain" and strategy != "replay":
        raise ConfigError(f"the chain verifier commits by replay only, not {strategy!r}")
    if verifier == "chain" and isinstance(tree, Tree) and not tree.is_chain:
        raise ConfigError("the chain verifier verifies chains only; use verifier='tree' for trees")
    return verifier


def check_strategy(name: str) -> str:
    if name not in COMMIT_STRATEGIES:
        raise ConfigError(f"unknown commit strategy {name!r}: choose one of {', '.join(COMMIT_STRATEGIES)}")
    return name
