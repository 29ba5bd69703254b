"""Engine, acceptance rules and synthetic drafting: exactness against AR on every route."""

from __future__ import annotations

import pytest
import torch

from repro.data.suites import load_suite
from repro.decoding.acceptance import TargetMatch, make_rule
from repro.decoding.engine import Route, generate
from repro.decoding.routes import build_route
from repro.decoding.tree_builders import Backbone, Chain, SingleNode
from repro.drafters.synthetic import SyntheticDrafter
from repro.errors import ConfigError
from repro.models.tokenizer import ByteTokenizer
from repro.tree import Tree

TOK = ByteTokenizer()
torch.set_num_threads(1)  # toy shapes: threading only adds overhead
MAX_NEW = 40


@pytest.fixture(scope="module")
def suite_prompts():
    """One prompt per suite (first turn), chat-templated; short enough for fast tests."""
    out = []
    for suite in ("mt_bench", "gsm8k", "humaneval"):
        prompt = load_suite(suite, limit=1, seed=7)[0]
        out.append(TOK.chat_prompt([{"role": "user", "content": prompt.turns[0][:300]}]))
    return out


@pytest.fixture(scope="module")
def ar_outputs(model64, suite_prompts):
    return [generate(model64, ids, ar_route(), MAX_NEW).output_ids for ids in suite_prompts]


def ar_route(temperature=0.0, seed=0):
    rule = make_rule("greedy" if temperature == 0 else "sample_match", temperature, seed)
    return Route("ar", None, SingleNode(), rule, {"kind": "ar"})


SPECS = [
    {"name": "c1", "kind": "synthetic_chain", "k": 4, "p": 0.8},
    {"name": "c2", "kind": "synthetic_chain", "k": 7, "p": 0.5},
    {"name": "c3", "kind": "synthetic_chain", "k": 3, "p": 1.0},
    {"name": "c4", "kind": "synthetic_chain", "k": 3, "p": 0.0},
    {"name": "t1", "kind": "synthetic_tree", "k": 4, "p": 0.6, "width": 3},
    {"name": "t2", "kind": "synthetic_tree", "k": 2, "p": 0.3, "width": 5},
    {"name": "r1", "kind": "synthetic_chain", "k": 4, "p": 0.7, "commit": "replay"},
    {"name": "s1", "kind": "synthetic_tree", "k": 3, "p": 0.7, "width": 2, "commit": "snapshot"},
]


@pytest.mark.parametrize("spec", SPECS, ids=[s["name"] for s in SPECS])
def test_every_route_reproduces_ar_greedy_on_all_suites(model64, suite_prompts, ar_outputs, spec):
    for ids, ar_ids in zip(suite_prompts, ar_outputs):
        route = build_route(spec, TOK.vocab_size, "greedy", 0.0, seed=3)
        assert route.commit == spec.get("commit", "closed_form")
        res = generate(model64, ids, route, MAX_NEW, reference_ids=ar_ids)
        assert res.output_ids == ar_ids
        assert len(res.output_ids) == MAX_NEW
        assert sum(res.accepted_lengths) == MAX_NEW - 1  # the first token comes from prefill


def test_acceptance_extremes_give_known_mal(model64, suite_prompts):
    ids = suite_prompts[1]
    ar = generate(model64, ids, ar_route(), 33)
    assert ar.accepted_lengths == [1] * 32
    full = generate(
        model64, ids, build_route(SPECS[2], TOK.vocab_size, "greedy", 0, 1), 33, (), ar.output_ids
    )
    assert full.accepted_lengths == [4] * 8  # k drafts + bonus each step: 32 = 8 * 4
    none = generate(
        model64, ids, build_route(SPECS[3], TOK.vocab_size, "greedy", 0, 1), 33, (), ar.output_ids
    )
    assert none.accepted_lengths == [1] * 32
    assert none.tree_sizes == [4] * 32


def test_every_accept_position_occurs(model64, suite_prompts):
    """With p = 0.5 and k = 6, accepted lengths 1..7 all show up over a few prompts."""
    seen = set()
    spec = {"name": "c", "kind": "synthetic_chain", "k": 6, "p": 0.5}
    for ids in suite_prompts:
        ar = generate(model64, ids, ar_route(), 120)
        res = generate(
            model64, ids, build_route(spec, TOK.vocab_size, "greedy", 0, 5), 120, (), ar.output_ids
        )
        assert res.output_ids == ar.output_ids
        seen |= set(res.accepted_lengths[:-1])
    assert seen == set(range(1, 8))


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_routes_reproduce_ar_samples(model64, suite_prompts, temperature):
    """Target-sample-then-match with position-keyed draws samples exactly AR's tokens."""
    for ids in suite_prompts:
        ar = generate(model64, ids, ar_route(temperature, seed=11), MAX_NEW)
        greedy = generate(model64, ids, ar_route(), MAX_NEW)
        assert ar.output_ids != greedy.output_ids  # sampling really samples
        for spec in (SPECS[0], SPECS[4]):
            route = build_route(spec, TOK.vocab_size, "sample_match", temperature, seed=11)
            res = generate(model64, ids, route, MAX_NEW, reference_ids=ar.output_ids)
            assert res.output_ids == ar.output_ids


