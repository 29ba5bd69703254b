"""Experiment configs: YAML files shipped in the package (or a user's path) plus overrides."""

from __future__ import annotations

import copy
import itertools
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import yaml

from repro.data.suites import canonical_suite
from repro.decoding.acceptance import ACCEPTANCE_RULES
from repro.decoding.routes import EXTERNAL, name_routes
from repro.decoding.switches import check_switches
from repro.errors import ConfigError
from repro.gdn.backends import default_backend
from repro.harness.overrides import apply_edits, takes_param
from repro.models.graphed import resolve_engine
from repro.models.static import check_static_strategy
from repro.models.target import check_device_name, resolve_device, resolve_dtype

DEFAULTS: dict[str, Any] = {
    "name": None,
    "description": "",
    "kind": "decode",
    "target": "default",
    "target_seed": 0,
    "dtype": "float32",  # or auto: bfloat16 on CUDA, else float32
    "device": "auto",  # CUDA when present
    "cpu_threads": 1,  # tiny models decode fastest single-threaded; raise for large checkpoints
    "commit": "closed_form",
    "gdn_backend": "auto",  # triton (fused CUDA kernels) on CUDA, reference elsewhere; or either by name
    "engine": "auto",  # graphed (static decoder, CUDA graphs) on CUDA, eager (HybridLM) on CPU
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
    # every non-AR route under each of these acceptance rules ("auto": greedy at T=0, else the sampling
    # rules), named <route>@<rule> when there are several: the protocol columns of a paper table
    "protocols": None,
    # {param: NAME, values: [...]}: every non-AR route once per value, named <route>@<param>=<value>
    "sweep": None,
    # parameters (e.g. drafter, weaver checkpoints) given to every route that declares them and lacks them
    # a route diverging from AR fails the run (exit 3); null: exactly when greedy in float64
    "lossless": None,
    # engine switches set for the run (repro.decoding.switches: {fuse_accept: false, ...}); a run at the
    # engine's defaults carries none (the key is dropped when empty: its config is that of earlier runs)
    "switches": {},
}
OVERRIDABLE = (
    "target", "suites", "limit", "max_new_tokens", "temperature", "seed", "dtype", "device", "gdn_backend",
    "commit", "engine", "sweep", "routes",
)  # fmt: skip
SAMPLING_PROTOCOLS = ("sample_match", "spec_sampling", "traversal")


TEMPLATES = "experiments/templates"


def shipped_experiments(folder: str = "experiments") -> list[str]:
    """Names of the shipped experiments (of ``folder``, relative to the package)."""
    root = resources.files("repro").joinpath(*folder.split("/"))
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def shipped_templates() -> list[str]:
    """The real-checkpoint templates: their checkpoint paths are given at run time (``--target``...)."""
    return shipped_experiments(TEMPLATES)


def _read_yaml(path: Path | Any, label: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"experiment file {label} is not valid YAML: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"experiment file {label} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read experiment file {label}: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"experiment file {label} must hold a mapping of settings")
    return data


def load_experiment(
    name_or_path: str, overrides: dict[str, Any] | None = None, edits: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The resolved config of a shipped experiment or template name or a YAML path, with ``edits``
    (``--set`` / ``--drafter`` / ``--weaver``: :func:`repro.harness.overrides.apply_edits` keywords)
    and then ``overrides`` applied."""
    raw = read_experiment(name_or_path)
    if edits:
        raw = apply_edits(raw, **edits)
    return resolve(raw, overrides or {})


def read_experiment(name_or_path: str) -> dict[str, Any]:
    """The raw settings of a shipped experiment or template name or a YAML path (``name`` filled in)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.exists():
            raise ConfigError(f"experiment file {path} does not exist")
        raw = _read_yaml(path, str(path))
        raw.setdefault("name", path.stem)
    else:
        name = name_or_path.removeprefix("templates/")
        shipped = resources.files("repro") / "experiments" / f"{name}.yaml"
        if not shipped.is_file():
            shipped = resources.files("repro").joinpath(*TEMPLATES.split("/"), f"{name}.yaml")
        if not shipped.is_file():
            raise ConfigError(
                f"unknown experiment {name_or_path!r}: shipped ones are {', '.join(shipped_experiments())}, "
                f"templates {', '.join(shipped_templates())}, or pass a path to a YAML file"
            )
        raw = _read_yaml(shipped, name)
        raw.setdefault("name", name)
    return raw


MAX_NEW_TOKENS_CAP = 1_000_000
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# the type of every setting: a type or a tuple of types (int excludes bool; None where allowed)
TYPES: dict[str, Any] = {
    "name": str, "description": str, "kind": str, "target": str, "target_seed": int, "dtype": str,
    "device": str, "cpu_threads": int, "commit": str, "gdn_backend": str, "engine": str,
    "suites": (list, str), "limit": (int, type(None)), "seed": int, "max_new_tokens": int,
    "temperature": (int, float),
    "acceptance": str, "ignore_eos": bool, "warmup": int, "routes": list, "route_grid": (dict, type(None)),
    "lossless": (bool, type(None)), "protocols": (str, list, type(None)), "sweep": (dict, type(None)),
    "switches": dict,
}  # fmt: skip
TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
              dict: "a mapping", type(None): "null"}  # fmt: skip


