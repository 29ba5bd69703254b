"""The device sampling rules (repro.decoding.device_acceptance) pinned to the host rules.

- Identity: on many random padded trees (given children, repeated sibling tokens, padding) and target
  distributions, in float64 on CPU, each device rule gives the host walk's path and bonus when the host
  walk draws the same uniforms (fed in the device's keying: one per node's test, one per bonus);
  sample_match gives ``TargetMatch.accept``'s result (the same position uniforms).
- Exactness in distribution: test_acceptance_exact's decode-and-compare test on the device rules at a
  smaller N, with negative controls (the residual left out, traversal's weights frozen) that must fail it;
  the twins at T != 1 through the engine's entry, with theirs (bonus reusing the accept draws, temperature
  applied twice).
- Capture safety: no host read or data-dependent shape, the same ops on different data.
- The engine: on a GraphedTarget (CPU, eager) sample_match through the device path decodes AR's sampled
  tokens; spec_sampling and traversal decode on the device with one read a step, reproducibly by seed.
- GPU (``gpu``): the keyed uniforms equal the CPU ones, and a sampling step syncs once (read_back).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import test_acceptance_exact as exact
import torch
from conftest import SMALL_VOCAB, small_hybrid, small_ids, sync_debug
from scipy.stats import kstest
from test_acceptance_exact import ALPHA, decode_counts, verdict

from repro.decoding import device_acceptance as da
from repro.decoding import engine
from repro.decoding.acceptance import SpecSampling, TargetMatch, Traversal, spec_walk, traversal_walk
from repro.decoding.device_acceptance import HostView, keyed_uniforms, spec_accept, traversal_accept
from repro.decoding.engine import Route, device_sampling, generate, prepare_sampling
from repro.decoding.replayed import AcceptanceProcess, ReplayedAcceptance
from repro.decoding.sampling import step_rng
from repro.decoding.tree_builders import BestFirst, Chain, SingleNode
from repro.drafters.base import Proposal
from repro.models.graphed import GraphedTarget
from repro.models.graphs import check_capture
from repro.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")
DEVICE_RULES = {"spec_sampling": (spec_walk, spec_accept), "traversal": (traversal_walk, traversal_accept)}


def random_tree(gen: np.random.Generator, n: int, vocab: int) -> tuple[list[int], list[int]]:
    """Tokens and parents of a random ``n``-node tree (a fifth of them chains); children often repeat a
    sibling's token."""
    chain = gen.random() < 0.2  # as deep as the slot: every pointer-jumping round counts
    parents = [-1] + [
        int(gen.integers(0, i)) if gen.random() < 0.8 and not chain else i - 1 for i in range(1, n)
    ]
    tokens = [int(gen.integers(0, vocab)) for _ in range(n)]
    for i in range(2, n):
        sib = [j for j in range(1, i) if parents[j] == parents[i]]
        if sib and gen.random() < 0.15:
            tokens[i] = tokens[sib[0]]
    return tokens, parents


