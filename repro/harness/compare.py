"""``repro compare OLD NEW``: what changed between two nights' results, and whether it regressed.

OLD and NEW are run directories or folders of them (searched recursively for ``manifest.json``);
runs are matched by their path relative to the folder and must be of the same kind (two single run
directories are matched to each other). Per kind:

- ``decode``: per route, tokens/s paired per prompt across the two runs (the (suite, prompt, turn)
  records both hold, a prompt's turns pooled). The change is the new pooled tokens/s over the old
  (token-weighted, as every speedup of the reports) with its 95% percentile-bootstrap interval over
  prompts (:func:`repro.reporting.stats.paired_ratio`, seeded). **Noise** is a change whose interval
  includes 1 or whose size is below ``min_effect`` (default 3%), or below what the route moved between
  repeated runs of one code (``--repeats DIR``: :func:`repeat_floors`; a host-paced route can move more
  between processes than its bootstrap interval over prompts shows); with fewer than
  :data:`MIN_UNITS` pairs no interval is formed and only a change beyond ``threshold`` (default 10%)
  counts. A slowdown beyond noise is a regression; so is any prompt that was identical to AR (or the
  reference) and now diverges, and any record newly refused; records of the old run the new one lacks
  are listed per route.
- ``bench-kernels`` / ``bench-model``: per measured row (shape, method, T, ...), its time; one timing
  per row, so a row slower by more than ``threshold`` is a regression, as is a row whose status was
  ok and is not.
- ``falsify-tree-exactness``: a case that passed and now does not; ``falsify-external``: repro's own
  control route diverging where it was identical (another engine's changed verdict is reported,
  not a regression).
- ``CLAIMS.md`` beside the runs in both folders: every claim whose verdict changed is flagged.

Other kinds are listed as not compared, and so is a matched pair of runs that holds no record in
common. Any regression makes ``repro compare`` exit 3. Nothing to compare is bad input (ReproError,
exit 2): a side with neither a run directory nor a CLAIMS.md, or no matched pair of runs with a
record in common and no claim in both CLAIMS.md.

Comparing two code versions (git shas) of one experiment is the intended use. A matched pair whose
manifests say they are not the same experiment (another config hash: config settings, checkpoint or
suite contents; or another device class) is still compared, under a warning naming what differs
(:func:`differences`), since its changes may come from that and not from the code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.errors import ConfigError, ReproError
from repro.harness.run_kinds import load_run
from repro.reporting.records import MANIFEST_FILE
from repro.reporting.rundir import Run, changed_checkpoint, changed_suites, recorded_device_class
from repro.reporting.stats import MIN_UNITS, Paired, paired_ratio

CLAIMS = "CLAIMS.md"
HEADING = "# Comparison:"  # the first line of the markdown report (then OLD -> NEW)
SHOWN_DIFFERENCES = 8  # what differs, named in a warning before "and N more"
# config settings named first in a warning: what most often makes two runs' numbers incomparable
KEY_SETTINGS = (
    "target", "targets", "drafter", "dtype", "device", "engine", "switches", "shapes", "suites", "routes",
)  # fmt: skip


@dataclass(frozen=True)
class Noise:
    """What counts as a real change: ``min_effect`` (relative, with a bootstrap interval excluding 1),
    raised per route to ``route_floors`` (what the route moved between repeats of one code:
    :func:`repeat_floors`), and ``threshold`` (relative, where no interval can be formed)."""

    min_effect: float = 0.03
    threshold: float = 0.10
    seed: int = 0
    route_floors: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("min_effect", "threshold"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):  # inf: no change could ever count
                raise ConfigError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}")

    def floor(self, route: str | None) -> float:
        """The least relative change of ``route``'s tokens/s that counts."""
        return max(self.min_effect, self.route_floors.get(route or "", 0.0))


@dataclass
class Change:
    """One difference between the two nights, beyond noise."""

    run: str
    item: str
    what: str
    old: str
    new: str
    regression: bool
    note: str = ""


# --------------------------------------------------------------------------- statistics


