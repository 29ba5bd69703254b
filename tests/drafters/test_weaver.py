"""Weaver (DFlash-TfM): residual logits over the DFlash pool, checkpoints, best-first tree growth,
exactness against AR, self-distillation training, pool mass and `repro train weaver`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.decoding.tree_builders import BestFirst
from repro.drafters.base import DraftContext
from repro.drafters.dflash import DFlashDrafter, random_dflash_for, save_dflash
from repro.drafters.pool import pool_mass
from repro.drafters.weaver import WeaverDrafter, load_weaver, random_weaver_for, save_weaver
from repro.errors import CheckpointError, ConfigError
from repro.harness.evaluation import depth_acceptance
from repro.models.default import build_default_target
from repro.models.loading import load_target, save_target
from repro.models.tokenizer import ByteTokenizer, write_byte_tokenizer_marker
from repro.train.cli import train_app
from repro.train.weaver import WeaverRecipe, train_weaver, weaver_loss
from repro.tree import Tree

TOK = ByteTokenizer()
V = TOK.vocab_size
MAX_NEW = 20


@pytest.fixture(scope="module")
def prompts():
    """A short chat prompt and one longer than a prefill chunk (64 tokens)."""
    texts = ["Hi!", "Write a haiku about the sea, the moon and a small boat at night."]
    return [TOK.chat_prompt([{"role": "user", "content": t}]) for t in texts]


@pytest.fixture(scope="module")
def ar_outputs(model64, prompts):
    ar = build_route({"kind": "ar"}, V, "greedy", 0.0, 0)
    return [generate(model64, ids, ar, MAX_NEW).output_ids for ids in prompts]


def make_drafter(target, block=6, budget=12, width=3, pool=None, zero=False, seed=0) -> WeaverDrafter:
    dflash = DFlashDrafter(random_dflash_for(target, seed=seed, block_size=block), target)
    weaver = random_weaver_for(dflash.model, target, seed=seed, zero_residual=zero)
    return WeaverDrafter(weaver, dflash, budget, width, pool)


def draft_once(drafter: WeaverDrafter, target, ids: list[int]):
    """Prefill ``ids`` (one chunk) as the engine does, draft once; the proposal and grow's inputs/result."""
    seen = {}
    grow = drafter.grow

    def spy(*args):
        seen["args"], seen["growth"] = args, grow(*args)
        return seen["growth"]

    drafter.grow = spy
    drafter.begin(ids, None)
    _, ver = target.prefill(ids, capture=drafter.capture_layers)
    drafter.observe_prefill(ver)
    first = int(ver.logits[-1].argmax())
    proposal = drafter.propose(DraftContext(ids, [first], ver, list(range(ver.tree.size))))
    return proposal, seen["args"], seen["growth"]


@torch.no_grad()
def path_log_q(drafter: WeaverDrafter, args, tree: Tree, node: int) -> float:
    """Cumulative log q of ``node`` recomputed from its root-to-node path alone (a causal chain)."""
    root, rows, pool_logits, pool_ids, feature = args
    w, emb = drafter.weaver, drafter.target.model.embed_tokens.weight
    if node == 0:
        return 0.0
    path = tree.path_to(node)
    toks = tree.tokens[path]
    x = w.embed(rows[: len(path) - 1], emb[toks[:-1]], feature)
    n = x.shape[0]
    u, _ = w(x[None], torch.ones(n, n, dtype=torch.bool).tril()[None])
    logq = w.pool_log_probs(u[0], pool_logits[:n], emb[pool_ids[:n]])
    ranks = [(pool_ids[d] == toks[d + 1]).nonzero().item() for d in range(n)]
    return float(sum(logq[d, r] for d, r in enumerate(ranks)))


# ----- (a) residual over the pool -----