def random_rows(gen: np.random.Generator, tokens: list[int], parents: list[int], vocab: int) -> torch.Tensor:
    """Target rows: peaked or flat, often favouring a child's token, some with exact zeros, some a
    point mass."""
    n = len(tokens)
    logits = gen.normal(size=(n, vocab)) * gen.choice([0.5, 2.0, 6.0], size=(n, 1))
    for i in range(1, n):
        if gen.random() < 0.5:
            logits[parents[i], tokens[i]] += 3.0
    rows = torch.softmax(torch.from_numpy(logits), -1)
    rows[torch.from_numpy(gen.random(n) < 0.2), : vocab // 3] = 0.0
    hot = torch.from_numpy(gen.random(n) < 0.1)
    rows[hot] = 0.0
    rows[hot, int(gen.integers(0, vocab))] = 1.0
    rows = rows + (rows.sum(-1, keepdim=True) == 0) * 1.0  # a row emptied by the zeros: flat again
    return rows / rows.sum(-1, keepdim=True)


class KeyedRand:
    """The host walks' ``children`` and ``rand`` feeding the device keying: after ``children(u)``,
    spec_walk's i-th draw is child i's test (then u's bonus); traversal_walk's first draw is u's test
    (the root has none), its next the bonus at u."""

    def __init__(self, kids: list[list[int]], u: np.ndarray, ub: np.ndarray, rule: str) -> None:
        self.kids, self.u, self.ub, self.rule = kids, u, ub, rule
        self.node, self.calls = 0, 0

    def children(self, node: int) -> list[int]:
        self.node, self.calls = node, 0
        return self.kids[node]

    def rand(self) -> float:
        i, self.calls = self.calls, self.calls + 1
        if self.rule == "spec_sampling":
            kids = self.kids[self.node]
            return float(self.u[kids[i]]) if i < len(kids) else float(self.ub[self.node])
        return float(self.u[self.node]) if i == 0 and self.node != 0 else float(self.ub[self.node])


def host_walk(rule: str, tokens, parents, rows, u, ub):  # noqa: ANN001, ANN201
    kids: list[list[int]] = [[] for _ in tokens]
    for i, p in enumerate(parents[1:], 1):
        kids[p].append(i)
    keyed = KeyedRand(kids, u, ub, rule)
    rows_np = rows.numpy()
    walk = DEVICE_RULES[rule][0]
    return walk(tokens, keyed.children, rows_np.__getitem__, "given", lambda _: None, keyed.rand)


def device_walk(rule: str, tokens, parents, rows, u, ub, pad: int = 0):  # noqa: ANN001, ANN201
    n = len(tokens)
    view = HostView.of(tokens, parents, n + pad)
    rows = torch.cat([rows, torch.softmax(torch.randn(pad, rows.shape[1], dtype=torch.float64), -1)])
    pad_u = lambda x: torch.cat([torch.from_numpy(x), torch.rand(pad, dtype=torch.float64)])  # noqa: E731
    node, bonus = DEVICE_RULES[rule][1](view, rows, pad_u(u), pad_u(ub))
    path = torch.nonzero(view.ancestors[int(node)]).flatten().tolist()
    return path, int(bonus)


@pytest.mark.parametrize("rule", DEVICE_RULES)
def test_device_rule_is_the_host_walk_given_the_same_uniforms(rule):
    gen = np.random.default_rng(7)
    accepted = 0
    for case in range(2000):
        n, vocab = int(gen.integers(1, 24)), int(gen.choice([3, 7, 40]))
        tokens, parents = random_tree(gen, n, vocab)
        rows = random_rows(gen, tokens, parents, vocab)
        u, ub = gen.random(n), gen.random(n)
        want = host_walk(rule, tokens, parents, rows, u, ub)
        pad = int(gen.integers(0, 5)) * (gen.random() < 0.7)
        got = device_walk(rule, tokens, parents, rows, u, ub, pad)
        assert got == (list(want[0]), int(want[1])), (case, rule, tokens, parents)
        accepted += len(want[0]) - 1
    assert accepted > 1000  # the cases accept drafts, not only bonuses


@pytest.mark.parametrize("n", [1, 2, 3, 5, 9, 16, 17, 33])
def test_entering_odds_reach_the_root_from_any_depth(n):
    """Pointer jumping on a chain as deep as the slot (and a random tree) against the recurrence node by
    node: every round is needed at some depth."""
    gen = np.random.default_rng(n)
    for parents in ([-1] + list(range(n - 1)), [-1] + [int(gen.integers(0, i)) for i in range(1, n)]):
        par = torch.tensor(parents)
        p = torch.from_numpy(gen.uniform(0.3, 1.0, n))
        before = torch.from_numpy(gen.uniform(0.0, 0.2, n)) * (torch.rand(n) < 0.5)
        want = torch.zeros(n, dtype=torch.float64)
        for c in range(1, n):
            want[c] = max(0.0, float((want[parents[c]] + 1 - before[c] - p[c]) / p[c]))
        got = da.entering_odds(par >= 0, par.clamp(min=0), p, before)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_sample_match_device_is_target_match_with_the_position_uniforms():
    gen = np.random.default_rng(3)
    for case in range(300):
        n, vocab = int(gen.integers(1, 20)), int(gen.choice([3, 11, 50]))
        tokens, parents = random_tree(gen, n, vocab)
        logits = torch.from_numpy(gen.normal(size=(n, vocab)) * 3)
        # make the target's picks hit children often: raise a child's token in its parent's row
        for i in range(1, n):
            if gen.random() < 0.6:
                logits[parents[i], tokens[i]] += 8.0
        temperature, seed, position = float(gen.choice([0.5, 1.0, 1.7])), int(gen.integers(0, 99)), case
        want = TargetMatch(temperature, seed).accept(Tree(tokens, parents), logits, position)
        view = HostView.of(tokens, parents, n + 3)
        padded = torch.cat([logits, torch.zeros(3, vocab, dtype=logits.dtype)])
        uniforms = torch.tensor(da.position_uniforms(seed, position, n + 3), dtype=torch.float64)
        node, bonus = da.match_accept(view, padded, temperature, uniforms)
        path = torch.nonzero(view.ancestors[int(node)]).flatten().tolist()
        assert (path, int(bonus)) == (want.path, want.bonus), case


@dataclass
class AcceptSlot(HostView):
    """A HostView with what a twin's ``accept`` reads and writes of a slot: logits, node, bonus."""

    logits: torch.Tensor | None = None
    node: torch.Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.long))
    bonus: torch.Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("kind", ["sample_match", "spec_sampling", "traversal", "replayed"])
