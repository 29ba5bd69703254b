"""The claims ledger: the committed results/CLAIMS.md is what `repro claims` generates, and its values
are the ones recorded in the run directories it names."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from repro.cli import main
from repro.harness import claims
from repro.reporting.rundir import restore_records

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


def _raw_records(source: str) -> list[dict]:
    """The records of the committed run ``source`` as JSON objects (archived or not)."""
    from repro.reporting.rundir import records_bytes

    return [json.loads(x) for x in (records_bytes(RESULTS / source / "records.jsonl") or b"").splitlines()]


def test_values_are_read_from_the_named_records():
    rows = {r["id"]: r for r in claims.ledger(RESULTS)}
    w5 = rows["W5"]
    recs = _raw_records(w5["source"])
    pools = [r for r in recs if r["record"] == "pool" and r["k"] == 512]
    kept = 1 - sum(r["mean_outside"] * r["positions"] for r in pools) / sum(r["positions"] for r in pools)
    assert w5["measured"] == pytest.approx(kept) and w5["ratio"] == pytest.approx(kept / 0.978)
    w3 = rows["W3"]  # MAL per verify step, pooled over the prompts, DFlash-TfM over chain DFlash
    t2 = _raw_records(w3["source"])

    def mal(route: str) -> float:
        g = [r for r in t2 if r.get("route") == route]
        return sum(sum(r["accepted_lengths"]) for r in g) / sum(r["steps"] for r in g)

    tfm, chain = mal("dflash-tfm-b64@sample_match"), mal("dflash-chain@sample_match")
    assert w3["measured"] == pytest.approx(tfm / chain - 1)
    w2 = rows["W2"]  # interactivity: DFlash-TfM's tokens/s per sequence over chain DFlash's, best-of protocol
    t2 = _raw_records(w2["source"])
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


def test_a_verdict_names_the_card_its_run_measured_on(tmp_path):
    """A note's {card} is the GPU of the run the value came from (a rerun on another card says so)."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS / "2026-12-05-h100-scale-rows" / "paper-mal-1.3b", results / "run")
    only = tuple(c for c in claims.CLAIMS if c.id == "S1-scale")
    assert "shape on an H100, the paper's MAL" in claims.ledger(results, only)[0]["verdict"]
    manifest_path = results / "run" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["device_info"]["cuda"] = "NVIDIA H200"
    manifest_path.write_text(json.dumps(manifest))
    verdict = claims.ledger(results, only)[0]["verdict"]
    assert "shape on an H200, the paper's MAL" in verdict and "{card}" not in verdict


def test_scale_claims_read_the_replayed_acceptance_rows():
    """W1-scale / S1-scale: the speedup of the route at the paper's shape in the latest bench-scale run on the
    GPU engine, with the paper's MAL replayed (its summary table), never a superseded run's."""
    from repro.bench.scale import summary_table

    rows = {r["id"]: r for r in claims.ledger(RESULTS)}
    for cid, shape, route in (("W1-scale", "qwen3.6-27b", "dflash_tfm"), ("S1-scale", "gdn-1.3b", "specla")):
        row = rows[cid]
        assert row["source"] is not None and row["source"] != "2026-12-01-h200-scale-rows/paper-mal"
        recs = _raw_records(row["source"])
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
    assert claims.verdict(at_least, 1.0, math.nan) == "not measured"  # not a refutation
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


