"""Weaver's tree growth on the device (repro.drafters.weaver_growth) against the host reference.

CPU, float64: :func:`grow_on_device` gives the host :func:`grow`'s tree (tokens, parents, order,
scores) for every width over random adapters and pools, exact and near ties, pools smaller than the
budget (padding) and trees that reach the last depth; it is capture-safe and runs the same ops on
the same shapes whatever the data. The weaver route through the graphed target (graphs off) with
device growth decodes AR's tokens. GPU (``gpu``): float32 in one CUDA graph equals the host growth,
with no host sync.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from conftest import sync_debug

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.drafters.layers import init_draft_weights
from repro.drafters.pool import top_k_pool
from repro.drafters.weaver import GrowthStep
from repro.drafters.weaver_growth import DeviceGrowth, grow, grow_on_device
from repro.drafters.weaver_model import WeaverConfig, WeaverModel
from repro.models.graphed import GraphedTarget
from repro.models.graphs import check_capture
from repro.tree import DeviceTree, Tree

pytestmark = pytest.mark.usefixtures("single_thread")
VOCAB, HIDDEN, FEATURES, DRAFT = 40, 12, 20, 14


def adapter(seed: int, depth: int, residual: float, dtype: torch.dtype = torch.float64) -> WeaverModel:
    """A seeded random adapter; ``residual`` scales ``out_proj`` (0: DFlash's marginals on the pool)."""
    cfg = WeaverConfig(
        d_model=16, num_heads=2, intermediate_size=24, pool_size=VOCAB, block_size=depth + 1,
        vocab_size=VOCAB, target_hidden_size=HIDDEN, target_feature_size=FEATURES, dflash_hidden_size=DRAFT,
    )  # fmt: skip
    model = init_draft_weights(WeaverModel(cfg), seed)
    with torch.no_grad():
        model.out_proj.weight.mul_(residual)
    return model.to(dtype).eval()


def inputs(seed: int, depth: int, pool: int, same_rows: bool = False, dtype: torch.dtype = torch.float64):
    """Embedding, root, DFlash rows, pools [depth, pool] and the root's features; ``same_rows``: every
    depth has the same draft logits (with a zero residual: exact ties between paths)."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(VOCAB, HIDDEN, generator=gen, dtype=dtype)
    rows = torch.randn(depth, DRAFT, generator=gen, dtype=dtype)
    logits = 2 * torch.randn(1 if same_rows else depth, VOCAB, generator=gen, dtype=dtype).expand(depth, -1)
    feature = torch.randn(FEATURES, generator=gen, dtype=dtype)
    root = int(torch.randint(0, VOCAB, (1,), generator=gen))
    pool_logits, pool_ids = top_k_pool(logits.contiguous(), pool)
    return emb, root, rows, pool_logits, pool_ids, feature


def check_same(weaver: WeaverModel, budget: int, args: tuple, widths=(1, 2, 4, 8)) -> Tree:
    """Device growth == host growth at every width (the real nodes; the other slots padding, after the
    real ones at width 1); returns the width-1 host tree."""
    emb, root, *rest = args
    ref = None
    for width in widths:
        dev = grow_on_device(weaver, emb, budget, torch.tensor([root]), *rest, width=width)
        assert dev.tokens.shape == dev.parents.shape == (budget + 1,)
        host = grow(weaver, emb, budget, width, root, *rest)
        ref = ref or host
        tokens, parents, scores = dev.real()
        assert tokens == host.tree.tokens.tolist(), (width, dev.tokens, host.tree.tokens)
        assert parents == host.tree.parents.tolist(), width
        assert torch.allclose(
            torch.tensor(scores, dtype=torch.float64), torch.tensor(host.scores, dtype=torch.float64),
            rtol=0, atol=1e-12,
        )  # fmt: skip
        pad = dev.parents.eq(-1)
        pad[0] = False
        assert int(pad.sum()) == budget + 1 - host.tree.size
        assert dev.tokens[pad].eq(0).all() and dev.scores[pad].eq(-float("inf")).all()
        if width == 1:
            assert not pad[: host.tree.size].any()  # padding after the real nodes
    assert ref is not None
    return ref.tree


CASES = [  # (depth, pool, budget, residual, same_rows)
    (1, 1, 1, 1.0, False), (3, 5, 12, 1.0, False), (6, 7, 40, 1.0, False), (4, VOCAB, 25, 1.0, False),
    (2, 3, 30, 1.0, False),  # pools smaller than the budget: 3 + 9 = 12 nodes, then padding
    (15, 1, 6, 1.0, False),  # a chain shorter than the depth
    (3, 2, 9, 0.5, False),   # 2 + 4 + 8 = 14 > 9: the last depth is reached
    (5, 4, 30, 0.0, True),   # zero residual, the same pool at every depth: exact ties between paths
    (4, 6, 30, 1e-9, True),  # near ties (1e-9 apart)
    (3, 4, 20, 0.0, False),  # zero residual: DDTree on the pool
]  # fmt: skip


def test_wider_steps_take_fewer_forwards_and_never_a_better_tree():
    """Width w: one forward for the root, then one a step but the last (``ceil(budget / w) - 1``, each
    of w nodes) when the pools suffice; width 1 takes the ``budget`` best nodes, so no wider step's
    tree has a larger total score, and on random pools some wider tree is strictly worse."""
    worse = 0
    for seed in range(8):
        weaver, args = adapter(seed, 15, 1.0), inputs(seed + 300, 15, 9)
        emb, root, *rest = args
        best = grow(weaver, emb, 30, 1, root, *rest)
        assert best.batches == [1] * 30
        for width in (2, 4, 8):
            g = grow(weaver, emb, 30, width, root, *rest)
            assert g.tree.size == 31 and g.batches == [1] + [width] * (-(-30 // width) - 1), (
                width,
                g.batches,
            )
            assert sum(g.scores) <= sum(best.scores) + 1e-9
            worse += sum(g.scores) < sum(best.scores) - 1e-9
    assert worse > 0


def test_a_tree_is_at_most_one_depth_deeper_per_step():
    """A node's children enter only after the step that scores it, so a tree of steps of w nodes is at
    most ceil(budget / w) deep (budget 32 at width 4: depth 8, of the DFlash block's 15); with a
    near-chain pool (one dominant token per depth) each width reaches its bound, width 1 the block's
    depth."""
    depth, budget = 15, 32
    weaver = adapter(5, depth, 0.0)  # DFlash's marginals on the pool
    emb, root, rows, _, _, feature = inputs(5, depth, 9)
    logits = torch.full((depth, VOCAB), -8.0, dtype=torch.float64)
    logits[:, 0] = 8.0  # token 0 first at every depth: best-first runs down the chain
    pool_logits, pool_ids = top_k_pool(logits, 9)
    for width in (1, 2, 4, 8):
        tree = grow(weaver, emb, budget, width, root, rows, pool_logits, pool_ids, feature).tree
        assert int(tree.depth.max()) - 1 == min(depth, -(-budget // width)), width


def test_a_step_without_candidates_left_leaves_its_slots_empty():
    """Pools of 2 at depth 3 (2 + 4 + 8 = 14 reachable nodes), width 4: the step's pops find the table
    empty before its forward pushes new candidates, so the host tree has empty slots where the device
    pads inside the tree, and real nodes follow them (here all 14 reachable ones)."""
    weaver, args = adapter(0, 3, 1.0), inputs(5, 3, 2)
    emb, root, *rest = args
    dev = grow_on_device(weaver, emb, 20, torch.tensor([root]), *rest, width=4)
    host = grow(weaver, emb, 20, 4, root, *rest)
    check_same(weaver, 20, args, widths=(4,))
    parents = dev.parents.tolist()
    first_pad = next(i for i in range(1, 21) if parents[i] == -1)
    assert any(p >= 0 for p in parents[first_pad:])  # a real node after a padding slot
    assert host.tree.size == 15  # every reachable node, the empty slots besides


@pytest.mark.parametrize("depth,pool,budget,residual,same_rows", CASES)
def test_device_growth_is_the_host_tree(depth, pool, budget, residual, same_rows):
    for seed in range(6):
        weaver = adapter(seed, depth, residual)
        tree = check_same(weaver, budget, inputs(seed + 100, depth, pool, same_rows))
        capacity = sum(pool**d for d in range(1, depth + 1))
        assert tree.size == min(budget, capacity) + 1


def test_exact_ties_pop_in_push_order():
    """Zero residual and one pool for every depth: the paths (rank a, rank b) and (rank b, rank a) tie
    exactly; the tree is still the heap's (push order decides), not merely some best-first tree."""
    weaver = adapter(0, 3, 0.0)
    args = inputs(7, 3, 3, same_rows=True)
    check_same(weaver, 13, args, widths=(1, 3))
    scores = grow(weaver, args[0], 13, 1, *args[1:]).scores
    assert len(set(scores)) < len(scores)  # there were ties


def test_many_random_cases():
    gen = torch.Generator().manual_seed(0)
    for case in range(200):
        depth, pool, budget = (
            int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 7), (1, 9), (1, 48))
        )
        residual = [1.0, 0.0, 1e-6, 3.0][case % 4]
        weaver = adapter(case, depth, residual)
        check_same(weaver, budget, inputs(case, depth, pool, same_rows=case % 3 == 0), widths=(1, 4))