def test_twin_keys_draws_by_the_root_position_read_on_the_device(kind):
    """A twin's step draws what the host keying gives the root's output position, which it reads from the
    committed length on the device (length - prompt + 1): the same step at another length draws anew."""
    gen = np.random.default_rng(9)
    process = AcceptanceProcess("test", (0.7, 0.6, 0.5, 0.9))
    rule = {
        "sample_match": TargetMatch(0.8, 5),
        "spec_sampling": SpecSampling(1.0, 2**40 + 3),
        "traversal": Traversal(1.0, 11),
        "replayed": ReplayedAcceptance(process=process, seed=4),
    }[kind]
    tokens, parents = [0, 1, 2, 3, 4, 5], [-1, 0, 1, 2, 0, 4]
    logits = torch.from_numpy(gen.normal(size=(8, SMALL_VOCAB)))
    prompt, new_tokens, depth = 9, 30, 8
    twin = da.device_rule(rule, torch.device("cpu"), depth, new_tokens + depth + 1)
    twin.begin(prompt, new_tokens)
    drawn = []
    for position in (1, 7, 19):
        slot = AcceptSlot(*vars(HostView.of(tokens, parents, 8)).values(), logits=logits)
        twin.accept(slot, torch.tensor([prompt + position - 1]))
        if kind == "sample_match":
            uniforms = torch.tensor(da.position_uniforms(5, position, depth), dtype=torch.float64)
            want = da.match_accept(slot, logits, 0.8, uniforms)
        elif kind == "replayed":
            wanted = torch.tensor([process.draw(step_rng(4, position))])
            want = da.replayed_accept(slot, logits, wanted)
        else:
            key = torch.tensor([rule.seed, position])
            rows = da.target_rows(logits, 1.0)
            u, ub = keyed_uniforms(key, 8, da.ACCEPT), keyed_uniforms(key, 8, da.BONUS)
            want = da.SAMPLING_ACCEPTS[type(rule)](slot, rows, u, ub)
        assert (slot.node.tolist(), slot.bonus.tolist()) == (want[0].tolist(), want[1].tolist()), position
        drawn.append(twin.table[position].item() if kind in ("sample_match", "replayed") else position)
    assert len(set(drawn)) > 1  # the positions draw differently (not one upload reused)
    if kind == "replayed":
        twin.done([0, 4, 5], 7)
        assert rule.steps == 1 and rule.truncated == int(process.draw(step_rng(4, 7)) > 2)
    with pytest.raises(ValueError, match="exceed"):
        twin.begin(prompt, new_tokens + 1)  # its trees could reach past the drawn positions
    assert da.device_rule(rule, torch.device("cpu"), depth, new_tokens + depth + 2) is not twin


@pytest.mark.parametrize("kind", ["sample_match", "replayed"])
def test_twin_draws_only_the_generations_positions(kind, monkeypatch):
    """``begin`` draws the ``max_new_tokens`` positions of the generation, however far past the end the
    twin's trees may reach (sized for the target's largest tree: 1024 positions on the family's targets);
    those past the end decide only tokens the engine cuts and hold a fixed value, also over what an earlier,
    longer generation left there."""
    process = AcceptanceProcess("test", (0.7, 0.6, 0.5, 0.9))
    rule = TargetMatch(0.8, 5) if kind == "sample_match" else ReplayedAcceptance(process=process, seed=4)
    rule.begin([1, 2, 3])
    new_tokens, depth = 12, 200
    twin = da.device_rule(rule, torch.device("cpu"), depth, 3 * new_tokens + depth + 1)
    twin.begin(9, 3 * new_tokens)  # a longer generation first: real draws where the next one's end is
    drawn: list[int] = []
    real = da.position_uniforms
    monkeypatch.setattr(da, "position_uniforms", lambda seed, p, n: drawn.append(n) or real(seed, p, n))
    twin.begin(9, new_tokens)
    past = twin.table[new_tokens : new_tokens + depth + 1]
    if kind == "sample_match":
        assert drawn == [new_tokens] and (past == 0.5).all()
        assert twin.table[:new_tokens].tolist() == real(rule.stream, 0, new_tokens)
    else:
        assert len(twin._drawn) == new_tokens and (past == 0).all()
        want = [process.draw(step_rng(rule.stream, p)) for p in range(new_tokens)]
        assert twin.table[:new_tokens].tolist() == want


@pytest.mark.parametrize("kind", ["sample_match", "replayed", "spec_sampling"])
def test_a_twin_lives_no_longer_than_its_rule(kind):
    """The one twin per (rule, device) is cached while its rule lives and freed with it (its tables, and
    on CUDA its pinned rows and device buffers): a twin holding its rule kept the cache's entry, keyed
    weakly by that rule, alive for good."""
    import gc
    import weakref

    process = AcceptanceProcess("test", (0.7, 0.6))
    make = {
        "sample_match": lambda: TargetMatch(0.8, 5),
        "replayed": lambda: ReplayedAcceptance(process=process, seed=4),
        "spec_sampling": lambda: SpecSampling(0.8, 5),
    }[kind]
    rule = make()
    twin = da.device_rule(rule, torch.device("cpu"), 8, 64)
    assert da.device_rule(rule, torch.device("cpu"), 8, 64) is twin and twin.rule is rule
    gone = weakref.ref(twin)
    del twin, rule
    gc.collect()
    assert gone() is None