def test_the_production_tree_claim_reads_the_newest_129_node_row():
    """W9 (the paper's 129-node production tree, us per layer, lower is better): the newest kernel bench with
    a 129-node Weaver verify row decides, at the best tree kernel there; a newer bench without that size
    (the T = 16..256 sweeps) does not hide it; the per-branch baseline's row never counts."""
    (w9,) = (c for c in claims.CLAIMS if c.id == "W9")
    assert w9.judge == "at_most" and w9.value(
        claims.yaml.safe_load((claims.BASELINES / "weaver.yaml").read_text())
    )

    def row(t: int, method: str, us: float) -> dict:
        return dict(shape="weaver", group="verify", kind="draft", T=t, method=method, dtype="bf16",
                    status="ok", us_graph=us)  # fmt: skip

    slots = ("slots", [row(129, "per_branch_recurrent", 50.0), row(129, "tree_fused", 112.7),
                       row(129, "tree_split", 74.6)])  # fmt: skip
    sweep = ("sweep", [row(128, "tree_split", 32.7), row(256, "tree_split", 93.5)])
    assert claims._latest_hit(w9, [sweep, slots]) == ("slots", 74.6)
    assert (
        claims.verdict(w9, 87.0, 74.6) == "reproduced"
        and claims.verdict(w9, 87.0, 87.0 * (1 + w9.tolerance) * 1.01) == "not reproduced"
    )
    rows = {r["id"]: r for r in claims.ledger(RESULTS)}
    runs = dict(claims.latest_runs(RESULTS, w9.kind, w9.gpu_only, w9.conditions))
    source = runs[rows["W9"]["source"]]  # a committed bench with a 129-node Weaver verify row decides
    assert any(r["shape"] == "weaver" and r["group"] == "verify" and r["T"] == 129 for r in source)
    assert rows["W9"]["measured"] < 87.0


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


def _claim(cid: str) -> claims.Claim:
    return next(c for c in claims.CLAIMS if c.id == cid)


def _acceptance(monkeypatch, grids: dict[str, dict[int, list[tuple[float, float]]]]) -> None:
    """Each planted run's records are its name; its acceptance table is ``grids[name]``: k -> (p, speedup)."""
    import pandas as pd

    import repro.reporting.report as report

    def table(records):
        rows = [dict(kind="synthetic_chain", width=1, k=k, p=p, speedup=s)
                for k, pts in grids[records[0]].items() for p, s in pts]  # fmt: skip
        return pd.DataFrame(rows, columns=["kind", "width", "k", "p", "speedup"])

    monkeypatch.setattr(report, "acceptance_table", table)


def test_s6_judges_every_draft_length(monkeypatch):
    """S6 ("unprofitable below ~0.7 at every draft length"): the k farthest from 0.7 decides (the committed
    run's k=2 breaks even at 0.596, inside 0.7 +- 15% by 0.001: reproduced), a newer run where some k never
    breaks even is read and refutes (it used to return None and fall back to an older run), and the per-k
    values are in the text."""
    s6 = _claim("S6")
    rows = {r["id"]: r for r in claims.ledger(RESULTS, (s6,))}
    assert rows["S6"]["measured"] == pytest.approx(0.596, abs=1e-3)
    text = rows["S6"]["verdict"]
    assert text.startswith("reproduced") and "0.596 / 0.793 / 0.724 at k = 2 / 4 / 8" in text
    assert claims.verdict(s6, 0.7, 0.594) == "not reproduced"  # just past the bound: the knife edge
    _acceptance(monkeypatch, {
        "good": {2: [(0.6, 0.9), (0.8, 1.1)], 4: [(0.6, 0.95), (0.8, 1.05)]},  # both k break even at 0.7
        "never": {2: [(0.6, 0.9), (0.8, 1.1)], 4: [(0.6, 0.5), (0.9, 0.8)]},  # k=4 never profitable
        "nan": {2: [(0.6, math.nan), (0.8, math.nan)], 4: [(0.6, 0.95), (0.8, 1.05)]},
    })  # fmt: skip
    assert claims._latest_hit(s6, [("good", ["good"])]) == ("good", pytest.approx(0.7))
    assert claims.verdict(s6, 0.7, 0.7) == "reproduced"
    hit = claims._latest_hit(s6, [("never", ["never"]), ("good", ["good"])])
    assert hit == ("never", math.inf) and claims.verdict(s6, 0.7, hit[1]) == "not reproduced"
    assert "never" in claims._break_even_detail(["never"])
    rel, v = claims._latest_hit(s6, [("nan", ["nan"]), ("good", ["good"])])
    assert rel == "nan" and claims.verdict(s6, 0.7, v) == "not measured"


