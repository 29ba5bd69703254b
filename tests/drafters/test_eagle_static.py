"""The static EAGLE drafter (repro/drafters/static_eagle.py) pinned to the eager EagleDrafter: the same
proposals step by step (chain tokens and probabilities; dynamic trees with tau, ties and early stops,
padding after the real nodes), buffer growth, a capture-safe device call, the route switch on the
graphed target, and eagle routes through the graphed target identical to AR. GPU: the same in
float32 with CUDA graphs and no host sync in ``propose``."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import sync_debug

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.drafters.base import DraftContext, Proposal
from repro.drafters.eagle import DynamicTree, EagleDrafter, random_eagle_for
from repro.drafters.static_eagle import StaticEagleDrafter, real_nodes
from repro.models.graphed import GraphedTarget
from repro.models.graphs import check_capture
from repro.models.target import open_target
from repro.tree import DeviceTree

FAMILY = "tiny-qwen35"
TEXTS = [
    "Write a short story about a cat and a boat.",
    "List three facts about the moon, the sea and the tides, then explain how they are related in detail.",
]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def family(dtype: str, device: str = "cpu"):  # noqa: ANN201 - (HybridLM, prompts)
    model, tok = open_target("default", dtype=dtype, device=device)
    if device == "cuda":
        model.set_gdn_backend("triton")
    return model, [tok.chat_prompt([{"role": "user", "content": t}]) for t in TEXTS]


@pytest.fixture(scope="module")
def family64():
    return family("float64")


@pytest.fixture(scope="module")
def ar64(family64):
    """AR's 32 tokens after each prompt."""
    model, prompts = family64
    ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, 0)
    return [generate(model, p, ar, 32).output_ids for p in prompts]


def twin(eager: EagleDrafter, **kw) -> StaticEagleDrafter:
    return StaticEagleDrafter(eager.model, eager.target, k=eager.k, width=eager.width, tree=eager.tree, **kw)


def tree_size(drafter: EagleDrafter) -> int:
    """The static drafter's fixed tree size: min(budget, candidates) + 1."""
    spec = drafter.tree
    assert spec is not None
    kids = min(spec.topk, drafter.model.config.vocab_size)
    return min(spec.budget, kids + (spec.depth - 1) * spec.topk * kids) + 1


def check_same(eager: EagleDrafter, ref: Proposal, got: Proposal) -> int:
    """Assert the static proposal ``got`` is the eager ``ref``; returns the padding nodes."""
    assert got.candidates == ref.candidates
    if eager.tree is None:
        assert got.tree is None and got.top_ids.shape == (eager.k, eager.width)
        assert (got.probs - ref.probs).abs().max().item() < 1e-10 * (
            1 if ref.probs.dtype == torch.float64 else 1e5
        )
        return 0
    assert isinstance(got.tree, DeviceTree) and got.tree.size == tree_size(eager)
    host = got.tree.to_tree()
    real = real_nodes(host)
    assert real.tokens.tolist() == ref.tree.tokens.tolist()
    assert real.parents.tolist() == ref.tree.parents.tolist()
    pad = host.size - real.size
    assert host.parents[real.size :].tolist() == [-1] * pad and host.tokens[real.size :].tolist() == [0] * pad
    return pad


def shadow(
    eager: EagleDrafter, static: StaticEagleDrafter, sync_check: bool = False
) -> tuple[list[int], list[int]]:
    """Feed everything the engine gives ``eager`` to ``static`` as well and compare every proposal; returns
    the padding and the buffers' capacity per step. ``sync_check``: every propose but the first runs
    under CUDA's sync debug mode "error" (a host sync raises)."""
    pads: list[int] = []
    capacities: list[int] = []
    begin, observe, propose = eager.begin, eager.observe_prefill, eager.propose

    def both_begin(prompt, ref):  # noqa: ANN001, ANN202
        begin(prompt, ref)
        static.begin(prompt, ref)

    def both_observe(ver):  # noqa: ANN001, ANN202
        observe(ver)
        static.observe_prefill(ver)

    def both_propose(ctx: DraftContext) -> Proposal:
        ref = propose(ctx)
        guard = sync_debug() if sync_check and pads else contextlib.nullcontext()
        with guard:
            got = static.propose(ctx)
        pads.append(check_same(eager, ref, got))
        capacities.append(static.capacity)
        return ref

    eager.begin, eager.observe_prefill, eager.propose = both_begin, both_observe, both_propose
    return pads, capacities