def test_twin_draws_are_made_before_the_clock(monkeypatch):
    """The host's draws of a sampled generation (a stand-in for a sampler's device generator, cached across
    a prompt's routes) are made before its clock starts: neither its prefill nor its decode time holds them.
    """
    model = small_hybrid(8)
    target = GraphedTarget(model, max_len=64, max_nodes=32)
    route = Route("ar", None, SingleNode(), TargetMatch(0.9, 11))
    real, calls = da.DeviceRule.begin, []

    def slow_begin(self: da.DeviceRule, *args: int) -> None:
        calls.append(time.sleep(0.5))
        real(self, *args)

    monkeypatch.setattr(da.DeviceRule, "begin", slow_begin)
    got = generate(target, small_ids(9, 6), route, 8)
    assert len(calls) == 1  # the draws were made (and slept) in this generation
    assert len(got.output_ids) == 8 and got.prefill_s < 0.5 and got.decode_s < 0.5


def test_keyed_uniforms_are_reproducible_uniform_and_keyed():
    key = torch.tensor([123, 45])
    u = keyed_uniforms(key, 20000, 0)
    assert torch.equal(u, keyed_uniforms(key.clone(), 20000, 0))
    assert ((u >= 0) & (u < 1)).all()
    pvalue = float(kstest(u.numpy(), "uniform").pvalue)
    print(f"keyed_uniforms (123, 45) stream 0, n={u.numel()}: KS against U[0, 1) p {pvalue:.3g}")
    assert pvalue > ALPHA
    for k, stream in [([123, 46], 0), ([124, 45], 0), ([123, 45], 1)]:
        other = keyed_uniforms(torch.tensor(k), 64, stream)
        assert not torch.isclose(u[:64], other).any()
    big = keyed_uniforms(torch.tensor([2**62 + 5, 2**40]), 8, 1)
    assert ((big >= 0) & (big < 1)).all()


def test_mul32_is_the_product_mod_2_to_the_32():
    """The hash's 32-bit multiply on int64 tensors (no overflow) against Python's integers, edges included."""
    gen = torch.Generator().manual_seed(3)
    edges = torch.tensor([0, 1, 2**16, 2**31, 2**32 - 1])
    x = torch.cat([torch.randint(0, 2**32, (3000,), generator=gen), edges])
    for c in (0x7FEB352D, 0x846CA68B, 0xFFFFFFFF, 0x10000, 1):
        assert da._mul32(x, c).tolist() == [v * c % 2**32 for v in x.tolist()], hex(c)


def test_keyed_uniforms_of_several_streams_are_each_streams_draws():
    """One hash chain for a step's two streams (accept, bonus) gives each stream's own draws, bit for bit,
    and the draws of a key are those of the recorded runs (a changed hash would re-draw every sampled
    T = 1 route's tokens: pinned from the per-stream form of 2026-12-05)."""
    for key in (torch.tensor([123, 45]), torch.tensor([2**62 + 5, 2**40]), torch.tensor([0, 0])):
        both = da.keyed_uniforms_of(key, 37, (da.ACCEPT, da.BONUS, 3))
        assert both.shape == (3, 37)
        for row, stream in zip(both, (da.ACCEPT, da.BONUS, 3)):
            assert torch.equal(row, keyed_uniforms(key, 37, stream))
    pinned = keyed_uniforms(torch.tensor([5, 2**40 + 3]), 3, 1).tolist()
    assert pinned == [0.025967458448969083, 0.08452368947991751, 0.3038083647741575]


# The uniformity check's negative control: the same draws to the power 1.1 (CDF x^(1/1.1), at most 0.035
# from uniform) must fail the same KS test (measured p 3e-20; the draws themselves p 0.589; the test's
# false-failure rate on uniform draws is ALPHA).
def test_keyed_uniforms_ks_catches_a_skew():
    u = keyed_uniforms(torch.tensor([123, 45]), 20000, 0).numpy()
    pvalue = float(kstest(u**1.1, "uniform").pvalue)
    print(f"control: keyed_uniforms ** 1.1, n={u.size}: KS p {pvalue:.3g}")
    assert pvalue < ALPHA


# --------------------------------------------------------------------- exactness in distribution


def as_walk(accept):  # noqa: ANN001, ANN201
    """A device rule in test_acceptance_exact's walk signature (given trees), its uniforms from ``rand``."""

    views: dict[tuple, HostView] = {}  # given trees repeat per prefix

    def walk(tokens, children, row, draw, proposal, rand):  # noqa: ANN001, ANN202
        assert draw == "given"
        n = len(tokens)
        parents = [-1] * n
        for u in range(n):
            for c in children(u):
                parents[c] = u
        rows = torch.from_numpy(np.stack([row(i) for i in range(n)]))
        key = (tuple(tokens), tuple(parents))
        view = views.get(key) or views.setdefault(key, HostView.of(tokens, parents))
        u = torch.tensor([rand() for _ in range(2 * n)], dtype=torch.float64)
        node, bonus = accept(view, rows, u[:n], u[n:])
        return torch.nonzero(view.ancestors[int(node)]).flatten().tolist(), int(bonus)

    return walk


