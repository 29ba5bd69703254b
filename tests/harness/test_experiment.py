"""Experiment settings: every one type-checked and in range, with one clear line."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from conftest import run_cli

import repro
from repro.errors import ConfigError
from repro.harness.experiment import load_experiment, resolve

BASE = {"name": "t", "target": "tiny-random", "suites": ["gsm8k"], "limit": 1}


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"temperature": "hot"}, "setting temperature must be an integer or a number, got 'hot'"),
        ({"seed": "abc"}, "setting seed must be an integer"),
        ({"routes": "ar"}, "setting routes must be a list"),
        ({"routes": ["ar"]}, "every route must be a mapping"),
        ({"suites": 5}, "setting suites must be a list or a string"),
        ({"suites": [5]}, "setting suites must be a string"),
        ({"target": None}, "setting target must be a string, got None"),
        ({"route_grid": "chain"}, "setting route_grid must be a mapping or null"),
        ({"route_grid": {"p": [0.5]}}, "route_grid needs a kind"),
        ({"route_grid": {"kind": "synthetic_chain", "name": "c{q}", "p": [0.5]}}, "cannot be filled"),
        ({"suites": ["gsm8k", "GSM8K"]}, "listed more than once: gsm8k"),
        ({"max_new_tokens": 8.9}, "setting max_new_tokens must be an integer, got 8.9"),
        ({"max_new_tokens": True}, "setting max_new_tokens must be an integer"),
        ({"max_new_tokens": 1_000_001}, "max_new_tokens must be in [1, 1,000,000]"),
        ({"max_new_tokens": 0}, "max_new_tokens must be in [1"),
        ({"ignore_eos": "no"}, "setting ignore_eos must be true or false, got 'no'"),
        ({"name": "/abs/path"}, "must be a plain word"),
        ({"name": "../x"}, "must be a plain word"),
        ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
        ({"temperature": math.nan}, "temperature must be a finite number >= 0"),
        ({"temperature": math.inf}, "temperature must be a finite number >= 0"),
        ({"limit": 0}, "setting limit must be >= 1"),
        ({"commit": "later"}, "unknown commit strategy"),
        ({"dtype": "fp32"}, "unknown dtype"),
        ({"lossless": "yes"}, "setting lossless must be true or false or null"),
    ],
)
def test_bad_settings_are_one_line_config_errors(settings, needle):
    with pytest.raises(ConfigError) as err:
        resolve({**BASE, **settings}, {})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_command_line_overrides_are_checked_the_same_way():
    with pytest.raises(ConfigError, match="temperature must be a finite number"):
        resolve(BASE, {"temperature": math.nan})  # before any decoding, not after
    with pytest.raises(ConfigError, match="unknown commit strategy"):
        resolve(BASE, {"commit": "sometimes"})
    assert resolve(BASE, {"commit": "replay"})["commit"] == "replay"
    assert resolve(BASE, {"commit": "delayed"})["commit"] == "delayed"  # graphed engine; eager: closed_form


def test_good_settings_resolve_auto_device_dtype_and_lossless():
    cfg = resolve({**BASE, "dtype": "auto", "temperature": 0, "suites": "gsm8k, humaneval"}, {})
    assert cfg["device"] == "cpu" and cfg["dtype"] == "float32"  # auto: CUDA when present (none here)
    assert cfg["suites"] == ["gsm8k", "humaneval"] and cfg["temperature"] == 0.0
    assert cfg["lossless"] is False  # float32: rounding may legitimately differ
    assert resolve({**BASE, "dtype": "float64"}, {})["lossless"] is True  # greedy and exact
    assert resolve({**BASE, "dtype": "float64", "temperature": 0.7}, {})["lossless"] is False
    assert resolve({**BASE, "dtype": "float64", "lossless": False}, {})["lossless"] is False


def test_a_file_stem_that_is_not_a_plain_word_needs_a_name(tmp_path):
    path = tmp_path / "my run.yaml"
    path.write_text("suites: [gsm8k]\n")
    with pytest.raises(ConfigError, match="plain word"):
        load_experiment(str(path))
    path.write_text("name: my-run\nsuites: [gsm8k]\n")
    assert load_experiment(str(path))["name"] == "my-run"


def test_new_tokens_beyond_the_targets_context_are_refused_and_long_prompts_warned(capsys):
    from repro.harness.runner import ExperimentRunner

    raw = {**BASE, "target": "default", "dtype": "float64", "warmup": 0, "ignore_eos": True}
    with pytest.raises(ConfigError, match="does not fit the target's context of 32768 tokens"):
        ExperimentRunner(resolve({**raw, "max_new_tokens": 32768}, {}))
    runner = ExperimentRunner(resolve({**raw, "max_new_tokens": 2}, {}))
    assert runner.context == 32768
    runner.decode(runner.routes[0], [1, 2, 3], None)
    assert "warning" not in capsys.readouterr().err
    runner.context = 4  # as if the checkpoint said max_position_embeddings: 4
    result = runner.decode(runner.routes[0], [1, 2, 3], None)
    assert len(result.output_ids) == 2
    err = capsys.readouterr().err
    assert "a prompt of 3 tokens plus max_new_tokens 2 exceed the target's context of 4" in err


def test_protocols_sweep_and_checkpoint_edits_expand_routes():
    from repro.harness.experiment import resolve
    from repro.harness.overrides import apply_edits
    from repro.harness.run_kinds import experiment_kind

    routes = [{"name": "ar", "kind": "ar"}, {"name": "dd", "kind": "ddtree", "budget": 8}]
    greedy = resolve({"name": "x", "routes": routes, "protocols": "auto"}, {})
    assert [(r["name"], r.get("acceptance")) for r in greedy["routes"]] == [("ar", None), ("dd", "greedy")]
    hot = resolve({"name": "x", "routes": routes, "protocols": "auto", "temperature": 1.0}, {})
    assert [r["name"] for r in hot["routes"]] == ["ar", "dd@sample_match", "dd@spec_sampling", "dd@traversal"]
    swept = resolve({"name": "x", "routes": routes, "sweep": {"param": "budget", "values": [4, 16]}}, {})
    assert [(r["name"], r.get("budget")) for r in swept["routes"][1:]] == [
        ("dd@budget=4", 4),
        ("dd@budget=16", 16),
    ]
    given = resolve(apply_edits({"name": "x", "routes": routes}, drafters=["/ckpt"]), {})
    assert given["routes"][1]["drafter"] == "/ckpt" and "drafter" not in given["routes"][0]
    with pytest.raises(ConfigError, match="no route of this experiment takes a weaver"):
        apply_edits({"name": "x", "routes": routes}, weaver="/w")
    with pytest.raises(ConfigError, match="greedy needs temperature 0"):
        resolve({"name": "x", "routes": routes, "protocols": ["greedy"], "temperature": 1.0}, {})
    with pytest.raises(ConfigError, match="unknown experiment kind 'nope'"):
        experiment_kind("nope")


def test_engine_setting_is_validated_resolved_and_wraps_the_target(tmp_path):
    """``engine``: auto is eager on CPU (graphed on CUDA); a bad name is one ConfigError; ``graphed`` on
    CPU runs the runner's routes on the static path (eagerly) with AR's tokens."""
    from repro.harness.runner import ExperimentRunner
    from repro.models.graphed import GraphedTarget
    from repro.reporting.report import DECODE_KIND
    from repro.reporting.rundir import RunDir

    base = {"name": "e", "device": "cpu", "dtype": "float64"}
    assert resolve(base, {})["engine"] == "eager"
    assert resolve({**base, "device": "cuda"}, {})["engine"] == "graphed"
    with pytest.raises(ConfigError, match="unknown engine 'turbo'"):
        resolve(base, {"engine": "turbo"})
    with pytest.raises(ConfigError, match="setting engine must be a string"):
        resolve({**base, "engine": 1}, {})
    routes = [{"name": "ar", "kind": "ar"}, {"name": "dd", "kind": "ddtree", "budget": 8}]
    cfg = resolve(
        {**base, "suites": ["gsm8k"], "limit": 1, "max_new_tokens": 12, "routes": routes, "warmup": 0},
        {"engine": "graphed"},
    )
    runner = ExperimentRunner(cfg)
    assert isinstance(runner.target, GraphedTarget) and runner.target.captures == 0
    with RunDir(tmp_path / "run", {"config": cfg}, DECODE_KIND) as run_dir:
        assert runner.run(run_dir) == 2
        assert [r.vs_ar for r in run_dir.records()] == ["reference", "identical"]


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in (Path(repro.__file__).parent / "experiments").glob("*.yaml"))
)
def test_every_builtin_experiment_passes_its_check_on_cpu(monkeypatch, capsys, name):
    # on cpu the GDN backend is the reference (the run refuses triton there, gpu-smoke's own)
    code, out, err = run_cli(
        monkeypatch, capsys, "run", name, "--check", "--device", "cpu", "--backend", "reference"
    )
    assert code == 0, err
    head, where = out.splitlines()[:2]
    assert re.fullmatch(rf"experiment {name}: settings and [1-9]\d* route\(s\) valid", head), out
    assert " on cpu (reference), suites " in where, out
    assert "  route ar (ar)" in out.splitlines(), out  # AR, the reference every run decodes
