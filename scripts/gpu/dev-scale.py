"""GPU check of `repro bench scale` (branch dev-scale): the scale rows at the Qwen3.6-27B and GDN-1.3B
shapes on one H200, acceptance replayed at the papers' MALs, then the 27B shape again at the tiny
family's measured per-depth acceptance if time is left; then the tiny-shape GPU test.

    python3 scripts/gpu/dev-scale.py OUT_DIR        # ~3-5 minutes on an H200, from any directory

On the device machine (fla wheels carried in .whl/): install them as scripts/gpu_engine.sh does and put
/tmp/site and the repository on PYTHONPATH (the subprocesses inherit it).

Writes OUT_DIR/paper-mal/ and OUT_DIR/records-tiny-family/ (run directories: records, manifest, report,
table), OUT_DIR/summary.json and OUT_DIR/summary.md, and prints the summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

BUDGET_S = 300.0
ROOT = Path(__file__).resolve().parents[2]
FAMILY_RUN = "results/2026-12-01-h200-graphed-routes/graphed"  # the tiny family on the graphed engine


def bench(out: Path, shapes: str, acceptance: str, timeout_s: float, routes: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "repro", "bench", "scale", "--shape", shapes, "--acceptance", acceptance,
           "--device", "cuda", "--dtype", "bfloat16", "--prompts", "3", "--max-new-tokens", "128",
           "--out", str(out)]  # fmt: skip
    if routes:
        cmd += ["--routes", routes]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = 124, str(exc.stdout or ""), f"timed out after {timeout_s:.0f} s"
    wall = time.monotonic() - t0
    print(stdout[-6000:], stderr[-3000:], sep="\n", flush=True)
    rows = pd.read_csv(out / "table.csv").to_dict("records") if (out / "table.csv").exists() else []
    return {"command": " ".join(cmd[1:]), "rc": rc, "wall_s": wall, "rows": rows}


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
    start = time.monotonic()
    runs = {"paper-mal": bench(out / "paper-mal", "qwen3.6-27b,gdn-1.3b", "paper-mal", BUDGET_S * 0.75)}
    left = BUDGET_S - (time.monotonic() - start)
    if left > 90 and Path(FAMILY_RUN).exists():
        runs["records-tiny-family"] = bench(
            out / "records-tiny-family", "qwen3.6-27b", f"records:{FAMILY_RUN}", left - 30,
            "ar,dflash_chain,ddtree,dflash_tfm",
        )  # fmt: skip
    test = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "gpu", "tests/bench/test_scale.py"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    summary = {"runs": runs, "gpu_test": {"rc": test.returncode, "tail": test.stdout[-1500:]},
               "total_s": time.monotonic() - start}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    lines = ["# dev-scale on the GPU", ""]
    for name, run in runs.items():
        lines += [f"## {name} (rc {run['rc']}, {run['wall_s']:.0f} s)", "", f"`{run['command']}`", ""]
        report = out / name / "report.md"
        lines += [report.read_text() if report.exists() else "(no report)", ""]
    lines += [f"GPU test (tests/bench/test_scale.py -m gpu): rc {test.returncode}", ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines[-3:]))
    for name, run in runs.items():
        for r in run["rows"]:
            mal = f"MAL {r['MAL']:.2f} (target {r['target_MAL']:.2f})"
            speed = f"{r['tokens_per_s']:8.1f} tok/s {r['speedup']:.2f}x"
            print(f"{name:20s} {r['shape']:12s} {r['route']:13s} {mal} {speed}")
    print(f"total {summary['total_s']:.0f} s")


if __name__ == "__main__":
    main()
