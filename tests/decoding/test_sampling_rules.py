"""The sampling acceptance rules in the engine: greedy limit, route parameters, reproducibility, the
engine's law at T != 1 over seeds (its random stream wiring), sampled best-first trees on sparse marginals."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from repro.decoding import acceptance, tree_builders
from repro.decoding.acceptance import ACCEPTANCE_RULES, SpecSampling, TargetMatch, Traversal, make_rule
from repro.decoding.engine import Route, generate
from repro.decoding.routes import build_route
from repro.decoding.sampling import step_rng, target_probs
from repro.decoding.tree_builders import BestFirst, Chain
from repro.drafters.base import DraftContext, Proposal
from repro.errors import ConfigError, TreeError
from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights
from repro.models.hybrid import HybridLM
from repro.tree import Tree

torch.set_num_threads(1)
PROMPT = list(range(40, 72))
V64 = 260  # the default target's vocabulary
ALPHA = 1e-3  # every chi-square test's significance here; fixed seeds make every verdict reproducible


def random_tree(gen: torch.Generator, n: int, vocab: int) -> Tree:
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    return Tree(torch.randint(0, vocab, (n,), generator=gen), parents)


@pytest.mark.parametrize("rule_cls", [SpecSampling, Traversal])
def test_at_temperature_zero_the_sampling_rules_are_greedy_longest_match(rule_cls):
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        tree = random_tree(gen, int(torch.randint(1, 12, (1,), generator=gen)), 4)
        logits = torch.randn(tree.size, 4, generator=gen, dtype=torch.float64)
        want = TargetMatch(0.0, 0).accept(tree, logits, 5)
        got = rule_cls(0.0, trial).accept(tree, logits, 5, step_rng(trial, 5))
        assert (got.path, got.bonus) == (want.path, want.bonus)


def test_sampled_trees_at_temperature_zero_are_greedy_too():
    """Children drawn from the marginals, judged with their q: at T=0 still the argmax path."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(100):
        probs = torch.softmax(torch.randn(3, 6, generator=gen, dtype=torch.float64), -1)
        rng = np.random.default_rng(trial)
        tree = BestFirst(5, sample=True).build(0, Proposal([[0]] * 3, probs), rng)
        assert tree.draw == "without_replacement" and tree.proposals is not None
        logits = torch.randn(tree.size, 6, generator=gen, dtype=torch.float64)
        want = TargetMatch(0.0, 0).accept(tree, logits, 2)
        for rule in (SpecSampling(0.0, trial), Traversal(0.0, trial)):
            got = rule.accept(tree, logits, 2, rng)
            assert (got.path, got.bonus) == (want.path, want.bonus)


def test_trees_refuse_unknown_draws_and_sampled_draws_without_proposals():
    with pytest.raises(TreeError, match="draw 'random'"):
        Tree([1, 2], [-1, 0], draw="random")
    with pytest.raises(TreeError, match="needs the proposal"):
        Tree([1, 2], [-1, 0], draw="iid")
    with pytest.raises(TreeError, match="proposals has 1 entries"):
        Tree([1, 2], [-1, 0], (None,))


def test_builders_record_proposals_and_sample_from_them():
    probs = torch.softmax(torch.randn(3, 8, generator=torch.Generator().manual_seed(2)), -1)
    prop = Proposal(probs.topk(2).indices.tolist(), probs)
    top = Chain().build(5, prop)
    assert (
        top.draw == "given"
        and top.proposals is not None
        and top.proposals[0][1].tolist() == probs[0].tolist()
    )
    assert top.proposals[-1] is None
    pvalue = chain_depth1_pvalue(prop)
    print(f"Chain(sample=True) depth 1 against its marginal, n={N_CHAIN}: chi-square p {pvalue:.3g}")
    assert pvalue > ALPHA  # depth 1 drawn from its marginal
    with pytest.raises(ValueError, match="random generator"):
        Chain(sample=True).build(5, prop)
    with pytest.raises(ConfigError, match="marginals"):
        Chain(sample=True).build(5, Proposal([[1], [2]]), np.random.default_rng(0))


# Sampled chains whose first draft token is tallied (seeds 0 .. N_CHAIN - 1) and compared with the depth-1
# marginal by chi-square at ALPHA (false-failure rate on exact draws, measured on 20,000 multinomial samples
# of the marginal: 1.1e-3). The control below, a draw from the marginal to the power 0.9 (renormalised), is
# caught at p 6e-6 (its largest frequency error is 0.022: a max-abs-deviation bound of 0.03 passed it); the
# exact draw: p 0.54.
N_CHAIN = 4000


