"""Python's garbage collections inside timed generations: `repro run routes` in this process, the collector
paused or not (``engine.PAUSE_GC``), every collection timed and placed inside or outside a ``generate`` call.

    python3 scripts/gpu/gc-probe.py OUT_DIR on|off [repro run options ...]

Runs ``repro run routes --out OUT_DIR/routes-gc-{on,off} --device cuda --dtype bfloat16 --engine graphed``
(more options after the mode; on CPU pass ``--device cpu``) with ``engine.PAUSE_GC`` = (mode == "off"), and
writes OUT_DIR/gc-{mode}.json: per generation (0-2) the collections inside and outside timed generations,
their count, total and largest ms; prints it. "on" = the collector runs during the timed decodes.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro import cli  # noqa: E402
from repro.decoding import engine  # noqa: E402


def main() -> int:
    out, mode, extra = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if mode not in ("on", "off"):
        raise SystemExit("usage: gc-probe.py OUT_DIR on|off [repro run options ...]")
    out.mkdir(parents=True, exist_ok=True)
    engine.PAUSE_GC = mode == "off"
    inside = [0]  # generate calls running now
    started: dict[int, tuple[float, bool]] = {}
    stats = {(g, where): [0, 0.0, 0.0] for g in range(3) for where in ("inside", "outside")}

    def on_gc(phase: str, info: dict) -> None:
        g = info["generation"]
        if phase == "start":
            started[g] = (time.perf_counter(), inside[0] > 0)
            return
        t0, within = started.pop(g)
        ms = 1e3 * (time.perf_counter() - t0)
        row = stats[(g, "inside" if within else "outside")]
        row[0], row[1], row[2] = row[0] + 1, row[1] + ms, max(row[2], ms)

    real = engine._generate  # generate's body, looked up at every call: the timed window

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - _generate's own signature
        inside[0] += 1
        try:
            return real(*args, **kwargs)
        finally:
            inside[0] -= 1

    engine._generate = counted
    gc.callbacks.append(on_gc)
    defaults = ["--device", "cuda", "--dtype", "bfloat16", "--engine", "graphed"]
    try:
        cli.main(["run", "routes", "--out", str(out / f"routes-gc-{mode}"), *defaults, *extra])
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    gc.callbacks.remove(on_gc)
    rows = [
        {"generation": g, "where": w, "count": c, "total_ms": round(t, 3), "max_ms": round(m, 3)}
        for (g, w), (c, t, m) in stats.items()
    ]
    (out / f"gc-{mode}.json").write_text(json.dumps({"mode": mode, "rc": rc, "rows": rows}, indent=1))
    for row in rows:
        print(json.dumps(row))
    return rc


if __name__ == "__main__":
    sys.exit(main())
