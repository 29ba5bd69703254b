"""The claims ledger: the committed results/CLAIMS.md is what `repro claims` generates, and its values
are the ones recorded in the run directories it names."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from repro.cli import main
from repro.harness import claims

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_committed_claims_are_what_the_command_generates():
    assert (RESULTS / "CLAIMS.md").read_text() == claims.claims_markdown(RESULTS)


def test_every_baseline_claim_has_a_row_and_a_verdict():
    rows = {r["id"]: r for r in claims.ledger(RESULTS)}
    assert {"W1", "W3", "W4", "W5", "W7-T128", "W8-T128", "S1", "S4", "S5", "S6"} <= set(rows)
    heads = {r["verdict"].split(" (")[0].split(":")[0] for r in rows.values()}
    assert heads <= {"reproduced", "not reproduced", "not yet measured", "not testable here"}
    assert rows["W1"]["command"] == "repro run table2" and rows["W1"]["source"].endswith("-graphed")
    assert rows["S1"]["source"].endswith("specla-bf16-graphed") and rows["S1"]["measured"] < 1.42
    assert rows["W6"]["verdict"].startswith("not testable here: ")


def test_values_are_read_from_the_named_records():
    rows = {r["id"]: r for r in claims.ledger(RESULTS)}
    w5 = rows["W5"]
    recs = [json.loads(x) for x in (RESULTS / w5["source"] / "records.jsonl").read_text().splitlines()]
    pools = [r for r in recs if r["record"] == "pool" and r["k"] == 512]
    kept = 1 - sum(r["mean_outside"] * r["positions"] for r in pools) / sum(r["positions"] for r in pools)
    assert w5["measured"] == pytest.approx(kept) and w5["ratio"] == pytest.approx(kept / 0.978)
    w3 = rows["W3"]
    fam = [json.loads(x) for x in (RESULTS / w3["source"] / "records.jsonl").read_text().splitlines()]

    def mal(route: str) -> float:
        g = [r for r in fam if r["target"] == "tiny-qwen35" and r["route"] == route]
        return sum(r["mal"] * r["steps"] for r in g) / sum(r["steps"] for r in g)

    assert w3["measured"] == pytest.approx(mal("weaver") / mal("dflash_chain") - 1)
    w2 = rows["W2"]  # interactivity: DFlash-TfM's tokens/s per sequence over chain DFlash's, best-of protocol
    t2 = [json.loads(x) for x in (RESULTS / w2["source"] / "records.jsonl").read_text().splitlines()]
    assert w2["source"].endswith("table2-bf16-graphed")

    def tok_s(route: str) -> float:  # pooled over the prompts: tokens over decode seconds
        g = [r for r in t2 if r.get("route") == route]
        return sum(len(r["output_ids"]) - 1 for r in g) / sum(r["decode_s"] for r in g)

    assert w2["measured"] == pytest.approx(
        tok_s("dflash-tfm-b64@sample_match") / tok_s("dflash-chain@sample_match") - 1, rel=0.05
    )


def test_end_to_end_speedups_are_read_from_gpu_runs_only(tmp_path):
    """CPU and eager runs' tokens/s time Python: the SpecLA speedups are "not yet measured" from them;
    the same records under a CUDA manifest of the graphed engine are read, and equal the run's table."""
    import pandas as pd

    results = tmp_path / "results"
    shutil.copytree(RESULTS / "2026-12-01-cpu-specla", results / "run")
    only = tuple(c for c in claims.CLAIMS if c.id in ("S1", "S2"))
    rows = {r["id"]: r for r in claims.ledger(results, only)}
    assert rows["S1"]["measured"] is None and "no run on the GPU engine yet" in rows["S1"]["verdict"]
    manifest_path = results / "run" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["device_info"]["cuda"] = "NVIDIA H200"
    manifest["config"]["engine"] = "eager"
    manifest_path.write_text(json.dumps(manifest))
    assert all(r["measured"] is None for r in claims.ledger(results, only))
    manifest["config"]["engine"] = "graphed"
    manifest_path.write_text(json.dumps(manifest))
    rows = {r["id"]: r for r in claims.ledger(results, only)}
    table = pd.read_csv(RESULTS / "2026-12-01-cpu-specla" / "table.csv")
    want = table[(table["method"] == "SpecLA") & (table["workload"] == "gsm8k")]["speedup"].iloc[0]
    assert rows["S2"]["measured"] == pytest.approx(want) and rows["S2"]["source"] == "run"


