"""What an external decode loop returns, and the lazy import of its package."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from repro.errors import ReproError

OK = "ok"
REFUSED = "refused: "


class MissingPackageError(ReproError):
    """An external implementation's package is not installed."""


@dataclass
class EngineResult:
    """One generation by an external loop.

    ``status`` is ``"ok"`` or ``"refused: <reason>"`` (the implementation declined or failed on this
    model: a finding, not a crash); ``accepted_lengths`` are the loop's own per-step counts where it
    reports them, else None; ``dtype`` says in which precision the weights were run. Engines that
    expose only counters (SGLang, vLLM) give ``verify_steps`` and their own ``mal`` instead.
    """

    output_ids: list[int]
    accepted_lengths: list[int] | None
    wall_s: float
    status: str
    dtype: str
    notes: str = ""
    verify_steps: int | None = None
    mal: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


def refused(reason: str, dtype: str, notes: str = "") -> EngineResult:
    """A result for a loop that declined (or could not run) on this model; ``reason`` on one line."""
    line = " ".join(str(reason).split())
    return EngineResult([], None, 0.0, REFUSED + line, dtype, notes)


def require(module: str, package: str | None = None) -> ModuleType:
    """Import ``module`` or raise one line naming the package to install."""
    package = package or module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingPackageError(f"package {package} is not installed: pip install {package}") from None
