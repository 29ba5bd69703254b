"""Device tree builders (repro.decoding.tree_builders ``build_device``) against the host builders.

``best_first_device`` must give BestFirst._top's tree node for node (tokens, parents, order) in
float64 over random marginals, near-ties, exact ties, probability-one rows and vocabularies smaller
than the budget; Chain and DrafterTree pass device proposals through without a host read.
"""

from __future__ import annotations

import pytest
import torch

from repro.decoding.tree_builders import BestFirst, Chain, DrafterTree, SingleNode, best_first_size
from repro.drafters.base import Proposal
from repro.tree import DeviceTree, Tree

F64 = torch.float64


def _same(host: Tree, dev: Tree | DeviceTree) -> None:
    assert isinstance(dev, DeviceTree)
    assert dev.size == host.size
    assert dev.tokens.tolist() == host.tokens.tolist()
    assert dev.parents.tolist() == host.parents.tolist()


def _check(probs: torch.Tensor, budget: int, root: int = 7) -> Tree:
    prop = Proposal([[0]] * probs.shape[0], probs)
    host = BestFirst(budget).build(root, prop)
    _same(host, BestFirst(budget).build_device(root, prop))
    assert host.size == best_first_size(probs.shape[0], probs.shape[1], budget)
    return host


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("budget", [1, 3, 16, 33, 100])
def test_device_best_first_equals_host_on_random_marginals(seed, budget):
    gen = torch.Generator().manual_seed(seed)
    depth, vocab = 1 + seed % 6, [5, 40, 300][seed % 3]
    temp = [0.5, 2.0, 6.0][seed % 3]
    probs = torch.softmax(temp * torch.randn(depth, vocab, generator=gen, dtype=F64), dim=-1)
    _check(probs, budget)


@pytest.mark.parametrize("budget", [4, 10, 50, 200])
def test_device_best_first_equals_host_on_ties_and_near_ties(budget):
    """Exact ties (equal probabilities within and across depths, sums that tie across depths),
    near-ties (1 ulp apart), rows with a probability-one token, and vocab < budget."""
    gen = torch.Generator().manual_seed(budget)
    rows = [
        torch.tensor([0.5, 0.25, 0.25, 0.0, 0.0, 0.0]),  # exact ties, zeros (tiny: log is finite)
        torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0, 0.0]),  # .5 * .5 == .25: ties across depths
        torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),  # a child ties its parent
        torch.tensor([0.25] * 4 + [0.0, 0.0]),
    ]
    ties = torch.stack(rows).to(F64)
    _check(ties, budget)
    near = torch.softmax(torch.randn(4, 6, generator=gen, dtype=F64), dim=-1)
    near[:, 1] = torch.nextafter(near[:, 0], torch.zeros(4, dtype=F64))  # 1 ulp below the first
    near[:, 2] = near[:, 0]
    _check(near, budget)
    _check(torch.full((5, 3), 1 / 3, dtype=F64), budget)  # everything ties
    _check(torch.tensor([[0.5, 0.5]], dtype=F64), budget)  # top-k runs out: 2 draft nodes at most


def test_tie_order_is_depth_then_frontier_then_rank():
    """depth 1: a .5, b .25, c .25; depth 2: x .5 ... ax (.25) ties b and c: shallower first, then
    siblings by rank; ay ties bx (.125): depth 2, a's children before b's."""
    probs = torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]], dtype=F64)
    tree = _check(probs, 6, root=9)
    assert tree.tokens.tolist() == [9, 0, 1, 2, 0, 1, 2]
    assert tree.parents.tolist() == [-1, 0, 0, 0, 1, 1, 1]


def test_best_first_size_counts_paths_up_to_the_budget():
    assert best_first_size(3, 2, 100) == 1 + 2 + 4 + 8
    assert best_first_size(3, 50, 10) == 11
    assert best_first_size(1, 50, 100) == 51
    assert best_first_size(0, 50, 10) == 1


