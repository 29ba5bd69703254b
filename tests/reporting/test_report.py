"""Summaries, histograms, the acceptance study, the markdown report and figures."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from repro.errors import ReproError
from repro.reporting.figures import plot_accept_histogram, plot_acceptance
from repro.reporting.records import DecodeRecord, sha256_ids
from repro.reporting.report import (
    DECODE_KIND,
    accept_histogram,
    acceptance_table,
    break_even_p,
    markdown_table,
    paired_speedups,
    summarize,
    write_report,
)
from repro.reporting.rundir import RunDir


def rec(
    route: str,
    suite: str,
    prompt_id: str,
    accepted: list[int],
    decode_s: float,
    turn: int = 0,
    output_ids: list[int] | None = None,
    params: dict | None = None,
    stage: dict[str, float] | None = None,
    prefill_s: float = 0.1,
) -> DecodeRecord:
    n = 1 + sum(accepted)
    out = list(range(n)) if output_ids is None else output_ids
    assert len(out) == n
    return DecodeRecord(
        route=route,
        route_params=params or {"kind": "ar" if route == "ar" else "chain"},
        suite=suite,
        prompt_id=prompt_id,
        turn=turn,
        prompt_sha256=sha256_ids([ord(c) for c in prompt_id]),
        prompt_tokens=5,
        new_tokens=n,
        steps=len(accepted),
        accepted_lengths=accepted,
        tree_sizes=[5] * len(accepted),
        prefill_s=prefill_s,
        decode_s=decode_s,
        stage_s=stage or {"draft": 0.0, "tree": 0.0, "verify": 0.0, "commit": 0.0},
        output_ids=out,
        output_sha256=sha256_ids(out),
        finish_reason="length",
        vs_ar="no reference",
        temperature=0.0,
        seed=0,
    )


def known_records() -> list[DecodeRecord]:
    """s1: AR 10 tok/s, chain 24 tok/s; s2: AR 20 tok/s, chain 40 tok/s (see the tests for the sums)."""
    diverged = list(range(20))
    diverged[5] = 999
    stage = {"draft": 0.03, "tree": 0.01, "verify": 0.1, "commit": 0.02}
    return [
        rec("ar", "s1", "p1", [1] * 9, 1.0),
        rec("chain", "s1", "p1", [4, 4, 1], 0.25, stage=stage),
        rec("ar", "s1", "p2", [1] * 19, 2.0),
        rec("chain", "s1", "p2", [4, 4, 4, 4, 3], 1.0, output_ids=diverged, stage=stage),
        rec("ar", "s2", "p1", [1] * 9, 0.5),  # same prompt id as in s1, another suite
        rec("chain", "s2", "p1", [3, 3, 3], 0.25),
    ]


def row(df: pd.DataFrame, suite: str, route: str) -> pd.Series:
    sel = df[(df["suite"] == suite) & (df["route"] == route)]
    assert len(sel) == 1
    return sel.iloc[0]


def test_summarize_known_numbers():
    df = summarize(known_records())
    assert list(df["route"].unique()) == ["ar", "chain"]
    c1 = row(df, "s1", "chain")
    assert c1["prompts"] == 2 and c1["turns"] == 2 and c1["new_tokens"] == 30
    assert c1["decode_s"] == pytest.approx(1.25)
    assert c1["tokens_per_s"] == pytest.approx(30 / 1.25)  # token-weighted: 24
    assert c1["mean_tokens_per_s"] == pytest.approx((40 + 20) / 2)  # per-record mean: 30
    assert c1["e2e_tokens_per_s"] == pytest.approx(30 / 1.45)
    assert c1["MAL"] == pytest.approx(28 / 8)  # 3.5
    assert c1["MAL_per_prompt"] == pytest.approx((9 / 3 + 19 / 5) / 2)  # 3.4
    assert c1["speedup"] == pytest.approx(24 / 10)
    assert c1["lossless"] == "1/2 identical, 1 diverged"
    assert c1["draft_ms"] == pytest.approx(1000 * 0.06 / 8)
    assert c1["verify_ms"] == pytest.approx(1000 * 0.2 / 8)
    assert c1["step_ms"] == pytest.approx(1000 * 1.25 / 8)
    assert c1["prefill_s"] == pytest.approx(0.1)


def test_speedup_uses_the_same_suite_ar():
    df = summarize(known_records())
    assert row(df, "s2", "chain")["speedup"] == pytest.approx(40 / 20)
    assert row(df, "s1", "ar")["speedup"] == pytest.approx(1.0)
    assert row(df, "s1", "ar")["lossless"] == "reference"
    assert row(df, "s2", "chain")["lossless"] == "1/1 identical"


def test_all_row_pools_every_suites_pairs():
    """The "all" speedup pools every suite's pairs (40 tokens in 1.5 s over AR's 40 in 3.5 s), not the mean
    of the suites' speedups ((2.4 + 2.0) / 2), as its other columns pool the records."""
    df = summarize(known_records())
    a = row(df, "all", "chain")
    assert a["speedup"] == pytest.approx(3.5 / 1.5)
    assert a["tokens_per_s"] == pytest.approx(40 / 1.5)
    assert a["MAL"] == pytest.approx(37 / 11)
    assert a["prompts"] == 3 and a["turns"] == 3
    assert a["lossless"] == "2/3 identical, 1 diverged"


