"""Where a sampled (T = 1) generation's wall time goes on the graphed engine, against greedy (issue 10).

    python3 scripts/gpu/sampled-ar.py OUT_DIR          (one GPU: < 90 s)
    python3 scripts/gpu/sampled-ar.py OUT_DIR cpu      (a CPU dry run of the plumbing: float32, eager)

`repro run table2` on an H100 (2026-12-05, bf16, graphed) decoded AR at T = 1 at 1367 tok/s against 8313
at T = 0 in `repro run routes`: ~30 ms a generation whatever its length (2 tokens: 35 ms; 64: 28-43 ms),
while its graphs were busy 9 ms. This times, per route (AR greedy, AR sample_match, chain DFlash
sample_match; the embedded family in bf16 on a GraphedTarget, scripts/gpu/routes-ab.py's setup), each
piece of a generation that is not the decode loop's stages: the rule's device twin (lookup, ``begin``: the
host's draws of every position and their copy), the loop itself, and a torch.profiler table of one
generation (host and device time by op). Writes OUT_DIR/sampled-ar.json and prints the tables.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's repro, not an installed one

from _routes_ab import ab  # noqa: E402 - the family, prompts and device choice of routes-ab

import repro.decoding.device_acceptance as da  # noqa: E402
import repro.decoding.engine as engine  # noqa: E402
from repro.decoding.engine import generate  # noqa: E402
from repro.decoding.routes import build_route, prepare_graphs  # noqa: E402
from repro.models import graphed  # noqa: E402

ROUTES = [  # (spec, acceptance, temperature)
    ({"name": "ar", "kind": "ar"}, "greedy", 0.0),
    ({"name": "ar", "kind": "ar"}, "sample_match", 1.0),
    ({"name": "dflash-chain", "kind": "dflash_chain"}, "sample_match", 1.0),
]
NEW_TOKENS = 16 if ab.CPU else 64


class Timed:
    """Wraps ``obj.name`` to sum its wall time (synchronizing the device after each call)."""

    def __init__(self, obj: Any, name: str) -> None:  # noqa: ANN401
        self.obj, self.name, self.fn = obj, name, getattr(obj, name)
        self.seconds, self.calls = 0.0, 0

    def __enter__(self) -> Timed:
        def timed(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
            t = time.perf_counter()
            try:
                return self.fn(*args, **kwargs)
            finally:
                if not ab.CPU:
                    torch.cuda.synchronize()
                self.seconds += time.perf_counter() - t
                self.calls += 1

        setattr(self.obj, self.name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.obj, self.name, self.fn)


def main() -> None:
    start = time.monotonic()
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    model, tok = ab.open_family()
    target = graphed.GraphedTarget(model, max_nodes=64, graphs=not ab.CPU)
    vocab = model.config.vocab_size
    routes = [build_route(s, vocab, acc, t, 42, target=target, family=ab.FAMILY) for s, acc, t in ROUTES]
    prepare_graphs(target, routes)
    prompts = ab.prompts(tok)
    device = "CPU (dry run)" if ab.CPU else torch.cuda.get_device_name()
    rows = []
    for (spec, acc, temp), route in zip(ROUTES, routes):
        generate(target, prompts[0], route, NEW_TOKENS)  # warm-up
        parts = {}
        with (
            Timed(engine, "device_rule") as rule,
            Timed(da.DeviceRule, "begin") as begin,
            Timed(graphed.GraphedTarget, "greedy_decode") as loop,
            Timed(engine, "_prefill") as prefill,
        ):
            decode, tokens, captures = 0.0, 0, 0
            for p in prompts:
                r = generate(target, p, route, NEW_TOKENS)
                decode += r.decode_s
                tokens += len(r.output_ids)
                captures += r.graph_captures
            parts = {t.name: (1e3 * t.seconds / len(prompts), t.calls) for t in (rule, begin, loop, prefill)}
        act = torch.profiler.ProfilerActivity
        acts = [act.CPU] + ([] if ab.CPU else [act.CUDA])
        with torch.profiler.profile(activities=acts) as prof:
            generate(target, prompts[0], route, NEW_TOKENS)
        sort = "self_cpu_time_total" if ab.CPU else "self_cuda_time_total"
        table_dev = prof.key_averages().table(sort_by=sort, row_limit=15)
        table_cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
        row = dict(route=f"{spec['name']}@{acc} T={temp}", decode_ms=1e3 * decode / len(prompts),
                   tokens=tokens / len(prompts), captures=captures,
                   parts_ms_per_generation={k: v[0] for k, v in parts.items()},
                   calls={k: v[1] for k, v in parts.items()})  # fmt: skip
        rows.append(row)
        print(json.dumps(row))
        print(f"--- {row['route']}: by device time\n{table_dev}\n--- by host time\n{table_cpu}")
    res = {"device": device, "new_tokens": NEW_TOKENS, "rows": rows, "seconds": time.monotonic() - start}
    (out / "sampled-ar.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