def chain_depth1_pvalue(prop: Proposal) -> float:
    """Chi-square p-value of ``Chain(sample=True)``'s depth-1 tokens over N_CHAIN seeds against the
    proposal's depth-1 marginal."""
    counts = np.zeros(prop.probs.shape[-1])
    for s in range(N_CHAIN):
        tree = Chain(sample=True).build(5, prop, np.random.default_rng(s))
        assert tree.draw == "iid" and tree.size == 4
        counts[int(tree.tokens[1])] += 1
    marginal = prop.probs[0].double().numpy()
    return float(chisquare(counts, N_CHAIN * marginal / marginal.sum()).pvalue)


def test_chain_drawn_from_a_tempered_marginal_is_caught(monkeypatch):
    """The negative control of test_builders_record_proposals_and_sample_from_them's chi-square: the same
    marginal and seeds, each depth drawn from its marginal^0.9 (renormalised), must fail it."""
    probs = torch.softmax(torch.randn(3, 8, generator=torch.Generator().manual_seed(2)), -1)
    real = tree_builders.draw_rows_without_replacement

    def tempered(rows, counts, rng):  # noqa: ANN001, ANN202
        return real([q**0.9 / (q**0.9).sum() for q in rows], counts, rng)

    monkeypatch.setattr(tree_builders, "draw_rows_without_replacement", tempered)
    pvalue = chain_depth1_pvalue(Proposal(probs.topk(2).indices.tolist(), probs))
    print(f"control: Chain drawing from marginal^0.9, n={N_CHAIN}: chi-square p {pvalue:.3g}")
    assert pvalue < ALPHA


def test_make_rule_names_every_rule():
    with pytest.raises(ConfigError) as err:
        make_rule("rejection", 1.0, 0)
    assert all(name in str(err.value) for name in ACCEPTANCE_RULES)
    assert isinstance(make_rule("spec_sampling", 1.0, 0), SpecSampling)
    assert isinstance(make_rule("traversal", 0.0, 0), Traversal)


def test_acceptance_is_a_route_parameter_defaulting_to_the_experiments():
    spec = {"name": "c", "kind": "synthetic_chain", "k": 2, "p": 0.5}
    route = build_route(spec, 260, "sample_match", 1.0, 0)
    assert route.params["acceptance"] == "sample_match" and type(route.rule) is TargetMatch
    route = build_route({**spec, "acceptance": "traversal"}, 260, "sample_match", 1.0, 0)
    assert route.params["acceptance"] == "traversal" and isinstance(route.rule, Traversal)
    with pytest.raises(ConfigError, match="route 'c'.*needs temperature 0") as err:
        build_route({**spec, "acceptance": "greedy"}, 260, "sample_match", 1.0, 0)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="acceptance must be one of greedy, sample_match, spec_sampling"):
        build_route({**spec, "acceptance": "rrs"}, 260, "greedy", 0.0, 0)


def test_draft_sample_is_a_dflash_route_parameter(model64):
    spec = {"name": "d", "kind": "ddtree", "drafter": "random", "budget": 8, "block_size": 4}
    assert build_route(spec, 0, "greedy", 0.0, 0, model64).params["draft"] == "top"
    route = build_route({**spec, "draft": "sample"}, 0, "spec_sampling", 1.0, 0, model64)
    assert route.builder.sample and route.random
    with pytest.raises(ConfigError, match="draft must be one of top, sample"):
        build_route({**spec, "draft": "any"}, 0, "greedy", 0.0, 0, model64)
    with pytest.raises(ConfigError, match="unknown parameter"):
        build_route(
            {"kind": "eagle_chain", "drafter": "random", "k": 2, "draft": "sample"},
            0,
            "greedy",
            0,
            0,
            model64,
        )


SPECS = [
    {"name": "tree", "kind": "synthetic_tree", "k": 3, "p": 0.6, "width": 2},
    {
        "name": "ddtree",
        "kind": "ddtree",
        "drafter": "random",
        "budget": 8,
        "block_size": 4,
        "draft": "sample",
    },
    {"name": "chain", "kind": "dflash_chain", "drafter": "random", "block_size": 4, "draft": "sample"},
]


