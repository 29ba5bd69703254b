"""External routes in ``repro run``: another implementation's loop beside repro's own routes on the same
prompts, in the same run directory, judged against the run's AR (today's findings on tiny-qwen35 in
float64, per transformers version: tests/external_findings.py; transformers' plain generate is identical
in every version); resume; a missing package refused up front."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from repro.engines import catalog
from repro.harness import runner

pytest.importorskip("transformers", reason="external routes run transformers' loops")
pytest.importorskip("dflash.model", reason="the external route runs the dflash package's loop")

from external_findings import (  # noqa: E402 - after the skips: it imports transformers
    CHANGED,
    DFLASH_DIVERGES,
    RECORDS_RECURRENT_STATES,
    assisted_verdict,
    dflash_loop_verdict,
)

NEW = 16
PINNED = {(*key.split("/"), 0): key for key in DFLASH_DIVERGES}  # (suite, prompt, turn) -> "suite/id"
ROUTES = [
    {"kind": "ar"},
    {"kind": "dflash_chain"},
    {"name": "zlab", "kind": "external", "engine": "dflash-generate"},
    {"name": "hf-ar", "kind": "external", "engine": "transformers-generate"},
    {"name": "hf-assisted", "kind": "external", "engine": "transformers-assisted"},
]


def experiment(tmp_path: Path, routes: list[dict], **settings) -> str:
    raw = {
        "name": "ext", "target": "tiny-qwen35", "dtype": "float64", "device": "cpu",
        "suites": ["gsm8k", "mt_bench"], "limit": 1, "max_new_tokens": NEW, "ignore_eos": True, "warmup": 0,
        "routes": routes, **settings,
    }  # fmt: skip
    path = tmp_path / "ext.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_external_routes_beside_repro_routes_with_verdicts_and_resume(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(monkeypatch, capsys, "run", experiment(tmp_path, ROUTES), "--out", str(out))
    assert code == 0, err  # an external loop's divergence is its finding, not a failed run
    assert "15 new record(s)" in err  # 3 prompt turns (MT-Bench has two) x 5 routes
    recs = records(out)
    by = {(r["route"], r["suite"], r["prompt_id"], r["turn"]): r for r in recs}
    turns = sorted({k[1:] for k in by})
    assert {k for k in turns if k in PINNED} == set(PINNED), "the suite sample changed: re-pick the pins"
    for turn in turns:
        assert by[("ar", *turn)]["vs_ar"] == "reference"
        assert by[("dflash_chain", *turn)]["vs_ar"] == "identical"
        assert by[("hf-ar", *turn)]["vs_ar"] == "identical"  # transformers' own AR: not a rounding effect
        assisted = by[("hf-assisted", *turn)]
        now, was = assisted["vs_ar"], assisted_verdict()
        assert now == was, CHANGED.format(was=was, now=now, what=f"transformers assisted on {turn}")
        refused = now.startswith("refused")
        assert (assisted["output_ids"] == [] and assisted["steps"] == 0) == refused
        zlab = by[("zlab", *turn)]
        assert zlab["route_params"] == {
            "kind": "external",
            "engine": "dflash-generate",
            "drafter": "tiny-qwen35-dflash",
        }
        if RECORDS_RECURRENT_STATES:  # the loop fails inside transformers: a finding, recorded, no tokens
            assert zlab["vs_ar"] == dflash_loop_verdict("gsm8k/588") and zlab["output_ids"] == []
            continue
        assert zlab["vs_ar"].startswith("diverged at token ")
        assert zlab["steps"] > 0 and sum(zlab["accepted_lengths"]) == NEW - 1  # the loop's own counts
        assert zlab["decode_s"] > 0 and zlab["new_tokens"] == NEW
    for key, prompt in PINNED.items():
        now, was = by[("zlab", *key)]["vs_ar"], dflash_loop_verdict(prompt)
        assert now == was, CHANGED.format(was=was, now=now, what=f"dflash_generate on {prompt}")
    report = (out / "report.md").read_text()
    assert assisted_verdict().split(" such as")[0] in report
    zlab_588 = dflash_loop_verdict("gsm8k/588")  # a divergence is listed per turn; a refusal once
    assert (f"zlab / gsm8k / 588 turn 0 (T=0): {zlab_588}" if "diverged" in zlab_588 else zlab_588) in report
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["external_routes"]["zlab"]["engine"] == "dflash-generate"

    # resume: an unchanged rerun decodes nothing; with the external rows of the last turn lost, only
    # those are decoded again, to the same tokens
    assert (
        "0 new record(s)"
        in run_cli(monkeypatch, capsys, "run", experiment(tmp_path, ROUTES), "--out", str(out))[2]
    )
    lines = (out / "records.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if not (json.loads(ln)["route"] != "ar" and json.loads(ln)["turn"] == 1)]
    (out / "records.jsonl").write_text("\n".join(kept) + "\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", experiment(tmp_path, ROUTES), "--out", str(out))
    assert code == 0 and f"{len(lines) - len(kept)} new record(s)" in err
    again = {(r["route"], r["suite"], r["prompt_id"], r["turn"]): r for r in records(out)}
    assert {k: (r["output_ids"], r["vs_ar"]) for k, r in again.items()} == {
        k: (r["output_ids"], r["vs_ar"]) for k, r in by.items()
    }


@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_a_missing_package_is_one_line_exit_2_before_any_weights_load(tmp_path, monkeypatch, capsys, check):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        catalog.importlib.util, "find_spec", lambda n, *a: None if n == "sglang" else found(n, *a)
    )

    def no_target(*args, **kwargs):
        raise AssertionError("the target was opened before the external routes were checked")

    monkeypatch.setattr(runner, "open_target", no_target)
    routes = [{"kind": "ar"}, {"name": "sg", "kind": "external", "engine": "sglang-ar"}]
    out = tmp_path / "run"
    args = ["run", experiment(tmp_path, routes), "--out", str(out)] + (["--check"] if check else [])
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and "\n" not in err
    assert "route 'sg' (external sglang-ar): package sglang is not installed (pip install sglang)" in err
    assert not out.exists()


def test_check_lists_external_routes_with_their_drafters(tmp_path, monkeypatch, capsys):
    code, stdout, err = run_cli(monkeypatch, capsys, "run", experiment(tmp_path, ROUTES), "--check")
    assert code == 0, err
    assert "route zlab (external): engine=dflash-generate, drafter=tiny-qwen35-dflash" in stdout
    assert "route hf-ar (external): engine=transformers-generate" in stdout
