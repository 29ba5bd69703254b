"""The paper tables recomputed from the records they came from, on planted records."""

from __future__ import annotations

import math

import pytest
from conftest import make_record

from repro.paper import specla_table, sweep, table2
from repro.reporting.report import summarize
from repro.reporting.stats import MIN_UNITS

SUITES = ("mt_bench", "gsm8k", "humaneval")
PAPER = {
    "end_to_end": [
        {"metric": "speedup_vs_ar", "method": "DFlash-TfM", "value": 4.37},
        {"metric": "mal_gain_vs_chain_dflash", "value": 0.77},
        {"metric": "mal_gain_vs_ddtree", "value": 0.32},
    ]
}


def rec(route, kind, suite, pid, accepted, decode_s, rule="sample_match", **params):
    r = make_record(route, suite, pid, 0, accepted=accepted, decode_s=decode_s, kind=kind)
    r.route_params.update(acceptance=rule, **params)
    return r


def table2_records():
    """AR 10 tokens/s; chain MAL 2; DDTree MAL 3 (sample_match) or 4 (traversal); TfM MAL 4 / 6."""
    out = []
    for suite in SUITES:
        for i, pid in enumerate(("p0", "p1", "p2")):
            slow = 1.0 + i  # prompts of different speed: pairing keeps the ratios exact
            out.append(rec("ar", "ar", suite, pid, [1] * 12, 1.2 * slow, rule="greedy"))
            out.append(rec("chain", "dflash_chain", suite, pid, [2] * 6, 0.6 * slow))
            out.append(rec("dd@sm", "ddtree", suite, pid, [3] * 4, 0.6 * slow, budget=64))
            out.append(rec("dd@tr", "ddtree", suite, pid, [4] * 3, 0.5 * slow, "traversal", budget=64))
            out.append(rec("tfm@sm", "dflash_tfm", suite, pid, [4] * 3, 0.4 * slow, budget=64))
            out.append(rec("tfm@tr", "dflash_tfm", suite, pid, [6] * 2, 0.3 * slow, "traversal", budget=64))
    return out


def test_table2_numbers_come_from_the_records():
    records = table2_records()
    main, gains = table2.tables(records, PAPER)
    summary = summarize(records).set_index(["suite", "route"])
    uni = main[main["protocol"] == "uniform"].set_index(["workload", "method"])
    best = main[main["protocol"] == "best-of"].set_index(["workload", "method"])
    assert (
        uni.loc[("gsm8k", "DDTree"), "route"] == "dd@sm" and best.loc[("gsm8k", "DDTree"), "route"] == "dd@tr"
    )
    assert best.loc[("all", "DFlash-TfM"), "route"] == "tfm@tr"
    for row in main.itertuples(index=False):
        mine = [
            r for r in records if r.route == row.route and (row.workload == "all" or r.suite == row.workload)
        ]
        ar = [r for r in records if r.route == "ar" and (row.workload == "all" or r.suite == row.workload)]
        rate = sum(r.new_tokens for r in mine) / sum(r.decode_s for r in mine)
        ar_rate = sum(r.new_tokens for r in ar) / sum(r.decode_s for r in ar)
        assert row.tokens_per_s == pytest.approx(rate)
        assert row.speedup == pytest.approx(rate / ar_rate)
        assert (
            pytest.approx(sum(sum(r.accepted_lengths) for r in mine) / sum(r.steps for r in mine)) == row.MAL
        )
        assert row.n == (9 if row.workload == "all" else 3)
        if row.workload != "all":
            assert row.speedup == pytest.approx(summary.loc[(row.workload, row.route), "speedup"])
        if row.n >= MIN_UNITS:  # every prompt has the same ratio: the interval is degenerate at the value
            assert row.speedup_low == pytest.approx(row.speedup) and row.speedup_high == pytest.approx(
                row.speedup
            )
        else:  # too few prompts for an interval
            assert math.isnan(row.speedup_low) and math.isnan(row.speedup_high)
    assert best.loc[("all", "DFlash-TfM"), "paper_speedup"] == 4.37
    assert math.isnan(uni.loc[("all", "DFlash-TfM"), "paper_speedup"])
    g = gains.set_index(["protocol", "workload", "over"])
    # hand-computed MAL ratios (accepted tokens per verify step, per prompt identical)
    assert g.loc[("uniform", "all", "DFlash (chain)"), "MAL_ratio"] == pytest.approx(4 / 2)  # +100%
    assert g.loc[("uniform", "all", "DDTree"), "MAL_ratio"] == pytest.approx(4 / 3)  # +33%
    assert g.loc[("best-of", "gsm8k", "DDTree"), "MAL_ratio"] == pytest.approx(6 / 4)  # +50%
    assert g.loc[("uniform", "all", "DDTree"), "paper_gain"] == 0.32
    assert math.isnan(g.loc[("uniform", "gsm8k", "DDTree"), "paper_gain"])
    text = table2._gains_text(gains)
    assert "+100% [+100%, +100%]" in set(text["+MAL% [95% CI]"]) and "+77% (budget 64)" in set(text["paper"])