def test_a_nan_measurement_is_not_measured_and_is_not_skipped(monkeypatch):
    """A run that holds the row with a NaN speedup decides the verdict ("not measured"), rather than an older
    run being read in its place; only an absent row falls back."""
    import pandas as pd

    import repro.bench.scale as scale

    monkeypatch.setattr(scale, "summary_table", lambda recs: pd.DataFrame(
        [dict(shape="qwen3.6-27b", route="dflash_tfm", acceptance="paper-mal", speedup=r["speedup"])
         for r in recs], columns=["shape", "route", "acceptance", "speedup"]))  # fmt: skip
    w1 = _claim("W1-scale")
    new, old = [{"status": "ok", "speedup": math.nan}], [{"status": "ok", "speedup": 4.9}]
    rel, v = claims._latest_hit(w1, [("new", new), ("old", old)])
    assert rel == "new" and claims.verdict(w1, 4.37, v) == "not measured"
    assert claims._latest_hit(w1, [("empty", []), ("old", old)]) == ("old", 4.9)


def test_mal_gains_are_read_at_the_papers_setting(tmp_path):
    """W3/W4 (MAL +77% / +32%, budget 64, T=1): from a Table 2 run at T=1 with both trees of 64 nodes (its
    gains table, uniform protocol), not the budget-32 greedy family report; a run at another temperature or
    budget is not read."""
    import pandas as pd

    rows = {r["id"]: r for r in claims.ledger(RESULTS)}
    src = rows["W3"]["source"]  # the newest committed Table 2 run at the paper's setting
    config = json.loads((RESULTS / src / "manifest.json").read_text())["config"]
    budgets = {r["kind"]: r.get("budget") for r in config["routes"]}
    assert config["temperature"] == 1.0 and budgets["ddtree"] == budgets["dflash_tfm"] == 64
    gains = pd.read_csv(RESULTS / src / "gains.csv")
    uni = gains[(gains["protocol"] == "uniform") & (gains["workload"] == "all")].set_index("over")
    for cid, over in (("W3", "DFlash (chain)"), ("W4", "DDTree")):
        assert rows[cid]["source"] == src and "T=1, both trees of 64 nodes" in rows[cid]["verdict"]
        assert rows[cid]["measured"] == pytest.approx(uni.loc[over, "MAL_ratio"] - 1)
    results = tmp_path / "results"
    shutil.copytree(RESULTS / src, results / "run", ignore=shutil.ignore_patterns("figures"))
    only = tuple(c for c in claims.CLAIMS if c.id in ("W1", "W3"))
    assert [r["source"] for r in claims.ledger(results, only)] == ["run", "run"]
    manifest_path = results / "run" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["config"]["temperature"] = 0.0  # a greedy table 2 run: not the paper's setting
    manifest_path.write_text(json.dumps(manifest))
    for r in claims.ledger(results, only):
        assert r["measured"] is None and "temperature=1.0" in r["verdict"]
    from repro.harness.run_kinds import load_run

    recs = load_run(results / "run").records
    assert claims._table2_mal_gain("DDTree")(recs) == pytest.approx(uni.loc["DDTree", "MAL_ratio"] - 1)
    assert claims._table2_mal_gain("DDTree", budget=32)(recs) is None


def test_a_host_bound_table_run_is_named_in_the_verdict(tmp_path):
    """A GPU Table 2 run whose AR spent 5x its graphs' busy time a step (the host set its pace: T = 1 AR
    until 2026-12-05) gets the caveat in W1's verdict; the committed run, 1.02-1.09, does not."""
    rows = {r["id"]: r for r in claims.ledger(RESULTS)}
    assert "host-bound" not in rows["W1"]["verdict"]
    results = tmp_path / "results"
    shutil.copytree(RESULTS / rows["W1"]["source"], results / "run", ignore=shutil.ignore_patterns("figures"))
    restore_records(results / "run")  # the committed run is archived (repro archive): its records.jsonl back
    path = results / "run" / "records.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for r in recs:
        if r["route"] == "ar":
            r["busy_stage_s"] = {k: v / 5 for k, v in r["busy_stage_s"].items()}
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    only = tuple(c for c in claims.CLAIMS if c.id == "W1")
    (row,) = claims.ledger(results, only)
    assert row["source"] == "run" and "host-bound routes in that run" in row["verdict"]
    assert "ar 5." in row["verdict"] and "dflash" not in row["verdict"].split("host-bound")[1]


