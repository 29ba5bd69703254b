"""What an external decode loop is asked (``EngineRequest``) and returns (``EngineResult``), and the
lazy import of its package."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from repro.errors import ReproError

OK = "ok"
REFUSED = "refused: "
SAMPLED = "sampled: not compared token-wise"  # the verdict of a loop run at temperature > 0


class MissingPackageError(ReproError):
    """An external implementation's package is not installed."""


@dataclass(frozen=True)
class EngineRequest:
    """One generation asked of an external loop: every adapter takes one, plus its own keywords.

    ``drafter_dir`` is None for loops without a drafter; ``stop_ids`` None: exactly
    ``max_new_tokens`` (no end-of-sequence token); greedy at ``temperature`` 0. The defaults are the
    CPU check's (float64 weights); the serving engines (SGLang, vLLM) run only bfloat16, float16 or
    float32 weights and refuse the others in one line, so their callers pass ``dtype`` explicitly.
    """

    target_dir: str | Path
    drafter_dir: str | Path | None
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stop_ids: list[int] | None = None
    dtype: str = "float64"
    device: str = "cpu"


def prompt_seed(seed: int, prompt_ids: list[int]) -> int:
    """The seed of one prompt's request: the run's ``seed`` and the prompt's ids, as repro's own routes key
    their draws (:func:`repro.decoding.sampling.generation_seed`), so that prompts sampled at T > 0 draw
    independently; 31 bits (the serving engines take 32-bit seeds)."""
    from repro.decoding.sampling import generation_seed

    return generation_seed(seed, prompt_ids) % 2**31


@dataclass
class EngineResult:
    """One generation by an external loop.

    ``status`` is ``"ok"`` or ``"refused: <reason>"`` (the implementation declined or failed on this
    model: a finding, not a crash); ``accepted_lengths`` are the loop's own per-step counts where it
    reports them, else None; ``dtype`` says in which precision the weights were run. Engines that
    expose only counters (SGLang, vLLM) give ``verify_steps`` and their own ``mal`` instead;
    ``prefill_s`` is the part of ``wall_s`` the loop reports as its prefill (None: not reported).
    """

    output_ids: list[int]
    accepted_lengths: list[int] | None
    wall_s: float
    status: str
    dtype: str
    notes: str = ""
    verify_steps: int | None = None
    mal: float | None = None
    prefill_s: float | None = None

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
