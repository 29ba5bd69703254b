"""The persistent decode launch (repro.gdn.triton_persistent) against the engine's decode step at the GDN-1.3B
shape (issue 13: AR decode >= 80% of the weight-bandwidth floor; 62% on separate kernels).

    python3 scripts/gpu/persistent.py OUT_DIR      (one H200: < 240 s)

Random bf16 weights at gdn-1.3b (repro.bench.model.build_model), the graphed engine's decode configuration
(GEMV matmuls, the separate GDN core: six launches a layer) beside StaticDecoder(persistent=True) under
each launch configuration of :data:`CONFIGS`: a CUDA graph of REPS ``decode_pick`` steps from one prefilled
state, median us per step over replays (configurations alternating), the floor (weight bytes over the
measured copy bandwidth); then, for the fastest configuration, the layers alone (no head) and under stage
masks (:func:`decode_layers` ``stages``): the barriers alone and each stage with every barrier (where the
time goes). Checked first: the persistent step equals its staged launches bitwise (logits, states), is
within bf16 rounding of the separate kernels, and leaves the barrier error flag at 0.
Writes OUT_DIR/persistent.json and OUT_DIR/persistent.md; prints the markdown.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pdl import graph_of, timed  # noqa: E402

from repro.bench.model import MODEL_SHAPES, build_model, weight_bytes  # noqa: E402
from repro.bench.timing import TimerConfig, measure_ceilings  # noqa: E402
from repro.gdn.triton_persistent import PersistentConfig, decode_layers, programs_for  # noqa: E402
from repro.models.static import StaticDecoder  # noqa: E402

REPS = 50
W4 = {"num_warps": 4}
CONFIGS: dict[str, PersistentConfig] = {
    "default": PersistentConfig(),
    "warps4": PersistentConfig(**W4),
    "warps4_cached": PersistentConfig(**W4, cached_vectors=True),
    "warps4_poll": PersistentConfig(**W4, load_poll=True),
    "warps4_cached_poll": PersistentConfig(**W4, cached_vectors=True, load_poll=True),
    "cached_poll": PersistentConfig(cached_vectors=True, load_poll=True),
    "warps4_cached_poll_p264": PersistentConfig(**W4, cached_vectors=True, load_poll=True, programs=264),
    "warps4_cached_poll_p132": PersistentConfig(**W4, cached_vectors=True, load_poll=True, programs=132),
    "warps4_cached_poll_bv16": PersistentConfig(**W4, cached_vectors=True, load_poll=True, block_v=16),
}
BREAKDOWN = {"barriers only": 0, **{f"stage {s} + barriers": 1 << s for s in range(5)}}


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    dev = torch.device("cuda")
    copy_gbps = float(measure_ceilings(dev, TimerConfig())["copy_GBps"])
    model = build_model(MODEL_SHAPES["gdn-1.3b"](), dev, torch.bfloat16, 0)
    model.set_gdn_backend("triton")
    floor = weight_bytes(model) / (copy_gbps * 1e3)
    state, _ = model.prefill(torch.arange(64, device=dev) % 1000)
    sep = StaticDecoder(model, 256, 4, gemv=True, fuse_decode=False, fuse_verify=False)
    per = StaticDecoder(model, 256, 4, gemv=True, fuse_decode=False, fuse_verify=False, persistent=True)
    pg = per.persistent_gdn
    assert pg is not None

    def first(dec: StaticDecoder) -> torch.Tensor:
        dec.load(state)
        dec.set_token(7)
        return dec.decode_pick().clone()

    want = first(sep)
    checks: dict[str, Any] = {}
    graphs, rows = {"separate": None}, []
    for name, cfg in CONFIGS.items():
        pg.configure(cfg)
        got = first(per)
        states = (per.gdn_states.clone(), per.gdn_conv.clone())
        per.load(state)
        per.set_token(7)
        x = model.model.embed_tokens(per.token)
        decode_layers(pg, x, staged=True)
        staged = per._head(x, True)
        err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        same = torch.equal(staged, got) and torch.equal(per.gdn_states, states[0])
        same = same and torch.equal(per.gdn_conv, states[1])
        checks[name] = dict(
            vs_separate=err,
            staged_bitwise=bool(same),
            error_flag=int(pg.error),
            programs=programs_for(pg, x),
            top1_equal=bool(got.argmax() == want.argmax()),
        )
        print(name, checks[name], flush=True)
        per.load(state)
        graphs[name] = graph_of(per.decode_pick, REPS, (True, False, "auto"))
    sep.load(state)
    graphs["separate"] = graph_of(sep.decode_pick, REPS, (True, False, "auto"))
    us = timed(graphs, REPS, lambda: None)
    best = min(CONFIGS, key=lambda n: us[n])
    pg.configure(CONFIGS[best])
    xbuf = model.model.embed_tokens(torch.tensor([7], device=dev))
    parts = {
        f"{best}: {name}": graph_of(
            lambda m=mask: decode_layers(pg, xbuf, stages=m), REPS, (True, False, "auto")
        )
        for name, mask in BREAKDOWN.items()
    }
    parts[f"{best}: all stages (no head)"] = graph_of(
        lambda: decode_layers(pg, xbuf), REPS, (True, False, "auto")
    )
    us.update(timed(parts, REPS, lambda: None))
    graphs.update(parts)
    for name in graphs:
        rows.append(dict(method=name, us=us[name], floor_us=floor, floor_frac=floor / us[name],
                         x_separate=us["separate"] / us[name], **checks.get(name, {}),
                         **({"config": repr(CONFIGS[name])} if name in CONFIGS else {})))  # fmt: skip
    lines = [
        f"# Persistent decode at gdn-1.3b (bf16, {REPS} steps a graph, median of replays; "
        f"floor {floor:.1f} us at {copy_gbps:.0f} GB/s)",
        "",
        "| method | us / token | % of floor | vs separate | programs | vs separate (logits) | staged bitwise "
        "| error flag |",
        "|---|--:|--:|--:|--:|--:|---|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['us']:.1f} | {100 * r['floor_frac']:.1f}% | {r['x_separate']:.3f}x "
            f"| {r.get('programs', '')} | {r.get('vs_separate', 0):.2e} | {r.get('staged_bitwise', '')} "
            f"| {r.get('error_flag', '')} |"
        )
    lines += ["", f"configs: {json.dumps({k: repr(v) for k, v in CONFIGS.items()})}",
              f"wall {time.monotonic() - t0:.0f} s"]  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "persistent.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "persistent.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