def test_specla_table_mixed_pools_the_three_suites():
    """mixed: MT-Bench's two turns, GSM8K and HumanEval pooled token-weighted (MT-Bench half the tokens, not
    an equal mix); tokens/s and MAL from those suites' records only, not the run's other suites ("all")."""
    records = []
    for j, suite in enumerate((*SUITES, "extra")):
        for pid in ("p0", "p1"):
            for turn in (0, 1) if suite == "mt_bench" else (0,):
                for route, kind, acc, secs in (
                    ("ar", "ar", [1] * 10, 1.0),
                    ("fla", "fla_sd", [2] * 5, 0.8 + 0.2 * j),
                    ("sl", "specla", [5] * 2 if suite != "extra" else [1] * 10, 0.5 + 0.1 * j),
                ):
                    r = make_record(route, suite, pid, turn, accepted=acc, decode_s=secs, kind=kind)
                    r.route_params.update(acceptance="greedy")
                    records.append(r)
    paper = {"end_to_end": [{"metric": "speedup_vs_ar", "suite": s, "value": v}
                            for s, v in (("mixed", 1.42), ("gsm8k", 1.70), ("humaneval", 1.06))]}  # fmt: skip
    t = specla_table.table(records, paper).set_index(["workload", "method"])
    assert list(dict.fromkeys(t.index.get_level_values(0))) == ["mixed", *SUITES, "extra"]
    # mixed, 11 tokens a record: SpecLA 8 records x 11 / (2 x (2 x 0.5 + 0.6 + 0.7)) s, AR 88 / 8 s
    sl = t.loc[("mixed", "SpecLA")]
    assert sl["tokens_per_s"] == pytest.approx(88 / 4.6) and sl["MAL"] == pytest.approx(5.0)
    assert sl["speedup"] == pytest.approx((88 / 4.6) / (88 / 8.0)) and sl["turns"] == 8
    assert sl["n"] == 6 and t.loc[("gsm8k", "SpecLA"), "n"] == 2
    assert specla_table.mixed_shares(records, "ar") == pytest.approx(
        {"mt_bench": 0.5, "gsm8k": 0.25, "humaneval": 0.25}
    )
    assert t.loc[("gsm8k", "SpecLA"), "speedup"] == pytest.approx(1 / 0.6)
    assert t.loc[("gsm8k", "SpecLA"), "paper_speedup"] == 1.70
    assert math.isnan(t.loc[("mixed", "FLA-SD"), "paper_speedup"])


