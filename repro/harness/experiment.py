"""Experiment configs: YAML files shipped in the package (or a user's path) plus overrides."""

from __future__ import annotations

import copy
import itertools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from repro.data.suites import canonical_suite
from repro.decoding.routes import name_routes
from repro.errors import ConfigError

DEFAULTS: dict[str, Any] = {
    "name": None,
    "description": "",
    "kind": "decode",
    "target": "default",
    "target_seed": 0,
    "dtype": "float32",
    "device": "cpu",
    "cpu_threads": 1,  # tiny models decode fastest single-threaded; raise for large checkpoints
    "commit": "closed_form",
    "gdn_backend": "reference",  # or "triton" (fused CUDA kernels)
    "suites": ["mt_bench", "gsm8k", "humaneval"],
    "limit": 2,
    "seed": 42,
    "max_new_tokens": 64,
    "temperature": 0.0,
    "acceptance": "greedy",
    "ignore_eos": False,
    "warmup": 1,
    "routes": [{"name": "ar", "kind": "ar"}],
    "route_grid": None,
}
OVERRIDABLE = (
    "target", "suites", "limit", "max_new_tokens", "temperature", "seed", "dtype", "device", "gdn_backend",
)  # fmt: skip


def shipped_experiments() -> list[str]:
    folder = resources.files("repro") / "experiments"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _read_yaml(path: Path | Any, label: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"experiment file {label} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"experiment file {label} must hold a mapping of settings")
    return data


def load_experiment(name_or_path: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The resolved config of a shipped experiment name or a YAML path, with overrides applied."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.exists():
            raise ConfigError(f"experiment file {path} does not exist")
        raw = _read_yaml(path, str(path))
        raw.setdefault("name", path.stem)
    else:
        shipped = resources.files("repro") / "experiments" / f"{name_or_path}.yaml"
        if not shipped.is_file():
            raise ConfigError(
                f"unknown experiment {name_or_path!r}: shipped ones are {', '.join(shipped_experiments())}, "
                "or pass a path to a YAML file"
            )
        raw = _read_yaml(shipped, name_or_path)
        raw.setdefault("name", name_or_path)
    return resolve(raw, overrides or {})


def resolve(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = set(raw) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"unknown experiment setting(s): {', '.join(sorted(unknown))}")
    cfg = copy.deepcopy(DEFAULTS)
    cfg.update(copy.deepcopy(raw))
    for key, value in overrides.items():
        if key not in OVERRIDABLE:
            raise ConfigError(f"setting {key!r} cannot be overridden from the command line")
        if value is not None:
            cfg[key] = value
    if isinstance(cfg["suites"], str):
        cfg["suites"] = [s.strip() for s in cfg["suites"].split(",") if s.strip()]
    if not cfg["suites"]:
        raise ConfigError("no suites selected: name at least one of mt_bench, gsm8k, humaneval")
    cfg["suites"] = [canonical_suite(s) for s in cfg["suites"]]
    cfg["routes"] = name_routes(expand_routes(cfg["routes"] or [], cfg.pop("route_grid")))
    if not any(r.get("kind") == "ar" for r in cfg["routes"]):
        cfg["routes"].insert(0, {"name": "ar", "kind": "ar"})
    cfg["routes"].sort(key=lambda r: r.get("kind") != "ar")  # AR first: the reference and baseline
    if cfg["temperature"] < 0:
        raise ConfigError(f"temperature must be >= 0, got {cfg['temperature']}")
    if cfg["temperature"] > 0 and cfg["acceptance"] == "greedy":
        cfg["acceptance"] = "sample_match"
    if int(cfg["max_new_tokens"]) < 1:
        raise ConfigError("max_new_tokens must be >= 1")
    return cfg


def expand_routes(routes: list[dict], grid: dict | None) -> list[dict]:
    """Routes listed explicitly plus the cartesian product of a ``route_grid``.

    A grid such as ``{kind: synthetic_chain, name: "chain-k{k}-p{p}", p: [0.5, 0.9], k: [2, 4]}``
    gives one route per (p, k).
    """
    out = [dict(r) for r in routes]
    if not grid:
        return out
    grid = dict(grid)
    template = grid.pop("name", None)
    kind = grid.pop("kind", None)
    axes = {k: v for k, v in grid.items() if isinstance(v, list)}
    fixed = {k: v for k, v in grid.items() if not isinstance(v, list)}
    for combo in itertools.product(*axes.values()):
        params = dict(zip(axes, combo))
        name = (template or kind + "-" + "-".join(f"{k}{v}" for k, v in params.items())).format(
            **params, **fixed
        )
        out.append({"name": name, "kind": kind, **fixed, **params})
    return out
