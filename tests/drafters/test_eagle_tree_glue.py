"""The static EAGLE drafter's tree glue (``TreeGrowth``, repro/drafters/static_eagle.py) pinned to the legacy
glue (``legacy_glue=True``) and to the eager EagleDrafter: the same tokens, parents, order and float64 scores
(bit for bit, padding included) over prompts, seeds, float32 and float64 and tree specs (tau pruning part of
a tree or all of it, ties, tau equal to a probability, budgets above the candidates, depth 1, a vocabulary
smaller than topk); the call capture-safe; its launches per proposal counted (legacy 157 -> 67 at the tiny
family's SpecLA shape)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import drafting_target

from repro.drafters.base import DraftContext
from repro.drafters.eagle import DynamicTree, EagleConfig, EagleDrafter, EagleDraftModel, random_eagle_for
from repro.drafters.static_eagle import StaticEagleDrafter, _at_least, real_nodes
from repro.models.graphs import check_capture

SPECS = [
    DynamicTree(32, 4, 0.05, 6),  # SpecLA's shape
    DynamicTree(24, 4, 0.0, 6),
    DynamicTree(16, 3, 0.06, 4),
    DynamicTree(200, 2, 0.0, 3),  # a budget above the candidates
    DynamicTree(40, 4, 0.08, 5),  # tau prunes part of the tree, whole levels at times
    DynamicTree(24, 4, 0.065, 6),
    DynamicTree(10, 5, 0.3, 5),  # tau prunes everything
    DynamicTree(8, 4, 0.0, 1),  # one level
    DynamicTree(3, 1, 0.0, 4),  # a chain-shaped beam
]


def tiny_vocab_target(vocab: int, dtype: torch.dtype) -> torch.nn.Module:
    """A 2-layer hybrid with a ``vocab``-token vocabulary (smaller than the trees' topk)."""
    from repro.models.config import ATTENTION, GDN, HybridConfig
    from repro.models.default import init_random_weights
    from repro.models.hybrid import HybridLM

    cfg = HybridConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, layer_types=[GDN, ATTENTION],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), 3).to(dtype).eval()


def proposals(model, eagle, spec: DynamicTree, prompt: list[int], pending: int) -> dict:  # noqa: ANN001
    """One proposal per drafter (eager, legacy glue, new glue) from the same state."""
    eager = EagleDrafter(eagle, model, tree=spec)
    legacy = StaticEagleDrafter(eagle, model, tree=spec, legacy_glue=True, capacity=16)
    new = StaticEagleDrafter(eagle, model, tree=spec, capacity=16)
    _, ver = model.prefill(prompt, capture=eager.capture_layers)
    out = {}
    ctx = DraftContext(prompt, [pending])
    for name, d in (("eager", eager), ("legacy", legacy), ("new", new)):
        d.begin(prompt, None)
        d.observe_prefill(ver)
        out[name] = d.propose(ctx)
        if name != "eager":
            out[f"{name}/step"] = [t.tolist() for t in d._step()]  # the call is idempotent
    return out


def check(got: dict) -> tuple[int, int]:
    """New glue == legacy glue exactly, both == the eager tree; (real nodes, tree size)."""
    assert got["new/step"] == got["legacy/step"]  # tokens, parents, float64 scores, padding
    ref = got["eager"]
    host = real_nodes(got["new"].tree.to_tree())
    assert host.tokens.tolist() == ref.tree.tokens.tolist()
    assert host.parents.tolist() == ref.tree.parents.tolist()
    assert got["new"].candidates == ref.candidates  # the greedy path, read through the kept scores
    return host.size, got["new"].tree.size


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_new_glue_equals_legacy_and_eager(dtype):
    model = drafting_target(dtype)
    rng = random.Random(0)
    sizes = []
    for seed in (1, 2):
        eagle = random_eagle_for(model, seed=seed)
        for spec in SPECS:
            prompt = [rng.randrange(3, model.config.vocab_size) for _ in range(rng.randrange(5, 20))]
            sizes.append(check(proposals(model, eagle, spec, prompt, rng.randrange(3, 40))))
    assert any(1 < real < size for real, size in sizes)  # pruned below the fixed size, not to nothing
    assert any(real == size for real, size in sizes)


@pytest.mark.parametrize("spec", [DynamicTree(12, 4, 0.0, 3), DynamicTree(5, 6, 0.2, 4)], ids=["full", "tau"])
def test_a_vocabulary_smaller_than_topk(spec):
    """kids = vocab < topk frontier rows: level 1 is padded with invalid children."""
    model = tiny_vocab_target(3, torch.float64)
    eagle = random_eagle_for(model, seed=4)
    for pending in (0, 1, 2):
        check(proposals(model, eagle, spec, [1, 2, 0, 1], pending))


A, B, C, D = 10, 11, 12, 13
HAND = [  # (spec, real nodes with the root)
    (DynamicTree(5, 2, 0.2, 3), 6),  # ties: ab = ba (one of them is the 5th: a, aa, b, aaa, ab|ba)
    (DynamicTree(20, 2, 0.3, 3), 4),  # b is below tau everywhere: the chain a, aa, aaa
    (DynamicTree(20, 2, 0.7, 3), 1),  # nothing is confident enough
    (DynamicTree(3, 6, 0.0, 2), 4),  # more frontier rows than children with support: a, aa, b
    (DynamicTree(30, 4, 0.25, 4), 23),  # tau == a probability (0.25): kept (>=); 2 + 4 + 8 + 8 nodes
]


