"""scripts/bootstrap.sh: every install step fails loudly, naming itself, pip's location noise filtered."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def step(command: str) -> subprocess.CompletedProcess:
    script = f'source scripts/bootstrap.sh; step "install fla" {command}; echo after'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT)


def test_a_failing_step_stops_the_script_and_names_itself():
    res = step("bash -c 'echo \"WARNING: Location x\"; echo no matching distribution; exit 7'")
    assert res.returncode == 7 and "after" not in res.stdout
    lines = res.stderr.splitlines()
    assert "no matching distribution" in lines and not any(s.startswith("WARNING: Location") for s in lines)
    assert "bootstrap: step 'install fla' failed (exit 7)" in res.stderr


def test_a_passing_step_goes_on():
    res = step("true")
    assert res.returncode == 0 and res.stdout.strip() == "after" and res.stderr == ""