def spec_without_residual(view: HostView, rows: torch.Tensor, u: torch.Tensor, ub: torch.Tensor):  # noqa: ANN201
    """The negative control: spec_accept testing every child against its parent's whole row (no
    residual: repeated tokens, earlier siblings' mass and the bonus's excluded tokens ignored)."""
    child, par, earlier = da._children(view)
    p = torch.where(child, rows.reshape(-1).index_select(0, par * rows.shape[1] + view.tokens), 0.0)
    passed = (u < p) & child
    ok = (passed & ~((earlier > 0) & passed[None, :]).any(-1)) | (torch.arange(p.numel()) == 0)
    node = da._deepest(ok, view)
    no_kids = HostView(view.tokens, torch.full_like(view.parents, -1), view.depth, view.ancestors, view.first)
    return node, da._draw(rows, node, no_kids, ub.index_select(0, node))


N_DEVICE = 5000
DISTRIBUTION_CASES = [  # on one level (wide) traversal is spec_sampling: its case is the deep one
    ("spec_sampling", "wide-given"),
    ("spec_sampling", "bestfirst-given"),
    ("traversal", "bestfirst-given"),
]


@pytest.mark.parametrize(("rule", "shape"), DISTRIBUTION_CASES, ids=["-".join(c) for c in DISTRIBUTION_CASES])
def test_device_rule_reproduces_the_target_joint_distribution(rule, shape):
    tv, noise, pvalue = verdict(decode_counts(as_walk(DEVICE_RULES[rule][1]), shape, N_DEVICE, seed=11))
    print(f"device {rule} {shape} n={N_DEVICE}: TV {tv:.4f} (noise {noise:.4f}), chi-square p {pvalue:.3g}")
    assert pvalue > ALPHA and tv < 1.5 * noise, (tv, noise, pvalue)


def _frozen_odds(child, par, p, before):  # noqa: ANN001, ANN202
    """The traversal control: every node entered as if its parent's weight were 1 (no composition)."""
    return torch.where(child, ((1.0 - before - p) / torch.where(p > 0, p, 1.0)).clamp(min=0), 0.0)


CONTROLS = {
    "spec-without-residual": (spec_without_residual, "wide-given", None),
    "traversal-frozen-weight": (traversal_accept, "bestfirst-given", ("entering_odds", _frozen_odds)),
}


@pytest.mark.parametrize("control", CONTROLS)
def test_negative_controls_are_caught(control, monkeypatch):
    accept, shape, patch = CONTROLS[control]
    if patch:
        monkeypatch.setattr(da, *patch)
    tv, noise, pvalue = verdict(decode_counts(as_walk(accept), shape, N_DEVICE, seed=12))
    print(f"control {control} on {shape} n={N_DEVICE}: TV {tv:.4f} (noise {noise:.4f}), p {pvalue:.3g}")
    assert pvalue < ALPHA and tv > 1.5 * noise, (tv, noise, pvalue)


def decode_twin(rule_cls: type, temperature: float, shape: str, n: int) -> np.ndarray:
    """test_acceptance_exact's decodes through the engine's device entry: decode j is a twin
    (:class:`~repro.decoding.device_acceptance.DeviceRule`) of ``rule_cls(temperature, j)`` whose ``accept``
    reads an :class:`AcceptSlot` holding logits ``temperature * log(target)`` (the target at that
    temperature) and keys its uniforms by (j, the root's position) from the committed length."""
    make, trees = exact.SHAPES[shape], {}
    assert shape in exact.DETERMINISTIC  # given children: the device rules' trees
    depth = exact.DEPTH + 1
    counts = np.zeros(exact.V**exact.L, dtype=np.int64)
    for j in range(n):
        twin = da.DeviceRule(rule_cls(temperature, j), torch.device("cpu"), depth, exact.L + depth + 1)
        twin.begin(1, exact.L)  # a one-token prompt: the root's position is the committed length
        ctx: tuple[int, ...] = (exact.ROOT,)
        while len(ctx) <= exact.L:
            if ctx not in trees:
                sim = make(ctx, np.random.default_rng(0))
                logits = temperature * torch.from_numpy(np.log(np.stack([exact.target(c) for c in sim.ctx])))
                parents = [-1] * len(sim.tokens)
                for u, kids in enumerate(sim.kids):
                    for c in kids:
                        parents[c] = u
                view = HostView.of(sim.tokens, parents)
                trees[ctx] = sim, AcceptSlot(*vars(view).values(), logits=logits)
            sim, slot = trees[ctx]
            twin.accept(slot, torch.tensor([len(ctx)]))
            ctx = sim.ctx[int(slot.node)] + (int(slot.bonus),)
        counts[np.ravel_multi_index(ctx[1 : exact.L + 1], (exact.V,) * exact.L)] += 1
    return counts


# At T != 1 a twin that took T = 1 samples target^T renormalised: measured at n = N_TWIN with that bug
# injected (both rules, both temperatures) TV / noise 3.15-5.04 and chi-square p 1e-124 or less; the exact
# twins (the same draws at both temperatures): TV / noise 0.85-1.06, p 0.578 or more.
N_TWIN = 1500