@pytest.mark.parametrize(("spec", "want"), HAND, ids=[str(i) for i in range(len(HAND))])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_hand_distributions_with_ties(spec, want, dtype):
    """Every node's distribution a .6, b .25, c .1, d .05: exact ties between paths and at tau."""
    model = drafting_target(dtype)
    dist = torch.zeros(model.config.vocab_size, dtype=dtype)
    dist[[A, B, C, D]] = torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=dtype)
    eagle = random_eagle_for(model)
    EagleDrafter._probs, saved = (lambda self, preds: dist.expand(preds.shape[0], -1)), EagleDrafter._probs
    try:
        real, size = check(proposals(model, eagle, spec, list(range(3, 20)), 7))
    finally:
        EagleDrafter._probs = saved
    assert real == want and size >= real


def test_at_least_rounds_tau_up_to_the_dtype():
    """p >= _at_least(tau) in float32 iff float(p) >= tau, for float32 values around tau."""
    for tau in (0.05, 0.1, 0.3, 1e-7, 0.25):
        t = torch.tensor(tau, dtype=torch.float32)
        near = [t]
        for _ in range(3):
            near = [
                torch.nextafter(near[0], torch.tensor(0.0)),
                *near,
                torch.nextafter(near[-1], torch.tensor(1.0)),
            ]
        thr = _at_least(tau, torch.float32)
        for p in near:
            assert (p >= thr).item() == (p.item() >= tau), (tau, p.item())


def test_the_new_glue_is_capture_safe():
    model = drafting_target(torch.float32)
    for spec in (DynamicTree(12, 3, 0.01, 4), DynamicTree(8, 4, 0.5, 1)):
        d = StaticEagleDrafter(random_eagle_for(model, seed=3), model, tree=spec)
        ids = list(range(3, 30))
        _, ver = model.prefill(ids, capture=d.capture_layers)
        d.observe_prefill(ver)
        d.propose(DraftContext(ids, [5]))
        first = check_capture(d._step)
        d.inputs[:3] = torch.tensor([20, 22, 9])
        second = check_capture(d._step)
        assert first.hazards == [] == second.hazards and first.trace == second.trace


def glue_launches(legacy: bool) -> tuple[int, int]:
    """(the whole proposal call's launches, its glue's: everything but the forwards and distributions) at
    the tiny family's drafter layout and SpecLA's tree (budget 32, topk 4, depth 6), eager forwards."""
    from torch.utils._python_dispatch import _disable_current_modes

    model = drafting_target(torch.float32)
    tc = model.config
    cfg = EagleConfig(
        hidden_size=tc.hidden_size, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=56, vocab_size=tc.vocab_size, target_layer_ids=[2],
        target_hidden_size=tc.hidden_size,
    )  # fmt: skip
    d = StaticEagleDrafter(
        EagleDraftModel(cfg).eval(), model, tree=DynamicTree(32, 4, 0.05, 6), legacy_glue=legacy
    )
    ids = list(range(3, 30))
    _, ver = model.prefill(ids, capture=(2,))
    d.observe_prefill(ver)
    d.propose(DraftContext(ids, [5]))
    whole = check_capture(d._step).launches

    def hidden(fn):  # noqa: ANN001, ANN202 - the forward's launches are not the glue's
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            with _disable_current_modes():
                return fn(*args, **kwargs)

        return call

    d._rows, d._probs, d.model.draft_features = (
        hidden(d._rows),
        hidden(d._probs),
        hidden(d.model.draft_features),
    )
    d._context_rows, d._draft_context = hidden(d._context_rows), hidden(d._draft_context)
    # less the step's root_pred gather at c - r - 1 and its copy of the committed count
    return whole, check_capture(d._step).launches - 4


def test_the_new_glue_launches_fewer_kernels():
    """Per proposal (SpecLA's shape): the tree glue 157 -> 67 launches (the call, eager forwards: 577 -> 487
    with the committed count's copy; with the fast forward 289 -> 199, tests/drafters/test_eagle_fast.py)."""
    (old_all, old_glue), (new_all, new_glue) = glue_launches(True), glue_launches(False)
    assert (old_glue, new_glue) == (157, 67)
    assert (old_all, new_all) == (577, 487)
    assert 2 * new_glue <= old_glue


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fast", [False, True], ids=["eager-forward", "fast-forward"])
def test_gpu_graphed_new_glue_equals_legacy(fast):
    """float32, CUDA graphs: the new glue's call outputs equal the legacy glue's bit for bit, and its trees
    the eager drafter's, over pending tokens and SpecLA's tree with tau pruning."""
    model = drafting_target(torch.float32, "cuda")
    eagle = random_eagle_for(model, seed=1)
    spec = DynamicTree(32, 4, 0.05, 6)
    eager = EagleDrafter(eagle, model, tree=spec)
    ds = [
        StaticEagleDrafter(eagle, model, tree=spec, graphs=True, fast=fast, legacy_glue=g)
        for g in (True, False)
    ]
    prompt = list(range(3, 40))
    _, ver = model.prefill(prompt, capture=eager.capture_layers)
    for d in (eager, *ds):
        d.begin(prompt, None)
        d.observe_prefill(ver)
    for pending in range(3, 11):
        ctx = DraftContext(prompt, [pending])
        ref = eager.propose(ctx)
        outs = []
        for d in ds:
            got = d.propose(ctx)
            outs.append([t.tolist() for t in d._call.output])
            host = real_nodes(got.tree.to_tree())
            assert host.tokens.tolist() == ref.tree.tokens.tolist()
            assert host.parents.tolist() == ref.tree.parents.tolist()
        assert outs[0] == outs[1]
