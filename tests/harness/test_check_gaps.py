"""``repro run EXPERIMENT --check`` refuses what the run refuses, in the run's own line (exit 2): an
impossible ``--shard``, an unknown GDN backend or one the device cannot run, an unknown acceptance rule,
an embedded family member of the wrong kind, a corrupted suite file; valid inputs still pass."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from repro.data.suites import suites_dir
from repro.errors import ConfigError
from repro.harness.check import check_experiment

SMOKE = ("run", "smoke", "--device", "cpu", "--limit", "1", "--max-new-tokens", "4")
SHARD = "--shard must be i/n with 0 <= i < n (e.g. 0/4), got"
# args -> what the run (and now the check) says
GAPS = {
    "shard-past-n": (("--shard", "3/2"), f"{SHARD} '3/2'"),
    "shard-0/0": (("--shard", "0/0"), f"{SHARD} '0/0'"),
    "shard-malformed": (("--shard", "x"), f"{SHARD} 'x'"),
    "backend-unknown": (("--backend", "foo"), "unknown GDN backend 'foo': choose one of reference, triton"),
    "backend-triton-on-cpu": (("--backend", "triton"), "the triton GDN backend needs a CUDA device"),
    "acceptance-unknown": (("--set", "acceptance=foo"), "route 'ar': unknown acceptance rule 'foo'"),
    "route-greedy-sampling": (
        ("--temperature", "0.5", "--set", "routes.dflash-chain.acceptance=greedy"),
        "route 'dflash-chain': acceptance 'greedy' needs temperature 0",
    ),
    "drafter-as-target": (("--target", "tiny-qwen35-dflash"), "unsupported architecture model_type='qwen3'"),
    "weaver-as-dflash": (
        ("--drafter", "dflash-chain=tiny-qwen35-weaver"),
        "tiny-qwen35-weaver/config.json is not a DFlashDraftModel checkpoint",
    ),
    "eagle-as-dflash": (("--drafter", "tiny-qwen35-eagle"), "is not a DFlashDraftModel checkpoint"),
    "dflash-as-weaver": (("--weaver", "tiny-qwen35-dflash"), "is not a WeaverAdapter checkpoint"),
    "dflash-as-eagle": (
        ("--drafter", "eagle-chain-k6=tiny-qwen35-dflash"),
        "tiny-qwen35-dflash/config.json is not an EagleDraftModel checkpoint",
    ),
}


def _refused(monkeypatch, capsys, *args: str) -> str:
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, (code, err)
    return err


@pytest.mark.parametrize("args, says", GAPS.values(), ids=GAPS.keys())
def test_check_refuses_what_the_run_refuses_in_its_line(monkeypatch, capsys, tmp_path, args, says):
    checked = _refused(monkeypatch, capsys, *SMOKE, *args, "--check")
    assert says in checked
    assert _refused(monkeypatch, capsys, *SMOKE, *args, "--out", str(tmp_path / "out")) == checked
    assert not (tmp_path / "out").exists()


def _suites(tmp_path: Path, monkeypatch, data: bytes, update_manifest: bool) -> Path:
    """A copy of the frozen suites whose gsm8k file holds ``data`` (and the manifest its sha256)."""
    folder = tmp_path / "suites"
    shutil.copytree(suites_dir(), folder)
    (folder / "gsm8k.jsonl").write_bytes(data)
    if update_manifest:
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["suites"]["gsm8k"]["sha256"] = hashlib.sha256(data).hexdigest()
        (folder / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("REPRO_SUITES_DIR", str(folder))
    return folder


@pytest.mark.parametrize(
    "update_manifest, says", [(False, "is corrupted: sha256"), (True, "line 1 is not valid JSON")]
)
def test_check_refuses_a_corrupted_suite_as_the_run_does(
    monkeypatch, capsys, tmp_path, update_manifest, says
):
    data = (suites_dir() / "gsm8k.jsonl").read_bytes()
    _suites(tmp_path, monkeypatch, b"{" + data, update_manifest)
    checked = _refused(monkeypatch, capsys, *SMOKE, "--check")
    assert "suite file" in checked and "gsm8k.jsonl" in checked and says in checked
    assert _refused(monkeypatch, capsys, *SMOKE, "--out", str(tmp_path / "out")) == checked


@pytest.mark.parametrize(
    "args, note",
    [
        ((), "checkpoint target: qwen3_5 target, 8 layers (6 GDN)"),
        (("--shard", "1/2"), "note: shard 1/2: 1 of 3 prompt(s)"),
        (("--backend", "reference"), "float64 on cpu (reference)"),
        (("--temperature", "0.5", "--set", "acceptance=spec_sampling"), "route ar (ar)"),
        (("--drafter", "dflash-chain=tiny-qwen35-dflash"), "dflash-chain.drafter: z-lab DFlash drafter"),
        (("--weaver", "tiny-qwen35-weaver"), "weaver-b32.weaver: Weaver adapter (tiny-qwen35-weaver)"),
        (("--drafter", "eagle-tree-b32=tiny-qwen35-eagle"), "eagle-tree-b32.drafter: EAGLE drafter"),
    ],
)
def test_check_still_passes_valid_inputs(monkeypatch, capsys, args, note):
    code, out, err = run_cli(monkeypatch, capsys, *SMOKE, *args, "--check")
    assert code == 0, err
    assert note in out


def test_the_built_random_target_is_not_read_as_a_directory(tmp_path):
    path = tmp_path / "random.yaml"
    routes = [{"name": "ar", "kind": "ar"}, {"name": "c", "kind": "synthetic_chain", "k": 2, "p": 0.5}]
    path.write_text(yaml.safe_dump({"target": "tiny-random", "routes": routes}))
    report = check_experiment(str(path), {"device": "cpu"})
    assert "target" not in report.checkpoints


def test_the_backend_is_checked_on_the_device_the_experiment_names(monkeypatch):
    """Where CUDA stands in as cpu, a CUDA experiment's triton backend passes; a cpu one's does not."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = check_experiment("gpu-smoke")
    assert report.cfg["device"] == "cpu" and "device checked as cpu" in report.text()
    with pytest.raises(ConfigError, match="triton GDN backend needs a CUDA device"):
        check_experiment("gpu-smoke", edits={"sets": ["device=cpu"]})


def test_float64_on_cuda_runs_the_reference_and_refuses_the_triton_kernels(monkeypatch):
    """The Triton GDN kernels are float32 (they do not compile for float64): an "auto" backend in float64
    on CUDA resolves to the reference; the triton backend named with float64 is refused in one line."""
    import torch

    from repro.gdn.backends import check_backend, default_backend
    from repro.harness.experiment import read_experiment, resolve

    cuda = torch.device("cuda")
    assert default_backend(cuda, torch.float64) == "reference"
    assert default_backend(cuda, torch.bfloat16) == default_backend(cuda) == "triton"
    assert check_backend("triton", cuda, dtype=torch.float32) == "triton"
    with pytest.raises(ConfigError, match="do not compile for float64"):
        check_backend("triton", cuda, dtype=torch.float64)
    cfg = resolve(read_experiment("smoke"), {"device": "cuda"})
    assert cfg["dtype"] == "float64" and cfg["gdn_backend"] == "reference"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="do not compile for float64"):
        check_experiment("gpu-smoke", edits={"sets": ["dtype=float64", "gdn_backend=triton"]})