@pytest.mark.parametrize("temperature", [0.6, 1.7])
@pytest.mark.parametrize("rule_cls", [SpecSampling, Traversal], ids=["spec_sampling", "traversal"])
def test_twin_samples_the_target_at_its_temperature(rule_cls, temperature):
    tv, noise, pvalue = verdict(decode_twin(rule_cls, temperature, "bestfirst-given", N_TWIN))
    print(
        f"twin of {rule_cls.__name__} at T={temperature}, n={N_TWIN}: TV {tv:.4f} (noise {noise:.4f}), "
        f"chi-square p {pvalue:.3g}"
    )
    assert pvalue > ALPHA and tv < 1.5 * noise, (tv, noise, pvalue)


# The negative controls of test_twin_samples_the_target_at_its_temperature (its decodes, N_TWIN, seeds and
# verdict), asserted to fail: a twin whose bonus reuses the accept draws (``ub`` = ``u``: measured TV / noise
# 3.97 (spec_sampling), 4.86 (traversal), chi-square p 7e-126, 5e-309; the same draws at both temperatures,
# so run at one) and a twin applying its temperature twice (TV / noise 3.24-4.83, p 5e-135 or less). The
# verdict's false-failure rate on exact decodes (20,000 multinomial samples of the joint at N_TWIN): 1.1e-3.
TWIN_CONTROLS = [
    *[("bonus-reuses-accept-draws", rule, 0.6) for rule in ("spec_sampling", "traversal")],
    *[("temperature-twice", rule, t) for rule in ("spec_sampling", "traversal") for t in (0.6, 1.7)],
]


@pytest.mark.parametrize(
    ("control", "rule", "temperature"), TWIN_CONTROLS, ids=["-".join(map(str, c)) for c in TWIN_CONTROLS]
)
def test_twin_controls_are_caught(control, rule, temperature, monkeypatch):
    rule_cls = {"spec_sampling": SpecSampling, "traversal": Traversal}[rule]
    if control == "bonus-reuses-accept-draws":
        real = da.SAMPLING_ACCEPTS[rule_cls]
        monkeypatch.setitem(da.SAMPLING_ACCEPTS, rule_cls, lambda view, rows, u, ub: real(view, rows, u, u))
    else:
        real_rows = da.target_rows
        monkeypatch.setattr(da, "target_rows", lambda logits, t: real_rows(logits / t, t))
    tv, noise, pvalue = verdict(decode_twin(rule_cls, temperature, "bestfirst-given", N_TWIN))
    print(f"control {control} twin of {rule} at T={temperature}: TV {tv:.4f} ({noise:.4f}), p {pvalue:.3g}")
    assert pvalue < ALPHA and tv > 1.5 * noise, (tv, noise, pvalue)


# --------------------------------------------------------------------------------- capture safety


def _capture_case(rule: str, seed: int):  # noqa: ANN202
    gen = np.random.default_rng(seed)
    tokens, parents = random_tree(gen, 9 + seed, 13)
    view = HostView.of(tokens, parents, 16)
    logits = torch.randn(16, 13, dtype=torch.float64)
    key = torch.tensor([seed, 100 + seed])
    if rule == "sample_match":
        return lambda: da.match_accept(view, logits, 0.8, torch.rand(16, dtype=torch.float64))

    def run() -> None:
        rows = da.target_rows(logits, 0.8)
        DEVICE_RULES[rule][1](view, rows, keyed_uniforms(key, 16, 0), keyed_uniforms(key, 16, 1))

    return run


@pytest.mark.parametrize("rule", ["sample_match", *DEVICE_RULES])
def test_device_rules_are_capture_safe(rule):
    """No host read or data-dependent shape, and the same ops on the same shapes for other data."""
    checks = [check_capture(_capture_case(rule, seed)) for seed in range(2)]
    assert checks[0].hazards == checks[1].hazards == []
    assert checks[0].trace == checks[1].trace


# ------------------------------------------------------------------------------------- the engine


class TopDrafter:
    """Per-depth marginals leaning on a reference continuation (device-style: probs and top_ids)."""

    capture_layers: tuple[int, ...] = ()

    def __init__(self, depth: int, seed: int) -> None:
        self.depth, self.seed = depth, seed

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        self.reference = list(reference_ids or [])
        self.gen = torch.Generator().manual_seed(self.seed)  # every generation proposes the same

    def propose(self, ctx):  # noqa: ANN001, ANN201 - the Drafter protocol
        noise = torch.randn(self.depth, SMALL_VOCAB, generator=self.gen, dtype=torch.float64)
        probs = torch.softmax(noise, -1)
        for d, t in enumerate(self.reference[ctx.next_position : ctx.next_position + self.depth]):
            probs[d, t] += 0.6
        probs = probs / probs.sum(-1, keepdim=True)
        return Proposal(probs=probs, top_ids=probs.topk(3, dim=-1).indices)


def sampling_routes(rule: TargetMatch) -> list[Route]:
    return [
        Route("chain", TopDrafter(5, 1), Chain(), rule),
        Route("ddtree", TopDrafter(4, 2), BestFirst(12), rule, commit="replay"),
        Route("ddtree-snap", TopDrafter(3, 3), BestFirst(7), rule, commit="snapshot"),
        Route("chain-verifier", TopDrafter(4, 4), Chain(), rule, commit="replay", verifier="chain"),
    ]


