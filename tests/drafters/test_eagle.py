"""EAGLE drafter: checkpoints, incremental drafting state against a from-scratch recompute, EAGLE-2
dynamic trees (budget, top-k, tau), exactness against AR, and the training recipe and its CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.drafters.base import DraftContext
from repro.drafters.dflash import random_dflash_for, save_dflash
from repro.drafters.eagle import (
    DynamicTree,
    EagleDrafter,
    load_eagle,
    random_eagle_for,
    save_eagle,
    sparse_rows,
)
from repro.errors import CheckpointError, ConfigError
from repro.models.loading import load_target
from repro.models.tokenizer import ByteTokenizer
from repro.train.cli import train_app
from repro.train.eagle import EagleRecipe, train_eagle
from repro.tree import Tree

TOK = ByteTokenizer()
MAX_NEW = 16
LAYER_NAMES = [
    *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
]


@pytest.fixture(scope="module")
def prompts():
    """A short chat prompt and one longer than a prefill chunk (64 tokens)."""
    texts = ["Hi!", "Write a haiku about the sea, the moon and a small boat at night."]
    return [TOK.chat_prompt([{"role": "user", "content": t}]) for t in texts]


@pytest.fixture(scope="module")
def ar_outputs(model64, prompts):
    ar = build_route({"kind": "ar"}, TOK.vocab_size, "greedy", 0.0, 0)
    return [generate(model64, ids, ar, MAX_NEW).output_ids for ids in prompts]


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "train_log.jsonl").read_text().splitlines()]


# ----- (a) checkpoints -----


def test_save_load_round_trip(tmp_path, model64):
    model = random_eagle_for(model64, seed=1, num_layers=2)
    save_eagle(model, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["EagleDraftModel"] and raw["model_type"] == "llama"
    assert raw["eagle_config"] == {"target_layer_ids": [3], "target_hidden_size": 64}
    assert (raw["num_hidden_layers"], raw["hidden_size"], raw["vocab_size"]) == (2, 64, 260)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert names == {"fc.weight"} | {f"layers.{i}.{n}" for i in range(2) for n in LAYER_NAMES}
    back = load_eagle(tmp_path, target=model64)
    assert back.config == model.config and back.dtype == torch.float64
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 260, (2, 9), generator=gen)
    feats = torch.randn(2, 9, 64, generator=gen, dtype=torch.float64)
    pos = torch.arange(5, 14).expand(2, -1)
    with torch.no_grad():
        a = model.compute_logits(model(ids, feats, pos, model64.model.embed_tokens.weight)[0], model64)
        b = back.compute_logits(back(ids, feats, pos, model64.model.embed_tokens.weight)[0], model64)
    # equal up to rounding (1.8e-15 seen: the BLAS kernels may take another path for the loaded buffers)
    assert torch.allclose(a, b, rtol=0, atol=1e-12) and a.shape == (2, 9, 260)
    assert load_eagle(tmp_path, dtype=torch.float32).dtype == torch.float32


def _bad(tmp_path: Path, model64, case: str) -> Path:
    path = tmp_path / "ckpt"
    save_eagle(random_eagle_for(model64, seed=0), path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    raw = json.loads(cfg_file.read_text())
    edits = {
        "no_eagle_config": lambda: raw.pop("eagle_config"),
        "no_hidden": lambda: raw.pop("hidden_size"),
        "width": lambda: raw.update(hidden_size=32),
        "layers": lambda: raw["eagle_config"].update(target_layer_ids=[7]),
        "vocab": lambda: raw.update(vocab_size=300),
        "rope": lambda: raw.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    }
    if case in edits:
        edits[case]()
        cfg_file.write_text(json.dumps(raw))
    elif case == "missing":
        return tmp_path / "nope"
    elif case == "file":
        return weights
    elif case == "no_config":
        cfg_file.unlink()
    elif case == "bad_json":
        cfg_file.write_text("{not json")
    elif case == "dflash":
        save_dflash(random_dflash_for(model64), tmp_path / "dflash")
        return tmp_path / "dflash"
    elif case == "no_weights":
        weights.unlink()
    elif case == "corrupt":
        weights.write_bytes(b"garbage")
    else:
        w = load_file(str(weights))
        if case == "missing_weight":
            del w["fc.weight"]
        elif case == "wrong_shape":
            w["layers.0.mlp.up_proj.weight"] = w["layers.0.mlp.up_proj.weight"][:10].contiguous()
        else:
            w["embed_tokens.weight"] = torch.zeros(2)
        save_file(w, str(weights))
    return path


@pytest.mark.parametrize(
    "case,needle",
    [
        ("missing", "does not exist"),
        ("file", "not a directory"),
        ("no_config", "no config.json"),
        ("bad_json", "not valid JSON"),
        ("dflash", "not an EagleDraftModel checkpoint"),
        ("no_eagle_config", "lacks the eagle_config"),
        ("no_hidden", "'hidden_size'"),
        ("width", "must equal eagle_config.target_hidden_size"),
        ("layers", "does not fit the target: target_layer_ids [7] are outside"),
        ("vocab", "does not fit the target: its vocabulary has 300"),
        ("rope", "unsupported rope_scaling"),
        ("no_weights", "no *.safetensors"),
        ("missing_weight", "incomplete: missing fc.weight"),
        ("wrong_shape", "layers.0.mlp.up_proj.weight has shape (10, 64), config.json implies (128, 64)"),
        ("extra_weight", "lacks: embed_tokens.weight"),
        ("corrupt", "cannot read weight file"),
    ],
)
def test_bad_checkpoints_give_one_line_errors(tmp_path, model64, case, needle):
    with pytest.raises(CheckpointError) as exc:
        load_eagle(_bad(tmp_path, model64, case), target=model64)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


# ----- (b) incremental drafting state against a from-scratch recompute -----


def _scratch_drafter(drafter: EagleDrafter, target, prompt: list[int], output: list[int]) -> EagleDrafter:
    """A fresh drafter that sees every committed feature at once (one verify of the whole prefix) and
    computes each drafted row by a full causal pass over committed rows + the row's path: no
    incremental cache, no tree mask."""
    fresh = EagleDrafter(drafter.model, target, k=drafter.k, width=drafter.width, tree=drafter.tree)
    tokens = prompt + output
    committed = tokens[:-1]
    fresh.begin(prompt, None)
    fresh.observe_prefill(target.verify(target.empty_state(), Tree.chain(committed), fresh.capture_layers))
    m, emb = fresh.model, target.model.embed_tokens.weight
    real = fresh.store.rows
    paths: list[list[tuple[int, torch.Tensor]]] = []

    def rows(tokens_new, parent_preds, parent_rows, depth):
        out = []
        for tok, pp, pr in zip(tokens_new, parent_preds, parent_rows):
            path = (paths[pr] if pr >= 0 else []) + [(tok, pp)]
            assert len(path) == depth
            paths.append(path)
            ids = torch.tensor(tokens[1:] + [t for t, _ in path])[None]
            feats = torch.cat([real, torch.stack([m.draft_features(p) for _, p in path])])[None]
            out.append(m(ids, feats, torch.arange(ids.shape[1])[None], emb)[0][0, -1])
        return torch.stack(out)

    fresh._draft_rows = rows
    return fresh


SCRATCH_ROUTES = [
    {"name": "chain", "kind": "eagle_chain", "drafter": "random", "k": 4},
    {"name": "tree", "kind": "eagle_tree", "drafter": "random", "budget": 40, "topk": 3, "depth": 4},
]


def _assert_matches_scratch(target, route, prompt: list[int], new_tokens: int) -> list[int]:
    """Every proposal of ``route`` while decoding equals the from-scratch drafter's; returns the
    accepted lengths."""
    drafter = route.drafter
    seen = []
    propose = drafter.propose

    def spy(ctx):
        proposal = propose(ctx)
        seen.append((list(ctx.prompt_ids), list(ctx.output_ids), proposal))
        return proposal

    drafter.propose = spy
    res = generate(target, prompt, route, new_tokens)
    assert len(seen) == res.steps > 1
    for prompt_ids, output, got in seen:
        ref = _scratch_drafter(drafter, target, prompt_ids, output).propose(DraftContext(prompt_ids, output))
        assert got.candidates == ref.candidates
        if got.tree is None:
            assert (got.probs - ref.probs).abs().max().item() < 1e-10
        else:
            assert torch.equal(got.tree.tokens, ref.tree.tokens)
            assert torch.equal(got.tree.parents, ref.tree.parents)
            _assert_conditionals(got.tree, ref.tree)
    return res.accepted_lengths


def _assert_conditionals(tree: Tree, ref: Tree) -> None:
    """Every inner node of ``tree`` carries the drafter's conditional there (``ref``'s, computed from
    scratch), a full float64 row over the small vocabulary whose top tokens are the node's children
    in order; leaves carry none."""
    assert tree.draw == "given" and tree.proposals is not None
    for node in range(tree.size):
        kids, prop, want = tree.children_of(node), tree.proposals[node], ref.proposals[node]
        if not kids:
            assert prop is None
            continue
        ids, probs = prop
        assert probs.dtype == torch.float64 and torch.equal(ids, torch.arange(TOK.vocab_size))
        assert torch.equal(ids, want[0]) and (probs - want[1]).abs().max().item() < 1e-10
        assert abs(probs.sum().item() - 1.0) < 1e-6
        top = torch.argsort(probs, descending=True, stable=True)[: len(kids)]
        assert top.tolist() == tree.tokens[kids].tolist()


@pytest.mark.parametrize("spec", SCRATCH_ROUTES, ids=[s["name"] for s in SCRATCH_ROUTES])
def test_incremental_drafting_matches_scratch(model64, prompts, spec):
    route = build_route(spec, TOK.vocab_size, "greedy", 0.0, 0, target=model64)
    _assert_matches_scratch(model64, route, prompts[1], 10)


def test_last_committed_row_follows_the_pending_token(model64, prompts):
    """The last committed row reads the pending token: another pending token on the same committed
    state must be drafted from, not served from the cache."""
    ids = prompts[0]
    _, ver = model64.prefill(ids, capture=(3,))

    def drafter():
        d = EagleDrafter(random_eagle_for(model64, seed=2), model64, k=2)
        d.begin(ids, None)
        d.observe_prefill(ver)
        return d

    reused = drafter()
    first = reused.propose(DraftContext(ids, [7]))
    second = reused.propose(DraftContext(ids, [8]))
    fresh = drafter().propose(DraftContext(ids, [8]))
    assert (second.probs - fresh.probs).abs().max() < 1e-12 < (first.probs - second.probs).abs().max()


# ----- (c) dynamic trees -----

A, B, C, D = 10, 11, 12, 13


@pytest.mark.parametrize(
    "shape,tokens,parents,forwards",
    [
        # scores: a .6, aa .36, b .25, aaa .216, ab = ba .15 (ab drafted first), aab .09, ...
        (DynamicTree(5, topk=2, tau=0.2, depth=3), [A, B, A, B, A], [0, 0, 1, 1, 3], 3),
        (DynamicTree(20, 2, 0.2, 3), [A, B, A, B, A, B, A, B, A, B], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4], 3),
        (DynamicTree(20, 2, 0.3, 3), [A, A, A], [0, 1, 2], 3),  # b (.25) is below tau everywhere
        (DynamicTree(2, 2, 0.0, 3), [A, A], [0, 1], 2),  # depth 3 cannot beat the best 2: stop early
        (DynamicTree(20, 3, 0.0, 1), [A, B, C], [0, 0, 0], 1),
        (DynamicTree(20, 2, 0.7, 3), [], [], 1),  # nothing is confident enough: the root alone
    ],
)
def test_dynamic_tree_hand_examples(model64, prompts, shape, tokens, parents, forwards):
    """Every node's drafter distribution is a .6, b .25, c .1, d .05: the tree follows from the
    EAGLE-2 rules alone. The prefill's last chunk runs the drafter over the prompt's rows but the
    last (one forward); then one drafter forward per depth (the first brings the last row in)."""
    dist = torch.zeros(TOK.vocab_size, dtype=torch.float64)
    dist[[A, B, C, D]] = torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64)
    drafter = EagleDrafter(random_eagle_for(model64), model64, tree=shape)
    drafter._probs = lambda preds: dist.expand(preds.shape[0], -1)
    calls = []
    forward = drafter.model.forward
    drafter.model.forward = lambda *a, **kw: calls.append(a[0].shape) or forward(*a, **kw)
    ids = prompts[0]
    drafter.begin(ids, None)
    _, ver = model64.prefill(ids, capture=drafter.capture_layers)
    drafter.observe_prefill(ver)
    assert calls == [(1, len(ids) - 1)] and drafter.rows == len(ids) - 1
    calls.clear()
    proposal = drafter.propose(DraftContext(ids, [7]))
    assert proposal.tree.tokens.tolist() == [7, *tokens]
    assert proposal.tree.parents.tolist() == [-1, *parents]
    assert len(calls) == forwards and calls[0] == (1, 1)
    assert all(c[1] <= shape.topk for c in calls[1:])  # a depth's frontier drafts together
    assert [c[0] for c in proposal.candidates] == [A] * (max(proposal.tree.depth.tolist()) - 1)
    inner = [i for i in range(proposal.tree.size) if proposal.tree.children_of(i)]
    assert [i for i, p in enumerate(proposal.tree.proposals) if p is not None] == inner
    assert all(torch.equal(proposal.tree.proposals[i][1], dist) for i in inner)


def test_sparse_rows_keep_the_top_support():
    probs = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), -1)
    full, top = sparse_rows(probs, 50), sparse_rows(probs, 4)
    assert all(
        torch.equal(ids, torch.arange(50)) and torch.equal(p, r.double()) for (ids, p), r in zip(full, probs)
    )
    for (ids, p), r in zip(top, probs):
        assert ids.tolist() == torch.topk(r, 4).indices.tolist() and torch.equal(p, r[ids].double())


def test_dynamic_tree_settings_are_checked(model64):
    for kw, needle in [({"budget": 0}, "budget"), ({"topk": 0}, "topk"), ({"tau": 1.0}, "tau")]:
        with pytest.raises(ConfigError, match=needle):
            DynamicTree(**{"budget": 8, **kw})
    with pytest.raises(ConfigError, match="needs the target"):
        build_route({"kind": "eagle_tree", "drafter": "random", "budget": 4}, 260, "greedy", 0.0, 0)
    with pytest.raises(ConfigError, match="missing parameter"):
        build_route({"kind": "eagle_tree", "drafter": "random"}, 260, "greedy", 0.0, 0, target=model64)
    with pytest.raises(ConfigError, match="k must be"):
        build_route(
            {"kind": "eagle_chain", "drafter": "random", "k": 0}, 260, "greedy", 0.0, 0, target=model64
        )


# ----- (d) lossless against AR -----

ROUTES = [
    {"name": "chain1", "kind": "eagle_chain", "drafter": "random", "k": 1},
    {"name": "chain5", "kind": "eagle_chain", "drafter": "random", "k": 5},
    {"name": "tree8", "kind": "eagle_tree", "drafter": "random", "budget": 8, "topk": 2, "depth": 4},
    {"name": "tree24", "kind": "eagle_tree", "drafter": "random", "budget": 24, "topk": 4, "tau": 0.03},
]


def _check_route(target, route, spec, prompts, refs) -> list[Tree]:
    """Every output equals AR's; returns the trees the route verified."""
    trees: list[Tree] = []
    build = route.builder.build
    route.builder.build = lambda root, prop, rng=None: trees.append(build(root, prop, rng)) or trees[-1]
    for ids, ref in zip(prompts, refs):
        res = generate(target, ids, route, len(ref))
        assert res.output_ids == ref
        assert sum(res.accepted_lengths) == len(ref) - 1
    for tree in trees:
        inner = [bool(tree.children_of(i)) for i in range(tree.size)]
        assert tree.proposals is not None and [p is not None for p in tree.proposals] == inner
        if spec["kind"] == "eagle_chain":
            assert tree.is_chain and tree.size == spec["k"] + 1
        else:
            draft_depth = max(tree.depth.tolist()) - 1  # Tree.depth counts the root as depth 1
            assert tree.size - 1 <= spec["budget"] and draft_depth <= spec.get("depth", 6)
            kids = [tree.children_of(i) for i in range(tree.size)]
            assert max(len(k) for k in kids) <= spec["topk"]
            assert all(len({int(tree.tokens[c]) for c in k}) == len(k) for k in kids)
    return trees