@pytest.mark.parametrize("spec", SPECS, ids=[s["name"] for s in SPECS])
@pytest.mark.parametrize("rule", ["spec_sampling", "traversal"])
def test_sampling_rules_decode_reproducibly_and_greedily_at_zero(model64, spec, rule):
    ar0 = generate(model64, PROMPT, build_route({"kind": "ar"}, 0, "greedy", 0.0, 3), 24).output_ids
    at0 = build_route({**spec, "acceptance": rule}, V64, "greedy", 0.0, 3, model64)
    assert generate(model64, PROMPT, at0, 24, reference_ids=ar0).output_ids == ar0
    ar1 = generate(model64, PROMPT, build_route({"kind": "ar"}, 0, "sample_match", 1.0, 3), 24).output_ids
    runs = []
    for _ in range(2):
        route = build_route({**spec, "acceptance": rule}, V64, "sample_match", 1.0, 3, model64)
        res = generate(model64, PROMPT, route, 24, reference_ids=ar1)
        assert len(res.output_ids) == 24 and sum(res.accepted_lengths) == 23
        runs.append(res.output_ids)
    assert runs[0] == runs[1]  # seeded: the same seed decodes the same tokens
    assert runs[0][0] == ar1[0]  # the first token is prefill's, AR's position-keyed pick


@pytest.mark.parametrize("rule_cls", [SpecSampling, Traversal])
def test_sampling_rules_need_the_steps_random_stream(rule_cls):
    """No silent fallback to a fresh step_rng(seed, position): that stream is the builder's, already drawn."""
    tree, logits = Tree([0, 1], [-1, 0]), torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="rng"):
        rule_cls(1.0, 0).accept(tree, logits, 1)
    with pytest.raises(ValueError, match="random generator"):
        rule_cls(1.0, 0).accept(tree, logits, 1, None)


# ----- the engine's law over seeds: generate's first L_ENGINE tokens against AR's enumerated joint

V_ENGINE, L_ENGINE, T_ENGINE = 6, 3, 1.3
ENGINE_PROMPT = [1, 2, 3]
# Decodes a case (seeds 0 .. N_ENGINE - 1). Asserted by test_engine_replaying_the_builders_draws_is_caught:
# the rule handed the step's stream from its start (the sampled builder's draws replayed as the rule's
# uniforms) fails the chi-square, measured p 8e-20 (tree, spec_sampling), 2e-18 (chain), 5e-13 (tree,
# traversal). Measured before, not asserted: with the rule's temperature taken as 1: p 5e-5 or less; with the
# step stream's seed ignored: 6 distinct outputs (one continuation per first token) and p 0. The exact engine:
# p 0.016 or more and 183 or more distinct outputs; the chi-square's false-failure rate on exact decodes
# (20,000 multinomial samples of AR's joint at N_ENGINE): 1.3e-3.
N_ENGINE = 1_500


def _tiny_target() -> HybridLM:
    """A float64 2-layer hybrid (GDN, attention) of width 16 over V_ENGINE tokens: its joints enumerate."""
    cfg = HybridConfig(
        vocab_size=V_ENGINE, hidden_size=16, intermediate_size=24, layer_types=[GDN, ATTENTION],
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, partial_rotary_factor=0.5,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), 0).to(torch.float64).eval()


@pytest.fixture(scope="module")
def tiny():
    """The tiny target and AR's joint of its first L_ENGINE tokens after ENGINE_PROMPT at T_ENGINE."""
    model = _tiny_target()

    def after(ctx: tuple[int, ...]) -> np.ndarray:
        return target_probs(model.prefill(ENGINE_PROMPT + list(ctx))[1].logits[-1], T_ENGINE).numpy()

    rows = {ctx: after(ctx) for n in range(L_ENGINE) for ctx in itertools.product(range(V_ENGINE), repeat=n)}
    joint = np.array(
        [
            np.prod([rows[seq[:i]][t] for i, t in enumerate(seq)])
            for seq in itertools.product(range(V_ENGINE), repeat=L_ENGINE)
        ]
    )
    return model, joint


class MarginalDrafter:
    """Per-depth marginals, a function of the context (the last token and its position), half their mass
    on token 0: a sampled builder draws token 0 at depth 1 often, its test the stream's first uniform."""

    capture_layers: tuple[int, ...] = ()

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        noise = np.random.default_rng([7, ctx.output_ids[-1], len(ctx.output_ids)]).normal(
            size=(self.depth, V_ENGINE)
        )
        probs = 0.5 * torch.softmax(torch.from_numpy(noise), -1)
        probs[:, 0] += 0.5
        return Proposal([[0]] * self.depth, probs)


