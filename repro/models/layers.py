"""Layers of the hybrid model, each evaluated on a draft tree against a committed state.

Parameter names follow the transformers Qwen3.5 text model so that its checkpoints load as-is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from repro.gdn import reference as gdn
from repro.gdn.backends import chain_function, recurrent_function, tree_function
from repro.models.config import HybridConfig
from repro.models.state import AttentionLayerState, GDNLayerState


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) times ``scale`` (per channel)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale


class RMSNorm(nn.Module):
    """RMSNorm; ``zero_centered`` scales by (1 + w) as Qwen3.5 does, otherwise by w as fla does."""

    def __init__(self, dim: int, eps: float, zero_centered: bool) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def scale(self) -> torch.Tensor:
        """The per-channel factor: 1 + w (zero-centred) or w."""
        return 1.0 + self.weight if self.zero_centered else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.scale(), self.eps)


class GatedRMSNorm(nn.Module):
    """Per-head RMSNorm of the GDN output, then times SiLU(gate)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        y = rms_norm(x, self.weight, self.eps)
        return y * F.silu(gate) if gate is not None else y


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def gated(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU(gate_proj x) * up_proj x: what down_proj reads."""
        return F.silu(self.gate_proj(x)) * self.up_proj(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gated(x))


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, neg_decay: torch.Tensor, dt_bias: torch.Tensor, beta_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) from the a and b projections: g = neg_decay softplus(a + dt_bias), beta = s sigmoid(b)."""
    g = neg_decay * F.softplus(a + dt_bias)
    beta = torch.sigmoid(b)
    return g, beta if beta_scale == 1.0 else beta_scale * beta


@dataclass
class GDNVerification:
    """What a GDN layer's tree pass leaves for its commit: factors and raw conv inputs."""

    factors: gdn.TreeFactors
    conv_inputs: torch.Tensor
    chain: bool = False  # verified by the chain form: commit replays through the backend's recurrence


@dataclass
class AttentionVerification:
    """Keys (rotary applied) and values of every tree node, for KV compaction on commit."""

    keys: torch.Tensor
    values: torch.Tensor


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet token mixer (short conv on q/k/v, L2 norm, gates, grouped value heads)."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.num_k_heads = cfg.linear_num_key_heads
        self.num_v_heads = cfg.linear_num_value_heads
        self.head_k_dim = cfg.linear_key_head_dim
        self.head_v_dim = cfg.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_size = cfg.linear_conv_kernel_dim
        self.beta_scale = 2.0 if cfg.allow_neg_eigval else 1.0
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = (
            nn.Linear(cfg.hidden_size, self.value_dim, bias=False) if cfg.linear_output_gate else None
        )
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.conv_size, groups=self.conv_dim, bias=cfg.linear_conv_bias
        )
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, cfg.linear_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)
        self.backend = "reference"  # or "triton" (CUDA): see repro.gdn.backends

    def empty_state(self, dtype: torch.dtype, device: torch.device) -> GDNLayerState:
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        return GDNLayerState(
            recurrent=torch.zeros(
                self.num_v_heads, self.head_v_dim, self.head_k_dim, dtype=state_dtype, device=device
            ),
            conv=torch.zeros(self.conv_size - 1, self.conv_dim, dtype=dtype, device=device),
        )

    def gate_constants(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(-exp(A_log), dt_bias) in the gates' dtype (float64 models: float64, else float32)."""
        gdt = torch.float64 if dtype == torch.float64 else torch.float32
        return -self.A_log.to(gdt).exp(), self.dt_bias.to(gdt)

    def gates(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, beta) [n, HV]: log decay -exp(A_log) softplus(a + dt_bias) and sigmoid(b)."""
        neg_decay, dt_bias = self.gate_constants(h.dtype)
        a = self.in_proj_a(h).to(neg_decay.dtype)
        return gdn_gates(a, self.in_proj_b(h), neg_decay, dt_bias, self.beta_scale)

    def forward_tree(
        self,
        h: torch.Tensor,
        state: GDNLayerState,
        parents: torch.Tensor,
        ancestors: torch.Tensor,
        keep_snapshots: bool,
        chain: bool = False,
    ) -> tuple[torch.Tensor, GDNVerification]:
        """Outputs of every tree node against ``state`` (left untouched) and the commit data.

        ``chain`` (the nodes form a chain): the backend's chain evaluator runs from the committed
        state and its final state is dropped; the factors then hold only what a replay needs.
        """
        n = h.shape[0]
        conv_inputs = self.in_proj_qkv(h)
        bias = self.conv1d.bias
        mixed = gdn.tree_short_conv(conv_inputs, state.conv, self.conv1d.weight[:, 0], parents, bias)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        sdt = state.recurrent.dtype
        q = l2norm(q.reshape(n, self.num_k_heads, self.head_k_dim).to(sdt))
        k = l2norm(k.reshape(n, self.num_k_heads, self.head_k_dim).to(sdt))
        v = v.reshape(n, self.num_v_heads, self.head_v_dim).to(sdt)
        g, beta = self.gates(h)
        if chain:
            chain_fn = chain_function(self.backend, h.device)
            o, _ = chain_fn(
                q[None], k[None], v[None], g.to(sdt)[None], beta.to(sdt)[None], state.recurrent[None],
                self.head_k_dim**-0.5,
            )  # fmt: skip
            o = o[0]
            kh = gdn.expand_key_heads(k, self.num_v_heads)
            factors = gdn.TreeFactors(kh.new_empty(0), g.to(sdt).cumsum(0), kh, v, g.to(sdt), beta.to(sdt))
        else:
            tree_fn = tree_function(self.backend, h.device)
            o, factors = tree_fn(
                q, k, v, g.to(sdt), beta.to(sdt), state.recurrent, parents, ancestors, self.head_k_dim**-0.5,
                keep_snapshots,
            )  # fmt: skip
        z = (
            self.in_proj_z(h).reshape(n, self.num_v_heads, self.head_v_dim)
            if self.in_proj_z is not None
            else None
        )
        o = self.norm(o.to(h.dtype), z).reshape(n, self.value_dim)
        return self.out_proj(o), GDNVerification(factors, conv_inputs, chain)

    def forward_chain(
        self, h: torch.Tensor, state: GDNLayerState | None = None
    ) -> tuple[torch.Tensor, GDNLayerState]:
        """Batched chains h [B, L, d] from ``state`` (shared by all rows; None = empty), differentiable.

        Returns the outputs [B, L, d] and the final states (recurrent [B, HV, d_v, d_k], conv
        window [B, W-1, C]). Same math as :meth:`forward_tree` on a chain.
        """
        b, n, _ = h.shape
        conv_inputs = self.in_proj_qkv(h)  # [B, L, C]
        sdt = torch.float64 if h.dtype == torch.float64 else torch.float32
        if state is None:
            state = self.empty_state(h.dtype, h.device)
        history = state.conv.to(conv_inputs.dtype).expand(b, -1, -1)
        ext = torch.cat([history, conv_inputs], dim=1)
        conv = F.conv1d(ext.transpose(1, 2), self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim)
        mixed = F.silu(conv)
        q, k, v = torch.split(mixed.transpose(1, 2), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(b, n, self.num_k_heads, self.head_k_dim).to(sdt))
        k = l2norm(k.reshape(b, n, self.num_k_heads, self.head_k_dim).to(sdt))
        v = v.reshape(b, n, self.num_v_heads, self.head_v_dim).to(sdt)
        g, beta = self.gates(h)
        chain_fn = chain_function(self.backend, h.device, torch.is_grad_enabled())
        initial = state.recurrent.to(sdt).expand(b, -1, -1, -1)
        o, final = chain_fn(q, k, v, g.to(sdt), beta.to(sdt), initial, self.head_k_dim**-0.5)
        z = self.in_proj_z(h).reshape(b, n, self.num_v_heads, -1) if self.in_proj_z is not None else None
        o = self.norm(o.to(h.dtype), z).reshape(b, n, self.value_dim)
        window = ext[:, ext.shape[1] - (self.conv_size - 1) :]
        return self.out_proj(o), GDNLayerState(final, window)

    def commit(
        self, state: GDNLayerState, ver: GDNVerification, path: list[int], strategy: str
    ) -> GDNLayerState:
        if ver.chain:  # replay through the backend's token-by-token recurrence (fla's fused kernel)
            f = ver.factors
            recurrent = state.recurrent.clone()
            if path:
                replay = recurrent_function(self.backend)
                _, recurrent = replay(
                    f.k[path], f.k[path], f.v[path], f.g[path], f.beta[path], state.recurrent, 1.0
                )
        else:
            recurrent = gdn.COMMIT_FUNCTIONS[strategy](state.recurrent, ver.factors, path)
        conv = gdn.conv_history_after(state.conv, ver.conv_inputs, path)
        return GDNLayerState(recurrent, conv)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [n, 1, rotary_dim] in ``dtype`` for integer positions [n] (angles in float64)."""
    freqs = positions.to(torch.float64)[:, None] * inv_freq.to(positions.device)[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim channels of x [n, heads, head_dim] by the tables."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)


class Attention(nn.Module):
    """Gated full attention with q/k RMSNorm and partial rotary, evaluated under a tree mask."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.output_gate = cfg.attention_output_gate
        q_out = self.num_heads * self.head_dim * (2 if self.output_gate else 1)
        self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, cfg.zero_centered_norm)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, cfg.zero_centered_norm)
        rot = cfg.rotary_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def empty_state(self, dtype: torch.dtype, device: torch.device) -> AttentionLayerState:
        empty = torch.zeros(0, self.num_kv_heads, self.head_dim, dtype=dtype, device=device)
        return AttentionLayerState(empty, empty.clone())

    def rotary(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Apply rotary to the first rotary_dim channels of x [n, heads, head_dim]."""
        return apply_rotary(x, *rotary_tables(positions, self.inv_freq, x.dtype))

    def forward_tree(
        self, h: torch.Tensor, state: AttentionLayerState, positions: torch.Tensor, ancestors: torch.Tensor
    ) -> tuple[torch.Tensor, AttentionVerification]:
        n = h.shape[0]
        q = self.q_proj(h)
        if self.output_gate:
            q, gate = q.view(n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(n, -1)
        q = self.rotary(self.q_norm(q.reshape(n, self.num_heads, self.head_dim)), positions)
        k = self.rotary(self.k_norm(self.k_proj(h).view(n, self.num_kv_heads, self.head_dim)), positions)
        v = self.v_proj(h).view(n, self.num_kv_heads, self.head_dim)
        keys = torch.cat([state.keys, k], dim=0)
        values = torch.cat([state.values, v], dim=0)
        groups = self.num_heads // self.num_kv_heads
        keys_h = keys.repeat_interleave(groups, dim=1).transpose(0, 1)  # [H, L+n, d]
        values_h = values.repeat_interleave(groups, dim=1).transpose(0, 1)
        scores = q.transpose(0, 1) @ keys_h.transpose(1, 2) * self.head_dim**-0.5  # [H, n, L+n]
        prefix = state.keys.shape[0]
        mask = torch.cat([torch.ones(n, prefix, dtype=torch.bool, device=h.device), ancestors], dim=1)
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores.float() if scores.dtype == torch.float16 else scores, dim=-1).to(h.dtype)
        out = (attn @ values_h).transpose(0, 1).reshape(n, -1)
        if self.output_gate:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out), AttentionVerification(k, v)

    def forward_chain(
        self, h: torch.Tensor, state: AttentionLayerState | None, positions: torch.Tensor
    ) -> tuple[torch.Tensor, AttentionLayerState]:
        """Causal attention over batched chains h [B, L, d] after ``state``'s keys (shared by all
        rows; None = none). Returns outputs [B, L, d] and the keys/values [B, P + L, KV, hd]."""
        b, n, _ = h.shape
        q = self.q_proj(h)
        if self.output_gate:
            q, gate = q.view(b, n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(b, n, -1)
        q = self.rotary(self.q_norm(q.reshape(b * n, self.num_heads, self.head_dim)), positions.repeat(b))
        k = self.k_norm(self.k_proj(h).view(b * n, self.num_kv_heads, self.head_dim))
        k = self.rotary(k, positions.repeat(b)).view(b, n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(h).view(b, n, self.num_kv_heads, self.head_dim)
        prefix = 0 if state is None else state.keys.shape[-3]  # keys [P, KV, hd] or [B, P, KV, hd]
        if prefix:
            k = torch.cat([state.keys.to(k.dtype).expand(b, -1, -1, -1), k], dim=1)
            v = torch.cat([state.values.to(v.dtype).expand(b, -1, -1, -1), v], dim=1)
        groups = self.num_heads // self.num_kv_heads
        keys_h = k.repeat_interleave(groups, dim=2).transpose(1, 2)  # [B, H, P + L, hd]
        values_h = v.repeat_interleave(groups, dim=2).transpose(1, 2)
        q = q.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        mask = torch.ones(n, prefix + n, dtype=torch.bool, device=h.device).tril(prefix)
        out = F.scaled_dot_product_attention(q, keys_h, values_h, attn_mask=mask, scale=self.head_dim**-0.5)
        out = out.transpose(1, 2).reshape(b, n, -1)
        if self.output_gate:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out), AttentionLayerState(k, v)

    def commit(
        self, state: AttentionLayerState, ver: AttentionVerification, path: list[int]
    ) -> AttentionLayerState:
        idx = torch.tensor(path, dtype=torch.long, device=ver.keys.device)
        return AttentionLayerState(
            torch.cat([state.keys, ver.keys[idx]], dim=0), torch.cat([state.values, ver.values[idx]], dim=0)
        )


class DecoderLayer(nn.Module):
    def __init__(self, cfg: HybridConfig, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centered_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centered_norm)

    @property
    def mixer(self) -> GatedDeltaNet | Attention:
        return self.linear_attn if self.layer_type == "linear_attention" else self.self_attn
