"""busy_recorder (repro.models.graphs): every GraphedCall replay bracketed by the recorder's two events.

No CUDA here: a GraphedCall is made without a capture (its graph a fake that logs its replays) and the
recorder hands out fake events that log when they are recorded, so the order is checked exactly.
"""

from __future__ import annotations

import pytest

from repro.models.graphs import GraphedCall, busy_recorder


class FakeGraph:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def replay(self) -> None:
        self.log.append(("replay", self.name))


class LogEvent:
    def __init__(self, log: list, n: int) -> None:
        self.log, self.n = log, n

    def record(self, stream: str) -> None:
        self.log.append(("record", self.n, stream))


class Recorder:
    stream = "s"
    recording = True

    def __init__(self, log: list) -> None:
        self.log, self.made = log, 0

    def event(self) -> LogEvent:
        self.made += 1
        return LogEvent(self.log, self.made)

    def replayed(self, start: LogEvent, end: LogEvent) -> None:
        self.log.append(("pair", start.n, end.n))


def graphed_call(log: list, name: str) -> GraphedCall:
    """A GraphedCall on a fake graph (no capture: ``__init__`` needs CUDA)."""
    call = object.__new__(GraphedCall)
    call.graph, call.output = FakeGraph(log, name), f"out-{name}"
    return call


def test_each_replay_hands_the_recorder_one_pair_recorded_around_it():
    log: list = []
    a, b = graphed_call(log, "a"), graphed_call(log, "b")
    with busy_recorder(Recorder(log)) as rec:
        assert a() == "out-a"
        b.replay()
    assert rec.made == 4
    assert log == [
        ("record", 1, "s"), ("replay", "a"), ("record", 2, "s"), ("pair", 1, 2),
        ("record", 3, "s"), ("replay", "b"), ("record", 4, "s"), ("pair", 3, 4),
    ]  # fmt: skip


def test_without_a_recorder_a_replay_records_nothing_and_the_recorder_leaves_on_errors():
    log: list = []
    call = graphed_call(log, "a")
    assert call() == "out-a"
    assert log == [("replay", "a")]
    rec = Recorder(log)
    with pytest.raises(RuntimeError), busy_recorder(rec):
        raise RuntimeError("a failed generation")
    call.replay()
    assert rec.made == 0 and log == [("replay", "a")] * 2


def test_the_innermost_recorder_gets_the_replays():
    log: list = []
    call = graphed_call(log, "a")
    outer, inner = Recorder([]), Recorder([])
    with busy_recorder(outer):
        with busy_recorder(inner):
            call()
        assert (outer.made, inner.made) == (0, 2)
        call()
    assert (outer.made, inner.made) == (2, 2)


def test_a_recorder_that_is_not_recording_gets_no_replay():
    log: list = []
    call = graphed_call(log, "a")
    rec = Recorder(log)
    with busy_recorder(rec):
        rec.recording = False  # a sampling clock's unsampled step
        call()
        rec.recording = True
        call()
    assert rec.made == 2
    assert log == [("replay", "a"), ("record", 1, "s"), ("replay", "a"), ("record", 2, "s"), ("pair", 1, 2)]