def test_scale_claims_read_the_replayed_acceptance_rows():
    """W1-scale / S1-scale: the speedup of the route at the paper's shape in the latest bench-scale run on the
    GPU engine, with the paper's MAL replayed (its summary table), never a superseded run's."""
    from repro.bench.scale import summary_table

    rows = {r["id"]: r for r in claims.ledger(RESULTS)}
    for cid, shape, route in (("W1-scale", "qwen3.6-27b", "dflash_tfm"), ("S1-scale", "gdn-1.3b", "specla")):
        row = rows[cid]
        assert row["source"] is not None and row["source"] != "2026-12-01-h200-scale-rows/paper-mal"
        recs = [json.loads(x) for x in (RESULTS / row["source"] / "records.jsonl").read_text().splitlines()]
        t = summary_table(recs)
        hit = t[(t["shape"] == shape) & (t["route"] == route)]
        assert hit["acceptance"].iloc[0].startswith("paper-mal")
        assert row["measured"] == pytest.approx(float(hit["speedup"].iloc[0]))
        assert "not a real-checkpoint number" in row["verdict"]


def test_planted_verdicts_and_a_missing_kind():
    at_least = claims.Claim("x", "weaver", "k", lambda b: 1.0, "s", "c", "k")
    at_most = claims.Claim("y", "weaver", "k", lambda b: 1.0, "s", "c", "k", judge="at_most")
    assert claims.verdict(at_least, 1.0, 0.91) == "reproduced"
    assert claims.verdict(at_least, 1.0, 0.89) == "not reproduced"
    assert claims.verdict(at_most, 1.0, 1.09) == "reproduced" and claims.verdict(at_most, 1.0, 1.2) == (
        "not reproduced"
    )
    about = claims.Claim("a", "specla", "k", lambda b: 0.7, "s", "c", "k", judge="about", tolerance=0.15)
    assert (
        claims.verdict(about, 0.7, 0.79) == "reproduced" and claims.verdict(about, 0.7, 0.61) == "reproduced"
    )
    assert claims.verdict(about, 0.7, 0.81) == "not reproduced" == claims.verdict(about, 0.7, 0.59)
    ghost = claims.Claim("z", "weaver", "k", lambda b: 2.0, "s", "repro run z", "no-such-kind", lambda r: 1.0)
    (row,) = claims.ledger(RESULTS, (ghost,))
    assert row["verdict"] == "not yet measured" and row["measured"] is None


def test_the_command_writes_claims_md(monkeypatch, capsys, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    (copy / "CLAIMS.md").unlink()
    monkeypatch.setattr(sys, "argv", ["repro", "claims", "--results", str(copy)])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0
    assert (copy / "CLAIMS.md").read_text() == (RESULTS / "CLAIMS.md").read_text()
    monkeypatch.setattr(sys, "argv", ["repro", "claims", "--results", str(tmp_path / "none")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2


def test_a_best_row_claim_keeps_each_size_from_its_newest_run():
    """S4 (the best tree size): a newer kernel bench of other sizes does not hide an older size's best
    speedup, and a newer bench of the same size replaces it (even when lower); runs come newest first."""
    (s4,) = (c for c in claims.CLAIMS if c.id == "S4")
    assert s4.row_key is not None

    def bench(rows: list[tuple[int, float]], status: str = "ok") -> list[dict]:
        ok = status == "ok"
        return [dict(shape="specla", group="verify", kind="draft", T=t, method="tree_split", dtype="bf16",
                     status=status, speedup_graph=v if ok else None) for t, v in rows]  # fmt: skip

    old, new = ("old", bench([(128, 3.4), (64, 2.0)])), ("new", bench([(65, 1.8), (129, 1.7)]))
    assert claims._best_row_hit(s4, [new, old]) == ("old", 3.4)
    assert claims._latest_hit(s4, [new, old]) == ("new", 1.8)  # what the newest run alone would say
    newest = ("newest", bench([(128, 2.9)]))
    assert claims._best_row_hit(s4, [newest, new, old]) == ("newest", 2.9)  # 128 re-measured
    skipped = ("skipped", bench([(128, 0.0)], status="skipped"))  # out of its time budget: not a measurement
    assert claims._best_row_hit(s4, [skipped, new, old]) == ("old", 3.4)
    assert claims._best_row_hit(s4, []) is None


def test_a_scale_claim_says_when_its_run_replayed_one_draw_for_all_prompts():
    """W1-scale / S1-scale: a source run whose replayed records carry no per-prompt acceptance seed (before
    the fix) is flagged in the verdict; one that does is not."""
    (w1,) = (c for c in claims.CLAIMS if c.id == "W1-scale")
    assert w1.caveat is not None
    old = [{"status": "ok", "acceptance": None}, {"status": "ok", "acceptance": {"mal": 10.2}}]
    new = [
        {"status": "ok", "acceptance": None},
        {"status": "ok", "acceptance": {"mal": 10.2}, "acceptance_seed": 7},
    ]
    assert "one acceptance draw" in w1.caveat(old)
    assert w1.caveat(new) is None and w1.caveat(old[:1]) is None