STEP_SPECS = {
    "chain": ({"kind": "eagle_chain", "k": 6}, {"width": 3}),
    "tree": ({"kind": "eagle_tree", "budget": 24, "topk": 4, "tau": 0.05, "depth": 6}, {}),
}


def run_shadowed(  # noqa: ANN001 - model: HybridLM, prompts: token lists
    model, prompts, name: str, new_tokens: int, **static_kw
) -> tuple[list[int], list[int], list[int]]:
    """Decode with the eager route, the static drafter shadowing it: (lengths, paddings, capacities)."""
    spec, extra = STEP_SPECS[name]
    route = build_route(spec, model.config.vocab_size, "greedy", 0.0, 0, target=model, family=FAMILY)
    eager = route.drafter
    if extra:
        eager = route.drafter = EagleDrafter(eager.model, model, k=eager.k, **extra)
    static = twin(eager, **static_kw)
    pads, capacities = shadow(eager, static, sync_check=static.graphs)
    lengths = [n for p in prompts for n in generate(model, p, route, new_tokens).accepted_lengths]
    return lengths, pads, capacities


@pytest.mark.parametrize("name", list(STEP_SPECS))
def test_static_proposals_equal_eager_step_by_step(family64, name):
    """Across generations with varying accepted paths (a prompt longer than a prefill chunk too), with tau
    pruning and buffers doubled from 16 positions, every proposal equals the eager drafter's."""
    model, prompts = family64
    lengths, pads, capacities = run_shadowed(model, prompts, name, 40, capacity=16)
    assert max(lengths) > 2 and min(lengths) == 1
    assert capacities[-1] > capacities[0] > 16  # doubled at prefill, then while decoding
    if name == "tree":  # tau prunes some trees below the budget (padded), not all
        assert min(pads) == 0 < max(pads)


A, B, C, D = 10, 11, 12, 13
HAND_SHAPES = [
    DynamicTree(5, topk=2, tau=0.2, depth=3),  # ties: ab = ba
    DynamicTree(20, 2, 0.2, 3),
    DynamicTree(20, 2, 0.3, 3),  # b is below tau everywhere
    DynamicTree(2, 2, 0.0, 3),  # the eager drafter stops early
    DynamicTree(20, 3, 0.0, 1),
    DynamicTree(20, 2, 0.7, 3),  # nothing is confident enough: the root and padding
    DynamicTree(3, 6, 0.0, 2),  # more frontier rows than children with a 4-token support
]


@pytest.mark.parametrize("shape", HAND_SHAPES, ids=[str(i) for i in range(len(HAND_SHAPES))])
def test_hand_trees_equal_eager(model64, shape):
    """Every node's drafter distribution is a .6, b .25, c .1, d .05 (exact ties between paths): the static
    tree is the eager one, padding after it."""
    dist = torch.zeros(model64.config.vocab_size, dtype=torch.float64)
    dist[[A, B, C, D]] = torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64)
    eager = EagleDrafter(random_eagle_for(model64), model64, tree=shape)
    static = twin(eager)
    ids = list(range(3, 40))
    _, ver = model64.prefill(ids, capture=eager.capture_layers)
    for d in (eager, static):
        d._probs = lambda preds: dist.expand(preds.shape[0], -1)
        d.begin(ids, None)
        d.observe_prefill(ver)
    ctx = DraftContext(ids, [7])
    check_same(eager, eager.propose(ctx), static.propose(ctx))


def test_prompt_rows_run_at_prefill_not_in_the_first_step(model64):
    """The drafter's own prefill: after the prompt's last chunk the rows the first step's device call
    leaves out are there (one eager forward); the first propose runs only the device call, and proposes
    what a drafter that catches up inside propose (the prompt not given to begin) proposes."""
    eager = EagleDrafter(random_eagle_for(model64, seed=4), model64, k=3)
    static, late = twin(eager), twin(eager)
    ids = list(range(3, 40))
    _, ver = model64.prefill(ids, capture=eager.capture_layers)
    fast: list[bool] = []
    rows = static._context_rows
    static._context_rows = lambda ids, start, f=True: fast.append(f) or rows(ids, start, f)
    for d, prompt in ((eager, ids), (static, ids), (late, [])):
        d.begin(prompt, None)
        d.observe_prefill(ver)
    assert fast == [False] and static.rows == len(ids) - static.block and late.rows == 0
    ctx = DraftContext(ids, [7])
    got = static.propose(ctx)
    assert fast == [False, True]  # the device call's own rows only
    check_same(eager, late.propose(ctx), got)
    check_same(eager, eager.propose(ctx), got)