@pytest.mark.parametrize("spec", ROUTES, ids=[s["name"] for s in ROUTES])
def test_random_eagle_routes_reproduce_ar(model64, prompts, ar_outputs, spec):
    route = build_route(spec, TOK.vocab_size, "greedy", 0.0, 0, target=model64)
    trees = _check_route(model64, route, spec, prompts, ar_outputs)
    if spec["name"] == "tree24":  # tau prunes some steps' trees below the budget, not all
        assert min(t.size for t in trees) < 25 == max(t.size for t in trees)


# ----- (e) training -----


def eagle_recipe(target: Path, corpus: Path, out: Path, **kw) -> EagleRecipe:
    base = dict(
        prompts=6, prompt_len=12, gen_len=16, steps=12, batch_size=4, lr=3e-3, warmup=2, device="cpu",
        eval_prompts=2, eval_new_tokens=16,
    )  # fmt: skip
    return EagleRecipe(target=str(target), corpus=str(corpus), out=str(out), **{**base, **kw})


def test_eagle_training_learns_and_stays_lossless(trained, corpus, tmp_path):
    target_dir, _ = trained
    metrics = train_eagle(eagle_recipe(target_dir, corpus, tmp_path))
    curve = losses(tmp_path)
    assert len(curve) == 12 and sum(curve[-3:]) / 3 < sum(curve[:3]) / 3 - 1.0, curve
    for name in ("config.json", "model.safetensors", "loss.png", "metrics.json", "manifest.json"):
        assert (tmp_path / name).is_file(), name
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    assert json.loads((tmp_path / "manifest.json").read_text())["config"]["recipe"] == "eagle"
    assert metrics["lossless"] and metrics["target_layer_ids"] == [3]
    assert metrics["heldout_chain_mal"] > metrics["heldout_chain_mal_untrained"]
    assert metrics["train_top1_agreement"] > 0.3
    target = load_target(target_dir, dtype=torch.float64)
    assert load_eagle(tmp_path, target=target).config.num_hidden_layers == 1
    ar = build_route({"kind": "ar"}, target.config.vocab_size, "greedy", 0.0, 0)
    prompts = [list(b"the dog ran to "), list(b"a red house by the sea and ")]
    refs = [generate(target, p, ar, MAX_NEW).output_ids for p in prompts]
    for spec in (
        {"kind": "eagle_chain", "drafter": str(tmp_path), "k": 4},
        {"kind": "eagle_tree", "drafter": str(tmp_path), "budget": 12, "topk": 3, "tau": 0.05, "depth": 5},
    ):
        route = build_route(spec, target.config.vocab_size, "greedy", 0.0, 0, target=target)
        _check_route(target, route, spec, prompts, refs)
        # accepted drafts make the committed rows grow by several per step: still as from scratch
        fresh = build_route(spec, target.config.vocab_size, "greedy", 0.0, 0, target=target)
        assert max(_assert_matches_scratch(target, fresh, prompts[0], MAX_NEW)) > 2