def check_type(key: str, value: Any, types: Any) -> None:
    """A one-line ConfigError unless ``value`` is one of ``types`` (a bool is not an int or a number)."""
    types = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        want = " or ".join(TYPE_NAMES[t] for t in types)
        raise ConfigError(f"setting {key} must be {want}, got {value!r}")


def check_temperature(value: float, what: str = "temperature") -> float:
    """A finite temperature >= 0 (0 = greedy), else a one-line ConfigError."""
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{what} must be a finite number >= 0 (0 = greedy), got {value}")
    return float(value)


def check_max_new_tokens(value: int, what: str = "max_new_tokens") -> int:
    """New tokens in [1, :data:`MAX_NEW_TOKENS_CAP`], else a one-line ConfigError."""
    if not 1 <= value <= MAX_NEW_TOKENS_CAP:
        raise ConfigError(f"{what} must be in [1, {MAX_NEW_TOKENS_CAP:,}], got {value}")
    return value


def check_weight_seed(seed: int, what: str = "target_seed") -> int:
    """A seed of random weights: torch's generator takes 64-bit words, so 0 <= seed < 2**64."""
    if not 0 <= seed < 2**64:
        raise ConfigError(f"{what} must be in [0, 2**64) (a seed of random weights), got {seed}")
    return seed


def check_name(name: str) -> str:
    """A run name is one plain file-name-safe word: it becomes a folder under runs/."""
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"experiment name {name!r} must be a plain word of letters, digits, '.', '_' or '-' "
            "(it names the folder under runs/); use --out to choose where records go"
        )
    return name


