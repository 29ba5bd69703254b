"""GPU check and timing of the EAGLE drafter's one-launch attention (branch eagle-attn).

Usage: python scripts/gpu/eagle-attn.py OUT_DIR [--cpu-dry-run]   (CUDA; well under 90 s on an H200)

1. The attention glue of one drafter layer, bf16, CUDA graphs (``REPS`` calls captured in one graph, the
   median over ``ITERS`` replays, per call, in us): eager (``eager_tables`` + ``rope_attend_eager`` of
   repro/drafters/eagle_fast.py: the rotary table's rows and the additive mask, rotary, the two KV writes,
   ``attend``: 12 launches, what a one-layer drafter's forward spends on attention) against
   ``rope_attend`` (one launch; its default splits of the buffer rows, and one program per kv head), at
   the tiny family's drafter shape (its trained EAGLE drafter's heads) and the GDN-1.3B EAGLE shape (16
   heads, 16 kv heads, head dim 128: ``repro.drafters.shapes.GDN13B_EAGLE``), rows n = 1, 4, 8, 32 and
   buffer rows S = 512, 2048 (a tree mask: the committed prefix, a few ancestors and the row's own slot).
   Before timing each kernel's output is compared with eager's (relative error, expected ~4e-3 in bf16:
   eager rounds its scores to bf16; the keys / values buffers' largest difference, expected 0 or one bf16
   ulp of a key) and one float32 case per shape (expected <= 1e-5). Then the kernel's launch options (splits,
   key block rows) at the GDN-1.3B shape, S = 2048, n = 4.
2. One SpecLA proposal (``StaticEagleDrafter``, fast, CUDA graphs, bf16: budget 32, topk 4, tau 0.05,
   depth 6) at both shapes (as scripts/gpu/eagle-fast.py builds them: the tiny family's trained drafter;
   the GDN-1.3B EAGLE drafter with random weights on a 2-layer random target), with the kernel and with
   the eager attention glue (``FastEagle.fused_attention = False``); their trees compared first (bf16 may
   flip near-ties), then timed with eagle-fast.py's ``time_drafter`` (event median of ``propose``, the
   graph's replay).

Writes OUT_DIR/eagle-attn.json and OUT_DIR/eagle-attn.md and prints the tables. ``--cpu-dry-run``: the
tiny shape only, small sizes, float32 through Triton's interpreter, no graphs: a check of the script.
"""

from __future__ import annotations

import os
import sys

DRY = "--cpu-dry-run" in sys.argv[2:]
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    os.environ.setdefault("EAGLE_FAST_CALLS", "3")
os.environ.setdefault("EAGLE_FAST_CALLS", "20")  # proposals timed per drafter (scripts/gpu/eagle-fast.py)

import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

import repro.gdn.triton_common  # noqa: E402, F401 - the interpreter's NumPy patch (dry run)
from repro.drafters import eagle_attention  # noqa: E402
from repro.drafters.eagle_attention import launch_plan, rope_attend  # noqa: E402

eagle_attention.CUDA_DEFAULT = True  # the kernel on CUDA (off by default until this script has run)
from repro.drafters.eagle_fast import eager_tables, rope_attend_eager  # noqa: E402
from repro.drafters.fast_rules import rotary_rows, signed_rotary  # noqa: E402
from repro.drafters.shapes import GDN13B_EAGLE  # noqa: E402

_spec = importlib.util.spec_from_file_location("eagle_fast_script", Path(__file__).with_name("eagle-fast.py"))
ef = importlib.util.module_from_spec(_spec)  # the proposal helpers of scripts/gpu/eagle-fast.py
_spec.loader.exec_module(ef)  # type: ignore[union-attr]

DEVICE = torch.device("cpu" if DRY else "cuda")
DTYPE = torch.float32 if DRY else torch.bfloat16
ROWS = [1, 4] if DRY else [1, 4, 8, 32]
BUFFER = [100, 300] if DRY else [512, 2048]
REPS, ITERS = (1, 2) if DRY else (20, 7)
VARIANTS = [(2, 32)] if DRY else [(4, 64), (8, 32), (16, 32), (16, 64)]  # (splits, key block rows)
SPECLA = {"tree": ef.DynamicTree(32, topk=4, tau=0.05, depth=6)}


def shapes() -> dict[str, tuple[int, int, int]]:
    """(heads, kv heads, head dim) of the tiny family's EAGLE drafter and of the GDN-1.3B one."""
    _, model = ef.tiny(torch.float32)
    c = model.config
    out = {"tiny": (c.num_attention_heads, c.num_key_value_heads, c.head_dim)}
    if not DRY:
        g = GDN13B_EAGLE
        out["gdn-1.3b"] = (g["num_attention_heads"], g["num_key_value_heads"], g["head_dim"])
    return out