def test_device_growth_is_capture_safe_and_static():
    """No host read or data-dependent shape, and the same ops on the same shapes for other data
    (another pool size of exhausted pools included)."""
    for width in (1, 4):
        traces = []
        for seed, pool in ((0, 5), (1, 5), (2, 5)):
            weaver, args = adapter(seed, 4, 1.0), inputs(seed, 4, pool, same_rows=seed == 2)
            emb, root, *rest = args
            grow_it = functools.partial(
                grow_on_device, weaver, emb, 20, torch.tensor([root]), *rest, width=width
            )
            check = check_capture(grow_it)
            assert check.hazards == []
            traces.append(check.trace)
        assert traces[0] == traces[1] == traces[2]


def test_growth_step_takes_its_inputs_and_returns_marginals():
    """The eager step (pool top-K of the logits, marginals, growth) on static input buffers."""
    weaver = adapter(3, 5, 1.0)
    emb, root, rows, _, _, feature = inputs(3, 5, 4)
    step = GrowthStep(weaver, emb, 17, 4, graphs=False, width=3)
    for seed in (1, 2):
        logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        growth, probs = step(root + seed, rows, logits, feature)
        host = grow(weaver, emb, 17, 3, root + seed, rows, *top_k_pool(logits, 4), feature)
        assert growth.real()[:2] == (host.tree.tokens.tolist(), host.tree.parents.tolist())
        assert torch.allclose(probs, torch.softmax(logits, -1))