@contextlib.contextmanager
def counted_reads(monkeypatch):  # noqa: ANN001, ANN201
    import repro.models.graphed as graphed

    reads: list[int] = []
    real = graphed.read_back
    monkeypatch.setattr(graphed, "read_back", lambda h, c: reads.append(1) or real(h, c))
    yield reads


def test_sample_match_device_path_decodes_ar_sampled_tokens(monkeypatch):
    model = small_hybrid(5)
    target = GraphedTarget(model, max_len=96, max_nodes=32)
    prompt = small_ids(9, 4)
    rule = TargetMatch(0.9, 17)
    ar = generate(model, prompt, Route("ar", None, SingleNode(), rule), 40).output_ids

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the host path ran on the device path")

    with counted_reads(monkeypatch) as reads:
        monkeypatch.setattr(TargetMatch, "accept", refuse)
        monkeypatch.setattr(GraphedTarget, "commit", refuse)
        for route in sampling_routes(rule):
            assert device_sampling(target, route) and not device_sampling(model, route)
            reads.clear()
            got = generate(target, prompt, route, 40, reference_ids=ar)
            assert got.output_ids == ar, route.name
            assert len(reads) == got.steps and max(got.accepted_lengths) > 1, route.name


@pytest.mark.parametrize("rule_cls", [SpecSampling, Traversal], ids=["spec_sampling", "traversal"])
def test_sampling_rules_take_the_device_path_reproducibly(rule_cls, monkeypatch):
    model = small_hybrid(6)
    target = GraphedTarget(model, max_len=96, max_nodes=32)
    prompt = small_ids(9, 5)
    ar = generate(model, prompt, Route("ar", None, SingleNode(), TargetMatch(0.0, 0)), 40).output_ids
    longest: dict[str, int] = {}
    with counted_reads(monkeypatch) as reads:
        monkeypatch.setattr(rule_cls, "accept", lambda *a, **k: (_ for _ in ()).throw(AssertionError("host")))
        for seed in range(3, 9):  # the drafts lean on greedy AR's tokens: a sampled path leaves them soon
            for route in sampling_routes(rule_cls(1.0, seed)):
                reads.clear()
                first = generate(target, prompt, route, 40, reference_ids=ar)
                assert len(reads) == first.steps
                again = generate(target, prompt, route, 40, reference_ids=ar)
                assert first.output_ids == again.output_ids and first.accepted_paths == again.accepted_paths
                longest[route.name] = max(longest.get(route.name, 0), *first.accepted_lengths)
    assert min(longest.values()) > 1, longest  # every route accepted drafts on some seed


def test_sampled_ar_picks_on_the_device_the_host_paths_tokens(monkeypatch):
    """sample_match AR on a graphed target picks on the device (groups of steps one ahead of the host, no
    host pick but the prefill's): the host AR's tokens, at limits inside and across groups and at a stop
    token. Greedy AR has its own device path; AR under spec_sampling / traversal keeps the host's bonus."""
    model = small_hybrid(8)
    target = GraphedTarget(model, max_len=64, max_nodes=32)  # 64: the buffers grow during the run
    prompt = small_ids(9, 6)
    rule_cls = TargetMatch
    route = Route("ar", None, SingleNode(), rule_cls(0.9, 11))
    assert engine.device_ar_sampling(target, route) and not engine.device_ar_sampling(model, route)
    for other in (TargetMatch(0.0, 0), SpecSampling(0.9, 11), Traversal(0.9, 11)):
        assert not engine.device_ar_sampling(target, Route("ar", None, SingleNode(), other))
    want = generate(model, prompt, route, 70).output_ids
    assert len(set(want)) > 10  # sampled, not a repeated argmax
    calls: list[int] = []
    real = rule_cls.pick
    monkeypatch.setattr(rule_cls, "pick", lambda self, *a: calls.append(1) or real(self, *a))
    for limit in (70, 13, 8, 1):
        calls.clear()
        got = generate(target, prompt, route, limit)
        assert got.output_ids == want[:limit] and got.finish_reason == "length", limit
        assert len(calls) == 1  # the prefill's token; every later pick on the device
    stop = want[20]
    got = generate(target, prompt, route, 70, stop_ids=[stop])
    assert got.output_ids == want[: want.index(stop) + 1] and got.finish_reason == "stop"


def test_which_routes_take_the_sampling_device_path():
    target = GraphedTarget(small_hybrid(7), max_len=64, max_nodes=32)
    sampled = Route("s", TopDrafter(3, 1), BestFirst(5, sample=True), SpecSampling(1.0, 0))
    assert not device_sampling(target, sampled)  # sampled draws: the host builder and walk
    assert not device_sampling(target, Route("ar", None, SingleNode(), TargetMatch(1.0, 0)))
    assert not device_sampling(target, Route("g", TopDrafter(3, 1), Chain(), TargetMatch(0.0, 0)))
    assert device_sampling(target, Route("t", TopDrafter(3, 1), Chain(), Traversal(0.7, 0)))
    prepare_sampling(target, [sampled])  # without CUDA graphs: nothing to capture