def test_chain_and_drafter_tree_device_paths():
    top = torch.tensor([[4, 1], [5, 2], [6, 3]])
    dev = Chain().build_device(9, Proposal(top_ids=top))
    assert isinstance(dev, DeviceTree)
    _same(Chain().build(9, Proposal(top.tolist())), dev)
    bonus = torch.tensor([9], dtype=torch.int32)  # a pipelined step's root: the last step's bonus
    after = Chain().build_device(bonus, Proposal(top_ids=top))
    _same(Chain().build(9, Proposal(top.tolist())), after)
    assert after.tokens.dtype == torch.long and after.parents is dev.parents  # one parents tensor a length
    host = Chain().build_device(9, Proposal([[4], [5]]))  # host candidates: a host tree
    assert isinstance(host, Tree) and host.tokens.tolist() == [9, 4, 5]
    tree = DeviceTree(torch.tensor([9, 4, 5]), torch.tensor([-1, 0, 0]))
    assert DrafterTree().build_device(9, Proposal([[4]], tree=tree)) is tree
    assert DrafterTree().build(9, Proposal([[4]], tree=tree)).tokens.tolist() == [9, 4, 5]
    assert SingleNode().build_device(9, None).tokens.tolist() == [9]
    assert BestFirst(4).build_device(9, None).tokens.tolist() == [9]


def test_graphed_best_first_reuses_its_static_inputs(monkeypatch):
    """The CUDA-graph wrapper (a stand-in graph that calls the function on CPU) reads the marginals and
    the root from its static inputs on every call: each call gives that call's tree."""
    import repro.models.graphs as graphs
    from repro.decoding.tree_builders import GraphedBestFirst

    monkeypatch.setattr(graphs, "GraphedCall", lambda fn, device: fn)
    gen = torch.Generator().manual_seed(7)
    rows = [torch.softmax(torch.randn(5, 40, generator=gen, dtype=torch.float64), -1) for _ in range(3)]
    graphed = GraphedBestFirst(rows[0], 12)
    for root, probs in zip((3, 9, 1), rows):
        tree = graphed(root, probs).to_tree()
        host = BestFirst(12).build(root, Proposal(probs=probs, top_ids=probs.topk(1, -1).indices))
        assert tree.tokens.tolist() == host.tokens.tolist()
        assert tree.parents.tolist() == host.parents.tolist()


def test_graphed_best_first_reads_device_roots_where_they_lie(monkeypatch):
    """With ALIASED_ROOTS, a device root (a pipelined step's bonus) gets a graph that reads it in place: a
    root buffer changed in place between calls gives that call's tree, and only ALIASED_ROOTS buffers get
    graphs; other roots (and non-int64 ones) are copied into the static root as before."""
    import repro.decoding.tree_builders as tb
    import repro.models.graphs as graphs

    made = []
    monkeypatch.setattr(graphs, "GraphedCall", lambda fn, device: made.append(fn) or fn)
    monkeypatch.setattr(tb, "ALIASED_ROOTS", 4)  # off by default (results/2026-12-04-h200-derive-rows)
    gen = torch.Generator().manual_seed(8)
    probs = torch.softmax(torch.randn(5, 40, generator=gen, dtype=torch.float64), -1)
    graphed = tb.GraphedBestFirst(probs, 12)
    assert len(made) == 1  # the static-root graph
    result = torch.zeros(6, dtype=torch.long)  # a slot's result: the bonus at [1]
    roots = list(range(3, 3 + tb.ALIASED_ROOTS + 2))
    for step, root in enumerate((7, 11, 2)):
        result[1] = root
        tree = graphed(result[1:2], probs).to_tree()
        host = BestFirst(12).build(root, Proposal(probs=probs, top_ids=probs.topk(1, -1).indices))
        assert tree.tokens.tolist() == host.tokens.tolist() and tree.parents.tolist() == host.parents.tolist()
        assert len(made) == 2, step  # one graph for that buffer, made once
    buffers = [torch.full((1,), r, dtype=torch.long) for r in roots]
    for buf in buffers:
        assert int(graphed(buf, probs).tokens[0]) == int(buf[0])
    assert len(made) == 1 + tb.ALIASED_ROOTS  # the buffers past the limit took the copying graph
    assert int(graphed(torch.full((1,), 5, dtype=torch.int32), probs).tokens[0]) == 5  # copied, not aliased
    assert len(made) == 1 + tb.ALIASED_ROOTS
