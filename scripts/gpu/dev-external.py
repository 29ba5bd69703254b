"""GPU check of external routes (branch dev-external): `repro run external` on CUDA, float32, a few
prompts, so that other implementations' loops (the dflash package's dflash_generate, transformers'
generate plain / assisted) run beside repro's graphed AR and dflash_chain in one process on the GPU.

Usage: python scripts/gpu/dev-external.py OUT_DIR   (< 90 s on an H200)
Writes OUT_DIR/dev-external.json and OUT_DIR/dev-external.md (per route: verdicts vs AR, tokens, MAL,
decode seconds) and prints the markdown. Exit 0 when every route ran (refusals are results); 1 otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    cmd = [
        sys.executable, "-m", "repro", "run", "external", "--device", "cuda", "--dtype", "float32",
        "--suites", "gsm8k,mt_bench", "--limit", "1", "--max-new-tokens", "24", "--out", str(run_dir),
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=85)
    wall = time.perf_counter() - t0
    records_path = run_dir / "records.jsonl"
    recs = [json.loads(x) for x in records_path.read_text().splitlines()] if records_path.exists() else []
    routes: dict[str, dict] = {}
    for r in recs:
        row = routes.setdefault(r["route"], {"kind": r["route_params"]["kind"], "verdicts": [], "tokens": 0,
                                             "steps": 0, "accepted": 0, "decode_s": 0.0})  # fmt: skip
        row["verdicts"].append(f"{r['suite']}/{r['prompt_id']}#{r['turn']}: {r['vs_ar']}")
        row["tokens"] += r["new_tokens"]
        row["steps"] += r["steps"]
        row["accepted"] += sum(r["accepted_lengths"])
        row["decode_s"] += r["decode_s"]
    manifest = (
        json.loads((run_dir / "manifest.json").read_text()) if (run_dir / "manifest.json").exists() else {}
    )
    result = {
        "command": " ".join(cmd), "rc": proc.returncode, "wall_s": round(wall, 1), "records": len(recs),
        "device": manifest.get("device"), "external_routes": manifest.get("external_routes"),
        "routes": routes, "stderr_tail": proc.stderr[-3000:],
    }  # fmt: skip
    (out / "dev-external.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# External routes on the GPU (dev-external)", "",
        f"`{result['command']}`: rc {proc.returncode}, {wall:.1f} s, {len(recs)} records,"
        f" {result['device']}", "",
        "| route | kind | tokens | MAL | decode_s | verdicts vs AR |", "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, row in routes.items():
        mal = f"{row['accepted'] / row['steps']:.2f}" if row["steps"] else "-"
        verdicts = "; ".join(row["verdicts"]).replace("|", "/")
        lines.append(
            f"| {name} | {row['kind']} | {row['tokens']} | {mal} | {row['decode_s']:.3f} | {verdicts} |"
        )
    if proc.returncode not in (0, 3):
        lines += ["", "stderr (tail):", "```", proc.stderr[-1500:], "```"]
    text = "\n".join(lines) + "\n"
    (out / "dev-external.md").write_text(text)
    print(text)
    return 0 if proc.returncode in (0, 3) and len(recs) == 18 else 1  # 3 prompt turns x 6 routes


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out/dev-external")))