def test_ar_route_found_by_kind_and_missing_reference():
    recs = [
        rec("baseline", "s", "p1", [1] * 9, 1.0, params={"kind": "ar"}),
        rec("fast", "s", "p1", [5, 4], 0.5),
        rec("fast", "s", "p2", [5, 4], 0.5),
    ]
    df = summarize(recs)
    f = row(df, "s", "fast")
    assert f["speedup"] == pytest.approx(20.0 / 10.0)  # paired over p1 only
    assert f["lossless"] == "1/2 identical, 1 no reference"
    no_ar = summarize([rec("fast", "s", "p1", [5, 4], 0.5)])
    assert math.isnan(row(no_ar, "s", "fast")["speedup"])
    assert math.isnan(row(no_ar, "all", "fast")["speedup"])


def test_multi_turn_counts_prompts_and_turns():
    recs = [rec("ar", "mt", "81", [1, 1], 1.0, turn=0), rec("ar", "mt", "81", [1, 1, 1], 1.0, turn=1)]
    r = row(summarize(recs), "mt", "ar")
    assert (r["prompts"], r["turns"], r["new_tokens"]) == (1, 2, 7)


def test_accept_histogram_counts_and_per_position_rates():
    hist = accept_histogram(known_records())
    chain = hist[hist["route"] == "chain"].set_index("length")
    # chain steps: s1 [4,4,1] + [4,4,4,4,3], s2 [3,3,3] -> 11 steps
    assert chain["steps"].to_dict() == {1: 1, 2: 0, 3: 4, 4: 6}
    assert chain.loc[1, "accept_rate"] == pytest.approx(10 / 11)
    assert chain.loc[3, "accept_rate"] == pytest.approx(6 / 11)
    assert chain.loc[3, "cond_accept_rate"] == pytest.approx(6 / 10)
    assert chain.loc[4, "accept_rate"] == 0
    assert chain["share"].sum() == pytest.approx(1.0)
    ar = hist[hist["route"] == "ar"]
    assert ar["length"].tolist() == [1] and ar["steps"].tolist() == [37] and ar["accept_rate"].tolist() == [0]


def test_break_even_p_interpolates():
    table = pd.DataFrame(
        {
            "kind": ["synthetic_chain"] * 8,
            "k": [4, 4, 4, 8, 8, 2, 2, 2],
            "p": [0.2, 0.4, 0.6, 0.2, 0.6, 0.4, 0.2, 0.9],
            "speedup": [0.5, 0.8, 1.2, 0.3, 0.9, 1.5, 1.1, float("nan")],
        }
    )
    be = break_even_p(table)
    assert be[4] == pytest.approx(0.4 + 0.2 * (1 - 0.8) / (1.2 - 0.8))  # 0.5
    assert be[8] is None
    assert be[2] == pytest.approx(0.2)  # the smallest grid point already breaks even
    both = pd.concat([table, table.assign(kind="synthetic_tree")])
    with pytest.raises(ValueError, match="kind"):
        break_even_p(both)
    assert break_even_p(both, kind="synthetic_tree")[4] == pytest.approx(0.5)
    widths = pd.concat([table.assign(width=2.0), table.assign(width=3.0, speedup=table["speedup"] + 0.5)])
    with pytest.raises(ValueError, match="width"):
        break_even_p(widths)
    assert break_even_p(widths, width=3.0)[4] == pytest.approx(0.2)


def synthetic_records() -> list[DecodeRecord]:
    recs = []
    for pid in ("a", "b"):
        recs.append(rec("ar", "s", pid, [1] * 12, 1.0))
        recs.append(
            rec(
                "chain-k2-p0.5",
                "s",
                pid,
                [1, 2, 3, 2, 3, 1],
                1.25,
                params={"kind": "synthetic_chain", "p": 0.5, "k": 2},
            )
        )
        recs.append(
            rec(
                "chain-k2-p0.9",
                "s",
                pid,
                [3, 3, 3, 3],
                0.8,
                params={"kind": "synthetic_chain", "p": 0.9, "k": 2},
            )
        )
    return recs


