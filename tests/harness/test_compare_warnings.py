"""``repro compare`` with nothing to compare (exit 2, one line) and with matched runs that are not the
same experiment (compared, under a warning naming what differs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli as cli

from repro.errors import ReproError
from repro.harness.compare import compare, differences
from repro.reporting.rundir import restore_records

RESULTS = Path(__file__).resolve().parents[2] / "results"
ROUTES = RESULTS / "2026-11-30-h200-routes" / "float32"  # a decode run on the H200, 4 prompts x 3 suites


def _night(tmp_path: Path, name: str, run: str = "routes", edit=None, manifest=None) -> Path:
    """A results folder holding a copy of the routes run as ``run``, its records passed through ``edit``
    and its manifest through ``manifest``."""
    root = tmp_path / name
    shutil.copytree(ROUTES, root / run, ignore=shutil.ignore_patterns("*.png", "*.log"))
    restore_records(root / run)  # the committed run is archived (repro archive): its records.jsonl back
    if edit:
        path = root / run / "records.jsonl"
        rows = [edit(json.loads(line)) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if manifest:
        path = root / run / "manifest.json"
        path.write_text(json.dumps(manifest(json.loads(path.read_text())), indent=2))
    return root


def _other_prompts(r: dict) -> dict:
    r["prompt_id"] = f"other-{r['prompt_id']}"
    return r


def test_folders_sharing_no_run_are_bad_input(monkeypatch, capsys, tmp_path):
    old, new = _night(tmp_path, "old", "a"), _night(tmp_path, "new", "b")
    code, out, err = cli(monkeypatch, capsys, "compare", str(old), str(new))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "nothing to compare" in err
    assert "a: only in" in err and "b: only in" in err


def test_runs_sharing_no_record_are_bad_input(monkeypatch, capsys, tmp_path):
    old, new = _night(tmp_path, "old"), _night(tmp_path, "new", edit=_other_prompts)
    code, out, err = cli(monkeypatch, capsys, "compare", str(old), str(new))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "nothing to compare" in err and "routes: no record in common" in err
    code, _, err = cli(monkeypatch, capsys, "compare", str(old / "routes"), str(new / "routes"))
    assert code == 2 and "nothing to compare" in err  # two single run directories


@pytest.mark.parametrize("side", ["old", "new"])
def test_a_folder_without_runs_is_bad_input(monkeypatch, capsys, tmp_path, side):
    runs, empty = _night(tmp_path, "runs"), tmp_path / "empty"
    (empty / "notes").mkdir(parents=True)
    (empty / "notes" / "README.md").write_text("no runs here\n")
    args = (empty, runs) if side == "old" else (runs, empty)
    code, out, err = cli(monkeypatch, capsys, "compare", *map(str, args))
    assert code == 2 and out == ""
    assert err.splitlines() == [f"error: {empty} holds no run directory (no manifest.json in or below it):"
                                " nothing to compare"]  # fmt: skip
    code, _, err = cli(monkeypatch, capsys, "compare", str(tmp_path / "missing"), str(runs))
    assert code == 2 and len(err.splitlines()) == 1 and "does not exist" in err


def test_a_run_without_common_records_is_listed_beside_one_that_has_them(tmp_path):
    old = _night(tmp_path, "old")
    new = _night(tmp_path, "new")
    shutil.copytree(old / "routes", old / "second")
    _night(tmp_path, "new", "second", edit=_other_prompts)
    result = compare(old, new)
    assert result.matched == [("routes", "decode")]
    assert [s for s in result.skipped if s.startswith("second")] == [
        "second: no record in common (70 old, 70 new)"
    ]
    assert "not compared: second: no record in common" in result.markdown()


def _bf16_h100(m: dict) -> dict:
    m["config"]["dtype"] = "bfloat16"
    m["config_hash"] = "f" * 64
    m["device_class"] = "NVIDIA H100 80GB HBM3"
    return m


def _other_sha(m: dict) -> dict:
    m["git_sha"], m["created_at"] = "0" * 40, "2026-12-24T00:00:00+00:00"
    return m


def test_runs_of_another_config_are_compared_under_a_warning(monkeypatch, capsys, tmp_path):
    """Another git sha of the same config is compare's use: no warning; another dtype and device: one,
    above the summary and on stderr, and the runs are still compared."""
    old, same = _night(tmp_path, "old"), _night(tmp_path, "same", manifest=_other_sha)
    code, out, err = cli(monkeypatch, capsys, "compare", str(old), str(same))
    assert code == 0 and err == "" and "Warning" not in out
    new = _night(tmp_path, "new", manifest=_bf16_h100)
    code, out, err = cli(monkeypatch, capsys, "compare", str(old), str(new))
    assert code == 0, err
    assert "1 run(s) matched; 0 regression(s)" in out
    warning = next(line for line in out.splitlines() if line.startswith("**Warning**"))
    assert out.index(warning) < out.index("run(s) matched")  # above the summary, not below the table
    named = (
        "routes: not the same experiment",
        'dtype "float32" -> "bfloat16"',
        "device class NVIDIA H200 -> NVIDIA H100 80GB HBM3",
        "config hash 681b5720793a -> ffffffffffff",
    )
    for what in named:
        assert what in warning and what in err
    assert err.startswith("warning: routes: not the same experiment") and len(err.splitlines()) == 1


def test_differences_name_settings_checkpoints_and_suites():
    ckpt = {"target": {"path": "/ckpt/a", "files": {"model.safetensors": "1"}}}
    old = {"config": {"dtype": "float32", "timer": {"rep_ms": 40}, "routes": [{"name": "ar"}] * 9},
           "config_hash": "a", "checkpoints": ckpt, "suites": {"gsm8k": {"sha256": "1" * 64}}}  # fmt: skip
    changed = {"target": {"path": "/ckpt/a", "files": {"model.safetensors": "2"}}}
    new = {"config": {"dtype": "float32", "timer": {"rep_ms": 50}, "routes": [{"name": "chain"}] * 9},
           "config_hash": "b", "checkpoints": changed, "suites": {"gsm8k": {"sha256": "2" * 64}}}  # fmt: skip
    assert differences(old, new) == [
        "routes differs",
        "checkpoints (target: /ckpt/a/model.safetensors changed)",
        "suites (gsm8k: sha256 111111111111 -> 222222222222)",
        "timer.rep_ms 40 -> 50",
    ]
    assert differences(old, old) == []


def test_compare_raises_one_line_for_nothing_to_compare(tmp_path):
    old, new = _night(tmp_path, "old", "a"), _night(tmp_path, "new", "b")
    with pytest.raises(ReproError, match=r"^nothing to compare: .*share no run with a record in common"):
        compare(old, new)