def _bench(rows, method="tree_split", group="verify", dtype="bf16"):
    return [dict(shape="specla", group=group, kind="draft", T=t, depth=d, method=method, dtype=dtype,
                 status="ok", speedup_graph=v) for t, d, v in rows]  # fmt: skip


def test_a_range_claim_tests_both_ends():
    """S4 (1.8-7.1x over tree sizes): the lowest size's best kernel against the low end and the highest
    against the high end, each size from its newest run; the best row alone (3.5x) used to reproduce it."""
    s4 = _claim("S4")
    new = ("new", _bench([(128, 16, 3.5)]) + _bench([(128, 16, 1.3)], method="tree_fused"))
    old = ("old", _bench([(64, 13, 1.2), (128, 16, 2.0)]))
    src, lo, hi, text = claims._range_hit(s4, [new, old])
    assert (lo, hi) == (1.2, 3.5) and src == "new, old" and "64/13, 128/16" in text
    assert claims.verdict(s4, 1.8, lo, hi, 7.1) == "not reproduced"
    assert claims.verdict(s4, 1.8, 1.7, 6.5, 7.1) == "reproduced"  # both ends within 10%
    assert claims.verdict(s4, 1.8, 2.0, 3.5, 7.1) == "not reproduced"  # the high end missed
    rows = {r["id"]: r for r in claims.ledger(RESULTS, (s4, _claim("S5")))}
    for cid in ("S4", "S5"):
        assert rows[cid]["measured_high"] >= rows[cid]["measured"]
        assert rows[cid]["verdict"].startswith("not reproduced") and "measured " in rows[cid]["verdict"]


def test_partly_superseded_rows_do_not_decide_a_claim():
    """A partly superseded run (supersedes.json "partly": true): its rows of a family the run in ``by``
    re-measured are dropped for a row claim, whatever their size; a one-value claim skips the run when ``by``
    holds the value; the rest of the run stands."""
    s4 = _claim("S4")
    partial = ("partial", _bench([(16, 7, 1.26), (64, 13, 1.22)]) + _bench([(16, 7, 1.9)], group="recovery"))
    by = _bench([(128, 16, 1.4)])
    kept = claims.without_superseded_parts(s4, [partial], {"partial": by})
    assert [r["group"] for r in kept[0][1]] == ["recovery"]
    assert claims._range_hit(s4, kept) is None
    w7 = _claim("W7-T16")
    weaver = [dict(r, shape="weaver", method="tree_fused", us_graph=9.0) for r in _bench([(16, 7, 1.2)])]
    only_weaver = [("partial", weaver)]
    assert claims.without_superseded_parts(w7, only_weaver, {"partial": by}) == only_weaver
    assert claims.without_superseded_parts(w7, [("partial", weaver)], {"partial": weaver}) == []
    committed = claims.partly_superseded(RESULTS, "bench-kernels")
    assert committed and "2026-11-30-h200-kernels/bench-kernels" not in committed  # superseded whole
    rows = {r["id"]: r for r in claims.ledger(RESULTS, (s4, w7))}
    assert "2026-11-30-h200-kernels/bench-kernels" not in rows["S4"]["source"]
    newest = claims.latest_runs(RESULTS, w7.kind, w7.gpu_only, w7.conditions)
    with_t16 = [
        rel
        for rel, recs in newest
        if any(r["shape"] == "weaver" and r["group"] == "verify" and r["T"] == 16 for r in recs)
    ]
    assert rows["W7-T16"]["source"] == with_t16[0]  # the newest run with a T = 16 verify row
    assert "2026-11-30-h200-kernels/bench-kernels" not in dict(newest)


