"""Progress of long commands: a rich bar on a terminal, else one log line on stderr at most every
``interval`` seconds (nohup, CI, nightly jobs), with items done / total, elapsed time and ETA."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

LOG_INTERVAL_S = 30.0


def _clock_text(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """``with Progress("smoke", total) as p: ... p.advance(item="gsm8k/3 ar")``.

    On a terminal (``stream.isatty()``) it draws rich's bar; otherwise it writes
    ``label: done/total (pct), elapsed E, ETA R; item`` when at least ``interval`` seconds passed since
    the last line (the first after ``interval``), and a last line when the work ends.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        interval: float = LOG_INTERVAL_S,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
    ) -> None:
        self.label, self.total, self.interval, self.clock = label, total, interval, clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.done = 0
        self.item = ""
        self._bar = None
        self._task = None
        self._start = self._last = 0.0
        self._logged = 0  # items done at the last log line

    def __enter__(self) -> Progress:
        self._start = self._last = self.clock()
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
            self._bar = Bar(
                *columns, TimeElapsedColumn(), TextColumn("{task.fields[item]}"),
                console=Console(file=self.stream), transient=False,
            )  # fmt: skip
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, item="")
        return self

    def advance(self, n: int = 1, item: str = "") -> None:
        """Count ``n`` more items done; ``item`` names the last one."""
        self.done += n
        self.item = item
        if self._bar is not None:
            self._bar.update(self._task, advance=n, item=item)
            return
        now = self.clock()
        if now - self._last >= self.interval:
            self._last = now
            self._log(now)

    def print(self, text: str) -> None:
        """Print ``text`` as its own line (above the bar on a terminal)."""
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """The log line for the current state."""
        elapsed = (self.clock() if now is None else now) - self._start
        parts = [f"{self.label}: {self.done}"]
        if self.total:
            parts[0] += f"/{self.total} ({100 * self.done / self.total:.0f}%)"
        parts.append(f"elapsed {_clock_text(elapsed)}")
        if self.total and self.done:
            parts.append(f"ETA {_clock_text(elapsed / self.done * max(0, self.total - self.done))}")
        text = ", ".join(parts)
        return f"{text}; {self.item}" if self.item else text

    def _log(self, now: float) -> None:
        self._logged = self.done
        self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)
        elif self.done != self._logged:
            self._log(self.clock())