ENGINE_CASES = {
    "tree-spec_sampling": (lambda: BestFirst(4, sample=True), 3, SpecSampling),
    "chain-spec_sampling": (lambda: Chain(sample=True), 3, SpecSampling),
    # traversal draws its first uniform at the first leaf, not at a depth-1 child: a shallower tree (depth
    # 2) keeps the stream-reuse bias as visible as spec_sampling's (at depth 3: p 5e-4)
    "tree-traversal": (lambda: BestFirst(4, sample=True), 2, Traversal),
}


@pytest.mark.parametrize("case", ENGINE_CASES)
def test_generate_samples_ars_law_over_seeds(tiny, case):
    """``generate`` with a sampled builder and a sampling rule at T != 1, seed by seed: the first L_ENGINE
    tokens follow AR's joint (chi-square), and seeds decode different continuations (the step stream is
    keyed by the seed, not only the prefill's pick)."""
    model, joint = tiny
    make_builder, depth, rule_cls = ENGINE_CASES[case]
    outputs, pvalue, tv = engine_law(model, joint, case, make_builder(), rule_cls)
    firsts = {o[0] for o in outputs}
    print(
        f"generate {case} T={T_ENGINE} seeds 0..{N_ENGINE - 1}: TV {tv:.4f}, chi-square p {pvalue:.3g}, "
        f"{len(set(outputs))} distinct outputs, {len(firsts)} first tokens"
    )
    assert len(set(outputs)) > len(firsts) + 10  # not one continuation per first token: the seed counts
    assert pvalue > ALPHA, (tv, pvalue)


def engine_law(model: HybridLM, joint: np.ndarray, case: str, builder: object, rule_cls: type):  # noqa: ANN201
    """``generate``'s first L_ENGINE tokens over seeds 0 .. N_ENGINE - 1 on ``case``'s drafter: (the outputs,
    the chi-square p-value against ``joint``, cells with expected count < 5 pooled, the TV distance)."""
    depth = ENGINE_CASES[case][1]
    outputs = []
    for seed in range(N_ENGINE):
        route = Route(case, MarginalDrafter(depth), builder, rule_cls(T_ENGINE, seed))
        outputs.append(tuple(generate(model, ENGINE_PROMPT, route, L_ENGINE).output_ids))
    counts = np.bincount(
        [np.ravel_multi_index(o, (V_ENGINE,) * L_ENGINE) for o in outputs], minlength=joint.size
    )
    expected = N_ENGINE * joint
    small = expected < 5
    obs, exp = (
        np.append(counts[~small], counts[small].sum()),
        np.append(expected[~small], expected[small].sum()),
    )
    pvalue = float(chisquare(obs, exp).pvalue)
    return outputs, pvalue, float(0.5 * np.abs(counts / N_ENGINE - joint).sum())


class _RecordsStream:
    """A builder mixin keeping a copy of each step's stream as it was before the builder's draws."""

    def build(self, root_token, proposal, rng=None):  # noqa: ANN001, ANN201
        self.before = copy.deepcopy(rng)
        return super().build(root_token, proposal, rng)  # type: ignore[misc]


@pytest.mark.parametrize("case", ENGINE_CASES)
def test_engine_replaying_the_builders_draws_is_caught(tiny, case):
    """The negative control of test_generate_samples_ars_law_over_seeds (its seeds, N_ENGINE and chi-square):
    the rule given the step's stream from its start, not past the builder's draws, must fail it. Built on
    the builder's own stream (whatever keys it), so the control does not depend on the keying."""
    model, joint = tiny
    make_builder, _, rule_cls = ENGINE_CASES[case]
    builder = make_builder()
    builder.__class__ = type(f"Recording{type(builder).__name__}", (_RecordsStream, type(builder)), {})

    class Replaying(rule_cls):
        def accept(self, tree, logits, position, rng):  # noqa: ANN001, ANN201
            return super().accept(tree, logits, position, builder.before)

    _, pvalue, tv = engine_law(model, joint, case, builder, Replaying)
    print(f"control: generate {case} replaying the builder's draws: TV {tv:.4f}, chi-square p {pvalue:.3g}")
    assert pvalue < ALPHA, (tv, pvalue)


# ----- sampled best-first trees on sparse marginals

