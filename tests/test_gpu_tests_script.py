"""scripts/gpu_tests.sh on the CPU, with stand-in test files: a summary line a file (exit, seconds, the junit
counts), the files side by side heaviest first, the deadline that keeps a file from starting, and its
default set of files (those pytest collects gpu tests from)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_tests.sh"
PASSING = "import pytest\n\n\n@pytest.mark.gpu\ndef test_passes():\n    assert True\n"
FAILING = "import pytest\n\n\n@pytest.mark.gpu\ndef test_fails():\n    assert False\n"


def run(tmp_path: Path, files: list[Path], **env: str) -> tuple[int, list[str]]:
    out = tmp_path / "out"
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPU_TEST", "PYTEST_"))},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # its python3 has pytest
        "OUT": str(out),
        **env,
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), *map(str, files)], env=environ, capture_output=True, text=True, timeout=300
    )
    return done.returncode, (out / "summary.txt").read_text().splitlines()


def test_a_summary_line_per_file_with_its_exit_and_junit_counts_heaviest_first(tmp_path):
    good = tmp_path / "test_stand_in_good.py"  # the default limit, 60 s
    bad = tmp_path / "test_pdl.py"  # a name with a longer limit (150 s): side by side it starts first
    good.write_text(PASSING)
    bad.write_text(FAILING)
    rc, lines = run(tmp_path, [good, bad], GPU_TEST_JOBS="2", GPU_TEST_DEADLINE="200")
    assert rc == 1  # one file failed
    assert len(lines) == 2
    assert re.fullmatch(r"test_pdl: exit 1 after \d+ s; errors=0 failures=1 skipped=0 tests=1 ", lines[0])
    assert re.fullmatch(
        r"test_stand_in_good: exit 0 after \d+ s; errors=0 failures=0 skipped=0 tests=1 ", lines[1]
    )


def test_a_file_with_too_little_of_the_deadline_left_is_not_started(tmp_path):
    good = tmp_path / "test_stand_in_good.py"
    good.write_text(PASSING)
    rc, lines = run(tmp_path, [good], GPU_TEST_DEADLINE="10")
    assert rc == 1 and lines == ["test_stand_in_good: not started (deadline)"]
    assert not list((tmp_path / "out").glob("junit-*.xml"))  # pytest never ran


def test_the_default_files_are_those_with_gpu_tests_by_pytests_own_collection():
    """Every file pytest collects a gpu-marked test from, and no other (this file writes the marker only
    into stand-in sources: listed, it ran with no test selected); the model path's two files first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_TEST")}
    listed = subprocess.run(
        ["bash", str(SCRIPT)], env={**env, "GPU_TEST_LIST": "1"}, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    files = listed.stdout.split()
    assert files[:2] == ["tests/models/test_static_decoder.py", "tests/gdn/test_triton_tree.py"]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-n", "0", "-p", "no:warnings",
         "tests"], cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    per_file = re.findall(r"^(tests/\S+\.py): \d+$", collected.stdout, flags=re.MULTILINE)
    assert len(per_file) > 30, collected.stdout[-2000:]
    assert sorted(files) == sorted(per_file) and len(files) == len(set(files))
    assert "tests/test_gpu_tests_script.py" not in files