@pytest.mark.parametrize("tree", [None, DynamicTree(12, 3, 0.01, 4)], ids=["chain", "tree"])
def test_the_device_call_is_capture_safe(model64, tree):
    """No host read, host copy or data-dependent shape in the call a CUDA graph captures, and the same ops on
    the same shapes whatever its inputs (another context length and pending token)."""
    drafter = StaticEagleDrafter(random_eagle_for(model64, seed=3), model64, k=3, width=2, tree=tree)
    ids = list(range(3, 30))
    _, ver = model64.prefill(ids, capture=drafter.capture_layers)
    drafter.observe_prefill(ver)
    drafter.propose(DraftContext(ids, [5]))
    first = check_capture(drafter._step)
    drafter.inputs[:3] = torch.tensor([20, 22, 9])  # two rows ending at position 21, pending token 9
    second = check_capture(drafter._step)
    assert first.hazards == [] and second.hazards == []
    assert first.trace == second.trace


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "eagle_chain", "k": 6},
        {"kind": "eagle_tree", "budget": 32, "tau": 0.05},
        {"kind": "specla", "budget": 24, "topk": 4, "tau": 0.05, "depth": 6},
    ],
    ids=["eagle_chain", "eagle_tree", "specla"],
)
def test_eagle_routes_on_the_graphed_target_reproduce_ar(family64, ar64, spec):
    """build_route on a GraphedTarget gives the static drafter (on HybridLM, the eager one); its routes
    through the graphed target (no graphs on CPU) give AR's tokens."""
    model, prompts = family64
    outputs, sizes, _ = decode_graphed(model, prompts, spec, graphs=False, new_tokens=32, refs=ar64)
    assert [got for _, got in outputs] == ar64
    if spec["kind"] != "eagle_chain":
        assert len(set(sizes)) == 1  # the fixed, padded size
    hybrid = build_route(spec, model.config.vocab_size, "greedy", 0.0, 0, target=model, family=FAMILY)
    assert type(hybrid.drafter) is EagleDrafter


def decode_graphed(model, prompts, spec, graphs: bool, new_tokens: int, refs=None):  # noqa: ANN001, ANN201
    """(AR tokens, route tokens) per prompt, the tree sizes, the drafter of ``spec`` on a GraphedTarget
    (``refs``: AR's tokens, when known)."""
    target = GraphedTarget(model, graphs=graphs)
    vocab = model.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 0)
    route = build_route(spec, vocab, "greedy", 0.0, 0, target=target, family=FAMILY)
    assert isinstance(route.drafter, StaticEagleDrafter) and route.drafter.graphs == graphs
    outputs, sizes = [], []
    for i, p in enumerate(prompts):
        ref = refs[i] if refs else generate(model, p, ar, new_tokens).output_ids
        res = generate(target, p, route, new_tokens)
        outputs.append((ref, res.output_ids))
        sizes += res.tree_sizes
    return outputs, sizes, route.drafter


# ------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("name", list(STEP_SPECS))
def test_graphed_static_proposals_equal_eager_on_gpu_without_sync(name):
    """float32 on CUDA: the graphed static drafter's proposals equal the eager drafter's at every step, and
    every propose after the first (the capture) makes no host sync."""
    model, prompts = family("float32", "cuda")
    lengths, _, _ = run_shadowed(model, prompts, name, 48, capacity=1024, graphs=True)
    assert max(lengths) > 2


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize(
    "spec",
    [{"kind": "eagle_chain", "k": 6}, {"kind": "specla", "budget": 32, "topk": 4, "tau": 0.05, "depth": 6}],
    ids=["eagle_chain", "specla"],
)
def test_eagle_routes_on_the_graphed_target_reproduce_ar_on_gpu(spec):
    model, prompts = family("float32", "cuda")
    outputs, _, drafter = decode_graphed(model, prompts, spec, graphs=True, new_tokens=48)
    assert all(got == ref for ref, got in outputs)
    assert drafter._call is not None  # the proposals came from the graph