SPARSE = {  # (marginals, budget): the greedy shape has more children at a node than its marginal has tokens
    # float32 softmax underflowing to exact zeros: 4 root slots, 2 tokens (the draw raised "shape mismatch")
    "underflow": (
        torch.softmax(torch.tensor([[0.0, 0.3, -200, -200, -200], [0.0, -200, -200, -200, -200]]), -1),
        6,
    ),
    # a one-token support under two children: the draw broadcast token 0 into both (the rules then raised
    # "child token 0 has no proposal mass")
    "one-token": (torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64), 2),
}


@pytest.mark.parametrize("case", SPARSE)
def test_sampled_best_first_keeps_zero_probability_tokens_out_of_its_shape(case):
    """The sampled shape holds each depth's positive-probability tokens only: sibling tokens distinct and of
    positive proposal mass, the rules accept every tree, and the first token follows the target (chi-square);
    a shape with more children than tokens to draw (the greedy one) is refused by ``draw``."""
    probs, budget = SPARSE[case]
    prop = Proposal([[0]] * probs.shape[0], probs)
    greedy = BestFirst(budget).shape(0, prop)
    assert len(greedy.children_of(0)) > int((probs[0] > 0).sum())  # the premise: zero-probability children
    for rule_cls, (c, pvalue) in sparse_first_tokens(case).items():
        print(f"{case} {rule_cls.__name__}: first tokens {c.tolist()}, chi-square p {pvalue:.3g}")
        assert pvalue > ALPHA, (rule_cls.__name__, c.tolist())
    with pytest.raises(ValueError, match="children but its proposal only"):
        BestFirst.draw(greedy, np.random.default_rng(0))


def sparse_first_tokens(case: str) -> dict[type, tuple[np.ndarray, float]]:
    """Per rule: the first tokens committed over N_SPARSE sampled trees of ``case`` (the shape's invariants
    asserted on each) and their chi-square p-value against the root's target row."""
    probs, budget = SPARSE[case]
    vocab = probs.shape[-1]
    prop = Proposal([[0]] * probs.shape[0], probs)
    root_p = np.array([0.1, 0.3, 0.2, 0.15, 0.25][:vocab])
    root_p /= root_p.sum()
    logits = torch.randn(budget + 1, vocab, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    logits[0] = torch.from_numpy(np.log(root_p))
    n = N_SPARSE
    counts = {SpecSampling: np.zeros(vocab), Traversal: np.zeros(vocab)}
    for s in range(n):
        rng = step_rng(s, 1)
        tree = BestFirst(budget, sample=True).build(0, prop, rng)
        depth = tree.depth.tolist()
        for node in range(tree.size):
            tokens = tree.tokens[tree.children_of(node)].tolist()
            assert len(set(tokens)) == len(tokens), (s, tree.tokens.tolist(), tree.parents.tolist())
            assert all(probs[depth[node] - 1, t] > 0 for t in tokens), (s, tree.tokens.tolist())
        for i, (rule_cls, c) in enumerate(counts.items()):  # each rule its own stream, past the builder's
            acc = rule_cls(1.0, s).accept(tree, logits[: tree.size], 1, np.random.default_rng([s, i]))
            c[int(tree.tokens[acc.path[1]]) if len(acc.path) > 1 else acc.bonus] += 1
    return {rule_cls: (c, float(chisquare(c, n * root_p).pvalue)) for rule_cls, c in counts.items()}


# Trees a case (seeds 0 .. N_SPARSE - 1). The control below (no residual) measured p 3e-55 (one-token,
# spec_sampling) or less; the exact rules p 0.208 or more; the chi-square's false-failure rate on exact draws
# (20,000 multinomial samples of the root's row at N_SPARSE): 1.2e-3 (5 tokens), 7.5e-4 (3 tokens) a rule.
N_SPARSE = 2000


def _no_residual(r, q, weight=1.0):  # noqa: ANN001, ANN202
    """Forgets rejected children: the bonus may be a child just rejected (and traversal's weights stay)."""
    return r, float(weight)


@pytest.mark.parametrize("case", SPARSE)
def test_sparse_first_token_without_residual_is_caught(case, monkeypatch):
    """The negative control of test_sampled_best_first_keeps_zero_probability_tokens_out_of_its_shape's
    chi-square (its trees, seeds and streams): both rules without the residual must fail it."""
    monkeypatch.setattr(acceptance, "residual", _no_residual)
    for rule_cls, (c, pvalue) in sparse_first_tokens(case).items():
        print(f"control: {case} {rule_cls.__name__} without residual: {c.tolist()}, p {pvalue:.3g}")
        assert pvalue < ALPHA, (rule_cls.__name__, c.tolist())