def speed_change(change: Paired, noise: Noise, route: str | None = None) -> tuple[float, str, int] | None:
    """(ratio, description, direction) of a change of ``route``'s speed (new over old tokens/s, paired per
    prompt: :func:`prompt_sums`) beyond noise (direction -1 slower, +1 faster), or None when within noise."""
    ratio, n = change.value, change.n
    floor = noise.floor(route)
    if n == 0 or not math.isfinite(ratio):
        return None
    if math.isnan(change.low):  # fewer than MIN_UNITS prompts: no interval
        beyond = abs(ratio - 1) > noise.threshold
        what = f"x{ratio:.3f} over {n} prompt(s) (< {MIN_UNITS}: threshold {noise.threshold:.0%})"
        return (ratio, what, 1 if ratio > 1 else -1) if beyond else None
    what = f"x{ratio:.3f} [{change.low:.3f}, {change.high:.3f}] over {n} prompts"
    if floor > noise.min_effect:
        what += f" (beyond the {floor:.1%} it moved between repeats)"
    if change.high < 1 and ratio < 1 - floor:
        return ratio, what, -1
    if change.low > 1 and ratio > 1 + floor:
        return ratio, what, 1
    return None


def prompt_sums(pairs: list[tuple[Any, Any]]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per prompt (suite, id), the new run's tokens and decode seconds, then the old run's, over the turns
    both hold (MT-Bench's two turns pooled: a prompt is one resampling unit): the arrays of
    :func:`repro.reporting.stats.paired_ratio`, whose ratio is the new pooled tokens/s over the old."""
    by_prompt: dict[tuple[str, str], list[tuple[Any, Any]]] = defaultdict(list)
    for a, b in pairs:
        by_prompt[(b.suite, b.prompt_id)].append((a, b))
    turns = list(by_prompt.values())
    return (
        [sum(b.new_tokens for _, b in t) for t in turns],
        [sum(b.decode_s for _, b in t) for t in turns],
        [sum(a.new_tokens for a, _ in t) for t in turns],
        [sum(a.decode_s for a, _ in t) for t in turns],
    )


# --------------------------------------------------------------------------- per kind


def route_pairs(old: Run, new: Run) -> dict[str, list[tuple[Any, Any]]]:
    """Per route, the (old, new) records of the (suite, prompt, turn) both runs hold."""
    olds = {r.key: r for r in old.records}
    by_route: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    for rec in new.records:
        if rec.key in olds:
            by_route[rec.route].append((olds[rec.key], rec))
    return by_route


def timed_pairs(pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The pairs whose records both have a finite tokens/s."""
    return [(a, b) for a, b in pairs if _finite(a.tokens_per_s) and _finite(b.tokens_per_s)]


def repeat_floors(root: Path, seed: int = 0) -> dict[str, float]:
    """Per route, the largest relative change of tokens/s (paired per prompt, point estimate, either way)
    between any two of the decode runs under ``root``: repeats of one experiment at one code (each in its
    own process), whose differences are noise by construction. ReproError (one line) for fewer than two
    decode runs, or runs of other experiments, devices or code."""
    runs = [load_run(path) for path in find_runs(root).values()]
    runs = [run for run in runs if run.kind.name == "decode"]
    if len(runs) < 2:
        raise ReproError(f"--repeats {root}: needs two or more decode runs of one code, found {len(runs)}")
    first = runs[0]
    for run in runs[1:]:
        if why := differences(first.manifest, run.manifest):
            raise ReproError(
                f"--repeats {root}: {run.path.name} is not a repeat of {first.path.name}: {why[0]}"
            )
        if run.manifest.get("git_sha") != first.manifest.get("git_sha"):
            raise ReproError(
                f"--repeats {root}: {run.path.name} ran other code ({run.manifest.get('git_sha')}) than "
                f"{first.path.name} ({first.manifest.get('git_sha')})"
            )
    floors: dict[str, float] = {}
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            for route, pairs in route_pairs(a, b).items():
                ratio = paired_ratio(prompt_sums(timed_pairs(pairs)), seed).value
                if math.isfinite(ratio) and ratio > 0:
                    floors[route] = max(floors.get(route, 0.0), max(ratio, 1 / ratio) - 1)
    return floors


def _decode(name: str, old: Run, new: Run, noise: Noise) -> tuple[list[Change], int]:
    changes = []
    olds = {r.key: r for r in old.records}
    by_route = route_pairs(old, new)
    for route, pairs in by_route.items():
        ok = timed_pairs(pairs)
        change = speed_change(paired_ratio(prompt_sums(ok), noise.seed), noise, route)
        if change:
            old_rate, new_rate = _rate([a for a, _ in ok]), _rate([b for _, b in ok])
            changes.append(
                Change(
                    name, route, "tokens/s", f"{old_rate:.1f}", f"{new_rate:.1f}", change[2] < 0, change[1]
                )
            )
        for a, b in pairs:
            item = f"{route} {b.suite}/{b.prompt_id} turn {b.turn}"
            if a.vs_ar in ("identical", "reference") and b.vs_ar.startswith("diverged"):
                changes.append(Change(name, item, "vs AR", a.vs_ar, b.vs_ar, True, "new divergence from AR"))
            if b.vs_ar.startswith("refused") and not a.vs_ar.startswith("refused"):
                changes.append(Change(name, item, "vs AR", a.vs_ar, b.vs_ar, True, "newly refused"))
    news = {r.key for r in new.records}
    held = Counter(route for route, *_ in olds)
    lost = Counter(route for (route, *rest) in olds if (route, *rest) not in news)
    for route, n in lost.items():  # a record the new run lacks: its comparison silently shrinks
        what = "records" if route in by_route else "route"
        changes.append(
            Change(
                name,
                route,
                what,
                f"{held[route]}",
                f"{held[route] - n}",
                False,
                f"{n} record(s) not in the new run",
            )  # fmt: skip
        )
    return changes, sum(len(pairs) for pairs in by_route.values())


def _rate(recs: list[Any]) -> float:
    """Pooled tokens/s: the records' new tokens over their decode seconds."""
    return sum(r.new_tokens for r in recs) / sum(r.decode_s for r in recs)


def _finite(x: float) -> bool:
    return math.isfinite(x) and x > 0


BENCH_KEYS = ("shape", "group", "kind", "method", "baseline", "T", "context", "dtype", "precision")


def _bench(name: str, old: Run, new: Run, noise: Noise) -> tuple[list[Change], int]:
    def key(r: dict) -> str:
        return " ".join(f"{k}={r[k]}" for k in BENCH_KEYS if r.get(k) not in (None, ""))

    olds = {key(r): r for r in old.records}
    changes, paired = [], 0
    for rec in new.records:
        a = olds.get(key(rec))
        if a is None:
            continue
        paired += 1
        if a.get("status") == "ok" and rec.get("status") != "ok":
            changes.append(
                Change(name, key(rec), "status", "ok", str(rec.get("status")), True, rec.get("reason", ""))
            )
            continue
        if not (_finite(float(a.get("us") or math.nan)) and _finite(float(rec.get("us") or math.nan))):
            continue
        speed = a["us"] / rec["us"]  # > 1: faster now
        if abs(speed - 1) > noise.threshold:
            note = f"x{speed:.3f} speed (one timing per row: threshold {noise.threshold:.0%})"
            changes.append(
                Change(name, key(rec), "us", f"{a['us']:.1f}", f"{rec['us']:.1f}", speed < 1, note)
            )
    return changes, paired


Comparator = Callable[[str, Run, Run, Noise], tuple[list[Change], int]]
"""(run name, old, new, noise) -> (the changes, how many pairs of records it compared)."""


def _verdicts(
    keys: tuple[str, ...], field: str, good: Callable[[str], bool], regresses: Callable[[dict], bool]
) -> Comparator:
    """A comparator of records keyed by ``keys`` whose ``field`` is a verdict: a change from a ``good``
    verdict is a regression when ``regresses(record)``; every other change is reported."""

    def compare(name: str, old: Run, new: Run, noise: Noise) -> tuple[list[Change], int]:
        def key(r: dict) -> str:
            return " ".join(str(r.get(k)) for k in keys if r.get(k) is not None)

        olds = {key(r): r for r in old.records}
        out, paired = [], 0
        for rec in new.records:
            a = olds.get(key(rec))
            if a is None:
                continue
            paired += 1
            if a.get(field) != rec.get(field):
                bad = good(str(a.get(field))) and regresses(rec)
                out.append(Change(name, key(rec), field, str(a.get(field)), str(rec.get(field)), bad))
        return out, paired

    return compare


COMPARATORS: dict[str, Comparator] = {
    "decode": _decode,
    "bench-kernels": _bench,
    "bench-model": _bench,
    "falsify-tree-exactness": _verdicts(
        ("level", "shape", "tree", "nodes", "depth", "backend", "dtype"), "verdict",
        lambda v: v == "pass", lambda r: True,
    ),
    "falsify-external": _verdicts(
        ("engine", "target", "suite", "prompt_id"), "vs_ar",
        lambda v: v == "identical", lambda r: str(r.get("engine", "")).startswith("repro-"),
    ),
}  # fmt: skip


# --------------------------------------------------------------------------- claims ledger


def claim_verdicts(path: Path) -> dict[str, str]:
    """Claim -> verdict from the markdown tables of a CLAIMS.md whose header has a 'verdict' column
    (the claim is the row's first cell)."""
    out: dict[str, str] = {}
    col = None
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = (
            [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else None
        )
        if cells is None:
            col = None
        elif col is None:
            col = next((i for i, c in enumerate(cells) if re.search(r"verdict", c, re.I)), None)
        elif not set("".join(cells)) <= set("-: ") and len(cells) > col:
            out[cells[0]] = cells[col]
    return out


def _claims(old_root: Path, new_root: Path) -> tuple[list[Change], int]:
    """The claims whose verdict changed between the two folders' CLAIMS.md, and how many both hold."""
    old, new = old_root / CLAIMS, new_root / CLAIMS
    if not (old.is_file() and new.is_file()):
        return [], 0
    a, b = claim_verdicts(old), claim_verdicts(new)
    changes = [
        Change(CLAIMS, claim, "verdict", a[claim], b[claim], True, "claim verdict changed")
        for claim in b
        if claim in a and a[claim] != b[claim]
    ]
    return changes, len(a.keys() & b.keys())


# --------------------------------------------------------------------------- comparability

_UNSET = object()


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``{"a.b": leaf}`` (lists and scalars are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _shown(value: Any) -> str:
    """A config value as shown in a warning: short JSON, ``unset``, or "" when too long to show."""
    text = "unset" if value is _UNSET else json.dumps(value, default=str)
    return text if len(text) <= 24 else ""


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What makes the runs of manifests ``old`` and ``new`` not the same experiment, one short phrase
    each, empty when they are: the config settings that differ (``dtype "float32" -> "bfloat16"``,
    ``routes differs``), the checkpoint and suite contents they read, the device class they ran on.
    The git sha and package versions are not among them: comparing code versions is compare's use."""
    ranked: list[list[str]] = [[], [], []]  # phrases of the key settings, the others, unset <-> null
    a, b = _flat(old.get("config") or {}), _flat(new.get("config") or {})
    for key in dict.fromkeys([*b, *a]):
        was, now = a.get(key, _UNSET), b.get(key, _UNSET)
        if was != now:
            shown = (_shown(was), _shown(now))
            nothing = all(v is _UNSET or v is None for v in (was, now))
            rank = 0 if key.split(".")[0] in KEY_SETTINGS else 2 if nothing else 1
            ranked[rank].append(f"{key} {shown[0]} -> {shown[1]}" if all(shown) else f"{key} differs")
    out = list(ranked[0])
    for key, changed in (("checkpoints", changed_checkpoint), ("suites", changed_suites)):
        was, now = old.get(key), new.get(key)
        if was == now:
            continue
        if not was or not now:
            out.append(f"{key} recorded by the {'new' if now else 'old'} run only")
        else:
            out.append(f"{key} ({changed(was, now) or 'differ'})")
    was_device, now_device = recorded_device_class(old), recorded_device_class(new)
    if was_device is not None and now_device is not None and was_device != now_device:
        out.append(f"device class {was_device} -> {now_device}")
    out += ranked[1] + ranked[2]
    if not out and old.get("config_hash") != new.get("config_hash"):
        out.append("config hash")  # it differs for a reason the manifests do not show
    return out


def comparability_warning(name: str, old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """One line warning that the matched runs ``name`` (manifests ``old``, ``new``) are not the same
    experiment, naming what differs; None when they are."""
    diff = differences(old, new)
    if not diff:
        return None
    more = len(diff) - SHOWN_DIFFERENCES
    shown = "; ".join(diff[:SHOWN_DIFFERENCES]) + (f"; and {more} more" if more > 0 else "")
    hashes = f"config hash {str(old.get('config_hash'))[:12]} -> {str(new.get('config_hash'))[:12]}"
    return (
        f"{name}: not the same experiment ({hashes}): {shown}. Compared anyway: its changes may come from"
        " these differences, not from the code"
    )


# --------------------------------------------------------------------------- the comparison


def find_runs(root: Path) -> dict[str, Path]:
    """Run directories under ``root`` by path relative to it (``root`` itself: its own name)."""
    if not root.exists():
        raise ReproError(f"{root} does not exist; give a run directory or a folder of them")
    if not root.is_dir():
        raise ReproError(f"{root} is not a directory of results")
    if (root / MANIFEST_FILE).is_file():
        return {root.name: root}
    return {str(p.parent.relative_to(root)): p.parent for p in sorted(root.rglob(MANIFEST_FILE))}


@dataclass
class Comparison:
    """The matched runs, the changes beyond noise, and what could not be compared."""

    old: Path
    new: Path
    matched: list[tuple[str, str]]  # (run, kind)
    changes: list[Change]
    skipped: list[str]
    warnings: list[str] = dataclasses.field(default_factory=list)  # matched runs of two experiments

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    def markdown(self) -> str:
        lines = [f"{HEADING} {self.old} -> {self.new}", ""]
        lines += [f"**Warning**: {w}" for w in self.warnings] + ([""] if self.warnings else [])
        lines += [
            f"{len(self.matched)} run(s) matched; {len(self.regressions)} regression(s); "
            f"{len(self.changes) - len(self.regressions)} other change(s) beyond noise.",
            "",
        ]
        if self.changes:
            lines += [
                "| run | item | what | old | new | regression | note |",
                "|---|---|---|---|---|---|---|",
            ]
            for c in sorted(self.changes, key=lambda c: (not c.regression, c.run, c.item)):
                flag = "**yes**" if c.regression else "no"
                lines.append(f"| {c.run} | {c.item} | {c.what} | {c.old} | {c.new} | {flag} | {c.note} |")
            lines.append("")
        lines += [f"- {run} ({kind})" for run, kind in self.matched]
        lines += [f"- not compared: {why}" for why in self.skipped]
        return "\n".join(lines) + "\n"


def compare(old_root: str | Path, new_root: str | Path, noise: Noise | None = None) -> Comparison:
    """Compare every run of ``new_root`` with its match in ``old_root`` (see the module docstring)."""
    noise = noise or Noise()
    old_root, new_root = Path(old_root), Path(new_root)
    old_runs, new_runs = find_runs(old_root), find_runs(new_root)
    single = (old_root / MANIFEST_FILE).is_file() and (new_root / MANIFEST_FILE).is_file()
    pairs = [(new_root.name, old_root, new_root)] if single else [
        (name, old_runs[name], path) for name, path in new_runs.items() if name in old_runs
    ]  # fmt: skip
    skipped = [f"{name}: only in {new_root}" for name in new_runs if not single and name not in old_runs]
    skipped += [f"{name}: only in {old_root}" for name in old_runs if not single and name not in new_runs]
    claims = (old_root / CLAIMS).is_file() and (new_root / CLAIMS).is_file()
    for root, runs in ((old_root, old_runs), (new_root, new_runs)):
        if not runs and not claims:
            raise ReproError(
                f"{root} holds no run directory (no {MANIFEST_FILE} in or below it): nothing to compare"
            )
    matched, changes, warned = [], [], []
    for name, old_dir, new_dir in pairs:
        old, new = load_run(old_dir), load_run(new_dir)
        if old.kind.name != new.kind.name:
            skipped.append(f"{name}: a {old.kind.name} run then a {new.kind.name} run")
        elif old.kind.name not in COMPARATORS:
            skipped.append(f"{name}: {new.kind.name} runs have no comparison")
        else:
            found, paired = COMPARATORS[new.kind.name](name, old, new, noise)
            if not paired:
                held = f"{len(old.records)} old, {len(new.records)} new"
                skipped.append(f"{name}: no record in common ({held})")
                continue
            matched.append((name, new.kind.name))
            changes += found
            if warning := comparability_warning(name, old.manifest, new.manifest):
                warned.append(warning)
    claim_changes, claims_paired = _claims(old_root, new_root)
    if not matched and not claims_paired:
        why = "; ".join(skipped[:3]) + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        raise ReproError(
            f"nothing to compare: {old_root} and {new_root} share no run with a record in common"
            f" ({why or 'no run matched by path and kind'})"
        )
    changes += claim_changes
    return Comparison(old_root, new_root, matched, changes, skipped, warned)


def summary_line(result: Comparison) -> str:
    """One line naming the regressions (for the exit-3 message)."""
    items: Iterable[str] = (f"{c.run}: {c.item} {c.what} {c.old} -> {c.new}" for c in result.regressions)
    return f"{len(result.regressions)} regression(s): " + "; ".join(list(items)[:5])
