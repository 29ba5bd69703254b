"""The fused decode step (StaticDecoder ``fuse_decode``) on the H200: correctness, graph time, AR tokens/s.

    python3 scripts/gpu/dev-decode.py OUT_DIR      (one H200: < 90 s)

1. correctness: the embedded tiny-qwen35 in float32 and bf16 (GEMV matmuls), 24 decode steps from a
   prefilled prompt, fused vs the old decode path (``fuse_decode=False``), eager and as CUDA graphs:
   logits error, greedy picks equal, the pick equal to the logits' argmax, GDN states and KV caches;
2. decode graph time (median per step over replays of one CUDA graph of 50 decode steps) fused vs old
   at tiny-qwen35 (bf16, GEMV matmuls) and at the gdn-1.3b shape (random bf16 weights; cuBLAS and GEMV
   matmuls), the weight-bandwidth floor (weights once at the measured copy bandwidth) beside it, and
   the CUDA kernels one eager step launches (torch profiler);
3. AR tokens/s through ``GraphedTarget`` + ``repro.decoding.engine.generate`` on tiny-qwen35 (bf16,
   8 suite prompts x 128 new tokens, no stop tokens), fused vs old decode graph, outputs compared
   (issue 10's target: >= 2500 tokens/s).

Writes OUT_DIR/dev-decode.json and OUT_DIR/dev-decode.md; prints the markdown.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

import repro.decoding.engine as engine  # noqa: E402
from repro.bench.model import build_model, gdn_1p3b, profile_kernels, weight_bytes  # noqa: E402
from repro.bench.timing import TimerConfig, measure_ceilings  # noqa: E402
from repro.data.suites import format_turn, load_suite  # noqa: E402
from repro.decoding.routes import build_route  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402
from repro.models.graphs import GraphedCall  # noqa: E402
from repro.models.static import StaticDecoder  # noqa: E402
from repro.models.target import open_target  # noqa: E402

DEV = torch.device("cuda")
STEPS = 24
START = time.perf_counter()
BUDGET_S = 45.0  # timing rows not started by then are skipped (the AR rows follow: < 90 s in all)
NEW_TOKENS = 128


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (
        float((a - b).norm() / b.norm().clamp_min(1e-300)) if bool(torch.isfinite(a).all()) else float("inf")
    )


def tiny(dtype: torch.dtype):  # noqa: ANN201
    model, tok = open_target("default", str(dtype).split(".")[-1], "cuda")
    model.set_gdn_backend("triton")
    return model, tok


def run_steps(dec: StaticDecoder, state, tokens: list[int], graphed: bool) -> dict[str, Any]:  # noqa: ANN001
    dec.load(state)
    call = dec.decode_pick
    if graphed:
        g = GraphedCall(dec.decode_pick, DEV)
        dec.load(state)
        call = g
    logits, picks = [], []
    for t in tokens:
        dec.set_token(t)
        logits.append(call().clone())
        picks.append(int(dec.pick))
    return {"logits": torch.cat(logits), "picks": picks, "state": dec.export()}


def correctness() -> list[dict[str, Any]]:
    out = []
    for dtype, gemv, tol in (
        (torch.float32, True, 1e-4),
        (torch.bfloat16, True, 3e-2),
    ):
        model, _ = tiny(dtype)
        prompt = list(range(5, 45))
        state, _ = model.prefill(prompt)
        tokens = torch.randint(5, 4000, (STEPS,), generator=torch.Generator().manual_seed(1)).tolist()
        for graphed in (False, True):
            res = {}
            for fuse in (False, True):
                dec = StaticDecoder(model, 256, 4, gemv=gemv, fuse_decode=fuse)
                res[fuse] = run_steps(dec, state, tokens, graphed)
            a, b = res[False], res[True]
            serr = max(
                rel(getattr(x, f), getattr(y, f))
                for x, y in zip(b["state"].layers, a["state"].layers)
                for f in (("recurrent", "conv") if hasattr(x, "recurrent") else ("keys", "values"))
            )
            lerr = rel(b["logits"], a["logits"])
            same = sum(p == q for p, q in zip(a["picks"], b["picks"]))
            argmax_ok = b["picks"] == b["logits"].argmax(-1).tolist()
            ok = lerr <= tol and serr <= tol and argmax_ok and (dtype != torch.float32 or same == STEPS)
            out.append(
                dict(
                    dtype=str(dtype).split(".")[-1],
                    gemv=gemv,
                    graphed=graphed,
                    logits_err=lerr,
                    state_err=serr,
                    picks_equal=f"{same}/{STEPS}",
                    pick_is_argmax=argmax_ok,
                    length=int(b["state"].position),
                    tol=tol,
                    ok=ok,
                )
            )
    return out


def graph_step_us(dec: StaticDecoder, state, reps: int = 50) -> float:  # noqa: ANN001
    """Median us per decode step over replays of one graph of ``reps`` steps (the state moves on)."""
    dec.load(state)
    stream = torch.cuda.Stream(DEV)
    stream.wait_stream(torch.cuda.current_stream(DEV))
    with torch.cuda.stream(stream):
        for _ in range(2):
            dec.decode_pick()
    torch.cuda.current_stream(DEV).wait_stream(stream)
    dec.load(state)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            dec.decode_pick()
    times = []
    for _ in range(7):
        dec.load(state)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / reps)
    return statistics.median(times)


def timing(ceil: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    tiny_model, _ = tiny(torch.bfloat16)
    big = build_model(gdn_1p3b(), DEV, torch.bfloat16, 0)
    big.set_gdn_backend("triton")
    cases = [("tiny-qwen35", tiny_model, True), ("gdn-1.3b", big, False), ("gdn-1.3b", big, True)]
    for shape, model, gemv in cases:
        if time.perf_counter() - START > BUDGET_S:  # the 1.3B GEMV row last: its kernels compile anew
            rows.append(dict(shape=shape, matmuls="gemv" if gemv else "cublas", skipped="time budget"))
            continue
        state, _ = model.prefill(list(range(3, 67)))
        floor = weight_bytes(model) / (ceil["copy_GBps"] * 1e3)
        first = {}
        for fuse in (False, True):
            dec = StaticDecoder(model, 1024, 4, gemv=gemv, fuse_decode=fuse)
            dec.load(state)
            dec.set_token(7)
            first[fuse] = dec.decode_pick().clone()
            us = graph_step_us(dec, state)
            dec.load(state)
            prof = profile_kernels(dec.decode_pick, DEV)
            rows.append(
                dict(
                    shape=shape,
                    matmuls="gemv" if gemv else "cublas",
                    decode="fused" if fuse else "old",
                    us=us,
                    floor_us=floor,
                    floor_frac=floor / us,
                    kernels=prof.kernels if prof else None,
                    groups=prof.summary() if prof else None,
                    logits_err_vs_old=rel(first[fuse], first[False]),
                )
            )
        del dec
    return rows


def prompts(tok) -> list[list[int]]:  # noqa: ANN001
    cases = [(s, p) for s in ("mt_bench", "gsm8k", "humaneval") for p in load_suite(s, 3, 42)][:8]
    return [tok.chat_prompt([{"role": "user", "content": format_turn(s, p.turns[0])}]) for s, p in cases]


def ar_rate() -> list[dict[str, Any]]:
    model, tok = tiny(torch.bfloat16)
    route = build_route(
        {"name": "ar", "kind": "ar"},
        model.config.vocab_size,
        "greedy",
        0.0,
        42,
        target=model,
        family="tiny-qwen35",
    )
    cases = prompts(tok)
    rows, outputs = [], {}
    for fuse in (False, True):
        target = GraphedTarget(model)
        target.decoder.fuse_decode = fuse and target.decoder.fused
        target.prepare(("closed_form",), (), 1)
        engine.generate(target, cases[0], route, 16, (), None)  # warm-up
        res = [engine.generate(target, p, route, NEW_TOKENS, (), None) for p in cases]
        new = sum(len(r.output_ids) for r in res)
        decode = sum(r.decode_s for r in res)
        steps = sum(r.steps for r in res)
        outputs[fuse] = [r.output_ids for r in res]
        rows.append(
            dict(
                decode="fused" if target.decoder.fuse_decode else "old",
                gemv=target.gemv,
                tokens_per_s=new / decode,
                wall_us_per_token=1e6 * decode / steps,
                tokens=new,
            )
        )
    same = sum(a == b for a, b in zip(outputs[True], outputs[False]))
    for r in rows:
        r["outputs_equal_old"] = f"{same}/{len(cases)}"
    return rows


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# dev-decode: the fused decode step (H200)",
        "",
        "## correctness (fused vs old decode)",
        "",
        "| dtype | gemv | graphed | logits err | state err | picks equal | pick = argmax | tol | ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in res["correctness"]:
        lines.append(
            f"| {c['dtype']} | {c['gemv']} | {c['graphed']} | {c['logits_err']:.2e} | {c['state_err']:.2e} | "
            f"{c['picks_equal']} | {c['pick_is_argmax']} | {c['tol']} | {c['ok']} |"
        )
    lines += [
        "",
        f"## decode graph per step (bf16; copy {res['ceilings']['copy_GBps']:.0f} GB/s)",
        "",
        "| shape | matmuls | decode | us | floor us | floor frac | kernels (eager) | err vs old | groups |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["timing"]:
        if "skipped" in r:
            lines.append(f"| {r['shape']} | {r['matmuls']} | skipped ({r['skipped']}) |")
            continue
        lines.append(
            f"| {r['shape']} | {r['matmuls']} | {r['decode']} | {r['us']:.1f} | {r['floor_us']:.1f} | "
            f"{r['floor_frac']:.0%} | {r['kernels']} | {r['logits_err_vs_old']:.1e} | {r['groups']} |"
        )
    lines += [
        "",
        f"## AR on tiny-qwen35 (bf16, 8 prompts x {NEW_TOKENS} tokens, GraphedTarget)",
        "",
        "| decode | gemv | tokens/s | wall us/token | outputs equal old |",
        "|---|---|---|---|---|",
    ]
    for r in res["ar"]:
        lines.append(
            f"| {r['decode']} | {r['gemv']} | {r['tokens_per_s']:.0f} | {r['wall_us_per_token']:.0f} | "
            f"{r['outputs_equal_old']} |"
        )
    lines += ["", f"total {res['seconds']:.0f} s"]
    return "\n".join(lines) + "\n"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name()}
    res["correctness"] = correctness()
    res["ceilings"] = measure_ceilings(DEV, TimerConfig(warmup_ms=2.0, rep_ms=10.0))
    res["timing"] = timing(res["ceilings"])
    res["ar"] = ar_rate()
    res["seconds"] = time.perf_counter() - t0
    (out / "dev-decode.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "dev-decode.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
