"""The engine's switches: the module-level choices of the decode path that a run may set.

Each switch is one measured engine choice (its module's comment gives the A/B behind the default), a
``bool`` or a positive ``int``, read where the engine builds or runs a step. An experiment sets them in its
``switches`` setting (``repro run routes --set switches.fuse_accept=false``); the run's config then holds
them (and its hash differs from the defaults' run: ``repro compare`` pairs the two), its report names
them, and :func:`applied` sets them around the run and restores them after it. A run at the defaults
carries no ``switches`` setting. ``repro bench scale --switch NAME=VALUE`` sets them for the scale rows the
same way; ``scripts/gpu/routes-ab.py`` takes its plain switch variants from here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import yaml

from repro.decoding import engine
from repro.drafters import dflash_fast
from repro.errors import ConfigError
from repro.models import graphed, static, static_layers, topk_kernels
from repro.models.slot_kernels import TAG_ROWS


@dataclass(frozen=True)
class Switch:
    """A module attribute of the engine that a run may set: ``kind`` bool or int (ints >= 1, and at most
    ``most`` where it is given)."""

    module: ModuleType
    attr: str
    kind: type
    what: str
    most: int | None = None

    def read(self) -> Any:
        return getattr(self.module, self.attr)

    def write(self, value: Any) -> None:
        setattr(self.module, self.attr, value)


SWITCHES: dict[str, Switch] = {
    "pipeline": Switch(
        engine, "PIPELINE", bool, "drafted device routes one step ahead of the host's read"
    ),
    "pipeline_depth": Switch(
        engine, "PIPELINE_DEPTH", int, "steps a pipelined loop keeps launched ahead of the host's read",
        most=TAG_ROWS - 1,
    ),
    "fuse_accept": Switch(
        graphed, "FUSE_ACCEPT", bool,
        "a pipelined step's acceptance and commit in its verify's graph (off: stages of their own)",
    ),
    "fuse_tree": Switch(
        engine, "FUSE_TREE", bool,
        "a pipelined DDTree / chain DFlash tree built inside the drafter's graph (its time: the draft's)",
    ),
    "host_writes": Switch(
        graphed, "HOST_WRITES", bool,
        "a step's result stored into pinned host memory by its graph (off: a stream copy and an event)",
    ),
    "pause_gc": Switch(
        engine, "PAUSE_GC", bool, "Python's garbage collector paused in timed generations"
    ),
    "clock_every": Switch(
        engine, "EVENT_EVERY", int,
        "the stage clock's CUDA events on every Nth step, their sums scaled to all steps",
    ),
    "ar_group": Switch(graphed, "AR_GROUP", int, "greedy AR's decode steps a graph"),
    "fuse_bookkeeping": Switch(
        static, "FUSE_BOOKKEEPING", bool,
        "a verify slot's derive, greedy accept, path and commit bookkeeping on Triton kernels (off: torch)",
    ),
    "fold_norms": Switch(
        static, "FOLD_NORMS", bool,
        "the verify's normed row-tiled linears on weights with the norm scales folded in",
    ),
    "gated_out_proj": Switch(
        static_layers, "GATED_OUT_PROJ", bool,
        "a GDN layer's output gated norm inside its out_proj's row-tiled launch",
    ),
    "drafter_fold_norms": Switch(
        dflash_fast, "FOLD_NORMS", bool, "the DFlash block's normed matrices folded"
    ),
    "topk_kernels": Switch(
        topk_kernels, "KERNELS", bool, "row top-k on Triton kernels (off: torch.topk)"
    ),
    "peel_root": Switch(
        static, "PEEL_ROOT", bool,
        "the split tree kernel solves node 0 before its row blocks on slots of 2^k + 1 nodes",
    ),
}  # fmt: skip


def check_switches(values: Any) -> dict[str, bool | int]:
    """``values`` as switch settings, in :data:`SWITCHES`' order; a one-line ConfigError for a name that is
    no switch or a value of the wrong kind."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"setting switches must be a mapping of switch names to values, got {values!r}")
    unknown = sorted(str(k) for k in values if k not in SWITCHES)
    if unknown:
        raise ConfigError(
            f"unknown engine switch(es): {', '.join(unknown)}; the switches are {', '.join(SWITCHES)}"
        )
    out: dict[str, bool | int] = {}
    for name, switch in SWITCHES.items():
        if name not in values:
            continue
        value = values[name]
        if switch.kind is bool and not isinstance(value, bool):
            raise ConfigError(f"switch {name} must be true or false, got {value!r}")
        if switch.kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"switch {name} must be an integer >= 1, got {value!r}")
        if switch.most is not None and value > switch.most:
            raise ConfigError(f"switch {name} must be an integer 1 .. {switch.most}, got {value!r}")
        out[name] = value
    return out


def parse_switches(texts: Iterable[str], option: str = "--switch") -> dict[str, bool | int]:
    """``NAME=VALUE`` texts (the value read as YAML: ``true``, ``4``) as checked switch settings (a later
    text for the same name wins); a one-line ConfigError naming ``option`` for a text without '='."""
    values: dict[str, Any] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ConfigError(f"{option} takes NAME=VALUE (an engine switch), got {text!r}")
        try:
            values[name.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            values[name.strip()] = value
    return check_switches(values)


def listing() -> str:
    """The switches as ``repro switches`` lists them: name, kind, the value now (the default outside a run)
    and what it chooses, one line each."""
    width = max(map(len, SWITCHES))
    lines = [f"{'switch':{width}}  kind  default  what", ""]
    for name, value in current().items():
        s = SWITCHES[name]
        shown = str(value).lower() if s.kind is bool else str(value)
        lines.append(f"{name:{width}}  {s.kind.__name__:4}  {shown:7}  {s.what}")
    lines += ["", "set for a run: repro run EXP --set switches.NAME=VALUE (bench scale: --switch NAME=VALUE)"]
    return "\n".join(lines)


def current() -> dict[str, bool | int]:
    """Every switch's value now."""
    return {name: switch.read() for name, switch in SWITCHES.items()}


@contextlib.contextmanager
def applied(values: Mapping[str, bool | int]) -> Iterator[None]:
    """Inside the block the switches of ``values`` (checked) hold those values; every one is restored on exit,
    an exception included."""
    settings = check_switches(values)
    old = {name: SWITCHES[name].read() for name in settings}
    try:
        for name, value in settings.items():
            SWITCHES[name].write(value)
        yield
    finally:
        for name, value in old.items():
            SWITCHES[name].write(value)