def test_zero_residual_is_the_dflash_marginal_on_the_pool(model64, prompts):
    ids = prompts[0]
    drafter = make_drafter(model64, pool=7, zero=True)
    proposal, (root, rows, pool_logits, pool_ids, feature), _ = draft_once(drafter, model64, ids)
    w, emb = drafter.weaver, model64.model.embed_tokens.weight
    for parent in (root, 65, 101):
        x = w.embed(rows, emb[parent].expand(rows.shape[0], -1), feature)
        u, _ = w(x[:, None], torch.ones(rows.shape[0], 1, 1, dtype=torch.bool))
        assert u.abs().max() == 0
        logq = w.pool_log_probs(u[:, 0], pool_logits, emb[pool_ids])
        on_pool = proposal.probs.gather(1, pool_ids)
        assert (logq - (on_pool / on_pool.sum(-1, keepdim=True)).log()).abs().max() < 1e-12
    # a non-zero residual moves q away from the marginal and conditions it on the parent token
    w = make_drafter(model64, pool=7).weaver
    qs = []
    for parent in (65, 101):
        x = w.embed(rows[:1], emb[parent][None], feature)
        u, _ = w(x[None], torch.ones(1, 1, 1, dtype=torch.bool))
        qs.append(w.pool_log_probs(u[0, 0], pool_logits[0], emb[pool_ids[0]]).exp())
    assert (qs[0] - qs[1]).abs().max() > 1e-3
    assert (qs[0] - proposal.probs[0, pool_ids[0]] / proposal.probs[0, pool_ids[0]].sum()).abs().max() > 1e-3


def test_zero_residual_full_pool_is_ddtree_at_every_width(model64, prompts):
    """K = V and W_o = 0: Weaver's tree is DDTree's best-first tree, whatever the width; wider
    steps need fewer Weaver forwards."""
    for budget in (5, 23):
        forwards = []
        for width in (1, 4):
            drafter = make_drafter(model64, budget=budget, width=width, pool=V, zero=True)
            proposal, args, growth = draft_once(drafter, model64, prompts[0])
            ddtree = BestFirst(budget).build(args[0], proposal)
            assert torch.equal(growth.tree.tokens, ddtree.tokens)
            assert torch.equal(growth.tree.parents, ddtree.parents)
            forwards.append(len(growth.batches))
        assert forwards[1] < forwards[0]


def test_tokens_outside_the_pool_are_never_proposed(model64, prompts):
    drafter = make_drafter(model64, block=5, budget=60, width=3, pool=3)
    proposal, args, growth = draft_once(drafter, model64, prompts[0])
    pool_ids, tree = args[3], growth.tree
    depth = tree.depth.tolist()
    for node in range(1, tree.size):
        assert int(tree.tokens[node]) in pool_ids[depth[node] - 2].tolist()
    assert tree.size == 61
    # the pool is DFlash's top 3 at every depth
    assert torch.equal(pool_ids, torch.topk(proposal.probs, 3, dim=-1).indices)


# ----- (b) tree growth -----


