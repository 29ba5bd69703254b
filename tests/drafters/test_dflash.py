"""DFlash drafter and DDTree trees: the dflash package oracle, checkpoints, best-first trees,
exactness against AR, and that the drafter reads the right target hidden states at the right positions."""

from __future__ import annotations

import heapq
import itertools
import json
import math

import pytest
import torch

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.decoding.tree_builders import BestFirst
from repro.drafters.base import Proposal
from repro.drafters.dflash import (
    DFlashDrafter,
    load_dflash,
    random_dflash_for,
    save_dflash,
)
from repro.drafters.dflash_model import spread_target_layers
from repro.errors import CheckpointError, ConfigError
from repro.models.default import build_default_target
from repro.models.loading import save_target
from repro.models.tokenizer import ByteTokenizer
from repro.tree import Tree

TOK = ByteTokenizer()
MAX_NEW = 24
AR_SPEC = {"name": "ar", "kind": "ar"}
F32_TOL = 2e-5  # float32 logits of magnitude ~3: measured max error 1.2e-6
F64_TOL = 1e-10  # float64 with the oracle's float32 norm/rotary islands lifted: measured ~1e-15


@pytest.fixture(scope="module")
def prompts():
    """Short chat prompts; the last is longer than one prefill chunk (64 tokens)."""
    texts = ["Hi!", "What is 7 times 8?", "Write a haiku about the sea, the moon and a small boat at night."]
    return [TOK.chat_prompt([{"role": "user", "content": t}]) for t in texts]


@pytest.fixture(scope="module")
def ar_outputs(model64, prompts):
    ar = build_route(AR_SPEC, TOK.vocab_size, "greedy", 0.0, 0)
    return [generate(model64, ids, ar, MAX_NEW).output_ids for ids in prompts]


def features(model, ids, layer_ids):
    """Target features [1, n, F] of ``ids`` from one full verify (the reference, no chunking)."""
    ver = model.verify(model.empty_state(), Tree.chain(ids), tuple(layer_ids))
    return torch.cat([ver.hidden[i] for i in layer_ids], dim=-1)[None]


# ----- (a) the dflash package's own model class is the oracle -----


