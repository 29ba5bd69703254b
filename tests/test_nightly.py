"""The nightly job's files: scripts/nightly.sh (--dry-run prints every stage, runs nothing, needs no
GPU), the SkyPilot task and the scheduled workflow that launches it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "nightly.sh"
STAGES = [
    "repro suites verify",
    "scripts/gpu_tests.sh",
    "repro falsify tree-exactness --device cuda --backend triton",
    "repro bench kernels",
    "repro bench model --shapes gdn-1.3b,qwen3.6-27b",
    "repro run qwen36-27b-weaver --check --target /m/qwen --drafter /m/dflash --weaver /m/weaver",
    "repro run gdn-1.3b-specla --check --target /m/gdn --drafter /m/eagle",
    "repro run qwen36-27b-weaver --target /m/qwen",
    "repro run gdn-1.3b-specla --target /m/gdn",
    "repro run table2 --target /m/qwen --drafter /m/dflash --weaver /m/weaver",
    "repro run specla --target /m/gdn --drafter /m/eagle",
    "aws s3 sync --delete --only-show-errors s3://bkt/nightly/latest",
    "repro compare results/nightly/previous results/nightly/2026-12-02 --out",
    "aws s3 sync --delete --only-show-errors results/nightly/2026-12-02 s3://bkt/nightly/2026-12-02",
]
CHECKPOINTS = {
    "REPRO_NIGHTLY_QWEN": "/m/qwen", "REPRO_NIGHTLY_QWEN_DFLASH": "/m/dflash",
    "REPRO_NIGHTLY_QWEN_WEAVER": "/m/weaver", "REPRO_NIGHTLY_GDN": "/m/gdn",
    "REPRO_NIGHTLY_GDN_EAGLE": "/m/eagle",
}  # fmt: skip


def nightly(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REPRO_NIGHTLY_")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env={**clean, "REPRO_NIGHTLY_DATE": "2026-12-02", **env},
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


def test_dry_run_prints_every_stage_in_order_and_runs_nothing(tmp_path):
    proc = nightly("--dry-run", REPRO_NIGHTLY_BUCKET="s3://bkt/nightly", **CHECKPOINTS)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(line.startswith("+ ") for line in lines)
    at = [next(i for i, line in enumerate(lines) if stage in line) for stage in STAGES]
    assert at == sorted(at), "stages out of order"
    assert not (ROOT / "results" / "nightly" / "2026-12-02").exists()
    for table in ("run table2", "run specla"):  # real checkpoints: bf16 at the templates' scale, not float64
        line = next(line for line in lines if table in line)
        assert "--dtype bfloat16 --limit 16 --max-new-tokens 256" in line, line


def test_dry_run_without_checkpoints_names_the_variables():
    proc = nightly("--dry-run")
    assert proc.returncode == 0
    assert "--target $REPRO_NIGHTLY_GDN --drafter $REPRO_NIGHTLY_GDN_EAGLE" in proc.stdout
    assert "sync" not in proc.stdout  # no bucket: no fetch, no upload, no comparison
    assert "comparison skipped" in proc.stderr


def test_gs_buckets_use_gsutil_and_a_local_previous_night_is_compared():
    proc = nightly(
        "--dry-run", REPRO_NIGHTLY_BUCKET="gs://b/n", REPRO_NIGHTLY_PREVIOUS="/prev", **CHECKPOINTS
    )
    assert "+ gsutil -m -q rsync -r -d results/nightly/2026-12-02 gs://b/n/latest" in proc.stdout
    assert (
        "compare /prev results/nightly/2026-12-02" in proc.stdout
        and "gs://b/n/latest results" not in proc.stdout
    )


def test_bad_setup_exits_2_in_one_line():
    missing = nightly()  # a real run with no checkpoints: refused before any stage
    assert missing.returncode == 2 and missing.stdout == ""
    assert "REPRO_NIGHTLY_QWEN is not set" in missing.stderr
    bucket = nightly("--dry-run", REPRO_NIGHTLY_BUCKET="ftp://x", **CHECKPOINTS)
    assert bucket.returncode == 2 and "must start with s3:// or gs://" in bucket.stderr
    assert nightly("--bogus").returncode == 2


def test_the_script_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed")
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_sky_task_runs_the_script_on_one_h100_with_checkpoints_by_name():
    task = yaml.safe_load((ROOT / "runbooks" / "nightly.sky.yaml").read_text())
    assert task["resources"]["accelerators"] == "H100:1"
    assert "hf download" in task["setup"] and "bootstrap.sh" in task["setup"]
    assert "./scripts/nightly.sh" in task["run"]
    exported = task["run"]
    assert all(var in exported for var in CHECKPOINTS)
    assert {"QWEN_REPO", "QWEN_DFLASH_REPO", "REPRO_NIGHTLY_BUCKET"} <= set(task["envs"])


def test_the_workflow_is_scheduled_and_launches_the_task():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    on = flow.get("on") or flow.get(True)  # YAML 1.1 reads the key `on` as true
    assert on["schedule"][0]["cron"].split()[2:] == ["*", "*", "*"]
    steps = " ".join(step.get("run", "") for step in flow["jobs"]["h100"]["steps"])
    assert "sky launch" in steps and "runbooks/nightly.sky.yaml" in steps and "--down" in steps