# ----------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_keyed_uniforms_equal_the_cpu_ones():
    key = torch.tensor([2**40 + 7, 1234])
    assert torch.equal(keyed_uniforms(key.cuda(), 512, 1).cpu(), keyed_uniforms(key, 512, 1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_sampling_step_syncs_only_in_read_back(monkeypatch):
    """The trained default target in float32 on CUDA graphs, the three sampling rules on a device chain
    and a device DDTree: prepare_sampling captures every graph ahead; under torch's sync debug mode
    ("error") a step syncs nowhere but in ``read_back``, once a step; sample_match decodes the graphed
    AR's sampled tokens."""
    import repro.decoding.engine as engine
    import repro.models.graphed as graphed
    from repro.models.target import open_target

    def allowing(fn):  # noqa: ANN001, ANN202
        def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            with sync_debug(0):
                return fn(*args, **kwargs)

        return wrapped

    model, _ = open_target("default", dtype="float32", device="cuda")
    model.set_gdn_backend("triton")
    vocab = model.config.vocab_size
    target = GraphedTarget(model, max_len=128, max_nodes=32)
    target.prepare(("closed_form", "replay"), (), 32)
    prompt = [t % vocab for t in small_ids(10, 12)]
    rules = [TargetMatch(1.0, 5), SpecSampling(1.0, 5), Traversal(1.0, 5)]
    reference = generate(target, prompt, Route("ar", None, SingleNode(), rules[0]), 30).output_ids
    reads: list[int] = []
    real_read = graphed.read_back
    monkeypatch.setattr(graphed, "read_back", allowing(lambda h, c: reads.append(1) or real_read(h, c)))
    monkeypatch.setattr(engine, "_clock", allowing(engine._clock))
    monkeypatch.setattr(engine, "_prefill", allowing(engine._prefill))
    monkeypatch.setattr(engine.StageClock, "device_s", allowing(engine.StageClock.device_s))
    monkeypatch.setattr(engine.StageClock, "_harvest", allowing(engine.StageClock._harvest))
    monkeypatch.setattr(TargetMatch, "pick", allowing(TargetMatch.pick))
    for rule in rules:
        for route in [
            Route("chain", GpuDrafter(5, 1, vocab), Chain(), rule),
            Route("ddtree", GpuDrafter(4, 2, vocab), BestFirst(12), rule, commit="replay"),
        ]:
            route.drafter.propose = allowing(route.drafter.propose)
            prepare_sampling(target, [route], 32)
            captured = target.captures
            generate(target, prompt, route, 30, reference_ids=reference)  # warm-up: the device builders
            assert target.captures == captured  # prepare_sampling made every graph the steps replay
            reads.clear()
            with sync_debug():
                got = generate(target, prompt, route, 30, reference_ids=reference)
            assert len(reads) == got.steps, (type(rule).__name__, route.name)
            if type(rule) is TargetMatch:
                assert got.output_ids == reference, route.name


class GpuDrafter(TopDrafter):
    """TopDrafter's marginals over ``vocab``, on CUDA in float32 (synchronized before the step's work)."""

    def __init__(self, depth: int, seed: int, vocab: int) -> None:
        super().__init__(depth, seed)
        self.vocab = vocab

    def propose(self, ctx):  # noqa: ANN001, ANN201
        noise = torch.randn(self.depth, self.vocab, generator=self.gen, dtype=torch.float64)
        probs = torch.softmax(noise, -1)
        for d, t in enumerate(self.reference[ctx.next_position : ctx.next_position + self.depth]):
            probs[d, t] += 0.6
        probs = (probs / probs.sum(-1, keepdim=True)).to("cuda", torch.float32)
        proposal = Proposal(probs=probs, top_ids=probs.topk(3, dim=-1).indices)
        torch.cuda.synchronize()
        return proposal


def test_sampling_device_paths_read_their_results_from_the_tagged_stores(request):
    """graphed.HOST_WRITES's path on the CPU (conftest's ``tagged_stores``): the sampling device routes
    (their acceptance graphs) and sampled AR (its group graphs, picking on the device) give the records of
    the stream copies, every result read through its tags."""
    import repro.models.graphed as graphed

    model = small_hybrid(5)
    prompt = small_ids(9, 4)
    routes = [Route("ar", None, SingleNode(), TargetMatch(0.9, 11)), *sampling_routes(SpecSampling(1.0, 4))]
    runs = []
    for tagged in (False, True):
        kinds = request.getfixturevalue("tagged_stores") if tagged else []
        target = GraphedTarget(model, max_len=96, max_nodes=32)
        got = [generate(target, prompt, route, 40) for route in routes]
        runs.append([(g.output_ids, g.accepted_paths, g.accepted_lengths) for g in got])
        if tagged:
            assert kinds and set(kinds) == {graphed.HostWrite}, kinds
    assert runs[0] == runs[1]
    assert max(max(lengths) for _, _, lengths in runs[1][1:]) > 1  # drafts were accepted somewhere