def _rmsnorm_in_input_dtype(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rotary_in_float64(self, x, position_ids):
    dim = 2 * self.inv_freq.numel()
    theta = float(self.config.rope_parameters["rope_theta"])
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = position_ids[..., None].to(torch.float64) * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("offset", [0, 17])
def test_dflash_package_loads_checkpoint_and_gives_same_logits(tmp_path, monkeypatch, dtype, offset):
    """z-lab's DFlashDraftModel loads our checkpoint (no missing/unexpected keys) and drafts the same
    logits from the same target features and block. float32: the package as is (tol 2e-5).
    float64: its RMSNorm and rotary compute in float32 internally, so those two precision islands
    are lifted to float64 (structure untouched) and the logits agree to 1e-10."""
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3", reason="needs transformers")
    zlab = pytest.importorskip(
        "dflash.model", reason="the dflash package is not installed (pip install --no-deps dflash==0.1.0)"
    )
    if dtype == torch.float64:
        monkeypatch.setattr(qwen3.Qwen3RMSNorm, "forward", _rmsnorm_in_input_dtype)
        monkeypatch.setattr(qwen3.Qwen3RotaryEmbedding, "forward", _rotary_in_float64)
    target = build_default_target(seed=0, dtype=dtype)
    ours = random_dflash_for(target, seed=3, num_layers=2, block_size=8)
    save_dflash(ours, tmp_path)
    theirs, info = zlab.DFlashDraftModel.from_pretrained(str(tmp_path), dtype=dtype, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"))
    assert list(theirs.target_layer_ids) == ours.config.target_layer_ids == [0, 2]
    assert (theirs.block_size, theirs.mask_token_id) == (8, ours.config.mask_token_id)

    prompt = TOK.chat_prompt([{"role": "user", "content": "Count: one, two, three."}])
    feats = features(target, prompt, ours.config.target_layer_ids)
    block = torch.tensor([[prompt[-1]] + [ours.config.mask_token_id] * 7])
    noise = target.model.embed_tokens(block)
    pos = offset + torch.arange(len(prompt) + 8)[None]
    with torch.no_grad():
        mine = ours.compute_logits(ours(feats, noise, pos)[:, 1:], target.lm_head)
        ref = theirs(target_hidden=feats, noise_embedding=noise, position_ids=pos, use_cache=False)
        ref = theirs.compute_logits(ref[:, 1:], target.lm_head)
    err = (mine - ref).abs().max().item()
    assert mine.shape == (1, 7, TOK.vocab_size)
    assert err < (F64_TOL if dtype == torch.float64 else F32_TOL), f"max |logit diff| {err:.3g}"


@pytest.mark.parametrize("target_name", ["tiny-qwen35", "tiny-gdn"])
def test_dflash_package_loads_the_shipped_family_drafters(monkeypatch, target_name):
    """The project's trained DFlash checkpoints (repro/assets/family) load in z-lab's class with no
    missing/unexpected keys and draft the same float64 logits from the trained target's features."""
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3", reason="needs transformers")
    zlab = pytest.importorskip(
        "dflash.model", reason="the dflash package is not installed (pip install --no-deps dflash==0.1.0)"
    )
    from repro.models.family import resolve_checkpoint
    from repro.models.loading import load_target
    from repro.models.tokenizer import load_tokenizer

    monkeypatch.setattr(qwen3.Qwen3RMSNorm, "forward", _rmsnorm_in_input_dtype)
    monkeypatch.setattr(qwen3.Qwen3RotaryEmbedding, "forward", _rotary_in_float64)
    target = load_target(target_name, dtype=torch.float64)
    path = resolve_checkpoint(f"{target_name}-dflash")
    ours = load_dflash(path, dtype=torch.float64)
    theirs, info = zlab.DFlashDraftModel.from_pretrained(
        str(path), dtype=torch.float64, output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"))
    assert list(theirs.target_layer_ids) == ours.config.target_layer_ids
    bs = ours.config.block_size
    prompt = load_tokenizer(target_name).chat_prompt([{"role": "user", "content": "What is 7 times 8?"}])
    feats = features(target, prompt, ours.config.target_layer_ids)
    block = torch.tensor([[prompt[-1]] + [ours.config.mask_token_id] * (bs - 1)])
    noise = target.model.embed_tokens(block)
    pos = torch.arange(len(prompt) + bs)[None]
    with torch.no_grad():
        mine = ours.compute_logits(ours(feats, noise, pos)[:, 1:], target.lm_head)
        ref = theirs(target_hidden=feats, noise_embedding=noise, position_ids=pos, use_cache=False)
        ref = theirs.compute_logits(ref[:, 1:], target.lm_head)
    assert mine.shape == (1, bs - 1, target.config.vocab_size)
    assert (mine - ref).abs().max().item() < F64_TOL


# ----- (b) checkpoints -----


def test_save_load_round_trip(tmp_path, model64):
    model = random_dflash_for(model64, seed=1, num_layers=2, block_size=6)
    save_dflash(model, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["block_size"] == 6
    assert raw["num_target_layers"] == 4
    assert raw["dflash_config"] == {"target_layer_ids": [0, 2], "mask_token_id": 259}
    back = load_dflash(tmp_path)
    assert back.config.to_dict() == model.config.to_dict()
    assert back.dtype == torch.float64
    for (name, a), (name_b, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert name == name_b and torch.equal(a, b)
    assert load_dflash(tmp_path, dtype=torch.float32).dtype == torch.float32


def _bad(tmp_path, model64, case):
    path = tmp_path / "ckpt"
    save_dflash(random_dflash_for(model64, seed=0), path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    raw = json.loads(cfg_file.read_text())
    edit = {
        "dflash2": lambda: raw.update(architectures=["DFlash2DraftModel"]),
        "no_mask": lambda: raw["dflash_config"].pop("mask_token_id"),
        "no_hidden": lambda: raw.pop("hidden_size"),
        "bad_layers": lambda: raw["dflash_config"].update(target_layer_ids=[0, 9]),
        "sliding": lambda: raw.update(use_sliding_window=True),
    }
    if case in edit:
        edit[case]()
        cfg_file.write_text(json.dumps(raw))
    elif case == "missing":
        return tmp_path / "nope"
    elif case == "file":
        return weights
    elif case == "no_config":
        cfg_file.unlink()
    elif case == "bad_json":
        cfg_file.write_text("{not json")
    elif case == "target_checkpoint":
        other = tmp_path / "target"
        save_target(model64, other)
        return other
    elif case == "no_weights":
        weights.unlink()
    elif case in ("missing_weight", "wrong_shape", "extra_weight"):
        from safetensors.torch import load_file, save_file

        w = load_file(str(weights))
        if case == "missing_weight":
            del w["fc.weight"]
        elif case == "wrong_shape":
            w["fc.weight"] = w["fc.weight"][:, :10].contiguous()
        else:
            w["layers.0.attention_conv.base_kernel"] = torch.zeros(2)
        save_file(w, str(weights))
    elif case == "corrupt":
        weights.write_bytes(b"garbage")
    return path


@pytest.mark.parametrize(
    "case,needle",
    [
        ("missing", "does not exist"),
        ("file", "not a directory"),
        ("no_config", "no config.json"),
        ("bad_json", "not valid JSON"),
        ("target_checkpoint", "not a DFlashDraftModel checkpoint"),
        ("dflash2", "DFlash-2"),
        ("no_mask", "mask_token_id"),
        ("no_hidden", "hidden_size"),
        ("bad_layers", "outside the 4 target layers"),
        ("sliding", "sliding-window"),
        ("no_weights", "no *.safetensors"),
        ("missing_weight", "incomplete: missing fc.weight"),
        ("wrong_shape", "has shape"),
        ("extra_weight", "lacks: layers.0.attention_conv"),
        ("corrupt", "cannot read weight file"),
    ],
)
def test_bad_checkpoints_give_one_line_errors(tmp_path, model64, case, needle):
    with pytest.raises(CheckpointError) as exc:
        load_dflash(_bad(tmp_path, model64, case))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_drafter_must_fit_target(model64):
    other = build_default_target(seed=0, dtype=torch.float64)
    other.config.hidden_size = 32  # only the config is read by the compatibility check
    with pytest.raises(ConfigError, match="width"):
        DFlashDrafter(random_dflash_for(model64), other)
    assert spread_target_layers(36, 5) == [1, 9, 17, 25, 33]  # z-lab's layers for Qwen3-8B
    assert spread_target_layers(4, 2) == [0, 2] and spread_target_layers(4, 1) == [2]


# ----- (c) BestFirst (DDTree) -----


def _proposal(rows: list[list[float]], ids: list[list[int]] | None = None, vocab: int = 6) -> Proposal:
    probs = torch.zeros(len(rows), vocab, dtype=torch.float64)
    for d, row in enumerate(rows):
        for r, p in enumerate(row):
            probs[d, ids[d][r] if ids else r] = p
    return Proposal([[int(probs[d].argmax())] for d in range(len(rows))], probs)


def test_best_first_hand_example():
    """depth 1: a=.6 b=.3 c=.1; depth 2: x=.55 y=.35 z=.1. Path scores: a .6, ax .33, b .3, ay .21,
    bx .165, by .105, c .1, az .06: budget 4 adds a, ax, b, ay; budget 6 also bx, by."""
    a, b, c, x, y, z = 5, 3, 1, 0, 4, 2
    prop = _proposal([[0.6, 0.3, 0.1], [0.55, 0.35, 0.1]], [[a, b, c], [x, y, z]])
    tree = BestFirst(4).build(99, prop)
    assert tree.tokens.tolist() == [99, a, x, b, y]
    assert tree.parents.tolist() == [-1, 0, 1, 0, 1]
    tree = BestFirst(6).build(99, prop)
    assert tree.tokens.tolist() == [99, a, x, b, y, x, y]
    assert tree.parents.tolist() == [-1, 0, 1, 0, 1, 3, 3]


def _path_scores(tree: Tree, logp: torch.Tensor) -> list[float]:
    scores = [0.0]
    depth = tree.depth.tolist()
    for i in range(1, tree.size):
        scores.append(scores[tree.parents[i]] + float(logp[depth[i] - 2, tree.tokens[i]]))
    return scores


@pytest.mark.parametrize("budget", [1, 7, 31, 100])
def test_best_first_properties(budget):
    gen = torch.Generator().manual_seed(budget)
    probs = torch.softmax(3 * torch.randn(5, 50, generator=gen, dtype=torch.float64), dim=-1)
    tree = BestFirst(budget).build(7, Proposal([[0]] * 5, probs))
    logp = probs.log()
    assert tree.size == budget + 1 and tree.tokens[0] == 7  # budget counts draft nodes, not the root
    assert all(p < i for i, p in enumerate(tree.parents.tolist()) if i)  # topological
    depth = tree.depth.tolist()
    for node in range(tree.size):
        kids = tree.children_of(node)
        kid_probs = [float(probs[depth[k] - 2, tree.tokens[k]]) for k in kids]
        assert kid_probs == sorted(kid_probs, reverse=True)  # siblings by decreasing probability
        assert len({int(tree.tokens[k]) for k in kids}) == len(kids)
    scores = _path_scores(tree, logp)
    assert all(s >= t for s, t in zip(scores[1:], scores[2:]))  # pop order: scores never increase


def test_best_first_is_the_top_budget_paths():
    """Brute force: the tree's nodes are exactly the `budget` highest-scoring paths."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(2 * torch.randn(3, 4, generator=gen, dtype=torch.float64), dim=-1)
    logp = probs.log()
    paths = [p for d in (1, 2, 3) for p in itertools.product(range(4), repeat=d)]
    score = {p: sum(float(logp[d, t]) for d, t in enumerate(p)) for p in paths}
    for budget in (1, 5, 12, 40):
        best = set(heapq.nlargest(budget, paths, key=score.__getitem__))
        tree = BestFirst(budget).build(0, Proposal([[0]] * 3, probs))
        got = {tuple(tree.tokens[tree.path_to(i)[1:]].tolist()) for i in range(1, tree.size)}
        assert got == best


def test_best_first_edges():
    assert BestFirst(5).build(3, None).tokens.tolist() == [3]
    with pytest.raises(ConfigError, match="marginals"):
        BestFirst(5).build(3, Proposal([[1], [2]]))
    for bad in (0, 1024):
        with pytest.raises(ConfigError, match="budget"):
            BestFirst(bad)
    tiny = BestFirst(50).build(0, _proposal([[0.5, 0.5]], vocab=2))  # top-k runs out: 2 nodes
    assert tiny.size == 3


# ----- (d) lossless against AR -----

ROUTES = [
    {"name": "chain4", "kind": "dflash_chain", "drafter": "random", "block_size": 4},
    {"name": "chain16", "kind": "dflash_chain", "drafter": "random"},
    {"name": "tree16", "kind": "ddtree", "drafter": "random", "budget": 16, "block_size": 8},
    {"name": "tree5", "kind": "ddtree", "drafter": "random", "budget": 5},
]


@pytest.mark.parametrize("spec", ROUTES, ids=[s["name"] for s in ROUTES])
def test_random_dflash_routes_reproduce_ar(model64, prompts, ar_outputs, spec):
    route = build_route(spec, TOK.vocab_size, "greedy", 0.0, 0, target=model64)
    for ids, ar in zip(prompts, ar_outputs):
        res = generate(model64, ids, route, MAX_NEW)
        assert res.output_ids == ar
        assert min(res.accepted_lengths) >= 1 and sum(res.accepted_lengths) == len(res.output_ids) - 1
        size = spec["budget"] + 1 if spec["kind"] == "ddtree" else spec.get("block_size", 16)
        assert set(res.tree_sizes) == {size}


def test_route_parameters(tmp_path, model64, prompts, ar_outputs):
    with pytest.raises(ConfigError, match="needs the target"):
        build_route({"name": "c", "kind": "dflash_chain", "drafter": "random"}, 260, "greedy", 0.0, 0)
    with pytest.raises(ConfigError, match="missing parameter"):
        build_route(
            {"name": "t", "kind": "ddtree", "drafter": "random"}, 260, "greedy", 0.0, 0, target=model64
        )
    with pytest.raises(ConfigError, match="budget"):
        spec = {"name": "t", "kind": "ddtree", "drafter": "random", "budget": 0}
        build_route(spec, 260, "greedy", 0.0, 0, target=model64)
    # a saved drafter behaves exactly like the random one it was saved from
    save_dflash(random_dflash_for(model64, seed=5, block_size=6), tmp_path)
    by_path = {"name": "p", "kind": "dflash_chain", "drafter": str(tmp_path)}
    random = {"name": "r", "kind": "dflash_chain", "drafter": "random", "block_size": 6}
    a = generate(model64, prompts[2], build_route(by_path, 260, "greedy", 0.0, 0, target=model64), MAX_NEW)
    b = generate(model64, prompts[2], build_route(random, 260, "greedy", 0.0, 5, target=model64), MAX_NEW)
    assert a.output_ids == b.output_ids == ar_outputs[2]
    assert a.accepted_lengths == b.accepted_lengths and set(a.tree_sizes) == {6}


def test_missing_prefill_chunks_are_an_error(model64, prompts):
    """Without the engine's observe_prefill the drafter sees only the last chunk: it must refuse."""
    from repro.drafters.base import DraftContext

    ids = prompts[2]
    assert len(ids) > 64
    drafter = DFlashDrafter(random_dflash_for(model64), model64)
    drafter.begin(ids, None)
    _, ver = model64.prefill(ids, capture=drafter.capture_layers)
    with pytest.raises(ConfigError, match="observe_prefill"):
        drafter.propose(DraftContext(ids, [1], ver, list(range(ver.tree.size))))


# ----- (e) the drafter reads the right hidden states at the right positions -----


def test_drafter_context_matches_full_recompute(model64, prompts):
    """Every proposal equals a from-scratch DFlash pass on reference features of all committed tokens
    (one full verify, no chunking, no incremental cache), and the cached features equal them."""
    route = build_route(ROUTES[2], TOK.vocab_size, "greedy", 0.0, 0, target=model64)
    drafter = route.drafter
    seen = []
    propose = drafter.propose

    def spy(ctx):
        proposal = propose(ctx)
        seen.append((len(ctx.prompt_ids) + len(ctx.output_ids) - 1, ctx.output_ids[-1], proposal.probs))
        return proposal

    drafter.propose = spy
    ids = prompts[2]
    res = generate(model64, ids, route, MAX_NEW)
    layers, model, bs = drafter.capture_layers, drafter.model, drafter.block_size
    full = features(model64, ids + res.output_ids, layers)
    assert len(seen) == res.steps
    for committed, root, probs in seen:
        block = torch.tensor([[root] + [model.config.mask_token_id] * (bs - 1)])
        with torch.no_grad():
            hidden = model(
                full[:, :committed], model64.model.embed_tokens(block), torch.arange(committed + bs)
            )
            ref = torch.softmax(model.compute_logits(hidden[0, 1:], model64.lm_head), dim=-1)
        assert (probs - ref).abs().max().item() < 1e-10
    last = seen[-1][0]
    assert drafter.committed >= last
    assert (drafter.features[:last] - full[0, :last]).abs().max().item() < 1e-10


def _force(drafter, prompt_len, continuation, right_p=1.0):
    """Make the drafter's logits put ``right_p`` on the target's own next tokens (the rest on a wrong
    one), at the absolute positions the drafter asks about."""
    vocab = TOK.vocab_size

    def block_rows(ctx):
        _, positions = drafter.block_inputs(ctx)
        assert drafter.kv[0][0].shape[2] == int(positions[0, 0])  # the context ends right before the block
        logits = torch.full((positions.shape[1] - 1, vocab), -1e4, dtype=torch.float64)
        for j, pos in enumerate(positions[0, 1:].tolist()):
            k = pos - prompt_len
            right = continuation[k] if k < len(continuation) else 0
            logits[j, right] = math.log(right_p)
            if right_p < 1:
                logits[j, (right + 1) % vocab] = math.log(1 - right_p)
        return None, logits

    drafter.block_rows = block_rows


def test_forced_continuation_is_fully_accepted(model64, prompts, ar_outputs):
    ids, ar = prompts[2], ar_outputs[2]
    chain = build_route(ROUTES[0], TOK.vocab_size, "greedy", 0.0, 0, target=model64)
    _force(chain.drafter, len(ids), ar)
    res = generate(model64, ids, chain, MAX_NEW)
    assert res.output_ids == ar and res.accepted_lengths == [4] * 5 + [3]

    # right token at rank 2 everywhere: a chain accepts nothing, a 14-node DDTree (2 + 4 + 8) everything
    spec = {"name": "t", "kind": "ddtree", "drafter": "random", "budget": 14, "block_size": 4}
    for route, lengths in (
        (chain, [1] * 23),
        (build_route(spec, 260, "greedy", 0.0, 0, target=model64), None),
    ):
        _force(route.drafter, len(ids), ar, right_p=0.45)
        res = generate(model64, ids, route, MAX_NEW)
        assert res.output_ids == ar
        assert res.accepted_lengths == (lengths or [4] * 5 + [3])


def test_proposals_read_candidates_lazily_and_once():
    """A proposal's candidates come from the list, the device ``top_ids`` or a ``read`` function (read on
    first use only, as the device path never asks); one of them is required."""
    calls = []
    lazy = Proposal(read=lambda: calls.append(1) or [[3], [5]])
    assert calls == [] and lazy.depth == 2 and lazy.candidates == [[3], [5]] and calls == [1]
    top = Proposal(top_ids=torch.tensor([[1, 2], [4, 0], [7, 7]]))
    assert top.depth == 3 and top.candidates == [[1, 2], [4, 0], [7, 7]]
    with pytest.raises(ValueError, match="candidates, top_ids or a reader"):
        Proposal(probs=torch.ones(2, 4))
