"""The progress helper without a terminal: a line at most every interval, with done/total, elapsed, ETA."""

from __future__ import annotations

import io

from repro.progress import Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_logs_at_most_every_interval_with_counts_elapsed_and_eta():
    clock, out = FakeClock(), io.StringIO()
    with Progress("smoke", 10, interval=30.0, stream=out, clock=clock, tty=False) as p:
        for i in range(10):
            clock.now += 10.0  # 10 s per item
            p.advance(item=f"gsm8k/{i} ar")
    lines = out.getvalue().splitlines()
    # items end at 10, 20, ..., 100 s: lines at 30, 60 and 90 s, and one at the end
    assert len(lines) == 4, lines
    assert lines[0] == "smoke: 3/10 (30%), elapsed 30s, ETA 1m10s; gsm8k/2 ar"
    assert lines[1].startswith("smoke: 6/10 (60%), elapsed 1m00s, ETA 40s")
    assert lines[-1].startswith("smoke: 10/10 (100%), elapsed 1m40s, ETA 0s")


def test_nothing_before_the_interval_and_no_duplicate_last_line():
    clock, out = FakeClock(), io.StringIO()
    with Progress("train", None, interval=30.0, stream=out, clock=clock, tty=False) as p:
        clock.now += 5.0
        p.advance()
        assert out.getvalue() == ""  # quiet until the interval passed
        clock.now += 30.0
        p.advance(item="loss 1.0")
    lines = out.getvalue().splitlines()
    assert lines == ["train: 2, elapsed 35s; loss 1.0"]  # no total: no ETA; the last state not repeated


def test_print_goes_to_the_stream_off_a_terminal():
    out = io.StringIO()
    with Progress("bench", 2, stream=out, tty=False) as p:
        p.print("row 1")
    assert out.getvalue() == "row 1\n"