@pytest.mark.parametrize(
    "budget,width,block,pool",
    [(1, 1, 4, None), (12, 1, 6, None), (12, 4, 6, None), (40, 8, 4, 3), (30, 3, 3, 2), (9, 2, 16, 5)],
)
def test_tree_respects_budget_width_depth(model64, prompts, budget, width, block, pool):
    drafter = make_drafter(model64, block=block, budget=budget, width=width, pool=pool)
    proposal, args, growth = draft_once(drafter, model64, prompts[0])
    tree, scores = growth.tree, growth.scores
    k = min(pool or 512, V)
    capacity = sum(k**d for d in range(1, block))
    assert tree.size <= min(budget, capacity) + 1 and int(tree.tokens[0]) == args[0]
    assert max(tree.depth.tolist()) <= block  # Tree depth counts the root as 1: drafts reach block - 1
    assert growth.batches[0] == 1 and all(1 <= b <= width for b in growth.batches)
    for node in range(tree.size):
        kids = tree.children_of(node)
        assert len({int(tree.tokens[c]) for c in kids}) == len(kids)
        assert [scores[c] for c in kids] == sorted((scores[c] for c in kids), reverse=True)
        # the tree-masked, cached batch forward equals the node's own root-to-node chain
        assert abs(scores[node] - path_log_q(drafter, args, tree, node)) < 1e-10
    # width 1: one node per forward (the root and every node with children to come, i.e. below the
    # last depth and not the node that filled the budget), the exact best-first pop order and every
    # reachable node up to the budget; a wider step takes fewer forwards and never a better tree
    one = make_drafter(model64, block=block, budget=budget, width=1, pool=pool)
    _, _, narrow = draft_once(one, model64, prompts[0])
    depth = narrow.tree.depth.tolist()
    assert narrow.tree.size == min(budget, capacity) + 1
    assert narrow.batches == [1] * (
        1 + sum(depth[n] < block and n < budget for n in range(1, narrow.tree.size))
    )
    assert all(a >= b for a, b in zip(narrow.scores[1:], narrow.scores[2:]))
    assert len(growth.batches) <= len(narrow.batches)
    if tree.size == narrow.tree.size:
        assert sum(scores) <= sum(narrow.scores) + 1e-9
    greedy, node = [], 0
    while tree.children_of(node):
        node = max(tree.children_of(node), key=scores.__getitem__)
        greedy.append(int(tree.tokens[node]))
    assert [c[0] for c in proposal.candidates] == greedy and proposal.probs.shape == (block - 1, V)


# ----- (c) checkpoints -----


