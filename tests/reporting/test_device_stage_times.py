"""Device and graph busy stage times in records (``device_stage_s``, ``busy_stage_s``) and the report."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import make_record

from repro.reporting.records import DecodeRecord
from repro.reporting.report import BUSY_COLUMNS, DEVICE_COLUMNS, summarize

DEVICE = {"draft": 0.03, "tree": 0.0, "verify": 0.09, "commit": 0.03}


def test_records_without_device_times_still_load_and_report_without_the_columns():
    old = make_record().to_dict()
    del old["device_stage_s"]
    rec = DecodeRecord.from_dict(old)
    assert rec.device_stage_s is None
    assert not set(DEVICE_COLUMNS) & set(summarize([rec]).columns)


def test_device_times_round_trip_and_are_reported_per_step():
    ar = dataclasses.replace(make_record(), device_stage_s=DEVICE)  # 3 steps, 1 s of decode
    back = DecodeRecord.from_json(ar.to_json())
    assert back.device_stage_s == DEVICE
    row = summarize([back]).iloc[-1]
    assert row["device_verify_ms"] == pytest.approx(30.0)
    assert row["device_step_ms"] == pytest.approx(50.0)
    assert row["step_ms"] == pytest.approx(1000 / 3)


def test_mixed_runs_give_no_device_numbers_and_bad_device_times_are_refused():
    rows = summarize([make_record(), dataclasses.replace(make_record(prompt_id="p1"), device_stage_s=DEVICE)])
    assert math.isnan(rows.iloc[-1]["device_step_ms"])
    with pytest.raises(ValueError, match="device_stage_s lacks verify"):
        partial = {"draft": 0.0, "tree": 0.0, "commit": 0.0}
        dataclasses.replace(make_record(), device_stage_s=partial).validate()


def test_the_report_shows_the_device_split_per_stage_when_records_have_it(tmp_path):
    from repro.reporting.report import DECODE_KIND, build_report
    from repro.reporting.rundir import Run

    ar = dataclasses.replace(make_record(), device_stage_s=DEVICE)
    text = build_report(Run(tmp_path, DECODE_KIND, {}, [ar]), None)
    assert "## Device time per stage" in text
    table = text.split("## Device time per stage")[1].split("##")[0]
    cells = [c.strip() for c in table.strip().splitlines()[-1].strip("|").split("|")]
    assert cells == ["all", "ar", "333.33", "50.00", "10.00", "0.00", "30.00", "10.00"]  # device split


BUSY = {"draft": 0.01, "tree": 0.0, "verify": 0.06, "commit": 0.005}  # graph replays: within DEVICE


def test_busy_times_round_trip_and_old_records_have_none():
    rec = dataclasses.replace(make_record(), device_stage_s=DEVICE, busy_stage_s=BUSY)
    assert DecodeRecord.from_json(rec.to_json()).busy_stage_s == BUSY
    old = rec.to_dict()
    del old["busy_stage_s"]
    assert DecodeRecord.from_dict(old).busy_stage_s is None
    with pytest.raises(ValueError, match="busy_stage_s lacks commit"):
        dataclasses.replace(rec, busy_stage_s={"draft": 0.0, "tree": 0.0, "verify": 0.0}).validate()


def test_busy_columns_per_step_only_when_records_have_them():
    assert not set(BUSY_COLUMNS) & set(summarize([dataclasses.replace(make_record(), device_stage_s=DEVICE)]))
    rec = dataclasses.replace(make_record(), device_stage_s=DEVICE, busy_stage_s=BUSY)  # 3 steps, 1 s
    row = summarize([rec]).iloc[-1]
    assert row["busy_verify_ms"] == pytest.approx(20.0) and row["busy_draft_ms"] == pytest.approx(10 / 3)
    assert row["busy_step_ms"] == pytest.approx(25.0)
    assert row["wall_over_busy"] == pytest.approx((1000 / 3) / 25.0)
    assert row["device_step_ms"] == pytest.approx(50.0)  # the device columns keep their meaning
    mixed = summarize([rec, dataclasses.replace(make_record(prompt_id="p1"), device_stage_s=DEVICE)])
    assert math.isnan(mixed.iloc[-1]["busy_step_ms"]) and math.isnan(mixed.iloc[-1]["wall_over_busy"])


def test_the_report_shows_busy_time_beside_the_device_split_when_records_have_it(tmp_path):
    from repro.reporting.report import DECODE_KIND, build_report
    from repro.reporting.rundir import Run

    rec = dataclasses.replace(make_record(), device_stage_s=DEVICE, busy_stage_s=BUSY)
    text = build_report(Run(tmp_path, DECODE_KIND, {}, [rec]), None)
    table = text.split("## Device time per stage")[1].split("##")[0]
    lines = [line for line in table.strip().splitlines() if line.startswith("|")]
    assert [c.strip() for c in lines[0].strip("|").split("|")][-6:] == [*BUSY_COLUMNS]
    cells = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert cells[2:8] == ["333.33", "50.00", "10.00", "0.00", "30.00", "10.00"]  # device split as before
    assert cells[8:] == ["25.000", "3.333", "0.000", "20.000", "1.667", "13.33"]
    assert "wall_over_busy = step_ms / busy_step_ms" in table


def test_speedup_bounds_from_the_graphs_busy_time():
    """MAL x the reference's busy ms a token over the route's busy step, then with drafting free, then
    with only verify left; nothing without busy times."""
    from repro.reporting.report import speedup_bounds

    ar = dataclasses.replace(make_record(), device_stage_s=DEVICE, busy_stage_s=BUSY)  # 3 tokens: 25 ms each
    spec_busy = {"draft": 0.03, "tree": 0.003, "verify": 0.06, "commit": 0.012}  # 2 steps: 52.5 ms each
    spec = dataclasses.replace(make_record("dd", accepted=[3, 2], kind="chain"), device_stage_s=DEVICE,
                               busy_stage_s=spec_busy)  # fmt: skip
    bounds = speedup_bounds(summarize([ar, spec])).set_index("route")
    row = bounds.loc["dd"]
    assert row["MAL"] == pytest.approx(2.5) and row["busy_step_ms"] == pytest.approx(52.5)
    assert row["prompts"] == 1  # the table prints n
    assert row["graphs_speedup"] == pytest.approx(2.5 * 25.0 / 52.5)
    assert row["free_draft"] == pytest.approx(2.5 * 25.0 / 36.0)
    assert row["verify_only"] == pytest.approx(2.5 * 25.0 / 30.0)
    assert list(bounds.index) == ["dd"]  # the reference has no row
    assert speedup_bounds(summarize([make_record(), make_record("dd", accepted=[3, 2])])).empty


def test_the_report_shows_the_bounds_with_busy_times(tmp_path):
    from repro.reporting.report import DECODE_KIND, build_report
    from repro.reporting.rundir import Run

    ar = dataclasses.replace(make_record(), device_stage_s=DEVICE, busy_stage_s=BUSY)
    spec = dataclasses.replace(make_record("dd", accepted=[3, 2]), device_stage_s=DEVICE, busy_stage_s=BUSY)
    text = build_report(Run(tmp_path, DECODE_KIND, {}, [ar, spec]), None)
    table = text.split("## What the graphs allow")[1].split("##")[0]
    assert "| dd " in table and "graphs_speedup" in table and "| ar " not in table
    assert "## What the graphs allow" not in build_report(
        Run(tmp_path, DECODE_KIND, {}, [make_record()]), None
    )


def test_outside_the_graphs_per_turn_median_turns_over_twice_it_and_the_worst(tmp_path):
    """A turn's device time outside the replays per launched step: the route's median over its turns, the
    turns above twice it (the host fell behind there), the worst named; launched steps past the end count;
    turns without busy times are left out; the report shows the table only with busy times."""
    from repro.reporting.report import DECODE_KIND, build_report, outside_graphs
    from repro.reporting.rundir import Run

    def turn(pid: str, outside_s: float, launched: int | None = None) -> DecodeRecord:
        device = {**BUSY, "verify": BUSY["verify"] + outside_s}  # the extra device time sits in verify
        rec = make_record("dd", prompt_id=pid, accepted=[3, 2])  # 2 steps
        return dataclasses.replace(rec, device_stage_s=device, busy_stage_s=BUSY, launched_steps=launched)

    recs = [turn("a", 20e-6), turn("b", 30e-6, launched=3), turn("c", 24e-6), turn("d", 120e-6)]
    recs.append(dataclasses.replace(make_record("dd", prompt_id="e", accepted=[3, 2]), device_stage_s=DEVICE))
    row = outside_graphs(recs).set_index("route").loc["dd"]
    # per step: 10, 10 (30 over 3 launched steps), 12, 60 us: median 11, one turn above 22
    assert row["turns"] == 4 and row["outside_us"] == pytest.approx(11.0)
    assert row["over_2x"] == 1 and row["worst_turn"] == "gsm8k/d turn 0"
    assert row["over_2x_at"] == "4" and row["worst_us"] == pytest.approx(60.0)  # the 4th of its turns run
    early = outside_graphs([turn("x", 300e-6), turn("y", 200e-6), *recs[:3]]).set_index("route").loc["dd"]
    assert early["over_2x"] == 2 and early["over_2x_at"] == "1, 2"  # per step 150, 100 | 10, 10, 12
    assert outside_graphs(recs[:3]).set_index("route").loc["dd", "over_2x_at"] == "-"
    ar = dataclasses.replace(make_record(), device_stage_s=DEVICE, busy_stage_s=BUSY)
    text = build_report(Run(tmp_path, DECODE_KIND, {}, [ar, *recs[:-1]]), None)
    assert "## Outside the graphs" in text and "| gsm8k/d turn 0 " in text
    assert outside_graphs([make_record()]).empty
    assert "## Outside the graphs" not in build_report(Run(tmp_path, DECODE_KIND, {}, [make_record()]), None)


def test_host_waits_per_step_beside_wall_over_busy_only_when_records_have_them(tmp_path):
    """``host_wait_s`` (the host's read waits, the graphed engine's records) round-trips, is reported as
    host_wait_ms per verify step after wall_over_busy with its caption, is absent for records without it
    (older runs rebuild as they were), and a negative wait is refused."""
    from repro.reporting.report import DECODE_KIND, WAIT_COLUMNS, build_report
    from repro.reporting.rundir import Run

    rec = dataclasses.replace(make_record(), device_stage_s=DEVICE, busy_stage_s=BUSY, host_wait_s=0.006)
    assert DecodeRecord.from_json(rec.to_json()).host_wait_s == 0.006
    old = rec.to_dict()
    del old["host_wait_s"]
    assert DecodeRecord.from_dict(old).host_wait_s is None
    row = summarize([rec]).iloc[-1]
    assert row["host_wait_ms"] == pytest.approx(2.0)  # 6 ms over 3 steps
    without = dataclasses.replace(rec, host_wait_s=None)
    assert not set(WAIT_COLUMNS) & set(summarize([without]).columns)
    mixed = summarize([rec, dataclasses.replace(without, prompt_id="p1")])
    assert math.isnan(mixed.iloc[-1]["host_wait_ms"])  # all or none: no partial sums
    text = build_report(Run(tmp_path, DECODE_KIND, {}, [rec]), None)
    table = text.split("## Device time per stage")[1].split("##")[0]
    lines = [line for line in table.strip().splitlines() if line.startswith("|")]
    assert [c.strip() for c in lines[0].strip("|").split("|")][-2:] == ["wall_over_busy", "host_wait_ms"]
    assert [c.strip() for c in lines[-1].strip("|").split("|")][-1] == "2.000"
    assert "host_wait_ms: the host's time a step waiting" in table
    assert "host_wait_ms" not in build_report(Run(tmp_path, DECODE_KIND, {}, [without]), None)
    with pytest.raises(ValueError, match="negative time"):
        dataclasses.replace(rec, host_wait_s=-0.001).validate()
