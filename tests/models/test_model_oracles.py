"""Oracles for the hybrid model: transformers' Qwen3.5, an fla transcription, sequential decoding.

Everything runs in float64 on CPU with small random configs (grouped value heads, d_k != d_v,
partial rotary) so that any mismatch in layout, gating, masking or positions shows up far above
rounding.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import leaves, random_tree, seed_of, tree_depths
from safetensors.torch import load_file, save_file

from repro.errors import CheckpointError
from repro.gdn.reference import recurrent_gdn
from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights
from repro.models.hybrid import COMMIT_STRATEGIES, HybridLM
from repro.models.loading import load_target, save_target
from repro.models.state import GDNLayerState, ModelState
from repro.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
VOCAB = 97
HYBRID_LAYERS = [GDN, ATTENTION, GDN, GDN, ATTENTION]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def hybrid_config(
    value_heads: int = 4, rotary: float = 0.25, layers: list[str] | None = None
) -> HybridConfig:
    return HybridConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=96,
        layer_types=list(layers or HYBRID_LAYERS),
        linear_num_key_heads=2,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=12,
        linear_value_head_dim=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        partial_rotary_factor=rotary,
    )


FLA_DICT = {
    "model_type": "gated_deltanet",
    "hidden_size": 48,
    "num_heads": 2,
    "num_v_heads": 4,
    "head_dim": 12,
    "expand_v": 1.5,
    "conv_size": 4,
    "norm_eps": 1e-6,
    "vocab_size": VOCAB,
    "num_hidden_layers": 3,
    "use_gate": True,
}


def build(cfg: HybridConfig, seed: int = 0) -> HybridLM:
    return init_random_weights(HybridLM(cfg), seed).to(F64).eval()


def token_ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def prefill_decode_logits(model: HybridLM, ids: torch.Tensor) -> torch.Tensor:
    """Logits of every position via prefill (64-token chunks) and one-token verify/commit steps."""
    n = ids.numel()
    _, first = model.prefill(ids[:64])  # one chunk: rows 0..63
    state, ver = model.prefill(ids[:66])  # two chunks (64 + 2): the last chunk's rows 64, 65
    rows = [first.logits, ver.logits]
    for t in range(66, n):
        ver = model.verify(state, Tree.single(int(ids[t])))
        rows.append(ver.logits)
        state = model.commit(state, ver, [0])
    assert state.position == n and state.committed_tokens == ids.tolist()
    return torch.cat(rows)


# ---------------------------------------------------------------- transformers Qwen3.5


HF_CASES = [(4, 0.25), (2, 0.5)]
HF_IDS = ["HV4-rot0.25", "HV2-rot0.5"]


def import_hf_torch_path():
    """transformers with its pure-torch GDN path: if fla imports (it does wherever triton is
    installed), transformers would bind fla's GPU kernels at import time instead."""
    transformers = pytest.importorskip("transformers", reason="transformers is needed for the Qwen3.5 oracle")
    name = "transformers.models.qwen3_5.modeling_qwen3_5"
    if name not in sys.modules:
        hidden = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "fla" or k.startswith("fla.")}
        sys.modules["fla"] = None  # makes `import fla` raise ImportError while the module binds
        try:
            importlib.import_module(name)
        finally:
            del sys.modules["fla"]
            sys.modules.update(hidden)
    return transformers