def test_partial_runs_show_missing_rows_instead_of_crashing():
    """A partial sweep / SpecLA run (a route without records in a suite yet): that row is absent, the rest
    of the table is built (it used to raise KeyError: 'specla@budget=32' in repro report)."""
    records = []
    for suite in SUITES:
        for pid in ("p0", "p1"):
            records.append(rec("ar", "ar", suite, pid, [1] * 12, 1.2, rule="greedy"))
            records.append(rec("dd@budget=16", "ddtree", suite, pid, [2] * 6, 0.6, budget=16))
            records.append(rec("sl", "specla", suite, pid, [3] * 4, 0.6, rule="greedy"))
            if suite == "gsm8k":  # the run stopped before the other suites of this value
                records.append(rec("specla@budget=32", "specla", suite, pid, [3] * 4, 0.5, budget=32))
    t = sweep.table(records, "budget")
    part = t[t["route"] == "specla"]
    assert set(part["suite"]) == {"gsm8k", "all"} and len(t[t["route"] == "dd"]) == 4
    s = specla_table.table([r for r in records if not (r.route == "sl" and r.suite == "humaneval")], {})
    sl = s[s["method"] == "SpecLA"]
    assert set(sl["workload"]) == {"mt_bench", "gsm8k"}  # no humaneval row, so no mixed row either
    assert len(s[s["method"] == "AR"]) == 4


def test_sweep_table_and_best_budget():
    records = []
    for pid in ("p0", "p1"):
        records.append(rec("ar", "ar", "gsm8k", pid, [1] * 12, 1.2, rule="greedy"))
        for budget, acc, secs in ((16, 2, 0.6), (32, 3, 0.5), (64, 4, 0.7)):
            records.append(
                rec(f"dd@budget={budget}", "ddtree", "gsm8k", pid, [acc] * (12 // acc), secs, budget=budget)
            )
    t = sweep.table(records, "budget")
    assert list(t[t["suite"] == "gsm8k"]["budget"]) == [16, 32, 64]
    assert list(t[t["suite"] == "gsm8k"]["MAL"]) == [2.0, 3.0, 4.0]
    b = sweep.best(t, "budget").iloc[0]
    assert (b["route"], b["best budget (speedup)"], b["best budget (MAL)"]) == ("dd", 32, 64)
    assert b["speedup"] == pytest.approx(1.2 / 0.5)
    pooled = t[(t["suite"] == "all") & (t["budget"] == 32)].iloc[0]
    assert b["n"] == pooled["n"] == 2  # the best value's speedup states its n and interval beside it
    assert [b["speedup_low"], b["speedup_high"]] == pytest.approx(
        [pooled["speedup_low"], pooled["speedup_high"]], nan_ok=True
    )


class _Run:
    """What ``summary_section`` reads and writes of a run: its records and its files."""

    def __init__(self, records: list) -> None:
        self.records, self.files = records, {}

    def write(self, name: str, text: str) -> None:
        self.files[name] = text


def test_paper_reports_put_wall_over_busy_beside_the_routes():
    """Where graphs ran, the paper reports give each route's wall time a step beside its graphs' busy time:
    a reference the host slowed (AR at 4x its busy time here, as T = 1 AR before 2026-12-05) shows there;
    runs without graphs (CPU) have no such table."""
    from repro.paper.common import summary_section

    records = table2_records()[:2]  # AR (12 steps, 1.2 s) and chain (6 steps, 0.6 s) on one prompt
    assert "Wall time over" not in "\n".join(summary_section(_Run(records)))
    for r, busy in zip(records, (0.3, 0.5)):
        r.device_stage_s = {"draft": 0.0, "tree": 0.0, "verify": r.decode_s, "commit": 0.0}
        r.busy_stage_s = {"draft": 0.0, "tree": 0.0, "verify": busy, "commit": 0.0}
    text = "\n".join(summary_section(_Run(records)))
    table = text[text.index("### Wall time over") :]
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in table.splitlines()[4:6]}
    assert rows == {"ar": "4.00", "chain": "1.20"}
    bound = next(line for line in table.splitlines() if line.startswith("**Host-bound**"))
    assert "ar (4.00)" in bound and "chain" not in bound
