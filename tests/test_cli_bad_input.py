"""Bad input at the command line: one clear line on stderr and exit 2, before anything is written."""

from __future__ import annotations

import pytest
from conftest import run_cli

from repro.errors import ConfigError
from repro.harness.experiment import read_experiment, resolve


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "scale"],  # default shape qwen3.6-27b
        ["bench", "scale", "--shape", "tiny,gdn-1.3b"],
        ["bench", "model"],  # default shapes gdn-1.3b, qwen3.6-27b
        ["bench", "model", "--shapes", "qwen3.6-27b"],
    ],
)
def test_real_bench_shapes_are_refused_off_cuda(args, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, *args, "--device", "cpu", "--out", str(out))
    assert code == 2 and "need a CUDA GPU" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_a_one_value_sweep_runs_each_route_once():
    cfg = resolve(read_experiment("sweep"), {"sweep": {"param": "budget", "values": [16]}, "device": "cpu"})
    assert [r["name"] for r in cfg["routes"]][1:] == [
        "ddtree@budget=16",
        "dflash_tfm@budget=16",
        "specla@budget=16",
    ]
    raw = read_experiment("sweep")
    raw["routes"] = [{"name": "ar", "kind": "ar"}]
    with pytest.raises(ConfigError, match="no route takes 'budget'"):
        resolve(raw, {"sweep": {"param": "budget", "values": [16]}, "device": "cpu"})
