"""Step chains (repro.models.step_graph): a pipelined step's graphs, copies and events launched as one graph.

On the CPU the chain launches nothing later (graphs are stand-ins that run as they are called), so what the
CPU can check is the condition that makes the CUDA chain correct: no op reaches the device eagerly while
the chain holds (on CUDA: would hold) work. The GPU tests check the graph itself against the work it joins.
"""

from __future__ import annotations

import pytest
import torch

from repro.decoding.engine import generate, pipelined
from repro.decoding.routes import build_route
from repro.models import graphs, step_graph
from repro.models.graphed import GraphedTarget
from repro.models.graphs import EagerCall, copy_into, flush_chain, record_event
from repro.models.step_graph import ChainBreaks, step_chain
from repro.models.target import open_target

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_chain_breaks_count_eager_ops_only_while_the_chain_holds_work():
    x = torch.ones(4)
    out = torch.zeros(4)
    with ChainBreaks() as b:
        y = x + 1  # no chain open
        with step_chain(torch.device("cpu")) as chain:
            assert chain is not None and not chain.pending
            z = x * 3  # the chain holds nothing yet: in order
            EagerCall(lambda: out.copy_(x * 2))()  # a graph's work: held on CUDA
            assert chain.pending
            w = x.exp()  # would run before it on CUDA: a break
            flush_chain()
            assert not chain.pending
            v = x - 1  # after the flush: in order
            copy_into(out, y)  # joins the chain (a stand-in copy here)
            assert chain.pending
        assert not chain.pending  # closed: flushed
        u = x.sum()
    assert b.ops == {"aten::exp": 1}
    assert out.tolist() == [2.0] * 4 and float(u) == 4.0
    assert z.tolist() == [3.0] * 4 and w.tolist() == x.exp().tolist() and v.tolist() == [0.0] * 4
    assert not graphs._chains


def test_chain_off_opens_nothing():
    step_graph_chain = step_graph.CHAIN
    try:
        step_graph.CHAIN = False
        with ChainBreaks() as b, step_chain(torch.device("cpu")) as chain:
            EagerCall(lambda: torch.ones(2) * 2)()
            torch.ones(2).exp()
        assert chain is None and not graphs._chains and b.ops == {}
    finally:
        step_graph.CHAIN = step_graph_chain


def test_copy_into_and_record_event_outside_a_chain_run_at_once():
    dst, src = torch.zeros(3), torch.arange(3.0)
    copy_into(dst, src)
    assert dst.tolist() == [0.0, 1.0, 2.0]

    class Recorded:
        def __init__(self) -> None:
            self.streams: list = []

        def record(self, stream: object) -> None:
            self.streams.append(stream)

    event = Recorded()
    record_event(event, "s")
    with step_chain(torch.device("cpu")):
        record_event(event, "t")  # off CUDA the chain records at once
    assert event.streams == ["s", "t"]


@pytest.mark.parametrize("fuse", [False, True])
def test_pipelined_routes_issue_no_eager_op_into_an_open_chain(monkeypatch, fuse):
    """Every pipelined route's decode loop (graphed target, CPU stand-ins) keeps the chain's condition: all
    its device work between a step's first and last mark joins the chain, or runs after a flush. The
    tokens are those of the loop without chains."""
    from repro.models import graphed

    monkeypatch.setattr(graphed, "FUSE_ACCEPT", fuse)
    model, tok = open_target("default", dtype="float32", device="cpu")
    target = GraphedTarget(model, max_nodes=64, graphs=False)
    prompt = tok.chat_prompt([{"role": "user", "content": "Write a short poem about the sea."}])
    specs = {
        "ddtree": {"kind": "ddtree", "budget": 32},
        "dflash_chain": {"kind": "dflash_chain"},
        "dflash_tfm": {"kind": "dflash_tfm", "budget": 32},
        "specla": {"kind": "specla", "budget": 32},
    }
    for name, spec in specs.items():
        route = build_route(
            spec, model.config.vocab_size, "greedy", 0.0, 42, target=target, family="tiny-qwen35"
        )
        assert pipelined(target, route), name
        monkeypatch.setattr(step_graph, "CHAIN", False)
        reference = generate(target, prompt, route, 24)
        monkeypatch.setattr(step_graph, "CHAIN", True)
        with ChainBreaks() as b:
            got = generate(target, prompt, route, 24)  # first uses included: captures flush the chain
        assert b.ops == {}, name
        assert got.output_ids == reference.output_ids and got.steps > 2, name


def _graphed(fn):  # noqa: ANN001, ANN202
    from repro.models.graphs import GraphedCall

    return GraphedCall(fn, torch.device("cuda"))


@pytest.mark.gpu
@cuda
def test_gpu_chain_launches_its_graphs_copies_and_events_as_one_graph_in_order():
    x = torch.arange(8.0, device="cuda")
    y, z, w = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    double = _graphed(lambda: y.copy_(x * 2))
    plus = _graphed(lambda: w.copy_(z + 1))
    chain = step_graph.chain_of(torch.device("cuda"))
    stream = torch.cuda.current_stream()
    for trial in range(3):
        x.copy_(torch.arange(8.0, device="cuda") + trial)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        launches = chain.launches
        with step_chain(torch.device("cuda")):
            record_event(events[0], stream)
            double()
            record_event(events[1], stream)
            copy_into(z, y)  # z reads y after `double` wrote it: in order
            plus()
            record_event(events[2], stream)
            if trial == 0:  # nothing launched yet (this read runs before the chain)
                assert w.abs().sum().item() == 0
        assert chain.launches == launches + 1
        torch.cuda.synchronize()
        assert w.tolist() == [(i + trial) * 2 + 1 for i in range(8)]
        assert events[0].elapsed_time(events[2]) > 0  # the nodes recorded them around the work
    assert sum(1 for key in chain._made if len(key) == 6) == 1  # one graph for the repeated sequence


@pytest.mark.gpu
@cuda
def test_gpu_pipelined_steps_launch_one_graph_each_and_equal_the_unchained_loop():
    from repro.models.graphed import GraphedTarget as Graphed

    model, tok = open_target("default", dtype="float32", device="cuda")
    target = Graphed(model, max_nodes=64)
    prompt = tok.chat_prompt([{"role": "user", "content": "Write a short poem about the sea."}])
    chain = step_graph.chain_of(target.device)
    for spec in (
        {"kind": "ddtree", "budget": 32},
        {"kind": "dflash_chain"},
        {"kind": "dflash_tfm", "budget": 32},
    ):
        route = build_route(
            spec, model.config.vocab_size, "greedy", 0.0, 42, target=target, family="tiny-qwen35"
        )
        step_graph.CHAIN = False
        try:
            reference = generate(target, prompt, route, 48)
        finally:
            step_graph.CHAIN = True
        generate(target, prompt, route, 48)  # captures
        launches = chain.launches
        got = generate(target, prompt, route, 48)
        assert got.output_ids == reference.output_ids, spec
        steps = got.launched_steps or got.steps
        assert chain.launches - launches <= steps + 2, (spec, chain.launches - launches, steps)
