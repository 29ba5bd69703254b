"""The embedded trained family: what is shipped, that it loads and fits, and its acceptance report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.drafters.dflash import DFlashDrafter, load_dflash
from repro.drafters.eagle import load_eagle
from repro.drafters.weaver import load_weaver
from repro.family import FAMILY_DIR, SIZE_BUDGET_BYTES, TARGETS, drafter_name, index, members
from repro.family_report import FamilyReportConfig, run_family_report
from repro.models.loading import load_target

ROOT = Path(__file__).resolve().parent.parent


def test_index_matches_what_is_shipped_and_fits_the_budget() -> None:
    info = index()
    assert sorted(info["members"]) == members()
    drafters = {drafter_name(t, k) for t in TARGETS for k in ("dflash", "eagle", "weaver")}
    assert set(members()) == set(TARGETS) | drafters
    on_disk = sum(f.stat().st_size for m in members() for f in (FAMILY_DIR / m).iterdir() if f.is_file())
    assert info["total_bytes"] == on_disk <= SIZE_BUDGET_BYTES
    for name, entry in info["members"].items():
        assert re.fullmatch(r"[0-9a-f]{40}", entry["git_sha"]), name
        assert entry["seed"] == 0 and entry["recipe"]["recipe"] in {"target", "dflash", "eagle", "weaver"}
        assert entry["metrics"] and "H200" in entry["device"], name
    assert re.fullmatch(r"[0-9a-f]{64}", info["corpus_manifest_sha256"])


@pytest.mark.parametrize("target_name", TARGETS)
def test_every_member_loads_and_fits_its_target(target_name: str) -> None:
    target = load_target(target_name, dtype=torch.float32)
    assert target.config.vocab_size == 4096
    dflash = load_dflash(drafter_name(target_name, "dflash"))
    DFlashDrafter(dflash, target)  # refuses a drafter made for another target shape
    load_eagle(drafter_name(target_name, "eagle"), target=target)
    load_weaver(drafter_name(target_name, "weaver"), dflash, target)


def test_family_report_writes_everything_and_every_route_is_lossless(tmp_path: Path) -> None:
    cfg = FamilyReportConfig(
        out=str(tmp_path / "r"), figures=str(tmp_path / "f"), corpus=None, suites=["gsm8k"], limit=1,
        new_tokens=8, budget=6, targets=["tiny-gdn"],
    )  # fmt: skip
    out = run_family_report(cfg)
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    routes = ["dflash-chain", "eagle-chain-k6", "ddtree-b6", "eagle-tree-b6", "weaver-b6"]
    assert [r["route"] for r in rows] == routes
    assert all(r["lossless"] and r["mal"] >= 1 and len(r["depth_acceptance"]) == 15 for r in rows)
    assert all(r["mean_tree_size"] <= 7 for r in rows if r["route"].endswith("b6"))
    report = (out / "report.md").read_text()
    assert "every route reproduced AR" in report and "## tiny-gdn" in report
    assert (tmp_path / "f" / "family_depth_acceptance.png").stat().st_size > 1000
    assert json.loads((out / "manifest.json").read_text())["config"]["targets"] == ["tiny-gdn"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--targets", "tiny-llama"], "unknown family target"), (["--suites", "gsm9k"], "unknown suite")],
)
def test_family_report_bad_options_are_one_line_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "repro", "family", "report", "--out", str(tmp_path), *args],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
