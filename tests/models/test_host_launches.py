"""HostLaunches: the ops a decode step launches from the host between its graphs (repro.models.graphs).

On CUDA every such op is a launch of its own (host time, a gap between graphs); on the CPU the graphed
calls' stand-ins (EagerCall) mark what a graph would replay, so the count is the same as on the GPU."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.models.graphed import GraphedTarget
from repro.models.graphs import EagerCall, GraphedCall, HostLaunches, graph_call
from repro.models.target import open_target


def test_host_launches_count_only_ops_outside_graphed_calls():
    x = torch.ones(4)
    inner = EagerCall(lambda: (x * 2).sum())
    outer = EagerCall(lambda: inner() + x.mean())
    with HostLaunches() as h:
        y = x + 1
        inner()
        outer()  # nested stand-ins: nothing inside counts
        z = y.exp()
    assert h.ops == Counter({"aten::add": 1, "aten::exp": 1}) and h.total == 2
    assert torch.equal(z, (x + 1).exp())
    with HostLaunches() as h:
        got = outer()
        outer.replay()
    assert h.total == 0 and float(got) == 9.0


def test_graph_call_stands_in_without_graphs():
    call = graph_call(lambda: torch.arange(3) * 2, torch.device("cpu"), graphs=False)
    assert isinstance(call, EagerCall) and torch.equal(call(), torch.tensor([0, 2, 4]))
    with pytest.raises(Exception, match="CUDA"):
        graph_call(lambda: None, torch.device("cpu"), graphs=True)
    assert GraphedCall is not EagerCall


# host launches a decode step, measured on the tiny family (float32, CPU): AR 0.1 (its groups' reads),
# DDTree 3 (the tree's and the result's copies), chain DFlash 3 (its tokens' concatenation, their copy, the
# result's: 7 before its parents were made once a length, 4 before the slot kept them), DFlash-TfM 8,
# SpecLA 8 (copies, the drafter's inputs)
BUDGET = {"ar": 0.5, "ddtree": 3.5, "dflash_chain": 3.5, "dflash_tfm": 9.0, "specla": 9.0}


def test_decode_steps_launch_few_ops_from_the_host():
    """Every route's decode loop on the graphed target leaves at most a handful of launches to the host
    between its graphs (the difference of a 12- and a 36-token generation: prefill and first-step setup
    cancel)."""
    model, tok = open_target("default", dtype="float32", device="cpu")
    target = GraphedTarget(model, max_nodes=64, graphs=False)
    prompt = tok.chat_prompt([{"role": "user", "content": "Write a short poem about the sea."}])
    specs = {"ar": {"kind": "ar"}, "ddtree": {"kind": "ddtree", "budget": 32},
             "dflash_chain": {"kind": "dflash_chain"},
             "dflash_tfm": {"kind": "dflash_tfm", "budget": 32},
             "specla": {"kind": "specla", "budget": 32}}  # fmt: skip
    for name, spec in specs.items():
        route = build_route(
            spec, model.config.vocab_size, "greedy", 0.0, 42, target=target, family="tiny-qwen35"
        )
        generate(target, prompt, route, 36)  # buffers and first uses
        runs = []
        for n in (12, 36):
            with HostLaunches() as h:
                r = generate(target, prompt, route, n)
            runs.append((r.steps, h.total))
        (s1, l1), (s2, l2) = runs
        assert s2 > s1, name
        per_step = (l2 - l1) / (s2 - s1)
        assert 0 <= per_step <= BUDGET[name], (name, per_step)


def test_a_slot_copies_constant_parents_once_and_again_after_other_trees():
    """``DeviceTree.constant_parents``: a deriving slot that holds those very parents copies only the tokens;
    a host tree written in between, or parents that are not constant (refreshed in place), are copied."""
    from repro.models.graphs import count_ops
    from repro.models.static import TreeSlot
    from repro.tree import DeviceTree, Tree

    model, _ = open_target("default", dtype="float32", device="cpu")
    slot = TreeSlot(GraphedTarget(model, graphs=False).decoder, 5, derive=True)
    chain = DeviceTree(torch.tensor([7, 8, 9, 10, 11]), torch.arange(-1, 4), constant_parents=True)
    assert count_ops(lambda: slot.set_device_tree(chain)) == 2  # tokens and parents
    assert count_ops(lambda: slot.set_device_tree(chain)) == 1  # tokens only
    assert slot.parents.tolist() == [-1, 0, 1, 2, 3] and slot.tokens.tolist() == [7, 8, 9, 10, 11]
    slot.set_tree(Tree(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([-1, 0, 0, 1, 1])))
    assert slot.parents.tolist() == [-1, 0, 0, 1, 1]
    assert count_ops(lambda: slot.set_device_tree(chain)) == 2  # the host tree overwrote them
    assert slot.parents.tolist() == [-1, 0, 1, 2, 3]
    parents = torch.tensor([-1, 0, 0, 1, 1])
    bushy = DeviceTree(torch.tensor([1, 2, 3, 4, 5]), parents)  # a graph output: refreshed in place
    slot.set_device_tree(bushy)
    parents.copy_(torch.tensor([-1, 0, 1, 1, 0]))
    assert count_ops(lambda: slot.set_device_tree(bushy)) == 2
    assert slot.parents.tolist() == [-1, 0, 1, 1, 0]
