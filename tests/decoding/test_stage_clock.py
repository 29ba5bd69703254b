"""StageClock (repro.decoding.engine): device stage times from events, summed once, events reused.

CUDA events are replaced by a fake with a device timeline, so the bookkeeping is checked on the CPU:
per stage the summed elapsed times, steps summed early only once their last event is done, and no
more events made than the steps in flight need.
"""

from __future__ import annotations

import pytest
import torch

import repro.decoding.engine as engine
from repro.decoding.engine import STAGES, StageClock


class FakeEvent:
    made = 0
    now = 0.0  # the device timeline, ms
    done_until = 0.0  # events recorded at or before this time have completed

    def __init__(self, enable_timing: bool = False) -> None:
        FakeEvent.made += 1
        self.at: float | None = None

    def record(self) -> None:
        self.at = FakeEvent.now

    def query(self) -> bool:
        return self.at is not None and self.at <= FakeEvent.done_until

    def synchronize(self) -> None:
        FakeEvent.done_until = max(FakeEvent.done_until, FakeEvent.now)

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.query() and other.query(), "elapsed_time of an event not yet done"
        return other.at - self.at


@pytest.fixture
def fake_events(monkeypatch):
    FakeEvent.made, FakeEvent.now, FakeEvent.done_until = 0, 0.0, 0.0
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    return FakeEvent


def test_device_times_are_summed_per_stage_and_events_reused(fake_events):
    clock = StageClock(torch.device("cuda"), sync=False)
    durations = {"draft": 1.0, "tree": 0.5, "verify": 3.0, "commit": 2.0}  # ms per step
    steps = 50
    for step in range(steps):
        clock.mark()
        for name in STAGES:
            fake_events.now += durations[name]
            clock.mark()
        fake_events.now += 0.25  # host bookkeeping between steps
        if step % 3 != 2:
            fake_events.done_until = fake_events.now  # the step's read waited for the device
    got = clock.device_s()
    for name in STAGES:
        assert got[name] == pytest.approx(steps * durations[name] / 1000.0)
    assert fake_events.made <= 3 * (len(STAGES) + 1)  # reused: at most the steps still in flight
    assert set(clock.wall) == set(STAGES)


def test_without_events_device_times_are_the_clocks(monkeypatch):
    clock = StageClock(torch.device("cpu"), sync=False)
    ticks = iter(range(100))
    monkeypatch.setattr(engine.time, "perf_counter", lambda: float(next(ticks)))
    for _ in range(2 * (len(STAGES) + 1)):
        clock.mark()
    assert clock.device_s() == clock.wall == dict.fromkeys(STAGES, 2.0)
