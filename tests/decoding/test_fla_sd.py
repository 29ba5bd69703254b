"""The fla_sd route (SpecLA's FLA-SD baseline): the chain verify path of HybridLM and its replay commit."""

from __future__ import annotations

import pytest
import torch

from repro.decoding.engine import generate
from repro.decoding.routes import ROUTE_KINDS, build_route, resolve_spec
from repro.errors import ConfigError
from repro.models.target import open_target
from repro.tree import Tree


@pytest.fixture(scope="module")
def family64():
    model, tok = open_target("default", "float64", "cpu", 0)
    ids = tok.chat_prompt([{"role": "user", "content": "What is 12 times 7? Explain step by step."}])
    return model, ids


def test_chain_verify_equals_tree_verify_and_leaves_the_state(family64):
    model, ids = family64
    state, _ = model.prefill(ids[:-5])
    chain = Tree.chain(torch.tensor(ids[-5:]))
    before = [layer.recurrent.clone() for layer in state.layers if hasattr(layer, "recurrent")]
    tree_ver = model.verify(state, chain, strategy="replay")
    chain_ver = model.verify(state, chain, strategy="replay", verifier="chain")
    assert chain_ver.verifier == "chain"
    torch.testing.assert_close(chain_ver.logits, tree_ver.logits, atol=1e-10, rtol=0)
    after = [layer.recurrent for layer in state.layers if hasattr(layer, "recurrent")]
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # verify never writes the state
    for path in ([], [0, 1], [0, 1, 2, 3, 4]):
        a = model.commit(state, tree_ver, path)
        b = model.commit(state, chain_ver, path)
        for la, lb in zip(a.layers, b.layers):
            if hasattr(la, "recurrent"):
                torch.testing.assert_close(lb.recurrent, la.recurrent, atol=1e-12, rtol=0)
                torch.testing.assert_close(lb.conv, la.conv, atol=1e-12, rtol=0)


def test_chain_verifier_refuses_trees_and_other_commits(family64):
    model, ids = family64
    state, _ = model.prefill(ids)
    tree = Tree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 0]))
    with pytest.raises(ConfigError, match="chains only"):
        model.verify(state, tree, strategy="replay", verifier="chain")
    with pytest.raises(ConfigError, match="replay only"):
        model.verify(state, Tree.chain(torch.tensor([1, 2])), verifier="chain")
    with pytest.raises(ConfigError, match="commit must be one of replay"):
        resolve_spec({"kind": "fla_sd", "k": 4, "commit": "closed_form"}, "tiny-qwen35")


def test_fla_sd_is_lossless_in_float64(family64):
    model, ids = family64
    ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, 0, model)
    ref = generate(model, ids, ar, 48)
    for spec in ({"kind": "fla_sd", "k": 4}, {"kind": "eagle_chain", "k": 4}):
        route = build_route(spec, model.config.vocab_size, "greedy", 0.0, 0, model, family="tiny-qwen35")
        res = generate(model, ids, route, 48)
        assert res.output_ids == ref.output_ids, spec
        assert res.steps < ref.steps  # the trained EAGLE drafter is accepted
    fla = build_route({"kind": "fla_sd", "k": 4}, 1, "greedy", 0.0, 0, model, family="tiny-qwen35")
    assert (fla.verifier, fla.commit, fla.params["commit"]) == ("chain", "replay", "replay")


def test_aliases_are_reported_under_their_own_names(family64):
    model, _ = family64
    tfm = build_route({"kind": "dflash_tfm", "budget": 8}, 1, "greedy", 0.0, 0, model, family="tiny-qwen35")
    assert tfm.params["kind"] == "dflash_tfm" and tfm.name == "dflash_tfm"
    assert ROUTE_KINDS["dflash_tfm"].factory is ROUTE_KINDS["weaver"].factory
    specla = build_route(
        {"kind": "specla", "budget": 8}, 1, "greedy", 0.0, 0, model, commit="replay", family="tiny-qwen35"
    )
    assert specla.commit == "closed_form" and specla.params["kind"] == "specla"
