"""The implementations the external check runs, by name, with one calling convention."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from repro.engines.dflash_loop import dflash_generate
from repro.engines.hf_generate import hf_assisted, hf_assisted_dflash, hf_assisted_perturbed, hf_generate
from repro.engines.repro_route import repro_dflash_chain
from repro.engines.result import EngineRequest, EngineResult
from repro.engines.sglang import sglang_generate
from repro.engines.vllm import vllm_generate
from repro.errors import ConfigError

EngineFn = Callable[[EngineRequest], EngineResult]


@dataclass(frozen=True)
class Engine:
    """``fn(request: EngineRequest) -> EngineResult`` (an adapter's own keywords, such as the serving
    engines' ``drafter``, bound with ``partial``); ``drafter`` is the drafter kind it takes (None: no
    drafter); ``package`` the optional serving engine it needs (``pip install 'repro[sglang]'``): left
    out of the default set when absent; ``needs`` the other packages it imports (all are checked
    before an experiment with an external route starts: :meth:`missing`)."""

    name: str
    fn: EngineFn
    drafter: str | None
    what: str
    package: str | None = None
    needs: tuple[str, ...] = ("transformers",)

    @property
    def installed(self) -> bool:
        return self.package is None or importlib.util.find_spec(self.package) is not None

    def missing(self) -> str | None:
        """The first package this engine imports that is not installed (None: all are)."""
        wanted = (self.package,) if self.package else self.needs
        return next((p for p in wanted if importlib.util.find_spec(p) is None), None)

    def drafter_dir(self, target: str, resolve: Callable[[str], Path]) -> Path | None:
        return resolve(f"{target}-{self.drafter}") if self.drafter else None


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("transformers-generate", hf_generate, None, "transformers generate, plain AR"),
        Engine(
            "transformers-assisted", hf_assisted, None, "transformers assisted generation, target assists"
        ),
        Engine(
            "transformers-assisted-perturbed",
            hf_assisted_perturbed,
            None,
            "transformers assisted generation, a perturbed copy of the target assists (drafts rejected)",
        ),
        Engine(
            "transformers-assisted-dflash",
            hf_assisted_dflash,
            "dflash",
            "transformers generate(speculation_type='dflash'), dflash package drafter",
            needs=("transformers", "dflash"),
        ),
        Engine(
            "dflash-generate",
            dflash_generate,
            "dflash",
            "dflash package dflash_generate (z-lab loop)",
            needs=("transformers", "dflash"),
        ),
        Engine(
            "repro-dflash-chain", repro_dflash_chain, "dflash", "repro dflash_chain route (control)", needs=()
        ),
        Engine("sglang-ar", sglang_generate, None, "SGLang offline Engine, plain AR", "sglang"),
        Engine(
            "sglang-dflash", partial(sglang_generate, drafter="dflash"), "dflash", "SGLang DFLASH", "sglang"
        ),
        Engine(
            "sglang-eagle", partial(sglang_generate, drafter="eagle"), "eagle", "SGLang EAGLE chain", "sglang"
        ),
        Engine("vllm-ar", vllm_generate, None, "vLLM offline LLM, plain AR", "vllm"),
        Engine(
            "vllm-dflash", partial(vllm_generate, drafter="dflash"), "dflash", "vLLM dflash method", "vllm"
        ),
        Engine("vllm-eagle", partial(vllm_generate, drafter="eagle"), "eagle", "vLLM eagle method", "vllm"),
    )
}


def pick(names: list[str] | tuple[str, ...] | None) -> list[Engine]:
    """The named engines (when None: all, less the serving engines whose package is not installed),
    in catalog order; ConfigError naming an unknown one. A named engine whose package is absent is
    kept: its records say "not run: package ... is not installed"."""
    if names is None:
        return [e for e in ENGINES.values() if e.installed]
    if not names:
        raise ConfigError(f"name at least one engine: choose from {', '.join(ENGINES)}")
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ConfigError(f"unknown engine(s) {', '.join(unknown)}: choose from {', '.join(ENGINES)}")
    return [e for e in ENGINES.values() if e.name in names]