def inputs(heads: int, kv: int, hd: int, n: int, S: int, dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """One layer's q|k|v rows and buffers: the last ``max(n, 64)`` buffer rows are the drafted slots
    (shuffled), each row sees the committed prefix, the slots of up to 3 earlier rows and its own."""
    g = torch.Generator().manual_seed(seed)
    draft = max(n, 64)
    committed = S - draft
    slots = committed + torch.randperm(draft, generator=g)[:n]
    mask = torch.zeros(n, S, dtype=torch.bool)
    mask[:, :committed] = True
    for i in range(n):
        mask[i, slots[max(0, i - 3) : i + 1]] = True
    on = {"device": DEVICE}
    return {
        "qkv": torch.randn(n, (heads + 2 * kv) * hd, generator=g).to(dtype=dtype, **on),
        "rope": signed_rotary(*rotary_rows(S + 8, hd, 10000.0, dtype, DEVICE)),
        "positions": (committed + torch.randint(0, 6, (n,), generator=g)).to(**on),
        "keys": torch.randn(kv, S, hd, generator=g).to(dtype=dtype, **on),
        "values": torch.randn(kv, S, hd, generator=g).to(dtype=dtype, **on),
        "mask": mask.to(**on),
        "slots": slots.to(**on),
        "counters": torch.zeros(kv, dtype=torch.int32, **on),
    }


def paths(x: dict[str, Any], heads: int, kv: int, hd: int) -> dict[str, Callable[[], torch.Tensor]]:
    """The eager glue (its tables made per call, as per forward) and the kernel (default splits; one
    program a kv head), each on its own copy of the buffers."""
    zero = torch.zeros((), dtype=x["qkv"].dtype, device=DEVICE)
    blocked = torch.full((), float("-inf"), dtype=x["qkv"].dtype, device=DEVICE)
    bufs = {name: (x["keys"].clone(), x["values"].clone()) for name in ("eager", "kernel", "kernel_1")}

    def eager() -> torch.Tensor:
        cos, sin, bias = eager_tables(x["rope"], x["positions"], x["mask"], heads // kv, zero, blocked)
        k, v = bufs["eager"]
        return rope_attend_eager(x["qkv"], cos, sin, k, v, bias, x["slots"], heads, kv, hd)

    def kernel(name: str, splits: int | None) -> Callable[[], torch.Tensor]:
        k, v = bufs[name]
        args = (
            x["qkv"],
            x["rope"],
            x["positions"],
            k,
            v,
            x["mask"],
            x["slots"],
            heads,
            kv,
            hd,
            x["counters"],
        )
        return lambda: rope_attend(*args, splits=splits)

    fns = {"eager": eager, "kernel": kernel("kernel", None), "kernel_1": kernel("kernel_1", 1)}
    fns["buffers"] = lambda: bufs  # type: ignore[assignment]
    return fns


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def graph_us(fn: Callable[[], Any]) -> float:
    """Median time of one call of ``fn`` in us: ``REPS`` calls captured in one CUDA graph, ``ITERS`` replays
    (the wall clock of direct calls in a dry run)."""
    if DRY:
        t = time.perf_counter()
        for _ in range(ITERS):
            fn()
        return 1e6 * (time.perf_counter() - t) / ITERS
    from repro.models.graphs import GraphedCall

    call = GraphedCall(lambda: [fn() for _ in range(REPS)], DEVICE)
    call.replay()
    times = []
    for _ in range(ITERS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(1e3 * a.elapsed_time(b) / REPS)
    return statistics.median(times)


def glue(shape_of: dict[str, tuple[int, int, int]]) -> tuple[list[dict], list[dict]]:
    """Checks and timings of the attention glue per shape, n and S."""
    checks, rows = [], []
    for shape, (heads, kv, hd) in shape_of.items():
        x = inputs(heads, kv, hd, 4, BUFFER[0], torch.float32)  # float32: the kernel within 1e-5 of eager
        f = paths(x, heads, kv, hd)
        ref = f["eager"]()
        for name in ("kernel",):
            checks.append({"shape": shape, "dtype": "float32", "n": 4, "S": BUFFER[0], "path": name,
                           "rel_err": rel(f[name](), ref)})  # fmt: skip
            print(json.dumps(checks[-1]), flush=True)
        for S in BUFFER:
            for n in ROWS:
                x = inputs(heads, kv, hd, n, S, DTYPE, seed=n + S)
                f = paths(x, heads, kv, hd)
                ref = f["eager"]()
                bufs = f["buffers"]()
                row: dict[str, Any] = {"shape": shape, "n": n, "S": S, "splits": launch_plan(S, hd)[0]}
                for name in ("kernel", "kernel_1"):
                    got = f[name]()
                    diff = max(
                        float((a.float() - b.float()).abs().max()) for a, b in zip(bufs[name], bufs["eager"])
                    )
                    row[f"{name}_rel_err"], row[f"{name}_kv_diff"] = rel(got, ref), diff
                for name in ("eager", "kernel", "kernel_1"):
                    row[f"{name}_us"] = graph_us(f[name])
                rows.append(row)
                print(json.dumps(row), flush=True)
    return checks, rows


def variants(shape_of: dict[str, tuple[int, int, int]]) -> list[dict]:
    """The kernel's launch options at the last shape's largest buffer, 4 rows (``VARIANTS``: splits x key
    block rows; speed only): checked against the default, then timed."""
    shape, (heads, kv, hd) = list(shape_of.items())[-1]
    S, n = BUFFER[-1], 4
    x = inputs(heads, kv, hd, n, S, DTYPE, seed=7)
    args = (x["qkv"], x["rope"], x["positions"], x["keys"], x["values"], x["mask"], x["slots"], heads, kv, hd)
    ref = rope_attend(*args, x["counters"])
    rows = []
    for splits, block_s in VARIANTS:
        fn = functools.partial(rope_attend, *args, x["counters"], splits=splits, block_s=block_s)
        got = fn()
        plan = launch_plan(S, hd, splits, block_s)[0]
        row = {
            "shape": shape,
            "n": n,
            "S": S,
            "splits": plan,
            "block_s": block_s,
            "rel_err_vs_default": rel(got, ref),
        }
        rows.append({**row, "us": graph_us(fn)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def proposals() -> tuple[list[dict], list[dict]]:
    """SpecLA proposals with and without the kernel, per shape: compared, then timed."""
    checks, rows = [], []
    builds = {"tiny": ef.tiny} if DRY else {"tiny": ef.tiny, "gdn-1.3b": ef.gdn13b}
    for shape, build in builds.items():
        target, model = build(DTYPE)
        ctxs = ef.contexts(target.config.vocab_size, ef.CONTEXT[shape], ef.CALLS)
        ds = {name: ef.static(model, target, True, SPECLA) for name in ("kernel", "eager_glue")}
        ds["eager_glue"]._fast.fused_attention = False
        assert ds["kernel"]._fast.fused_attention
        ef.prefilled(target, ctxs[0].prompt_ids, list(ds.values()))
        checks.append({"shape": shape, **ef.compare(ds["eager_glue"], ds["kernel"], ctxs[: ef.CHECKS])})
        print(json.dumps(checks[-1]), flush=True)
        for name, d in ds.items():
            rows.append({"shape": shape, "path": name, **ef.time_drafter(d, ctxs)})
            print(json.dumps(rows[-1]), flush=True)
        del target, model, ds
    return checks, rows


def markdown(r: dict[str, Any]) -> str:
    md = [
        f"# eagle-attn: the EAGLE drafter's attention in one launch ({r['dtype']}, CUDA graphs)",
        "",
        f"{r['device']}, torch {r['torch']}; per call, median of {ITERS} replays of {REPS} calls; heads "
        f"{r['shapes']}.",
        "",
        "| shape | n | S | splits | eager us | kernel us | 1 split us | speedup | rel err | KV max diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["glue"]:
        md.append(
            f"| {x['shape']} | {x['n']} | {x['S']} | {x['splits']} | {x['eager_us']:.1f} | "
            f"{x['kernel_us']:.1f} | {x['kernel_1_us']:.1f} | {x['eager_us'] / x['kernel_us']:.2f}x | "
            f"{x['kernel_rel_err']:.1e} | "
            f"{max(x['kernel_kv_diff'], x['kernel_1_kv_diff']):.1e} |"
        )
    md += [
        "",
        "float32 checks: " + ", ".join(f"{c['shape']} {c['path']} {c['rel_err']:.1e}" for c in r["checks"]),
    ]
    md += [
        "",
        "| shape | n | S | splits | key block rows | us | rel err vs default |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in r["variants"]:
        md.append(
            f"| {x['shape']} | {x['n']} | {x['S']} | {x['splits']} | {x['block_s']} | {x['us']:.1f} | "
            f"{x['rel_err_vs_default']:.1e} |"
        )
    md += [
        "",
        "| shape | SpecLA proposal | propose ms (event median) | wall ms/call | replay ms |",
        "|---|---|---|---|---|",
    ]
    for x in r["proposals"]:
        md.append(
            f"| {x['shape']} | {x['path']} | {x['event_ms_median']:.3f} | {x['wall_ms_per_call']:.3f} | "
            f"{x.get('replay_ms', float('nan')):.3f} |"
        )
    md += [
        "",
        "trees kernel vs eager glue: " + ", ".join(f"{c['shape']} {c['same']}" for c in r["proposal_checks"]),
    ]
    return "\n".join(md) + "\n"


def main(out: Path) -> None:
    if not DRY and not torch.cuda.is_available():
        sys.exit("eagle-attn.py needs a CUDA GPU (or --cpu-dry-run)")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    shape_of = shapes()
    result: dict[str, Any] = {
        "script": "scripts/gpu/eagle-attn.py",
        "device": "cpu (dry run, Triton interpreter)" if DRY else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": str(DTYPE).removeprefix("torch."),
        "shapes": shape_of,
        "reps": REPS,
        "iters": ITERS,
    }
    result["checks"], result["glue"] = glue(shape_of)
    result["variants"] = variants(shape_of)
    result["proposal_checks"], result["proposals"] = proposals()
    result["seconds"] = time.perf_counter() - t0
    (out / "eagle-attn.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (out / "eagle-attn.md").write_text(md)
    print(md)
    print(f"done in {result['seconds']:.1f} s -> {out}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python scripts/gpu/eagle-attn.py OUT_DIR [--cpu-dry-run]")
    main(Path(sys.argv[1]))