# ----- the weaver route through the graphed target -----


ROUTES = [
    {"name": "w12", "kind": "weaver", "drafter": "random", "weaver": "random", "budget": 12, "block_size": 6},
    {"name": "wk3", "kind": "weaver", "drafter": "random", "weaver": "random", "budget": 30, "pool": 3,
     "block_size": 3},  # 3 + 9 = 12 reachable nodes: padded trees
]  # fmt: skip


@pytest.mark.parametrize("spec", ROUTES, ids=[s["name"] for s in ROUTES])
def test_weaver_route_on_the_graphed_target_grows_on_the_device_and_equals_ar(model64, spec):
    target = GraphedTarget(model64, max_len=256, max_nodes=64, graphs=False)
    route = build_route(spec, model64.config.vocab_size, "greedy", 0.0, 0, target=target)
    assert route.drafter.device_growth and not route.drafter.step.graphs
    ar = build_route({"kind": "ar"}, model64.config.vocab_size, "greedy", 0.0, 0)
    for prompt in ([5, 17, 99, 3, 42], list(range(30, 101))):
        ref = generate(model64, prompt, ar, 16).output_ids
        res = generate(target, prompt, route, 16)
        assert res.output_ids == ref
        assert set(res.tree_sizes) == {spec["budget"] + 1}
        assert sum(res.accepted_lengths) == len(res.output_ids) - 1


def test_device_and_host_growth_propose_the_same_tree(model64):
    """One drafter, both growths on the same DFlash block: the same tree, marginals and greedy path."""
    spec = {"kind": "weaver", "drafter": "random", "weaver": "random", "budget": 20, "block_size": 5}
    drafter = build_route(spec, model64.config.vocab_size, "greedy", 0.0, 0, target=model64).drafter
    from repro.drafters.base import DraftContext

    prompt = [5, 17, 99, 3, 42, 7]
    proposals = []
    for device in (False, True):
        drafter.device_growth = device
        drafter.begin(prompt, None)
        _, ver = model64.prefill(prompt, capture=drafter.capture_layers)
        drafter.observe_prefill(ver)
        proposals.append(drafter.propose(DraftContext(prompt, [11], ver, list(range(ver.tree.size)))))
    host, dev = proposals
    assert isinstance(dev.tree, DeviceTree) and dev.tree.size == 21
    assert dev.tree.to_tree().tokens.tolist() == host.tree.tokens.tolist()
    assert dev.tree.to_tree().parents.tolist() == host.tree.parents.tolist()
    assert (
        torch.equal(dev.probs, host.probs) and dev.candidates == host.candidates and dev.depth == host.depth
    )