def test_cli_trains_eagle_with_seeded_noise(trained, corpus, tmp_path):
    help_text = CliRunner().invoke(train_app, ["eagle", "--help"], env={"COLUMNS": "200"})
    assert (
        help_text.exit_code == 0 and "--feature-noise" in help_text.output and "--w-cls" in help_text.output
    )
    target_dir, _ = trained
    args = ["eagle", "--target", str(target_dir), "--corpus", str(corpus), "--out", str(tmp_path / "cli")]
    args += ["--prompts", "2", "--prompt-len", "8", "--distill-new-tokens", "6", "--steps", "3"]
    args += ["--batch-size", "2"]
    args += ["--feature-noise", "0.1", "--k", "2", "--device", "cpu", "--eval-prompts", "1"]
    args += ["--max-new-tokens", "6"]
    result = CliRunner().invoke(train_app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["lossless"] is True  # progress lines go to stderr
    kw = dict(
        prompts=2, prompt_len=8, gen_len=6, steps=3, batch_size=2, k=2, eval_prompts=1, eval_new_tokens=6
    )
    train_eagle(
        eagle_recipe(target_dir, corpus, tmp_path / "same", feature_noise=0.1, warmup=20, lr=1e-3, **kw)
    )
    train_eagle(eagle_recipe(target_dir, corpus, tmp_path / "quiet", warmup=20, lr=1e-3, **kw))
    assert losses(tmp_path / "cli") == losses(tmp_path / "same") != losses(tmp_path / "quiet")