def test_acceptance_table_from_records():
    table = acceptance_table(synthetic_records())
    assert table["route"].tolist() == ["chain-k2-p0.5", "chain-k2-p0.9"]
    assert table["width"].tolist() == [1.0, 1.0]
    low = table.iloc[0]
    assert low["MAL"] == pytest.approx(2.0)
    assert low["MAL_iid"] == pytest.approx(1 + 0.5 + 0.25)
    assert low["speedup"] == pytest.approx((26 / 2.5) / (26 / 2.0))  # 0.8
    assert table.iloc[1]["speedup"] == pytest.approx((26 / 1.6) / 13)  # 1.25
    assert break_even_p(table)[2] == pytest.approx(0.5 + 0.4 * 0.2 / 0.45)
    bad = [rec("x", "s", "a", [2], 1.0, params={"kind": "synthetic_tree", "k": 2})]
    with pytest.raises(ReproError, match="'p' or 'k'"):
        acceptance_table(bad)
    assert acceptance_table(known_records()).empty


def test_markdown_table_renders_nan_and_escapes():
    df = pd.DataFrame({"route": ["a|b", "c"], "speedup": [1.234, float("nan")], "steps": [3, 4]})
    lines = markdown_table(df).splitlines()
    assert len(lines) == 4
    assert all(line.count("|") - line.count("\\|") == 4 for line in lines)
    assert "1.23x" in lines[2] and "a\\|b" in lines[2]
    assert lines[3].split("|")[2].strip() == "-"
    assert lines[1].split("|")[2].endswith(":")  # numeric column right-aligned


def test_write_report_rebuilds_files_from_records(tmp_path: Path):
    run = RunDir(tmp_path, {"config": {"experiment": "t"}, "seed": 0}, DECODE_KIND)
    for r in known_records() + synthetic_records():
        run.append(r)
    text = write_report(tmp_path)
    assert (tmp_path / "report.md").read_text() == text
    for route in ("ar", "chain", "chain-k2-p0.9"):
        assert f"| {route} " in text
    assert run.manifest["git_sha"] in text and run.manifest["device"] in text
    assert "diverged at token 5" in text
    assert "## Speedup over AR, paired per prompt" in text and "| all (pooled) | chain " in text
    assert "break-even p (synthetic_chain, speedup 1): k=2: p = 0.678" in text
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert set(summary["route"]) == {"ar", "chain", "chain-k2-p0.5", "chain-k2-p0.9"}
    assert "all" in set(summary["suite"])
    hist = pd.read_csv(tmp_path / "histogram.csv")
    assert hist.groupby("route")["steps"].sum()["chain"] == 11
    for png in ("accept_histogram.png", "acceptance.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_write_report_of_an_empty_run(tmp_path: Path):
    RunDir(tmp_path, {"config": {"experiment": "t"}, "seed": 0}, DECODE_KIND)
    (tmp_path / "records.jsonl").touch()
    assert "No records yet" in write_report(tmp_path)
    assert not (tmp_path / "accept_histogram.png").exists()


def test_figures_write_pngs(tmp_path: Path):
    table = acceptance_table(synthetic_records())
    p1 = plot_acceptance(table, tmp_path / "fig" / "acc.png")
    p2 = plot_accept_histogram(accept_histogram(known_records()), tmp_path / "hist.png")
    for p in (p1, p2):
        assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 1000
    with pytest.raises(ReproError):
        plot_acceptance(table.iloc[0:0], tmp_path / "empty.png")


def test_a_figure_is_saved_as_a_palette_png_of_what_matplotlib_draws(tmp_path: Path):
    """save_png keeps the picture (the 256-colour image close to matplotlib's own RGBA rendering, pixel by
    pixel) in far fewer bytes."""
    import io

    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    from repro.reporting.figures import PNG_DPI, save_png

    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    for k in range(6):
        ax.plot(range(40), [np.sin(x / (k + 2)) + k for x in range(40)], marker="o", label=f"k={k}")
    ax.legend()
    ax.grid(True, alpha=0.3)
    FigureCanvasAgg(fig)
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=PNG_DPI, bbox_inches="tight")
    path = save_png(fig, tmp_path / "sub" / "f.png")
    with Image.open(path) as img:
        assert img.mode == "P"
        got = np.asarray(img.convert("RGB"), dtype=float)
    want = np.asarray(Image.open(io.BytesIO(rgba.getvalue())).convert("RGB"), dtype=float)
    assert got.shape == want.shape
    assert np.abs(got - want).mean() < 0.5  # out of 255, averaged over every pixel and channel
    assert path.stat().st_size < 0.6 * len(rgba.getvalue())