# ----- GPU -----


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_growth_on_cuda_equals_host_without_sync():
    """float32 on CUDA: the growth step in one CUDA graph gives the host growth's tree (up to a float32
    near tie, checked), and replays it without a host sync."""
    dev = torch.device("cuda")
    for seed, (depth, pool, budget) in enumerate([(6, 7, 40), (15, 16, 32), (3, 2, 30), (5, 512, 64)]):
        pool = min(pool, VOCAB)
        weaver = adapter(seed, depth, 1.0, torch.float32).to(dev)
        emb, root, rows, _, _, feature = (
            t.to(dev, torch.float32) if isinstance(t, torch.Tensor) else t for t in inputs(seed, depth, pool)
        )
        logits = torch.randn(depth, VOCAB, generator=torch.Generator().manual_seed(seed)).mul(2).to(dev)
        step = GrowthStep(weaver, emb, budget, pool, graphs=True, width=4)
        step(root, rows, logits, feature)  # captures
        torch.cuda.synchronize()
        with sync_debug():
            growth, probs = step(root, rows, logits, feature)
            grown = DeviceGrowth(growth.tokens.clone(), growth.parents.clone(), growth.scores.clone())
        host = grow(weaver, emb, budget, 4, root, rows, *top_k_pool(logits, pool), feature)
        tokens, parents, scores = grown.real()
        n = host.tree.size
        same = tokens == host.tree.tokens.tolist() and parents == host.tree.parents.tolist()
        if not same:  # float32 forwards of other shapes may swap two candidates closer than float32 noise
            first = next(
                i
                for i in range(min(n, len(tokens)))
                if (tokens[i], parents[i]) != (int(host.tree.tokens[i]), int(host.tree.parents[i]))
            )
            assert abs(scores[first] - host.scores[first]) < 1e-4, (seed, first)
        else:
            assert torch.allclose(
                torch.tensor(scores, dtype=torch.float64),
                torch.tensor(host.scores, dtype=torch.float64),
                atol=1e-4,
            )
        assert torch.allclose(probs, torch.softmax(logits, -1))


def test_a_sibling_and_a_child_pushed_together_tie_in_push_order():
    """log q of the best child rounds to 0 (a peaked pool) and ranks 1..3 tie: the parent's next rank
    and the new node's first child, pushed in the same iteration, tie exactly; the sibling (pushed
    first) pops first."""
    weaver = adapter(0, 3, 0.0)
    emb, root, rows, _, _, feature = inputs(1, 3, 4)
    logits = torch.full((3, VOCAB), -50.0, dtype=torch.float64)
    logits[:, :4] = torch.tensor([100.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    args = (emb, root, rows, *top_k_pool(logits, 4), feature)
    assert float(torch.log_softmax(args[3][0], -1)[0]) == 0.0
    tree = check_same(weaver, 9, args, widths=(1, 2))
    assert tree.parents.tolist() == [-1, 0, 1, 2, 0, 1, 2, 0, 4, 1]  # node 7: the sibling, pushed first


@torch.no_grad()
def _scratch_q(weaver: WeaverModel, args: tuple, tree: Tree, node: int) -> torch.Tensor:
    """Weaver's q at ``node`` recomputed from scratch: one causal forward over the path root..node,
    no cache, no batching, no tree mask."""
    emb, _, rows, pool_logits, pool_ids, feature = args
    path = tree.path_to(node)  # node 0 (the root) first
    tokens = tree.tokens[path]
    depth = torch.arange(len(path))
    x = weaver.hidden_proj(rows[depth]) + weaver.feature_proj(feature) + weaver.token_proj(emb[tokens])
    mask = torch.ones(len(path), len(path), dtype=torch.bool).tril()
    u, _ = weaver(x[None], mask[None], None)
    d = len(path) - 1
    log_q = weaver.pool_log_probs(u[0, -1], pool_logits[d], emb[pool_ids[d]])
    return log_q.double().exp()


@pytest.mark.parametrize("depth,pool,budget", [(3, 5, 12), (4, 6, 30), (2, 3, 30), (6, 7, 40)])
def test_host_tree_carries_each_inner_nodes_q_over_its_pool(depth, pool, budget):
    """``grow``'s tree records, per inner node, q over the pool of the depth below it (float64), the
    distribution its children were ranked by (they are its top tokens, in order); leaves record none.
    At every width (batched forwards over a cache) equal to q recomputed from scratch."""
    for seed, width in itertools.product(range(3), (1, 4)):
        weaver, args = adapter(seed, depth, 1.0), inputs(seed + 50, depth, pool)
        emb, root, *rest = args
        tree = grow(weaver, emb, budget, width, root, *rest).tree
        assert tree.draw == "given" and tree.proposals is not None
        level = [d - 1 for d in tree.depth.tolist()]  # the root is level 0
        for node in range(tree.size):
            kids = tree.children_of(node)
            if not kids:
                assert tree.proposals[node] is None
                continue
            ids, q = tree.proposals[node]
            assert q.dtype == torch.float64 and torch.equal(ids, rest[2][level[node]])
            assert abs(q.sum().item() - 1.0) < 1e-12
            assert (q - _scratch_q(weaver, args, tree, node)).abs().max().item() < 1e-12
            top = ids[torch.argsort(q, descending=True, stable=True)[: len(kids)]]
            assert top.tolist() == tree.tokens[kids].tolist()
