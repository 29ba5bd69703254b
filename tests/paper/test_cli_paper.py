"""`repro run table2` and `repro sweep` end to end through the CLI on the tiny family (CPU, seconds)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_cli as cli

from repro.harness.run_kinds import load_run, rebuild_report
from repro.paper import table2


def test_run_table2_end_to_end_and_its_report_rebuilds(monkeypatch, capsys, tmp_path: Path):
    out = tmp_path / "t2"
    code, text, err = cli(monkeypatch, capsys, "run", "table2", "--limit", "1", "--max-new-tokens", "8",
                          "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert text.startswith("# Weaver Table 2") and "4.37x" in text and "+77% (budget 64)" in text
    run = load_run(out)
    assert run.manifest["kind"] == "paper-table2"
    kinds = {r.route_params["kind"] for r in run.records}
    assert kinds == {"ar", "dflash_chain", "ddtree", "dflash_tfm"}
    assert {r.route_params["acceptance"] for r in run.records if r.route != "ar"} == {
        "sample_match", "spec_sampling", "traversal"
    }  # fmt: skip
    for r in run.records:  # float64, sample-then-match: AR's tokens exactly
        if r.route_params["acceptance"] == "sample_match" and r.route != "ar":
            assert r.vs_ar == "identical", r.route
    csv = pd.read_csv(out / "table.csv")
    main_table, _ = table2.tables(run.records)
    pd.testing.assert_frame_equal(csv, main_table.reset_index(drop=True), check_dtype=False)
    for row in csv[csv["workload"] == "gsm8k"].itertuples():
        mine = [r for r in run.records if r.route == row.route and r.suite == "gsm8k"]
        assert row.tokens_per_s == pytest.approx(
            sum(r.new_tokens for r in mine) / sum(r.decode_s for r in mine)
        )
    assert (out / "figures" / "table2.png").stat().st_size > 1000 and (
        out / "figures" / "table2.svg"
    ).exists()
    before = (out / "table.csv").read_bytes(), (out / "gains.csv").read_bytes()
    written = (out / "report.md").read_text()
    (out / "report.md").unlink()
    assert rebuild_report(out) == written == (out / "report.md").read_text()  # byte for byte
    assert ((out / "table.csv").read_bytes(), (out / "gains.csv").read_bytes()) == before


def test_sweep_budget_end_to_end(monkeypatch, capsys, tmp_path: Path):
    out = tmp_path / "sw"
    args = ["--limit", "1", "--suites", "gsm8k", "--max-new-tokens", "8", "--routes", "ddtree,specla"]
    code, text, err = cli(monkeypatch, capsys, "sweep", "--budget", "4,8", *args, "--out", str(out))
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "sweep" and manifest["config"]["sweep"] == {
        "param": "budget",
        "values": [4, 8],
    }
    t = pd.read_csv(out / "table.csv")
    assert set(t["route"]) == {"ddtree", "specla"} and sorted(set(t["budget"])) == [4, 8]
    assert set(pd.read_csv(out / "best.csv")["route"]) == {"ddtree", "specla"}
    assert "Best budget per route" in text and (out / "figures" / "sweep.svg").exists()
    for r in load_run(out).records:
        assert r.vs_ar in ("reference", "identical")


def test_sweep_of_another_parameter_keeps_the_routes_budget(monkeypatch, capsys, tmp_path: Path):
    """``--param width=...`` on DFlash-TfM: the tree routes' budget comes from the sweep experiment (32)."""
    out = tmp_path / "sw"
    args = ["--limit", "1", "--suites", "gsm8k", "--max-new-tokens", "8", "--routes", "ar,dflash_tfm"]
    code, _, err = cli(monkeypatch, capsys, "sweep", "--param", "width=1,4", *args, "--out", str(out))
    assert code == 0, err
    t = pd.read_csv(out / "table.csv")
    tfm = t[t["route"] == "dflash_tfm"]
    assert sorted(set(tfm["width"])) == [1, 4]
    specs = json.loads((out / "manifest.json").read_text())["config"]["routes"]
    assert {s.get("budget") for s in specs if s["kind"] == "dflash_tfm"} == {32}
    for r in load_run(out).records:
        assert r.vs_ar in ("reference", "identical")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "4", "--param", "k=2"], "exactly one of"),
        (["--param", "pool"], "NAME=v1,v2"),
        (["--param", "pool=4,8", "--routes", "ddtree"], "has no parameter 'pool'"),
        (["--budget", "0,4", "--routes", "ddtree", "--limit", "1"], "budget must be an integer in [1, 1023]"),
        (["--budget", "4", "--routes", "nosuch"], "no route named (or of kind) 'nosuch'"),
        (["--budget", "16", "--routes", "ar"], "no route takes 'budget' to sweep"),
    ],
)
def test_sweep_bad_input_is_one_line(monkeypatch, capsys, tmp_path: Path, args, message):
    code, _, err = cli(monkeypatch, capsys, "sweep", *args, "--out", str(tmp_path / "x"))
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    shutil.rmtree(tmp_path / "x", ignore_errors=True)
