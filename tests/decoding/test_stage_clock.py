"""StageClock (repro.decoding.engine): device stage times from events, summed once at the end, events reused
by the next clock; the graphs' busy time (every replay's own events, attributed to the stage whose mark came
last).

CUDA events are replaced by a fake with a device timeline, so the bookkeeping is checked on the CPU:
per stage the summed elapsed times, no event read while the steps run, and no event made by a clock
that follows one of as many steps. The engine's wiring is checked on the CPU graphed
target (no graphs) with its graph calls routed through ``replay_graph`` on fake graphs that take a
known device time; the GPU test checks busy against the stage marks' device time on real graphs.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import SMALL_VOCAB, small_hybrid, small_ids

import repro.decoding.engine as engine
import repro.models.graphed as graphed
import repro.models.graphs as graphs
from repro.decoding.engine import STAGES, StageClock, generate
from repro.decoding.routes import build_route
from repro.models.graphs import GraphedCall, busy_recorder, replay_graph

FAKE_STREAM = object()  # the stream current when the clock was made


class FakeEvent:
    made = 0
    reads = 0  # query / synchronize / elapsed_time calls
    now = 0.0  # the device timeline, ms
    done_until = 0.0  # events recorded at or before this time have completed

    def __init__(self, enable_timing: bool = False) -> None:
        FakeEvent.made += 1
        self.at: float | None = None

    def record(self, stream: object = None) -> None:
        assert stream is FAKE_STREAM, "an event recorded on another stream than the generation's"
        self.at = FakeEvent.now

    def query(self) -> bool:
        FakeEvent.reads += 1
        return self._done()

    def _done(self) -> bool:
        return self.at is not None and self.at <= FakeEvent.done_until

    def synchronize(self) -> None:
        FakeEvent.reads += 1
        FakeEvent.done_until = max(FakeEvent.done_until, FakeEvent.now)

    def elapsed_time(self, other: FakeEvent) -> float:
        FakeEvent.reads += 1
        assert self._done() and other._done(), "elapsed_time of an event not yet done"
        return other.at - self.at


@pytest.fixture
def fake_events(monkeypatch):
    FakeEvent.made, FakeEvent.reads, FakeEvent.now, FakeEvent.done_until = 0, 0, 0.0, 0.0
    monkeypatch.setattr(engine, "_EVENTS", {})  # no fake event left in the pool for later tests
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FAKE_STREAM)
    return FakeEvent


def test_device_times_are_summed_per_stage_and_events_reused(fake_events):
    durations = {"draft": 1.0, "tree": 0.5, "verify": 3.0, "commit": 2.0}  # ms per step
    steps = 50
    for _ in range(2):  # two generations: the second clock reuses the first one's events
        clock = StageClock(torch.device("cuda"), sync=False)
        for step in range(steps):
            clock.mark()
            for name in STAGES:
                fake_events.now += durations[name]
                clock.mark()
            fake_events.now += 0.25  # host bookkeeping between steps
            if step % 3 != 2:
                fake_events.done_until = fake_events.now  # the step's read waited for the device
        assert fake_events.reads == 0  # the steps ran without reading an event
        assert fake_events.made == steps * (len(STAGES) + 1)  # the second clock took the first one's
        got = clock.device_s()
        for name in STAGES:
            assert got[name] == pytest.approx(steps * durations[name] / 1000.0)
        assert set(clock.wall) == set(STAGES)
        fake_events.reads = 0


def test_without_events_device_times_are_the_clocks(monkeypatch):
    clock = StageClock(torch.device("cpu"), sync=False)
    ticks = iter(range(100))
    monkeypatch.setattr(engine.time, "perf_counter", lambda: float(next(ticks)))
    for _ in range(2 * (len(STAGES) + 1)):
        clock.mark()
    assert clock.device_s() == clock.wall == dict.fromkeys(STAGES, 2.0)


class TimedGraph:
    """A graph whose replay takes ``ms`` of fake device time (and runs ``fn`` when given)."""

    def __init__(self, ms: float, fn=None) -> None:  # noqa: ANN001 - any callable
        self.ms, self.fn, self.output = ms, fn, None

    def replay(self) -> None:
        if self.fn is not None:
            self.output = self.fn()
        FakeEvent.now += self.ms


def timed_call(ms: float) -> GraphedCall:
    call = object.__new__(GraphedCall)  # no capture: GraphedCall's __init__ needs CUDA
    call.graph, call.output = TimedGraph(ms), None
    return call


def test_busy_times_go_to_the_stage_whose_mark_came_last(fake_events):
    graphs = {"draft": [0.4, 0.1], "tree": [0.2], "verify": [1.0], "commit": [0.5]}  # replays per stage, ms
    calls = {name: [timed_call(ms) for ms in times] for name, times in graphs.items()}
    late = timed_call(0.3)  # after the step's last mark: its last stage (commit)
    steps = 40
    for _ in range(2):
        clock = StageClock(torch.device("cuda"), sync=False)
        with busy_recorder(clock):
            for step in range(steps):
                clock.mark()
                for name in STAGES:
                    fake_events.now += 0.05  # the host's launch gap: device time, not busy time
                    for call in calls[name]:
                        call()
                    clock.mark()
                late.replay()
                fake_events.now += 0.25
                if step % 4 != 3:
                    fake_events.done_until = fake_events.now
        assert clock.replays == steps * (sum(map(len, graphs.values())) + 1)
        assert fake_events.made == steps * (len(STAGES) + 1) + 2 * clock.replays  # the second clock: reused
        busy, device = clock.busy_s(), clock.device_s()
        for name in STAGES:
            want = sum(graphs[name]) + (0.3 if name == "commit" else 0.0)
            assert busy[name] == pytest.approx(steps * want / 1000.0), name
        for name in ("draft", "tree", "verify"):
            assert busy[name] < device[name] == pytest.approx(steps * (sum(graphs[name]) + 0.05) / 1000.0)


def test_a_sampling_clock_records_every_nth_step_and_scales_to_all_steps(fake_events):
    durations = {"draft": 1.0, "tree": 0.5, "verify": 3.0, "commit": 2.0}  # ms per step
    replay = timed_call(0.75)  # in each step's verify stage
    steps, every = 10, 4  # steps 0, 4 and 8 are recorded
    clock = StageClock(torch.device("cuda"), sync=False, every=every)
    with busy_recorder(clock):
        for step in range(steps):
            clock.mark()
            assert clock.recording == (step % every == 0)
            for name in STAGES:
                fake_events.now += durations[name]
                if name == "verify":
                    replay()
                clock.mark()
            fake_events.now += 0.25 * step  # gaps between steps: not in any stage
    assert (clock.steps, clock.sampled, clock.replays) == (10, 3, 3)
    assert fake_events.made == 3 * (len(STAGES) + 1) + 2 * 3
    device, busy = clock.device_s(), clock.busy_s()
    for name in STAGES:
        extra = 0.75 if name == "verify" else 0.0  # the replay's fake time is inside the verify stage
        assert device[name] == pytest.approx(steps * (durations[name] + extra) / 1000.0), name
    assert busy == pytest.approx({n: (steps * 0.75 / 1000.0 if n == "verify" else 0.0) for n in STAGES})
    with pytest.raises(ValueError, match="every >= 1"):
        StageClock(torch.device("cuda"), sync=False, every=-1)


def test_busy_is_none_without_events_or_without_replays(fake_events):
    for device in ("cpu", "cuda"):
        clock = StageClock(torch.device(device), sync=False)
        with busy_recorder(clock):
            for _ in range(len(STAGES) + 1):
                clock.mark()
        assert clock.busy_s() is None, device


def _engine_with_timed_graphs(monkeypatch: pytest.MonkeyPatch, ms: dict[str, float]) -> Counter:
    """The CPU graphed target's graph calls through ``replay_graph`` on fake graphs of ``ms`` (by the
    call's function name) and StageClock on fake events; returns the replays counted by name."""
    counted: Counter = Counter()

    def replayed(self) -> object:  # noqa: ANN001 - EagerCall.__call__
        name = self.fn.__qualname__.split(".")[-1]
        graph = TimedGraph(ms.get(name, 0.0), self.fn)
        replay_graph(graph)
        counted[name] += 1
        return graph.output

    class EventClock(StageClock):
        def __init__(self, device: torch.device, sync: bool) -> None:
            super().__init__(device, sync)
            self.events, self.stream = True, FAKE_STREAM  # fake events on the CPU

    monkeypatch.setattr(graphs.EagerCall, "__call__", replayed)
    monkeypatch.setattr(engine, "StageClock", EventClock)
    return counted