def load_hf(tmp_path: Path, model: HybridLM):
    transformers = import_hf_torch_path()
    save_target(model, tmp_path / "ckpt")
    hf, info = transformers.Qwen3_5ForCausalLM.from_pretrained(
        tmp_path / "ckpt", dtype=F64, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = model.state_dict()
    theirs = hf.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    return hf.eval()


def hf_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = hf(ids[None], use_cache=False).logits[0]
    assert out.dtype == F64
    return out


@pytest.mark.parametrize("value_heads,rotary", HF_CASES, ids=HF_IDS)
def test_logits_match_transformers(tmp_path, value_heads, rotary):
    model = build(hybrid_config(value_heads, rotary), seed=seed_of("hf", value_heads, rotary))
    hf = load_hf(tmp_path, model)
    ids = token_ids(70, 1)
    ref = hf_logits(hf, ids)
    ours = model.verify(model.empty_state(), Tree.chain(ids)).logits
    # transformers' torch path computes the GDN core, its gate, every RMSNorm and the rotary
    # tables in float32 even for a float64 model: agreement is float32-level (measured ~2e-6).
    assert rel_err(ours, ref) <= 2e-5
    assert rel_err(prefill_decode_logits(model, ids), ref) <= 2e-5


def patch_transformers_to_float64(monkeypatch, hf) -> list[int]:
    """Replace the float32 islands of transformers' Qwen3.5 torch path by float64 equivalents.

    - the GDN core (``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``, module
      globals looked up at call time by ``Qwen3_5GatedDeltaNet.forward``) by a wrapper around
      repro's ``recurrent_gdn`` with their signature (it expands key heads to value heads itself,
      as they do, so the grouping convention is transformers'); the wrapper recomputes the gate
      g = -exp(A_log) softplus(a + dt_bias) in float64 from the calling layer (transformers casts
      ``a`` and ``A_log`` to float32 before the call) and checks it against the one passed in;
    - ``Qwen3_5RMSNorm``, ``Qwen3_5RMSNormGated`` (both upcast to float32) and the rotary tables
      (float32 inv_freq and angles) by the same formulas without the casts.
    Projections, the causal conv, l2norm, gated attention and the decoder wiring stay transformers'.
    """
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hfm

    calls: list[int] = []
    current: dict = {}

    def remember_layer(module, args, kwargs):
        current["layer"] = module
        current["hidden"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

    for module in hf.modules():
        if isinstance(module, hfm.Qwen3_5GatedDeltaNet):
            module.register_forward_pre_hook(remember_layer, with_kwargs=True)  # dies with this hf model

    def core(
        query,
        key,
        value,
        g,
        beta,
        chunk_size=64,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        layer, hidden = current["layer"], current["hidden"]
        g64 = -layer.A_log.exp() * F.softplus(layer.in_proj_a(hidden) + layer.dt_bias)
        assert g64.shape == g.shape and (g64 - g).abs().max() <= 1e-5 * g64.abs().max()
        calls.append(query.shape[1])
        batch, _, h, dk = key.shape
        hv, dv = value.shape[-2:]
        if h != hv:  # grouped value heads exactly as transformers' torch functions expand them
            query, key = query.repeat_interleave(hv // h, dim=2), key.repeat_interleave(hv // h, dim=2)
        if use_qk_l2norm_in_kernel:
            query, key = hfm.l2norm(query), hfm.l2norm(key)
        outs, finals = [], []
        for b in range(batch):
            s0 = (
                torch.zeros(hv, dv, dk, dtype=F64)
                if initial_state is None
                else initial_state[b].transpose(-1, -2)
            )
            o, s = recurrent_gdn(query[b], key[b], value[b], g64[b], beta[b], s0.to(F64), dk**-0.5)
            outs.append(o)
            finals.append(s.transpose(-1, -2))  # ours [HV, V, K] -> transformers [HV, K, V]
        return torch.stack(outs).to(query.dtype), torch.stack(finals) if output_final_state else None

    def rms_norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    def rms_norm_gated(self, x, gate):
        return (
            self.weight
            * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
            * F.silu(gate)
        )

    def rotary(self, x, position_ids):
        rope = self.config.rope_parameters
        dim = int(self.config.head_dim * rope.get("partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=F64) / dim))
        freqs = position_ids.expand(3, -1, -1)[..., None].to(F64) * inv_freq
        cos = self.recomposition_frequencies(freqs.cos() * self.attention_scaling)
        sin = self.recomposition_frequencies(freqs.sin() * self.attention_scaling)
        return cos.to(x.dtype), sin.to(x.dtype)

    monkeypatch.setattr(hfm, "torch_chunk_gated_delta_rule", core)
    monkeypatch.setattr(hfm, "torch_recurrent_gated_delta_rule", core)
    monkeypatch.setattr(hfm.Qwen3_5RMSNorm, "forward", rms_norm)
    monkeypatch.setattr(hfm.Qwen3_5RMSNormGated, "forward", rms_norm_gated)
    monkeypatch.setattr(hfm.Qwen3_5TextRotaryEmbedding, "forward", rotary)
    return calls


@pytest.mark.parametrize("value_heads,rotary", HF_CASES, ids=HF_IDS)
def test_logits_match_transformers_in_float64(tmp_path, monkeypatch, value_heads, rotary):
    cfg = hybrid_config(value_heads, rotary)
    model = build(cfg, seed=seed_of("hf", value_heads, rotary))
    hf = load_hf(tmp_path, model)
    ids = token_ids(70, 1)
    unpatched = hf_logits(hf, ids)
    calls = patch_transformers_to_float64(monkeypatch, hf)
    ref = hf_logits(hf, ids)
    assert calls == [70] * cfg.num_gdn_layers  # our core really ran, once per GDN layer
    assert rel_err(unpatched, ref) > 1e-9  # the float32 islands were real (and are now gone)
    ours = model.verify(model.empty_state(), Tree.chain(ids)).logits
    assert rel_err(ours, ref) <= 1e-10
    assert rel_err(prefill_decode_logits(model, ids), ref) <= 1e-10


# ---------------------------------------------------------------- fla GatedDeltaNet format


def fla_reference_logits(weights: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor) -> torch.Tensor:
    """Float64 transcription of fla's GatedDeltaNetForCausalLM forward, from fla-named weights.

    Follows fla/layers/gated_deltanet.py (separate q/k/v ShortConvolution = causal depthwise
    conv1d + SiLU, l2norm in the kernel, beta = sigmoid(b) (x2 with negative eigenvalues),
    g = -exp(A_log) softplus(a + dt_bias), FusedRMSNormGated o_norm with swish gate) and
    fla/models/gated_deltanet (attn_norm / mlp_norm / norm = plain RMSNorm x * w, GatedMLP SwiGLU).
    """
    w = {k: v.to(F64) for k, v in weights.items()}
    eps = cfg["norm_eps"]
    h_k, d_k = cfg["num_heads"], cfg["head_dim"]
    h_v, d_v = cfg.get("num_v_heads") or h_k, int(cfg["head_dim"] * cfg["expand_v"])
    n = ids.numel()

    def rms(x, weight):
        return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * weight

    def short_conv(x, weight):  # ShortConvolution: nn.Conv1d(padding=W-1, groups=C), weight [C, 1, W]
        y = F.conv1d(x.T[None].contiguous(), weight, padding=weight.shape[-1] - 1, groups=x.shape[1])
        return F.silu(y[0, :, :n].T)

    def l2norm(x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    x = w["model.embeddings.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.attn."
        h = rms(x, w[p + "attn_norm.weight"])
        q = l2norm(short_conv(h @ w[a + "q_proj.weight"].T, w[a + "q_conv1d.weight"]).view(n, h_k, d_k))
        k = l2norm(short_conv(h @ w[a + "k_proj.weight"].T, w[a + "k_conv1d.weight"]).view(n, h_k, d_k))
        v = short_conv(h @ w[a + "v_proj.weight"].T, w[a + "v_conv1d.weight"]).view(n, h_v, d_v)
        beta = torch.sigmoid(h @ w[a + "b_proj.weight"].T) * (2.0 if cfg.get("allow_neg_eigval") else 1.0)
        g = -w[a + "A_log"].exp() * F.softplus(h @ w[a + "a_proj.weight"].T + w[a + "dt_bias"])
        # fla naive loop, state [HV, K, V]; value head j reads key head j // (HV // H)
        q = q.repeat_interleave(h_v // h_k, dim=1) * d_k**-0.5
        k = k.repeat_interleave(h_v // h_k, dim=1)
        s = torch.zeros(h_v, d_k, d_v, dtype=F64)
        o = torch.zeros(n, h_v, d_v, dtype=F64)
        for t in range(n):
            s = s * g[t].exp()[:, None, None]
            u = (v[t] - (s * k[t][:, :, None]).sum(-2)) * beta[t][:, None]
            s = s + k[t][:, :, None] * u[:, None, :]
            o[t] = (q[t][:, :, None] * s).sum(-2)
        o = rms(o, w[a + "o_norm.weight"])
        if cfg.get("use_gate", True):
            o = o * F.silu((h @ w[a + "g_proj.weight"].T).view(n, h_v, d_v))
        x = x + o.reshape(n, h_v * d_v) @ w[a + "o_proj.weight"].T
        h = rms(x, w[p + "mlp_norm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    return x @ w.get("lm_head.weight", w["model.embeddings.weight"]).T


FLA_CASES = {
    "gated": {},
    "no-gate-negeig-HV=H": {"use_gate": False, "allow_neg_eigval": True, "num_v_heads": 2},
    "tied": {"tie_word_embeddings": True, "conv_size": 2},
}


@pytest.mark.parametrize("overrides", list(FLA_CASES.values()), ids=list(FLA_CASES))
def test_fla_format_roundtrip_and_transcription(tmp_path, overrides):
    raw = {**FLA_DICT, **overrides}
    cfg = HybridConfig.from_fla_dict(raw)
    assert cfg.source_format == "fla_gdn" and not cfg.zero_centered_norm
    assert cfg.intermediate_size == 256  # fla's rule: 256 * ceil(hidden * 4 * 2/3 / 256)
    model = build(cfg, seed=seed_of("fla", sorted(overrides.items())))
    save_target(model, tmp_path, fmt="fla_gdn")
    weights = load_file(str(tmp_path / "model.safetensors"))
    for name in (
        "model.embeddings.weight",
        "model.norm.weight",
        "model.layers.0.attn_norm.weight",
        "model.layers.0.mlp_norm.weight",
        "model.layers.0.attn.q_conv1d.weight",
        "model.layers.0.attn.k_conv1d.weight",
        "model.layers.0.attn.v_conv1d.weight",
        "model.layers.0.attn.q_proj.weight",
        "model.layers.0.attn.a_proj.weight",
        "model.layers.0.attn.b_proj.weight",
        "model.layers.0.attn.A_log",
        "model.layers.0.attn.dt_bias",
        "model.layers.0.attn.o_norm.weight",
        "model.layers.2.attn.o_proj.weight",
        "model.layers.2.mlp.down_proj.weight",
    ):
        assert name in weights, name
    assert ("model.layers.0.attn.g_proj.weight" in weights) == raw.get("use_gate", True)
    assert ("lm_head.weight" in weights) != raw.get("tie_word_embeddings", False)
    assert not any("linear_attn" in k or "in_proj" in k or "embed_tokens" in k for k in weights)
    kd = raw["num_heads"] * raw["head_dim"]
    assert weights["model.layers.0.attn.q_conv1d.weight"].shape == (kd, 1, raw["conv_size"])
    saved_cfg = json.loads((tmp_path / "config.json").read_text())
    assert saved_cfg["model_type"] == "gated_deltanet"

    reloaded = load_target(tmp_path, dtype=F64)
    ids = token_ids(40, 3)
    ours = model.verify(model.empty_state(), Tree.chain(ids)).logits
    again = reloaded.verify(reloaded.empty_state(), Tree.chain(ids)).logits
    assert torch.equal(ours, again)
    ref = fla_reference_logits(weights, raw, ids)
    assert rel_err(ours, ref) <= 1e-10


# ---------------------------------------------------------------- tree verification


def sequential_node_logits(model: HybridLM, state: ModelState, tree: Tree):
    """Every node's logits by plain decoding (one-node verify + commit) along its own path.

    Nodes come in topological order, so the state after a node's parent is always ready; the
    state kept for node i is exactly the result of decoding path_to(i) token by token.
    """
    states = {-1: state}
    logits = []
    for i, (tok, p) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True)):
        ver = model.verify(states[p], Tree.single(tok))
        logits.append(ver.logits[0])
        states[i] = model.commit(states[p], ver, [0])
    return torch.stack(logits), states


TREES = [("random", 30), ("chain", 40), ("fan", 30), ("forest", 24)]
MODEL_CONFIGS = {
    "hybrid": lambda: hybrid_config(4, 0.5),
    "pure-gdn-fla": lambda: HybridConfig.from_fla_dict(FLA_DICT),
}


@pytest.mark.parametrize("config_name", list(MODEL_CONFIGS))
@pytest.mark.parametrize("kind,n", TREES)
def test_tree_verify_matches_sequential_decoding(kind, n, config_name):
    gen = torch.Generator().manual_seed(seed_of("tree", kind, n, config_name))
    model = build(MODEL_CONFIGS[config_name](), seed=3)
    state, _ = model.prefill(token_ids(21, 4))
    parents = random_tree(n, kind, gen)
    if kind == "random":
        assert max(tree_depths(parents)) >= 4 and len(leaves(parents)) >= 4
    tree = Tree(torch.randint(0, VOCAB, (n,), generator=gen), parents)
    logits = model.verify(state, tree).logits
    ref, _ = sequential_node_logits(model, state, tree)
    assert logits.shape == (n, VOCAB)
    assert rel_err(logits, ref) <= 1e-10


def assert_states_close(a: ModelState, b: ModelState, tol: float) -> None:
    assert a.position == b.position and a.committed_tokens == b.committed_tokens
    assert len(a.layers) == len(b.layers)
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert type(la) is type(lb)
        pairs = (
            [(la.recurrent, lb.recurrent), (la.conv, lb.conv)]
            if isinstance(la, GDNLayerState)
            else [(la.keys, lb.keys), (la.values, lb.values)]
        )
        for x, y in pairs:
            assert x.shape == y.shape and x.dtype == y.dtype
            assert rel_err(x, y) <= tol


def assert_states_equal(a: ModelState, b: ModelState) -> None:
    assert a.position == b.position and a.committed_tokens == b.committed_tokens
    for la, lb in zip(a.layers, b.layers, strict=True):
        for name in ("recurrent", "conv") if isinstance(la, GDNLayerState) else ("keys", "values"):
            assert torch.equal(getattr(la, name), getattr(lb, name))


@pytest.mark.parametrize("config_name", list(MODEL_CONFIGS))
@pytest.mark.parametrize("kind,n", [("random", 30), ("mixed", 25)])
def test_commit_strategies_agree(kind, n, config_name):
    cfg = MODEL_CONFIGS[config_name]()
    gen = torch.Generator().manual_seed(seed_of("commit", kind, n, config_name))
    model = build(cfg, seed=5)
    models = dict.fromkeys(COMMIT_STRATEGIES, model)  # one model: the strategy is a per-call argument
    prompt = token_ids(19, 6)
    prefilled = {s: m.prefill(prompt, strategy=s)[0] for s, m in models.items()}
    for s in ("snapshot", "replay"):  # prefill commits whole chunks with each call's strategy
        assert_states_close(prefilled[s], prefilled["closed_form"], 1e-12)
    parents = random_tree(n, kind, gen)
    tree = Tree(torch.randint(0, VOCAB, (n,), generator=gen), parents)
    depth = tree_depths(parents)
    deep = max(leaves(parents), key=lambda i: depth[i])
    _, seq_states = sequential_node_logits(models["closed_form"], prefilled["closed_form"], tree)
    next_token = int(torch.randint(0, VOCAB, (), generator=gen))
    for path in (tree.path_to(deep), tree.path_to(n // 2), []):
        committed, next_logits = {}, {}
        for s, m in models.items():
            before = prefilled[s].clone()
            ver = m.verify(prefilled[s], tree, strategy=s)
            assert ver.strategy == s
            assert_states_equal(prefilled[s], before)  # verify leaves the committed state untouched
            committed[s] = m.commit(prefilled[s], ver, path)
            assert_states_equal(prefilled[s], before)  # so does commit (it returns a new state)
            next_logits[s] = m.verify(committed[s], Tree.single(next_token)).logits
        assert committed["closed_form"].position == prefilled["closed_form"].position + len(path)
        for s in ("snapshot", "replay"):
            assert_states_close(committed[s], committed["closed_form"], 1e-12)
            assert rel_err(next_logits[s], next_logits["closed_form"]) <= 1e-12
        expected = seq_states[path[-1]] if path else prefilled["closed_form"]
        assert_states_close(committed["closed_form"], expected, 1e-10)


def test_commit_rejects_foreign_paths_and_states():
    model = build(hybrid_config(), seed=1)
    state, _ = model.prefill(token_ids(5, 1))
    tree = Tree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 0]))
    ver = model.verify(state, tree)
    with pytest.raises(ValueError, match="not a root-to-node path"):
        model.commit(state, ver, [0, 2, 1])
    other, _ = model.prefill(token_ids(6, 1))
    with pytest.raises(ValueError, match="different state"):
        model.commit(other, ver, [0])


# ---------------------------------------------------------------- checkpoints


@pytest.fixture
def saved_hybrid(tmp_path) -> tuple[HybridLM, Path]:
    model = build(hybrid_config(), seed=9)
    return model, save_target(model, tmp_path / "good")


def rewrite_weights(path: Path, edit) -> None:
    weights = load_file(str(path / "model.safetensors"))
    edit(weights)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


def _missing_dir(src: Path, dst: Path) -> Path:
    return dst / "does-not-exist"


def _no_config(src: Path, dst: Path) -> Path:
    (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    return dst


def _bad_json(src: Path, dst: Path) -> Path:
    (dst / "config.json").write_text('{"model_type": "qwen3_5_text",')
    return dst


def _bad_model_type(src: Path, dst: Path) -> Path:
    raw = json.loads((dst / "config.json").read_text())
    raw["model_type"] = "llama"
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


def _no_weights(src: Path, dst: Path) -> Path:
    (dst / "model.safetensors").unlink()
    return dst


def _missing_weight(src: Path, dst: Path) -> Path:
    rewrite_weights(dst, lambda w: w.pop("model.layers.2.linear_attn.A_log"))
    return dst


def _wrong_shape(src: Path, dst: Path) -> Path:
    def edit(w):
        w["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(3, 48)

    rewrite_weights(dst, edit)
    return dst


def _missing_key_in_config(src: Path, dst: Path) -> Path:
    raw = json.loads((dst / "config.json").read_text())
    del raw["hidden_size"]
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


def _fla_with_attn(src: Path, dst: Path) -> Path:
    fla = build(HybridConfig.from_fla_dict(FLA_DICT), seed=1)
    save_target(fla, dst, fmt="fla_gdn")
    raw = json.loads((dst / "config.json").read_text())
    raw["attn"] = {"layers": [1], "num_heads": 4, "num_kv_heads": 2}
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


def _missing_shard(src: Path, dst: Path) -> Path:
    weights = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").rename(dst / "model-00001-of-00002.safetensors")
    names = sorted(weights)
    weight_map = {k: f"model-0000{1 + (i % 2)}-of-00002.safetensors" for i, k in enumerate(names)}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


CHECKPOINT_ERRORS = [
    (_missing_dir, "does not exist"),
    (_no_config, "no config.json"),
    (_bad_json, "not valid JSON"),
    (_bad_model_type, "model_type='llama'"),
    (_no_weights, "no *.safetensors"),
    (_missing_weight, "model.layers.2.linear_attn.A_log"),
    (_wrong_shape, "model.layers.1.self_attn.k_proj.weight has shape (3, 48)"),
    (_missing_key_in_config, "'hidden_size'"),
    (_fla_with_attn, "'attn'"),
    (_missing_shard, "model-00002-of-00002.safetensors"),
]


@pytest.mark.parametrize(
    "make,needle", CHECKPOINT_ERRORS, ids=[f.__name__.strip("_") for f, _ in CHECKPOINT_ERRORS]
)
def test_checkpoint_errors(saved_hybrid, tmp_path, make, needle):
    _, good = saved_hybrid
    dst = tmp_path / "broken"
    if make is _no_config:
        dst.mkdir()
    elif make not in (_missing_dir, _fla_with_attn):
        shutil.copytree(good, dst)
    path = make(good, dst)
    with pytest.raises(CheckpointError) as info:
        load_target(path, dtype=F64)
    msg = str(info.value)
    assert "\n" not in msg
    assert needle in msg, msg


def test_qwen35_multimodal_layout(saved_hybrid, tmp_path):
    model, good = saved_hybrid
    text = json.loads((good / "config.json").read_text())
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"depth": 2, "hidden_size": 32, "model_type": "qwen3_5"},
        "tie_word_embeddings": False,
        "image_token_id": 5,
    }
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for name, w in load_file(str(good / "model.safetensors")).items():
        weights["model.language_model." + name[len("model.") :] if name.startswith("model.") else name] = w
    weights["mtp.fc.weight"] = torch.randn(48, 96, generator=gen)
    weights["mtp.layers.0.mlp.up_proj.weight"] = torch.randn(96, 48, generator=gen)
    weights["model.visual.patch_embed.proj.weight"] = torch.randn(32, 3, 2, 4, 4, generator=gen)
    assert "lm_head.weight" in weights and "model.language_model.embed_tokens.weight" in weights
    mm = tmp_path / "multimodal"
    mm.mkdir()
    (mm / "config.json").write_text(json.dumps(config))
    half = len(weights) // 2
    names = sorted(weights)
    save_file({k: weights[k] for k in names[:half]}, str(mm / "model-00001-of-00002.safetensors"))
    save_file({k: weights[k] for k in names[half:]}, str(mm / "model-00002-of-00002.safetensors"))
    index = {
        "weight_map": {k: f"model-0000{1 + (i >= half)}-of-00002.safetensors" for i, k in enumerate(names)}
    }
    (mm / "model.safetensors.index.json").write_text(json.dumps(index))

    loaded = load_target(mm, dtype=F64)
    assert loaded.config.layer_types == model.config.layer_types
    ids = token_ids(30, 2)
    a = model.verify(model.empty_state(), Tree.chain(ids)).logits
    b = loaded.verify(loaded.empty_state(), Tree.chain(ids)).logits
    assert torch.equal(a, b)


def test_qwen35_roundtrip_tied_embeddings(tmp_path):
    cfg = hybrid_config()
    cfg.tie_word_embeddings = True
    model = build(cfg, seed=2)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    save_target(model, tmp_path)
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    loaded = load_target(tmp_path, dtype=F64)
    ids = token_ids(20, 0)
    a = model.verify(model.empty_state(), Tree.chain(ids)).logits
    assert torch.equal(a, loaded.verify(loaded.empty_state(), Tree.chain(ids)).logits)
