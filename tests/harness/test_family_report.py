"""`repro family report`: a tiny run writes every output with every route lossless; divergence is
flagged; a missing corpus leaves the suites; bad options fail in one line with exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from repro.cli import app, main
from repro.harness.family_report import (
    FIGURE,
    MAX_DEPTH,
    ROUTES,
    TREE_ROUTES,
    FamilyReportConfig,
    depth_table,
    flat_table,
    prompt_sets,
    report_markdown,
)
from repro.models.family import FAMILY_DIR
from repro.models.tokenizer import load_tokenizer

TARGET = "tiny-gdn"


@pytest.fixture(scope="module")
def run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny report: one target, one held-out prompt, one gsm8k prompt, 8 new tokens, budget 6."""
    out = tmp_path_factory.mktemp("report") / "run"
    args = [
        "family",
        "report",
        "--out",
        str(out),
        "--figures",
        str(out.parent / "fig"),
        "--corpus",
        str(corpus),
    ]
    args += ["--targets", TARGET, "--prompts", "1", "--suites", "gsm8k", "--limit", "1"]
    args += ["--max-new-tokens", "8"]
    res = CliRunner().invoke(app, [*args, "--budget", "6"])
    assert res.exit_code == 0, res.output
    return out


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_tiny_run_writes_every_output_and_every_route_is_lossless(run: Path) -> None:
    records = rows(run)
    assert [(r["prompt_set"], r["route"]) for r in records] == [
        (s, r) for s in ("heldout", "gsm8k") for r in ROUTES
    ]
    for r in records:
        assert r["target"] == TARGET and r["prompts"] == 1 and r["new_tokens"] == 8
        assert r["lossless"] and r["diverged"] == 0, r
        assert len(r["depth_acceptance"]) == MAX_DEPTH
        assert r["mal"] == pytest.approx((r["new_tokens"] - 1) / r["steps"]), r  # 1st token: prefill
        draft, verify = r["draft_ms_per_step"], r["verify_ms_per_step"]
        assert verify > 0 and (draft > 0 if r["route"] != "ar" else draft < verify)
        assert 1 <= r["mean_tree_size"] <= {"ar": 1, "dflash_chain": 16, "eagle_chain": 7}.get(r["route"], 7)
    ar = [r for r in records if r["route"] == "ar"]
    assert all(r["mal"] == 1.0 and r["steps"] == 7 and not any(r["depth_acceptance"]) for r in ar)
    eagle = [r for r in records if r["route"] == "eagle_chain"]
    assert all(not any(r["depth_acceptance"][6:]) for r in eagle)  # a chain of k=6 drafts

    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["targets"] == [TARGET] and manifest["seed"] == 0 and manifest["git_sha"]
    assert len(manifest["heldout_sha256"]) == 64 and manifest["notes"] == []
    assert set(manifest["family"]) == {TARGET, f"{TARGET}-dflash", f"{TARGET}-eagle", f"{TARGET}-weaver"}

    table = pd.read_csv(run / "table.csv")
    assert len(table) == 3 * len(ROUTES)  # two sets and the pooled rows
    pooled = table[table["prompt_set"] == "all"].set_index("route")
    for route, g in table[table["prompt_set"] != "all"].groupby("route"):
        assert pooled.loc[route, "mal"] == pytest.approx((g["mal"] * g["steps"]).sum() / g["steps"].sum())
    depths = depth_table(table, TARGET)
    assert list(depths["route"]) == list(TREE_ROUTES) and depths.shape == (len(TREE_ROUTES), 1 + MAX_DEPTH)

    report = (run / "report.md").read_text()
    assert (
        "**Lossless: every route reproduced AR's greedy tokens exactly" in report
        and "NOT LOSSLESS" not in report
    )
    assert f"## {TARGET}" in report and "| heldout | gsm8k |" in report and "d15 |" in report
    assert "not speed claims" in report and f"](../fig/{FIGURE})" in report
    assert (run.parent / "fig" / FIGURE).stat().st_size > 0


def test_a_divergence_is_flagged_loudly(run: Path, tmp_path: Path) -> None:
    records = rows(run)
    records[3] = {**records[3], "lossless": False, "diverged": 1}  # heldout / ddtree
    manifest = json.loads((run / "manifest.json").read_text())
    text = report_markdown(flat_table(records), manifest, tmp_path, None)
    assert f"**NOT LOSSLESS: 1 route(s) diverged from AR's greedy output: {TARGET}/heldout/ddtree" in text
    assert "**NO: 1/2 prompts diverged**" in text


def test_missing_corpus_leaves_the_suites_with_a_note(tmp_path: Path) -> None:
    cfg = FamilyReportConfig(
        out=str(tmp_path), figures=str(tmp_path), corpus=str(tmp_path / "none"), suites=["gsm8k"], limit=2
    )
    sets, notes = prompt_sets(load_tokenizer(FAMILY_DIR / TARGET), cfg)
    assert list(sets) == ["gsm8k"] and len(sets["gsm8k"]) == 2
    assert len(notes) == 1 and "heldout.txt is missing" in notes[0]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--targets", "tiny-nope", "unknown target(s) tiny-nope"),
        ("--suites", "gsm9k", "unknown suite 'gsm9k'"),
    ],
)
def test_bad_options_fail_in_one_line(
    monkeypatch, capsys, tmp_path: Path, option: str, value: str, message: str
):
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["repro", "family", "report", "--out", str(out), option, value])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and message in err and len(err.splitlines()) == 1
    assert not out.exists()