def test_generate_gives_each_stage_the_busy_time_of_its_graphs(fake_events, monkeypatch):
    ms = {"ar_steps": 1.0, "<lambda>": 2.0, "step": 0.5}  # AR's decode group, verify, accept+commit
    counted = _engine_with_timed_graphs(monkeypatch, ms)
    target = graphed.GraphedTarget(small_hybrid(3), max_len=64, max_nodes=32)
    prompt = small_ids(8, 1)
    ar = build_route({"kind": "ar"}, SMALL_VOCAB, "greedy", 0.0, 0)
    reference = generate(target, prompt, ar, 20).output_ids
    counted.clear()
    got = generate(target, prompt, ar, 20)
    assert got.output_ids == reference and got.busy_stage_s is not None
    group = graphed.AR_GROUP
    replays = 19 // group + 19 % group  # groups of AR_GROUP decode steps, single steps for the tail
    assert counted["ar_steps"] == replays and got.steps == 19
    want = {"draft": 0.0, "tree": 0.0, "verify": replays * 1e-3, "commit": 0.0}
    assert got.busy_stage_s == pytest.approx(want)
    chain = build_route({"kind": "synthetic_chain", "k": 3, "p": 0.8}, SMALL_VOCAB, "greedy", 0.0, 0)
    counted.clear()
    got = generate(target, prompt, chain, 20, reference_ids=reference)
    assert got.output_ids == reference and counted["<lambda>"] == counted["step"] == got.steps > 1
    want = {"draft": 0.0, "tree": 0.0, "verify": got.steps * 2e-3, "commit": got.steps * 0.5e-3}
    assert got.busy_stage_s == pytest.approx(want)
    for name in STAGES:  # the marks' events see the same fake timeline: busy is all of it here
        assert got.busy_stage_s[name] == pytest.approx(got.device_stage_s[name])