def test_stop_tokens_and_max_new_tokens(model64, suite_prompts):
    ids = suite_prompts[0]
    ar = generate(model64, ids, ar_route(), 60)
    stop = ar.output_ids[9]
    first = ar.output_ids.index(stop)
    stopped = generate(model64, ids, ar_route(), 60, stop_ids=[stop])
    assert stopped.output_ids == ar.output_ids[: first + 1] and stopped.finish_reason == "stop"
    spec = {"name": "c", "kind": "synthetic_chain", "k": 5, "p": 1.0}
    spec_stop = generate(
        model64, ids, build_route(spec, TOK.vocab_size, "greedy", 0, 0), 60, [stop], ar.output_ids
    )
    assert spec_stop.output_ids == stopped.output_ids and spec_stop.finish_reason == "stop"
    short = generate(model64, ids, build_route(spec, TOK.vocab_size, "greedy", 0, 0), 7, (), ar.output_ids)
    assert short.output_ids == ar.output_ids[:7] and short.finish_reason == "length"
    one = generate(model64, ids, ar_route(), 1)
    assert one.output_ids == ar.output_ids[:1] and one.steps == 0


def test_target_match_walks_the_matching_branch():
    """A hand-made tree: root -> {5, 7}; 7 -> {1}; target argmax 7 then 1 then 3."""
    tree = Tree([9, 5, 7, 1], [-1, 0, 0, 2])
    logits = torch.full((4, 10), -5.0)
    logits[0, 7] = 1.0  # at the root the target wants 7
    logits[2, 1] = 1.0  # after 7 it wants 1
    logits[3, 3] = 1.0  # after 1 it wants 3: no child, bonus
    logits[1, 4] = 1.0
    acc = TargetMatch(0.0, 0).accept(tree, logits, position=10)
    assert acc.path == [0, 2, 3] and acc.bonus == 3
    logits[0, 7], logits[0, 2] = -9.0, 2.0
    acc = TargetMatch(0.0, 0).accept(tree, logits, position=10)
    assert acc.path == [0] and acc.bonus == 2


def test_synthetic_tree_siblings_differ_and_p_controls_acceptance():
    ref = list(range(100, 200))
    drafter = SyntheticDrafter(p=0.5, depth=5, width=4, vocab_size=260, seed=1)
    drafter.begin([1, 2, 3], ref)
    hits = 0
    for pos in range(1, 80):
        from repro.drafters.base import DraftContext

        prop = drafter.propose(DraftContext([1, 2, 3], ref[:pos]))
        for d, level in enumerate(prop.candidates):
            assert len(set(level)) == len(level) == 4
            hits += level[0] == ref[pos + d] if pos + d < len(ref) else 0
    assert 0.35 < hits / (79 * 5 - 10) < 0.65
    tree = Backbone(4).build(0, prop)
    assert tree.size == 1 + 5 * 4 and tree.depth.max() == 6  # root + 5 draft levels
    assert Chain().build(0, prop).tokens.tolist() == [0] + [c[0] for c in prop.candidates]


def test_route_errors_are_one_line():
    for spec, needle in [
        ({"name": "x", "kind": "dflashh"}, "unknown route kind"),
        ({"name": "x", "kind": "synthetic_chain", "p": 0.5}, "missing parameter"),
        ({"name": "x", "kind": "synthetic_chain", "p": 0.5, "k": 2, "q": 1}, "unknown parameter"),
        ({"name": "x", "kind": "synthetic_chain", "p": 1.5, "k": 2}, "p must be a number in [0, 1], got 1.5"),
        ({"name": "x", "kind": "ar", "commit": "magic"}, "commit must be one of snapshot, replay"),
    ]:
        with pytest.raises(ConfigError) as err:
            build_route(spec, 260, "greedy", 0.0, 0)
        assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="needs temperature 0"):
        make_rule("greedy", 0.5, 0)


@pytest.mark.parametrize("pause", [True, False])
def test_the_garbage_collector_is_paused_only_inside_a_timed_generation(
    model64, suite_prompts, monkeypatch, pause
):
    """engine.PAUSE_GC: the collector is off while generate runs (seen from inside the decode loop) and back
    on after it, an exception included; with it off, the collector keeps running. A collector already off
    stays off."""
    import gc

    from repro.decoding import engine

    monkeypatch.setattr(engine, "PAUSE_GC", pause)
    seen: list[bool] = []
    real = SingleNode.build

    def build(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(gc.isenabled())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SingleNode, "build", build)
    assert gc.isenabled()
    generate(model64, suite_prompts[0], ar_route(), 4)
    assert seen and set(seen) == {not pause} and gc.isenabled()
    monkeypatch.setattr(SingleNode, "build", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        generate(model64, suite_prompts[0], ar_route(), 4)
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.setattr(SingleNode, "build", build)
        generate(model64, suite_prompts[0], ar_route(), 4)
        assert not gc.isenabled()
    finally:
        gc.enable()