def test_an_svg_rebuild_writes_the_same_bytes(tmp_path: Path):
    """Two saves of the same figure (clip paths included: matplotlib draws their ids at random) are equal
    byte for byte, and carry no date."""
    from matplotlib.figure import Figure

    from repro.reporting.figures import save_svg

    def draw(path: Path) -> bytes:
        fig = Figure(figsize=(3, 2))
        ax = fig.add_subplot()
        ax.plot([0, 1, 2], [2, 0, 1])
        ax.set_xlim(0.5, 1.5)  # the line is clipped: a clip path with an id
        return save_svg(fig, path).read_bytes()

    first, second = draw(tmp_path / "a.svg"), draw(tmp_path / "b.svg")
    assert b"clip-path" in first and b"<dc:date>" not in first
    assert first == second


def test_a_refused_record_pairs_with_nothing_in_the_speedup():
    """An external loop refused on one prompt (0 tokens in 0 s) leaves that prompt out of its speedup, so
    AR's time on it does not count against the prompts the loop did run."""
    from dataclasses import replace

    from conftest import make_record

    refused = {"output_ids": [], "accepted_lengths": [], "new_tokens": 0, "decode_s": 0.0}
    recs = [
        make_record("ar", "gsm8k", "p0", accepted=[1] * 9, decode_s=1.0),
        make_record("ar", "gsm8k", "p1", accepted=[1] * 9, decode_s=4.0),
        make_record("x", "gsm8k", "p0", accepted=[3] * 3, decode_s=0.5),
        replace(make_record("x", "gsm8k", "p1"), **refused),
    ]
    table = summarize(recs)
    row = table[(table["route"] == "x") & (table["suite"] == "gsm8k")].iloc[0]
    assert row["speedup"] == pytest.approx(2.0)  # p0 alone: 10 tokens in 0.5 s vs in 1.0 s
    paired = paired_speedups(recs).set_index("suite")
    assert paired.loc["gsm8k", ["prompts", "speedup"]].tolist() == pytest.approx([1, 2.0])  # the same pair


def test_paired_speedups_give_each_suite_and_the_pooled_prompts_with_an_interval():
    """Per suite the summary's speedup with n prompts (no interval below MIN_UNITS); pooled over every
    suite's prompts, token-weighted, with a percentile-bootstrap interval that contains it; a route twice
    as fast on every prompt gets [2, 2]."""
    from conftest import make_record

    from repro.reporting.stats import MIN_UNITS

    records = []
    for suite, n in (("gsm8k", 3), ("humaneval", 4)):
        for i in range(n):
            ar_s = 1.0 + 0.5 * i
            records.append(make_record("ar", suite, f"p{i}", accepted=[1] * 4, decode_s=ar_s))
            records.append(make_record("chain", suite, f"p{i}", accepted=[1] * 4, decode_s=ar_s / 2))
            # uneven: fast on early prompts, slow on late ones
            records.append(
                make_record("tree", suite, f"p{i}", accepted=[1] * 4, decode_s=ar_s * (0.3 + 0.3 * i))
            )
    table = paired_speedups(records)
    summary = summarize(records)
    chain = table[table["route"] == "chain"].set_index("suite")
    assert list(chain.index) == ["gsm8k", "humaneval", "all (pooled)"]
    assert list(chain["prompts"]) == [3, 4, 7]
    assert chain.loc["gsm8k", "speedup"] == pytest.approx(2.0) and math.isnan(chain.loc["gsm8k", "ci_low"])
    assert MIN_UNITS <= 3 + 4
    assert chain.loc["all (pooled)", ["speedup", "ci_low", "ci_high"]].tolist() == pytest.approx([2.0] * 3)
    tree = table[table["route"] == "tree"].set_index("suite")
    for suite in ("gsm8k", "humaneval"):
        want = summary[(summary["route"] == "tree") & (summary["suite"] == suite)]["speedup"].item()
        assert tree.loc[suite, "speedup"] == pytest.approx(want)
    low, value, high = tree.loc["all (pooled)", ["ci_low", "speedup", "ci_high"]]
    assert low < value < high  # prompts differ: a real interval
    assert "ar" not in set(table["route"])
    assert paired_speedups([r for r in records if r.route != "ar"]).empty  # no AR: no pairs