def test_save_load_round_trip(tmp_path, model64):
    dflash = random_dflash_for(model64, seed=1, block_size=6)
    model = random_weaver_for(dflash, model64, seed=2, d_model=32, heads=2, pool_size=17)
    model.config.extra = {"dflash_checkpoint": "somewhere"}
    save_weaver(model, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["WeaverAdapter"] and raw["dflash_checkpoint"] == "somewhere"
    want = dict(d_model=32, num_heads=2, pool_size=17, block_size=6, target_hidden_size=64)
    assert {k: raw[k] for k in want} == want
    assert raw["target_feature_size"] == 128 and raw["dflash_hidden_size"] == 64
    back = load_weaver(tmp_path, dflash, model64)
    assert back.config == model.config and back.dtype == torch.float64
    for (name, a), (name_b, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert name == name_b and torch.equal(a, b)


def _bad(tmp_path: Path, model64, case: str) -> tuple[Path, object]:
    path = tmp_path / "ckpt"
    dflash = random_dflash_for(model64, seed=0, block_size=6)
    save_weaver(random_weaver_for(dflash, model64), path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    raw = json.loads(cfg_file.read_text())
    edit = {
        "wrong_arch": lambda: raw.update(architectures=["DFlashDraftModel"]),
        "no_pool": lambda: raw.pop("pool_size"),
        "bad_heads": lambda: raw.update(num_heads=5),
        "bad_value": lambda: raw.update(d_model="wide"),
    }
    if case in edit:
        edit[case]()
        cfg_file.write_text(json.dumps(raw))
    elif case == "missing":
        path = tmp_path / "nope"
    elif case == "file":
        path = weights
    elif case == "no_config":
        cfg_file.unlink()
    elif case == "bad_json":
        cfg_file.write_text("{not json")
    elif case == "no_weights":
        weights.unlink()
    elif case in ("missing_weight", "wrong_shape", "extra_weight"):
        from safetensors.torch import load_file, save_file

        w = load_file(str(weights))
        if case == "missing_weight":
            del w["out_proj.weight"]
        elif case == "wrong_shape":
            w["q_proj.weight"] = w["q_proj.weight"][:, :10].contiguous()
        else:
            w["lm_head.weight"] = torch.zeros(2, 2)
        save_file(w, str(weights))
    elif case == "other_block":
        dflash = random_dflash_for(model64, seed=0, block_size=8)
    elif case == "other_features":
        dflash = random_dflash_for(model64, seed=0, block_size=6, num_features=3)
    return path, dflash


@pytest.mark.parametrize(
    "case,needle",
    [
        ("missing", "does not exist"),
        ("file", "not a directory"),
        ("no_config", "no config.json"),
        ("bad_json", "not valid JSON"),
        ("wrong_arch", "not a WeaverAdapter checkpoint"),
        ("no_pool", "lacks 'pool_size'"),
        ("bad_heads", "not a multiple of num_heads"),
        ("bad_value", "bad value"),
        ("no_weights", "no *.safetensors"),
        ("missing_weight", "incomplete: missing out_proj.weight"),
        ("wrong_shape", "has shape"),
        ("extra_weight", "lacks: lm_head.weight"),
        ("other_block", "block_size=6 but the DFlash drafter has 8"),
        ("other_features", "target_feature_size=128 but the DFlash drafter has 192"),
    ],
)
def test_bad_checkpoints_give_one_line_errors(tmp_path, model64, case, needle):
    path, dflash = _bad(tmp_path, model64, case)
    with pytest.raises(CheckpointError) as exc:
        load_weaver(path, dflash, model64)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


# ----- (d) lossless against AR -----

ROUTES = [
    {"name": "w12", "kind": "weaver", "drafter": "random", "weaver": "random", "budget": 12, "block_size": 6},
    {"name": "w1", "kind": "weaver", "drafter": "random", "weaver": "random", "budget": 5, "width": 1},
    {"name": "wk3", "kind": "weaver", "drafter": "random", "weaver": "random", "budget": 30, "width": 8,
     "pool": 3, "block_size": 4},
]  # fmt: skip
SIZES = {"wk3": 26}  # the root's 3 children fill 3 of the first step's 8 slots: 5 of 30 stay empty


@pytest.mark.parametrize("spec", ROUTES, ids=[s["name"] for s in ROUTES])
def test_random_weaver_routes_reproduce_ar(model64, prompts, ar_outputs, spec):
    route = build_route(spec, V, "greedy", 0.0, 0, target=model64)
    for ids, ar in zip(prompts, ar_outputs):
        res = generate(model64, ids, route, MAX_NEW)
        assert res.output_ids == ar
        assert sum(res.accepted_lengths) == len(res.output_ids) - 1
        assert set(res.tree_sizes) == {SIZES.get(spec["name"], spec["budget"] + 1)}


def test_route_parameters(model64):
    base = {"name": "w", "kind": "weaver", "drafter": "random", "weaver": "random", "budget": 4}
    with pytest.raises(ConfigError, match="needs the target"):
        build_route(base, V, "greedy", 0.0, 0)
    with pytest.raises(ConfigError, match="missing parameter"):
        build_route({k: v for k, v in base.items() if k != "budget"}, V, "greedy", 0.0, 0, target=model64)
    for bad, needle in (({"width": 0}, "width"), ({"pool": 0}, "pool"), ({"budget": 0}, "budget")):
        with pytest.raises(ConfigError, match=needle):
            build_route({**base, **bad}, V, "greedy", 0.0, 0, target=model64)


# ----- (e) training, pool mass, CLI -----


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A seeded random target (with the byte tokenizer) and a random DFlash drafter of block 4."""
    out = tmp_path_factory.mktemp("pair")
    target = build_default_target(seed=0)
    save_target(target, out / "target")
    write_byte_tokenizer_marker(out / "target")
    save_dflash(random_dflash_for(target, seed=1, block_size=4), out / "dflash")
    return out / "target", out / "dflash"


@pytest.fixture(scope="module")
def trained(pair, corpus, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("weaver")
    recipe = WeaverRecipe(
        target=str(pair[0]), dflash=str(pair[1]), corpus=str(corpus), out=str(out), pool_size=32,
        prompts=6, prompt_len=12, gen_len=12, anchors=4, steps=30, batch_size=8, lr=3e-3, warmup=2,
        device="cpu", budget=8, width=2, eval_prompts=2, eval_new_tokens=12,
    )  # fmt: skip
    return out, train_weaver(recipe)


def test_training_lowers_loss_reloads_and_stays_lossless(trained, pair, prompts):
    out, metrics = trained
    curve = [json.loads(line)["loss"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(curve) == 30 and sum(curve[-5:]) / 5 < sum(curve[:5]) / 5 - 0.05, curve
    for name in ("config.json", "model.safetensors", "loss.png", "metrics.json", "manifest.json"):
        assert (out / name).is_file(), name
    assert json.loads((out / "manifest.json").read_text())["config"]["recipe"] == "weaver"
    assert metrics["lossless"] and metrics["budget"] == 8
    for name in ("weaver", "ddtree"):
        row = metrics["heldout"][name]
        assert row["lossless"] and len(row["depth_acceptance"]) == 3
        assert row["mal"] == pytest.approx(2 * 11 / row["steps"])  # 2 prompts x 12 tokens, 1 by prefill
        acc = row["depth_acceptance"]
        assert all(a >= b for a, b in zip(acc, acc[1:])) and 0 <= acc[0] <= 1
    mass = metrics["pool_mass"]
    assert mass["pool_size"] == 32 and len(mass["mean_outside"]) == 3
    assert all(0 < m < 1 for m in mass["mean_outside"])
    target = load_target(pair[0], dtype=torch.float64)
    weaver = load_weaver(out)
    assert weaver.config.pool_size == 32 and weaver.out_proj.weight.abs().max() > 0  # trained from W_o = 0
    spec = {"kind": "weaver", "drafter": str(pair[1]), "weaver": str(out), "budget": 8, "width": 2}
    route = build_route(spec, V, "greedy", 0.0, 0, target=target)
    ar = build_route({"kind": "ar"}, V, "greedy", 0.0, 0)
    for ids in prompts:
        assert (
            generate(target, ids, route, MAX_NEW).output_ids == generate(target, ids, ar, MAX_NEW).output_ids
        )
    with pytest.raises(ConfigError, match="tv_weight"):
        WeaverRecipe(target="t", dflash="d", corpus="c", out="o", tv_weight=1.5)


@pytest.mark.parametrize("pool,tv_weight,temperature", [(V, 0.0, 1.0), (5, 1.0, 1.0), (5, 0.5, 0.3)])
def test_loss_of_the_untrained_adapter(model64, pool, tv_weight, temperature):
    """W_o = 0: the loss is KL / TV between the target's next-token distribution at a + j - 1 (at a
    distillation temperature) and DFlash's row j at anchor a renormalised on its pool, recomputed
    per anchor with z-lab's forward."""
    dflash = random_dflash_for(model64, seed=2, block_size=4)
    weaver = random_weaver_for(dflash, model64, seed=3, zero_residual=True)
    seqs = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[3, 8], [1, 9]])
    layers = tuple(dflash.config.target_layer_ids)
    logits, hidden = model64.forward_train_hidden(seqs, layers)
    features = torch.cat([hidden[i] for i in layers], dim=-1)
    got = weaver_loss(weaver, dflash, model64, seqs, features, logits, anchors, pool, tv_weight, temperature)
    emb, mask = model64.model.embed_tokens, dflash.config.mask_token_id
    terms = []
    with torch.no_grad():
        for b in range(2):
            for a in anchors[b].tolist():
                block = torch.tensor([[int(seqs[b, a])] + [mask] * 3])
                rows = dflash(features[b : b + 1, :a], emb(block), torch.arange(a + 4))
                q_all = torch.softmax(dflash.compute_logits(rows[0, 1:], model64.lm_head), dim=-1)
                for j in range(1, 4):
                    if a + j - 1 > 9:
                        continue
                    p = torch.softmax(logits[b, a + j - 1] / temperature, dim=-1)
                    ids = torch.topk(q_all[j - 1], min(pool, V)).indices
                    q = q_all[j - 1, ids] / q_all[j - 1, ids].sum()
                    p_in = p[ids]
                    kl = float((p_in / p_in.sum() * (p_in / p_in.sum() / q).log()).sum())
                    tv = 0.5 * float((p_in - q).abs().sum() + 1 - p_in.sum())
                    terms.append((1 - tv_weight) * kl + tv_weight * tv)
    assert len(terms) == 3 + 2 + 3 + 1
    assert abs(float(got.detach()) - sum(terms) / len(terms)) < 1e-6  # the loss computes p and q in float32


