"""Device stage times in records (``device_stage_s``) and the report's device_step_ms."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import make_record

from repro.reporting.records import DecodeRecord
from repro.reporting.report import DEVICE_COLUMNS, summarize

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
    from repro.reporting.report import build_report
    from repro.reporting.rundir import DECODE_KIND, Run

    ar = dataclasses.replace(make_record(), device_stage_s=DEVICE)
    text = build_report(Run(tmp_path, DECODE_KIND, {}, [ar]), None)
    assert "## Device time per stage" in text
    table = text.split("## Device time per stage")[1].split("##")[0]
    cells = [c.strip() for c in table.strip().splitlines()[-1].strip("|").split("|")]
    assert cells == ["all", "ar", "333.33", "50.00", "10.00", "0.00", "30.00", "10.00"]  # device split
