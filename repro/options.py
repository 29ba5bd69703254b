"""The options every command spells the same way: ``--dtype``, ``--device``, ``--max-new-tokens``,
``--time-budget``; one declaration each, shared by the main app and its sub-apps."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

import typer

from repro.errors import ConfigError, not_a_folder

DTYPE_NAMES = ("bfloat16", "float16", "float32", "float64")
DEVICE_NAMES = ("auto", "cpu", "cuda")
_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def _choice(names: tuple[str, ...]) -> Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        if value is not None and value not in names:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(names)}")
        return value

    return check


def dtype_option(help_text: str, auto: bool = False, name: str = "--dtype") -> typer.models.OptionInfo:
    """``--dtype`` (or ``name``) restricted to the full torch names (and ``auto`` where allowed)."""
    names = (*DTYPE_NAMES, "auto") if auto else DTYPE_NAMES
    return typer.Option(name, help=f"{'|'.join(names)}: {help_text}", callback=_choice(names))


def device_option(help_text: str = "auto (CUDA when present), cpu or cuda.") -> typer.models.OptionInfo:
    """``--device``: auto, cpu or cuda (``cuda:N`` too)."""
    return typer.Option("--device", help=help_text, callback=_device)


def _device(value: str | None) -> str | None:
    if value is not None and value not in DEVICE_NAMES and not value.startswith("cuda:"):
        raise typer.BadParameter(f"unknown device {value!r}: use auto, cpu or cuda")
    return value


def short_dtype(name: str, allowed: tuple[str, ...], option: str = "--dtype") -> str:
    """The short internal spelling (``bf16``, ``fp32``, ...) of a full dtype name, refused unless in
    ``allowed`` (given in short spelling)."""
    short = _SHORT.get(name)
    if short not in allowed:
        full = [k for k, v in _SHORT.items() if v in allowed]
        raise ConfigError(f"{option} must be one of {', '.join(full)} here, got {name!r}")
    return short


def comma_list(text: str) -> list[str]:
    """``a, b,,c`` -> ``["a", "b", "c"]``: a comma-separated option's names."""
    return [s.strip() for s in text.split(",") if s.strip()]


def comma_ints(text: str, option: str, minimum: int = 1) -> list[int]:
    """``--option``'s comma-separated integers, at least one, each >= ``minimum`` (one-line ConfigError)."""
    try:
        values = [int(s) for s in comma_list(text)]
    except ValueError:
        raise ConfigError(f"{option} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise ConfigError(f"{option} needs at least one value, each an integer >= {minimum}, got {text!r}")
    return values


def shape_names(text: str, known: Collection[str]) -> list[str]:
    """The comma-separated shape names of ``--shapes``, each one of ``known`` (one-line ConfigError)."""
    names = comma_list(text)
    unknown = [s for s in names if s not in known]
    if unknown or not names:
        raise ConfigError(f"unknown shape(s) {', '.join(unknown) or '(none)'}; known: {', '.join(known)}")
    return names


def figure_folder(path: Path | None) -> Path | None:
    """``--figures``, checked before any work: a folder or nothing yet (made when a figure is written)."""
    if path is not None and path.exists() and not path.is_dir():
        raise ConfigError(not_a_folder(path, "figure folder"))
    return path