def test_generate_without_graphs_has_no_busy_time():
    target = graphed.GraphedTarget(small_hybrid(3), max_len=64, max_nodes=32)
    ar = build_route({"kind": "ar"}, SMALL_VOCAB, "greedy", 0.0, 0)
    got = generate(target, small_ids(8, 1), ar, 8)
    assert got.busy_stage_s is None and got.device_stage_s is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_busy_time_of_the_graphs_is_within_the_stage_marks_device_time():
    from repro.data.suites import format_turn, load_suite
    from repro.decoding.routes import prepare_graphs
    from repro.models.target import open_target

    model, tok = open_target("default", dtype="bfloat16", device="cuda")
    model.set_gdn_backend("triton")
    target = graphed.GraphedTarget(model, max_nodes=64, graphs=True)
    vocab = model.config.vocab_size
    specs = [{"name": "ar", "kind": "ar"}, {"name": "ddtree-b32", "kind": "ddtree", "budget": 32}]
    routes = [build_route(s, vocab, "greedy", 0.0, 42, target=target, family="tiny-qwen35") for s in specs]
    prepare_graphs(target, routes)
    p = load_suite("gsm8k", 1, 42)[0]
    prompt = tok.chat_prompt([{"role": "user", "content": format_turn("gsm8k", p.turns[0])}])
    for route in routes:
        generate(target, prompt, route, 16)  # warm-up: first-use captures
        got = generate(target, prompt, route, 48)
        busy, device = got.busy_stage_s, got.device_stage_s
        assert busy is not None and device is not None, route.name
        assert busy["verify"] > 0 and sum(busy.values()) > 0, (route.name, busy)
        if route.drafter is not None:  # pipelined: the DFlash block's graph, the best-first tree's, then
            # verify + acceptance + commit as one graph (graphed.FUSE_ACCEPT): the commit stage replays none
            assert engine.pipelined(target, route) and graphed.FUSE_ACCEPT, route.name
            assert min(busy["draft"], busy["tree"]) > 0 and busy["commit"] == 0, (route.name, busy)
        for name in STAGES:  # the replays lie between the marks: busy <= device, up to event rounding
            assert busy[name] <= device[name] * 1.05 + 50e-6, (route.name, name, busy, device)
