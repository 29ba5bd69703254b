"""The implementations the external check runs, by name, with one calling convention."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from repro.engines.dflash_loop import dflash_generate
from repro.engines.hf_generate import hf_assisted, hf_assisted_dflash, hf_generate
from repro.engines.repro_route import repro_dflash_chain
from repro.engines.result import EngineResult
from repro.errors import ConfigError

EngineFn = Callable[..., EngineResult]


@dataclass(frozen=True)
class Engine:
    """``fn(target_dir, drafter_dir, prompt_ids, max_new_tokens, temperature, seed, stop_ids, dtype,
    device)``; ``drafter`` is the drafter kind it takes (None: no drafter)."""

    name: str
    fn: EngineFn
    drafter: str | None
    what: str

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
            "transformers-assisted-dflash",
            hf_assisted_dflash,
            "dflash",
            "transformers generate(speculation_type='dflash'), dflash package drafter",
        ),
        Engine("dflash-generate", dflash_generate, "dflash", "dflash package dflash_generate (z-lab loop)"),
        Engine("repro-dflash-chain", repro_dflash_chain, "dflash", "repro dflash_chain route (control)"),
    )
}


def pick(names: list[str] | tuple[str, ...] | None) -> list[Engine]:
    """The named engines (all when None), in catalog order; ConfigError naming an unknown one."""
    if names is None:
        return list(ENGINES.values())
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ConfigError(f"unknown engine(s) {', '.join(unknown)}: choose from {', '.join(ENGINES)}")
    return [e for e in ENGINES.values() if e.name in names]
