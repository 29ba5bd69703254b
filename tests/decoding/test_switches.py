"""The engine switches (repro.decoding.switches) and a run's ``switches`` setting."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_cli

from repro.decoding import switches
from repro.errors import ConfigError
from repro.harness.experiment import load_experiment
from repro.models import graphed


def test_every_switch_names_an_engine_attribute_of_its_kind():
    """A renamed or retyped module constant would leave its switch setting nothing the engine reads."""
    for name, switch in switches.SWITCHES.items():
        value = switch.read()
        assert type(value) is switch.kind, (name, value)
    assert switches.current() == {name: s.read() for name, s in switches.SWITCHES.items()}


def test_switches_are_set_inside_the_block_and_restored_after_it_an_exception_included():
    before = switches.current()
    with switches.applied({"fuse_accept": not graphed.FUSE_ACCEPT, "ar_group": 3}):
        assert graphed.FUSE_ACCEPT is (not before["fuse_accept"]) and graphed.AR_GROUP == 3
    assert switches.current() == before
    with pytest.raises(RuntimeError), switches.applied({"ar_group": 5}):
        assert graphed.AR_GROUP == 5
        raise RuntimeError("a failed run")
    assert switches.current() == before


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"nope": True}, "unknown engine switch(es): nope"),
        ({"pipeline": 1}, "switch pipeline must be true or false"),
        ({"ar_group": 0}, "switch ar_group must be an integer >= 1"),
        ({"clock_every": True}, "switch clock_every must be an integer >= 1"),
        ({"clock_every": 2.0}, "switch clock_every must be an integer >= 1"),
        ({"pipeline_depth": 4}, "switch pipeline_depth must be an integer 1 .. 3, got 4"),
        ([("pipeline", True)], "setting switches must be a mapping"),
    ],
)
def test_a_bad_switch_is_one_line_and_sets_nothing(values, why):
    before = switches.current()
    with pytest.raises(ConfigError, match=re.escape(why)), switches.applied(values):
        pass
    assert switches.current() == before


def test_the_setting_is_checked_kept_in_order_and_dropped_at_the_defaults():
    cfg = load_experiment("smoke", {}, {"sets": ["switches.ar_group=2", "switches.fuse_accept=false"]})
    assert list(cfg["switches"].items()) == [("fuse_accept", False), ("ar_group", 2)]  # SWITCHES' order
    assert "switches" not in load_experiment("smoke", {})  # the defaults' config: that of earlier runs
    assert "switches" not in load_experiment("smoke", {}, {"sets": ["switches={}"]})
    with pytest.raises(ConfigError, match="unknown engine switch"):
        load_experiment("smoke", {}, {"sets": ["switches.fuse_acept=false"]})


def test_a_run_decodes_under_its_switches_records_them_and_restores_them(tmp_path, monkeypatch, capsys):
    from repro.harness import runner

    seen = []
    run = runner.ExperimentRunner.run

    def spying(self, run_dir, progress=None):
        seen.append((graphed.AR_GROUP, graphed.HOST_WRITES))
        return run(self, run_dir, progress)

    monkeypatch.setattr(runner.ExperimentRunner, "run", spying)
    before = switches.current()
    args = ("run", "smoke", "--suites", "gsm8k", "--limit", "1", "--max-new-tokens", "3")
    args += ("--engine", "graphed")
    sets = ("--set", "routes=[{name: ar, kind: ar}]", "--set", "switches.ar_group=2")
    sets += ("--set", f"switches.host_writes={json.dumps(not before['host_writes'])}")
    code, _, err = run_cli(monkeypatch, capsys, *args, *sets, "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert seen == [(2, not before["host_writes"])]
    assert switches.current() == before
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"]["switches"] == {"host_writes": not before["host_writes"], "ar_group": 2}
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"- engine switches set: host_writes={json.dumps(not before['host_writes'])}, ar_group=2" in report
    bad = ("--set", "switches.ar_group=0", "--out", str(tmp_path / "b"))
    code, _, err = run_cli(monkeypatch, capsys, *args, *bad)
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: switch ar_group"), err
    assert not (tmp_path / "b").exists()


def test_compare_names_the_switches_first_among_what_differs():
    """An A/B of a switch is two runs of one experiment whose configs differ only there: compare's warning
    names it before the other settings."""
    from repro.harness.compare import differences

    cfg = load_experiment("smoke", {})
    switched = load_experiment("smoke", {"limit": 1}, {"sets": ["switches.fuse_accept=false"]})
    diff = differences({"config": cfg}, {"config": switched})
    assert diff[0] == "switches.fuse_accept unset -> false" and "limit 2 -> 1" in diff, diff


def test_repro_switches_lists_every_switch_with_its_kind_and_default(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "switches")
    lines = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[2:] if line.strip()}
    for name, switch in switches.SWITCHES.items():
        default = str(switch.read())
        assert lines[name] == [switch.kind.__name__, default.lower() if switch.kind is bool else default]
    assert code == 0 and "--set switches.NAME=VALUE" in out


def test_a_run_resumes_only_under_the_switches_it_ran_with(tmp_path, monkeypatch, capsys):
    """The switches are part of the run's configuration: the same command resumes it, another switch (or
    none) is refused in one line and its records stay as they were."""
    args = (
        "run",
        "smoke",
        "--suites",
        "gsm8k",
        "--limit",
        "1",
        "--max-new-tokens",
        "3",
        "--engine",
        "graphed",
    )
    args += ("--set", "routes=[{name: ar, kind: ar}]", "--out", str(tmp_path / "run"))
    code, _, err = run_cli(monkeypatch, capsys, *args, "--set", "switches.ar_group=2")
    records = (tmp_path / "run" / "records.jsonl").read_bytes()
    assert code == 0 and records, err
    code, _, err = run_cli(monkeypatch, capsys, *args, "--set", "switches.ar_group=2")
    assert code == 0 and "0 new record(s)" in err, err
    for other in (("--set", "switches.ar_group=4"), ()):
        code, _, err = run_cli(monkeypatch, capsys, *args, *other)
        assert code == 2 and "different configuration" in err and len(err.strip().splitlines()) == 1, err
        assert (tmp_path / "run" / "records.jsonl").read_bytes() == records


def test_check_names_the_switches_it_validated(monkeypatch, capsys):
    args = ("run", "smoke", "--check", "--set", "switches.fuse_accept=false")
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "  engine switches: fuse_accept=false" in out.splitlines()
    code, out, _ = run_cli(monkeypatch, capsys, "run", "smoke", "--check")
    assert code == 0 and "engine switches" not in out