def resolve(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Defaults, then ``raw``, then the non-None ``overrides``: every setting type-checked and in range,
    ``auto`` device and dtype resolved, ``lossless`` decided (see ``DEFAULTS``)."""
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
    for key, types in TYPES.items():
        check_type(key, cfg[key], types)
    check_name(cfg["name"])
    from repro.harness.run_kinds import experiment_kind  # here: run_kinds imports the paper tables

    experiment_kind(cfg["kind"])
    check_weight_seed(cfg["target_seed"])
    for key in ("cpu_threads", "warmup"):
        if cfg[key] < 0:
            raise ConfigError(f"setting {key} must be >= 0, got {cfg[key]}")
    if cfg["limit"] is not None and cfg["limit"] < 1:
        raise ConfigError(f"setting limit must be >= 1 (or null: every prompt), got {cfg['limit']}")
    check_max_new_tokens(cfg["max_new_tokens"])
    cfg["temperature"] = check_temperature(cfg["temperature"])
    check_static_strategy(cfg["commit"])  # `delayed` runs on the graphed engine (closed_form elsewhere)
    for device in (raw.get("device"), cfg["device"]):  # the file's too: --check may stand cpu in for it
        if isinstance(device, str):  # CUDA's presence: when opened
            check_device_name(device)
    if cfg["device"] == "auto":
        cfg["device"] = resolve_device("auto")
    cfg["engine"] = resolve_engine(cfg["engine"], cfg["device"])
    if cfg["dtype"] == "auto":
        cfg["dtype"] = "bfloat16" if cfg["device"].startswith("cuda") else "float32"
    dtype = resolve_dtype(cfg["dtype"])
    if cfg["gdn_backend"] == "auto":  # float64 runs the reference (the Triton kernels are float32)
        cfg["gdn_backend"] = default_backend(torch.device(cfg["device"]), dtype)
    if isinstance(cfg["suites"], str):
        cfg["suites"] = [s.strip() for s in cfg["suites"].split(",") if s.strip()]
    if not cfg["suites"]:
        raise ConfigError("no suites selected: name at least one of mt_bench, gsm8k, humaneval")
    for suite in cfg["suites"]:
        check_type("suites", suite, str)
    cfg["suites"] = [canonical_suite(s) for s in cfg["suites"]]
    twice = sorted({s for s in cfg["suites"] if cfg["suites"].count(s) > 1})
    if twice:
        raise ConfigError(f"suite(s) listed more than once: {', '.join(twice)}")
    for route in cfg["routes"]:
        if not isinstance(route, dict):
            raise ConfigError(f"every route must be a mapping such as {{name: ar, kind: ar}}, got {route!r}")
    routes = name_routes(expand_routes(cfg["routes"], cfg.pop("route_grid")))
    routes = _sweep(routes, cfg["sweep"])
    cfg["routes"] = name_routes(_protocols(routes, cfg))
    if not any(r.get("kind") == "ar" for r in cfg["routes"]):
        cfg["routes"].insert(0, {"name": "ar", "kind": "ar"})
    cfg["routes"].sort(key=lambda r: r.get("kind") != "ar")  # AR first: the reference and baseline
    if cfg["temperature"] > 0 and cfg["acceptance"] == "greedy":
        cfg["acceptance"] = "sample_match"
    if cfg["lossless"] is None:  # greedy in float64: speculation is exact, so any divergence is a bug
        cfg["lossless"] = cfg["temperature"] == 0 and cfg["dtype"] == "float64"
    cfg["switches"] = check_switches(cfg["switches"])
    if not cfg["switches"]:
        del cfg["switches"]
    return cfg


def _sweep(routes: list[dict], sweep: dict | None) -> list[dict]:
    """Every non-AR route once per value of the swept parameter (values are checked when built)."""
    if not sweep:
        return routes
    param, values = sweep.get("param"), sweep.get("values")
    if (
        not isinstance(param, str)
        or not isinstance(values, list)
        or not values
        or set(sweep) - {"param", "values"}
    ):
        raise ConfigError(f"setting sweep must be {{param: NAME, values: [v1, ...]}}, got {sweep!r}")
    out, swept = [], False
    for route in routes:
        if route.get("kind") == "ar" or (route.get("kind") == EXTERNAL and not takes_param(route, param)):
            out.append(route)  # the reference, and other implementations' loops: once each
            continue
        if not takes_param(route, param):
            raise ConfigError(
                f"route {route['name']!r} ({route.get('kind')}) has no parameter {param!r} to sweep;"
                " choose --routes whose kinds declare it (repro routes)"
            )
        out += [{**route, "name": f"{route['name']}@{param}={v}", param: v} for v in values]
        swept = True
    if not swept:
        raise ConfigError(
            f"no route takes {param!r} to sweep (AR and external loops run once); add a route whose kind"
            " declares it (repro routes)"
        )
    return out


def _protocols(routes: list[dict], cfg: dict[str, Any]) -> list[dict]:
    """Every non-AR route without its own ``acceptance`` once per protocol rule (``cfg["protocols"]``
    resolved to a list: ``auto`` is greedy at temperature 0, else the sampling rules)."""
    rules = cfg["protocols"]
    if rules is None:
        return routes
    if rules == "auto":
        rules = ["greedy"] if cfg["temperature"] == 0 else list(SAMPLING_PROTOCOLS)
    if isinstance(rules, str) or not rules or any(r not in ACCEPTANCE_RULES for r in rules):
        raise ConfigError(f"setting protocols must be auto or a list of {', '.join(ACCEPTANCE_RULES)}")
    if cfg["temperature"] > 0 and "greedy" in rules:
        raise ConfigError("protocol greedy needs temperature 0; use sample_match for sampling")
    cfg["protocols"] = list(rules)
    out = []
    for route in routes:
        if route.get("kind") in ("ar", EXTERNAL) or "acceptance" in route:  # external: the loop's own rule
            out.append(route)
        elif len(rules) == 1:
            out.append({**route, "acceptance": rules[0]})
        else:
            out += [{**route, "name": f"{route['name']}@{rule}", "acceptance": rule} for rule in rules]
    return out


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
    if not isinstance(kind, str) or not (template is None or isinstance(template, str)):
        raise ConfigError(f"route_grid needs a kind (a string) and at most a name template, got {kind!r}")
    axes = {k: v for k, v in grid.items() if isinstance(v, list)}
    if any(not v for v in axes.values()):
        raise ConfigError(f"route_grid axes must list at least one value, got {axes}")
    fixed = {k: v for k, v in grid.items() if not isinstance(v, list)}
    for combo in itertools.product(*axes.values()):
        params = dict(zip(axes, combo))
        try:
            name = (template or kind + "-" + "-".join(f"{k}{v}" for k, v in params.items())).format(
                **params, **fixed
            )
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"route_grid name template {template!r} cannot be filled: {exc!r}") from None
        out.append({"name": name, "kind": kind, **fixed, **params})
    return out