def test_depth_acceptance():
    assert depth_acceptance([[0], [0, 4, 6], [0, 2]], 3) == [2 / 3, 1 / 3, 0.0]
    assert depth_acceptance([], 2) == [0.0, 0.0]


def test_pool_mass(model64):
    dflash = random_dflash_for(model64, seed=4, block_size=4)
    seqs = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(0))
    full = pool_mass(model64, dflash, seqs, V, batch=1)
    assert full.positions == [16, 14, 12] and max(full.mean_outside) < 1e-12 and full.share_below == [0, 0, 0]
    top1 = pool_mass(model64, dflash, seqs, 1)
    top10 = pool_mass(model64, dflash, seqs, 10)
    # K = 1: 1 - p_target(DFlash's argmax), recomputed with a full verify and z-lab's forward per anchor
    emb, mask = model64.model.embed_tokens, dflash.config.mask_token_id
    layers = tuple(dflash.config.target_layer_ids)
    sums = [0.0, 0.0, 0.0]
    with torch.no_grad():
        for seq in seqs:
            ver = model64.verify(model64.empty_state(), Tree.chain(seq), layers)
            feats = torch.cat([ver.hidden[i] for i in layers], dim=-1)[None]
            p = torch.softmax(ver.logits, dim=-1)
            for a in range(1, 9):
                block = torch.tensor([[int(seq[a])] + [mask] * 3])
                hidden = dflash(feats[:, :a], emb(block), torch.arange(a + 4))
                best = dflash.compute_logits(hidden[0, 1:], model64.lm_head).argmax(-1)
                for j in range(1, 4):
                    if a + j - 1 <= 8:
                        sums[j - 1] += 1.0 - float(p[a + j - 1, best[j - 1]])
    expected = [s / n for s, n in zip(sums, top1.positions)]
    assert max(abs(a - b) for a, b in zip(top1.mean_outside, expected)) < 1e-10
    assert all(a >= b >= 0 for a, b in zip(top1.mean_outside, top10.mean_outside))
    assert all(0 <= s <= 1 for s in top10.share_below) and top1.share_below == [1.0, 1.0, 1.0]


def test_cli_train_weaver(pair, corpus, tmp_path):
    args = ["weaver", "--target", str(pair[0]), "--dflash", str(pair[1]), "--corpus", str(corpus)]
    args += ["--out", str(tmp_path), "--steps", "2", "--prompts", "2", "--prompt-len", "8"]
    args += ["--distill-new-tokens", "6"]
    args += ["--anchors", "2", "--batch-size", "2", "--device", "cpu", "--pool", "16", "--budget", "4"]
    args += ["--eval-prompts", "1", "--max-new-tokens", "6", "--d-model", "32", "--heads", "2"]
    result = CliRunner().invoke(train_app, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)  # progress lines go to stderr
    assert printed == json.loads((tmp_path / "metrics.json").read_text()) and printed["lossless"]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["pool_size"], cfg["d_model"], cfg["num_heads"], cfg["block_size"]) == (16, 32, 2, 4)
    assert len((tmp_path / "train_log.jsonl").read_text().splitlines()) == 2