def test_check_exits_3_when_a_verdict_changed(monkeypatch, capsys, tmp_path):
    """``repro claims --check``: writes nothing, exit 0 when every verdict is the committed one, 3 when one
    differs (here a committed "reproduced" that the results now refute)."""
    committed = (RESULTS / "CLAIMS.md").read_text()
    monkeypatch.setattr(sys, "argv", ["repro", "claims", "--results", str(RESULTS), "--check"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0 and (RESULTS / "CLAIMS.md").read_text() == committed
    line = next(x for x in committed.splitlines() if x.startswith("| W3 |"))
    tampered = tmp_path / "CLAIMS.md"
    tampered.write_text(committed.replace(line, line.replace("| not reproduced (", "| reproduced (")))
    assert claims.verdict_changes(tampered.read_text(), committed) == ["W3: reproduced -> not reproduced"]
    monkeypatch.setattr(sys, "argv", ["repro", "claims", "--results", str(RESULTS), "--check", "--out",
                                      str(tampered)])  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 3 and "W3: reproduced -> not reproduced" in capsys.readouterr().err


def test_the_ledger_is_never_written_over_a_file_it_did_not_write(monkeypatch, capsys, tmp_path):
    """--out naming another file (a run's records) is refused in one line and left as it was; an earlier
    ledger is rewritten."""
    from conftest import run_cli

    records = tmp_path / "records.jsonl"
    records.write_text('{"route": "ar"}\n')
    code, _, err = run_cli(monkeypatch, capsys, "claims", "--results", str(RESULTS), "--out", str(records))
    assert code == 2 and len(err.splitlines()) == 1 and str(records) in err, err
    assert records.read_text() == '{"route": "ar"}\n'
    ledger = tmp_path / "CLAIMS.md"
    ledger.write_text("# Claims ledger\n\nstale\n")
    assert run_cli(monkeypatch, capsys, "claims", "--results", str(RESULTS), "--out", str(ledger))[0] == 0
    assert ledger.read_text() == (RESULTS / "CLAIMS.md").read_text()


def test_the_interactivity_gain_is_paired_per_prompt():
    """W2 (DFlash-TfM's tokens/s over chain DFlash's): the paired ratio of the reports (stats.compare over
    the prompt turns both routes hold), not each route's pooled tokens/s over whatever records it has: with
    one chain DFlash record missing (an interrupted run) the two differ, and the claim reads the paired."""
    from repro.harness.run_kinds import load_run
    from repro.paper.table2 import protocol_routes, suites_of
    from repro.reporting.stats import SPEEDUP, compare

    src = "2026-12-02-h200-pipelined-sampling/table2-bf16-graphed"
    recs = load_run(RESULTS / src).records
    best = protocol_routes(recs)["best-of"]
    tfm, chain = best["dflash_tfm"], best["dflash_chain"]
    read = claims._table2_gain("DFlash-TfM", "DFlash (chain)")
    assert read(recs) == pytest.approx(compare(recs, tfm, chain, suites_of(recs), SPEEDUP).value - 1)
    fastest = max((r for r in recs if r.route == chain), key=lambda r: r.new_tokens / r.decode_s)
    fewer = [r for r in recs if r is not fastest]
    assert protocol_routes(fewer)["best-of"] == best
    paired = compare(fewer, tfm, chain, suites_of(fewer), SPEEDUP).value - 1

    def pooled(route: str) -> float:
        g = [r for r in fewer if r.route == route]
        return sum(r.new_tokens for r in g) / sum(r.decode_s for r in g)

    assert abs(paired - (pooled(tfm) / pooled(chain) - 1)) > 1e-4  # the unpaired ratio is another number
    assert read(fewer) == pytest.approx(paired, rel=1e-12)
