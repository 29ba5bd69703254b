"""GPU check and bench of the commit-latency branch (issue 13 item 3): the path commit reading a path index
(repro.gdn.triton_commit.commit_path_indexed) against token replay and the current path commit.

    python3 scripts/gpu/commit-latency.py OUT_DIR      (one H200: < 90 s)

Environment: COMMIT_LATENCY_BUDGET_S (70: commit rows not started by then are recorded as skipped;
COMMIT_LATENCY_STEP_BUDGET_S, 60: the same for the step rows), COMMIT_LATENCY_SHAPES (specla,weaver),
COMMIT_LATENCY_PARTS (commit,step: a second call can take the step rows alone).

At both paper layer shapes (repro.bench.shapes.SHAPES), a 128-node draft tree (make_tree("draft", 128, 3),
as scripts/gpu/dev-kernels13.py), accepted depths 1, 2, 4, 8, 16 (the first nodes of its deepest path):

- replay: fla's fused recurrence over the path's tokens (bf16 q/k/v, gathered outside the timing, as
  `repro bench kernels`' commit_replay_fla row);
- fused: the current commit_path_fused with the conv history (path gathered from the ancestor row);
- indexed-*: commit_path_indexed with the conv history at several contractions and tiles (the path index
  written once per step for every layer by write_path_index: outside the timing); ``path-index``: that
  write alone, timed once per shape (what a step pays once, not per layer);
- *-hot: the same with one node / path index shared by all input sets (in L2, as in the engine, where the
  acceptance writes it just before and every layer reads it); the other rows keep one per set (cold);
- indexed-*-x8: the same kernel on 8 stacked layers (8 input sets' states, factors, conv) in one launch,
  its time divided by 8: the per-layer cost if the decoder kept its GDN states and factors stacked (not yet:
  the decoder commits layer by layer).

Then (part "step", as many rows as the time allows) SpecLA's delayed commit inside the next verification
(`repro bench kernels` step rows: the previous step's path folded in by the tree kernel the decoder picks,
split at SpecLA's shape, fused at Weaver's; 64-node tree; depths 4 and 16), its pending path gathered from
the ancestor mask as before and read from the path index (``_indexed``, as the static decoder now does).

Each method is first checked on the first input set against the float64 recurrence over the path (state:
relative error <= 1e-5) and the conv reference (exact); then timed as the CUDA-graph median over 16 input
sets (fresh state, factors, conv operands, node and path index each: one cycle spills L2, as the bench's
rows). Prints the table and, per shape and depth, the fastest commit and whether it beats replay.

Writes OUT_DIR/commit-latency.json and OUT_DIR/commit-latency.md; exit 3 when a check fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.shapes import SHAPES, deepest_path, depths, make_tree
from repro.bench.timing import TimerConfig, graph_us, measure_ceilings
from repro.gdn import reference as gdn
from repro.gdn import triton_commit as tc
from repro.gdn.backends import recurrent_function
from repro.tree import Tree

BUDGET_S = float(os.environ.get("COMMIT_LATENCY_BUDGET_S", "70"))  # commit rows started after: skipped
STEP_BUDGET_S = float(os.environ.get("COMMIT_LATENCY_STEP_BUDGET_S", "60"))  # the same for the step rows
RUN_SHAPES = os.environ.get("COMMIT_LATENCY_SHAPES", "specla,weaver").split(",")
PARTS = os.environ.get("COMMIT_LATENCY_PARTS", "commit,step").split(",")
STEP_METHODS = {"specla": "step_delayed_split", "weaver": "step_delayed_fused"}  # the decoder's tree kernels
DEPTHS = [1, 2, 4, 8, 16]
N, WIDTH, SETS, TOL = 128, 4, 16, 1e-5
TIMER = TimerConfig(warmup_ms=1.0, rep_ms=4.0, graph_replays=3)
VARIANTS: dict[str, dict[str, Any]] = {  # commit_path_indexed settings
    "indexed-dot": {},  # 16 x 64 tiles, 4 warps, blocks of 16 rows as one exact dot
    "indexed-dot-w2": {"num_warps": 2},
    "indexed-rank1": {"mode": "rank1"},  # 16 rank-1 updates in straight-line code, no shared memory
    "indexed-rank1-w2": {"mode": "rank1", "num_warps": 2},
    "indexed-rank1-32x64": {"mode": "rank1", "block_v": 32},
    "indexed-dot-32x64": {"block_v": 32},
}
STACK = 8  # layers per launch of the stacked variant ("indexed-dot-x8": its time / 8 per layer)
STACKED = {f"indexed-dot-x{STACK}": {}, f"indexed-rank1-x{STACK}": {"mode": "rank1"}}
# "-hot": one node / path index shared by the 16 input sets, as the engine reads one per step in every layer
# (written just before: in L2); the other rows keep one per set (cold, as `repro bench kernels` rows)
HOT = ["fused-hot", "indexed-dot-hot", "indexed-rank1-hot"]
METHODS = ["replay", "fused", *VARIANTS, *STACKED, *HOT]


def draft_tree() -> list[int]:
    for seed in range(3, 103):
        parents = make_tree("draft", N, seed)
        if max(depths(parents)) >= max(DEPTHS):
            return parents
    raise RuntimeError("no draft tree deep enough")


class InputSet:
    """One input set of one shape: bench inputs (float64 and the kernels' dtypes), the float32 tree
    factors (repro.gdn.reference.tree_gdn, as the bench's commit rows), conv operands, node, path index."""

    def __init__(self, shape: str, parents: list[int], seed: int, dev: torch.device) -> None:
        sh = SHAPES[shape]
        self.x64 = km.make_inputs(sh, N, seed, dev)
        self.x32, self.xbf = self.x64.to("fp32"), self.x64.to("bf16")
        tree = torch.tensor(parents)
        self.anc = Tree(torch.zeros(N, dtype=torch.long), tree).ancestor_mask.to(dev)
        x = self.x32
        self.f = gdn.tree_gdn(
            x.q.float(), x.k.float(), x.v.float(), x.g, x.beta, x.state, self.anc, sh.scale
        )[1]
        # contiguous as the engine's buffers (delta is a view: the commits would copy it in every timed call;
        # they did up to 2026-12-02, results/2026-12-02-h200-delayed-phase1/NOTES.md)
        self.f.delta, self.f.k = self.f.delta.contiguous(), self.f.k.contiguous()
        gen = torch.Generator().manual_seed(seed)
        c = 2 * sh.h * sh.dk + sh.hv * sh.dv
        self.hist0 = torch.randn(WIDTH - 1, c, generator=gen).to(dev, torch.bfloat16)
        self.inputs = torch.randn(N, c, generator=gen).to(dev, torch.bfloat16)
        self.index = gdn.conv_gather_index(tree, WIDTH).to(dev)
        self.node = torch.zeros(1, dtype=torch.long, device=dev)
        self.path = tc.path_index_buffer(N, dev)
        self.state, self.hist = self.x32.state.clone(), self.hist0.clone()

    def accept(self, path: list[int], shared: tuple[torch.Tensor, torch.Tensor]) -> None:
        """The accepted path: the node and the path index, own and ``shared`` (once per step: untimed)."""
        self.shared = shared
        for node, index in ((self.node, self.path), shared):
            node.fill_(path[-1])
            tc.write_path_index(self.anc, node, index)
        self.gathered = [t[torch.tensor(path, device=t.device)].contiguous() for t in self.xbf_tokens()]

    def xbf_tokens(self) -> tuple[torch.Tensor, ...]:
        x = self.xbf
        return x.q, x.k, x.v, x.g, x.beta

    def reset(self) -> None:
        self.state.copy_(self.x32.state)
        self.hist.copy_(self.hist0)


def method_fn(name: str, s: InputSet, scale: float) -> Callable[[], Any]:
    """The timed call of ``name`` on input set ``s`` (state, history in place; replay returns its state)."""
    f = s.f
    node, path = s.shared if name.endswith("-hot") else (s.node, s.path)
    name = name.removesuffix("-hot")
    if name == "replay":
        replay = recurrent_function("triton")
        return lambda: replay(*s.gathered, s.xbf.state, scale)[1]
    if name == "fused":
        conv3 = (s.hist, s.inputs, s.index)
        return lambda: tc.commit_path_fused(s.state, f.delta, f.k, f.gate_cum, s.anc, node, conv=conv3)
    kw = VARIANTS[name]
    conv2 = (s.hist, s.inputs)
    return lambda: tc.commit_path_indexed(s.state, f.delta, f.k, f.gate_cum, path, conv=conv2, **kw)


class Stack:
    """STACK input sets' states, factors and conv operands stacked (one commit launch for all), one path."""

    def __init__(self, sets: list[InputSet]) -> None:
        self.sets, self.path = sets, sets[0].path
        self.state0 = torch.stack([s.x32.state for s in sets])
        self.hist0 = torch.stack([s.hist0 for s in sets])
        self.state, self.hist = self.state0.clone(), self.hist0.clone()
        self.ops = [torch.stack([getattr(s.f, a) for s in sets]) for a in ("delta", "k", "gate_cum")]
        self.inputs = torch.stack([s.inputs for s in sets])

    def fn(self, name: str) -> Callable[[], Any]:
        kw, conv = STACKED[name], (self.hist, self.inputs)
        return lambda: tc.commit_path_indexed(self.state, *self.ops, self.path, conv=conv, **kw)

    def reset(self) -> None:
        self.state.copy_(self.state0)
        self.hist.copy_(self.hist0)


def check_stack(name: str, st: Stack, path: list[int], scale: float) -> dict[str, Any]:
    """The stacked commit once vs every layer's float64 recurrence and conv reference."""
    st.reset()
    st.fn(name)()
    err, conv_bad = 0.0, 0
    p = torch.tensor(path, device=st.state.device)
    for i, s in enumerate(st.sets):
        x = s.x64
        ref = gdn.recurrent_gdn(x.q[p], x.k[p], x.v[p], x.g[p], x.beta[p], x.state, scale)[1]
        err = max(err, float((st.state[i].double() - ref).norm() / ref.norm()))
        want = gdn.conv_history_after(s.hist0.cpu(), s.inputs.cpu(), path)
        conv_bad += int((st.hist[i].cpu() != want).sum())
    st.reset()
    return {"state_err": err, "conv_mismatches": conv_bad, "ok": err <= TOL and conv_bad == 0}


def check(name: str, s: InputSet, path: list[int], scale: float) -> dict[str, Any]:
    """``name`` once on a fresh copy of set ``s`` vs the float64 recurrence over the path and the conv
    reference."""
    x = s.x64
    p = torch.tensor(path, device=x.q.device)
    ref = gdn.recurrent_gdn(x.q[p], x.k[p], x.v[p], x.g[p], x.beta[p], x.state, scale)[1]
    s.reset()
    out = method_fn(name, s, scale)()
    got = out if name == "replay" else s.state
    err = float((got.double().reshape(ref.shape) - ref).norm() / ref.norm())
    conv_bad = 0
    if name != "replay":
        want = gdn.conv_history_after(s.hist0.cpu(), s.inputs.cpu(), path)
        conv_bad = int((s.hist.cpu() != want).sum())
    s.reset()
    return {"state_err": err, "conv_mismatches": conv_bad, "ok": err <= TOL and conv_bad == 0}


def run_shape(shape: str, dev: torch.device, start: float) -> tuple[list[dict[str, Any]], float | None]:
    sh = SHAPES[shape]
    parents = draft_tree()
    sets = [InputSet(shape, parents, 1000 + i, dev) for i in range(SETS)]
    stacks = [Stack(sets[i : i + STACK]) for i in range(0, len(sets) - STACK + 1, STACK)]
    rows = []
    shared = (torch.zeros(1, dtype=torch.long, device=dev), tc.path_index_buffer(N, dev))
    for s in sets:
        s.accept(deepest_path(parents, max(DEPTHS)), shared)
    idx_fns = [lambda s=s: tc.write_path_index(s.anc, s.node, s.path) for s in sets]
    index_us = graph_us(idx_fns, dev, TIMER, 3.0)
    for d in DEPTHS:
        path = deepest_path(parents, d)
        for s in sets:
            s.accept(path, shared)
        for name in METHODS:
            row: dict[str, Any] = {"shape": shape, "depth": d, "method": name, "us_graph": None}
            if time.monotonic() - start > BUDGET_S:
                row["status"] = f"skipped: budget of {BUDGET_S:g} s spent"
                rows.append(row)
                continue
            try:
                if name in STACKED:  # per layer: the stacked launch's time over its layers
                    row.update(check_stack(name, stacks[0], path, sh.scale))
                    if row["ok"]:
                        row["us_launch"] = graph_us([st.fn(name) for st in stacks], dev, TIMER, 5.0 * STACK)
                        row["us_graph"] = row["us_launch"] / STACK
                        for st in stacks:
                            st.reset()
                else:
                    row.update(check(name, sets[0], path, sh.scale))
                    if row["ok"]:
                        fns = [method_fn(name, s, sh.scale) for s in sets]
                        row["us_graph"] = graph_us(fns, dev, TIMER, 5.0)
                        for s in sets:
                            s.reset()
                row["status"] = "ok" if row["ok"] else "FAIL"
            except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the table
                row.update(status=f"error: {type(exc).__name__}: {exc}", ok=False)
            rows.append(row)
            print(row, flush=True)
    return rows, index_us


def summary(rows: list[dict[str, Any]], index_us: dict[str, float | None]) -> tuple[str, dict[str, Any]]:
    """The markdown table (us per layer call, CUDA graph) and per (shape, depth) the fastest commit."""
    lines = ["| shape | depth | " + " | ".join(METHODS) + " | fastest per-layer commit | vs replay |"]
    lines.append("|---|---|" + "---|" * (len(METHODS) + 2))
    best: dict[str, Any] = {}
    wins: dict[str, list[float]] = {}
    for shape in RUN_SHAPES:
        for d in DEPTHS:
            us = {r["method"]: r["us_graph"] for r in rows if (r["shape"], r["depth"]) == (shape, d)}
            # the verdict: per-layer launches with a cold node / path index (as replay's inputs are cold)
            commits = {m: u for m, u in us.items() if m not in ("replay", *STACKED, *HOT) and u is not None}
            fast = min(commits, key=commits.get) if commits else None
            rep = us.get("replay")
            ratio = rep / commits[fast] if fast and rep else None
            best[f"{shape}/{d}"] = {
                "fastest": fast,
                "us": commits.get(fast),
                "replay_us": rep,
                "speedup": ratio,
            }
            for m, u in us.items():
                if rep and u is not None and m != "replay":
                    wins.setdefault(f"{shape}:{m}", []).append(rep / u)
            cells = " | ".join("" if us.get(m) is None else f"{us[m]:.2f}" for m in METHODS)
            verdict = "" if ratio is None else f"{ratio:.2f}x ({'wins' if ratio > 1 else 'loses'})"
            lines.append(f"| {shape} | {d} | {cells} | {fast or ''} | {verdict} |")
    lines.append("")
    lines.append("path-index write (once per step, not per layer): "
                 + ", ".join(f"{s} {u:.2f} us" for s, u in index_us.items() if u is not None))  # fmt: skip
    lines.append("")
    lines.append("worst speedup over replay across depths, per commit (higher is better):")
    worst = {k: min(v) for k, v in wins.items() if len(v) == len(DEPTHS)}
    for k, v in sorted(worst.items(), key=lambda kv: -kv[1]):
        lines.append(f"- {k}: {v:.2f}x {'(beats replay at every depth)' if v > 1 else ''}")
    return "\n".join(lines) + "\n", {"per_depth": best, "worst_speedup": worst}


def step_rows(dev: torch.device, start: float) -> list[dict[str, Any]]:
    """The delayed-commit step rows through repro.bench.kernels.measure (checked vs float64, then timed)."""
    cfg = bk.BenchConfig(timer=TIMER, depths=[4, 16])
    ceilings = measure_ceilings(dev, cfg.timer, quick=True)
    rows = []
    for shape in RUN_SHAPES:
        for d in (4, 16):
            for method in (STEP_METHODS[shape], STEP_METHODS[shape] + "_indexed"):
                spec = bk.RowSpec(shape, "step", "draft", 64, method, "bf16", d)
                late = time.monotonic() - start > STEP_BUDGET_S
                row = bk.measure(
                    spec, cfg, dev, ceilings, f"budget of {STEP_BUDGET_S:g} s spent" if late else None
                )
                rows.append(
                    {k: row.get(k) for k in ("shape", "depth", "method", "status", "rel_err", "us_graph")}
                )
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    dev = torch.device("cuda")
    rows: list[dict[str, Any]] = []
    index_us: dict[str, float | None] = {}
    for shape in RUN_SHAPES if "commit" in PARTS else []:
        got, index_us[shape] = run_shape(shape, dev, start)
        rows += got
    steps = step_rows(dev, start) if "step" in PARTS else []
    table, verdict = summary(rows, index_us)
    table += "\n## Delayed commit inside the next verification (us per step and layer, CUDA graph)\n\n"
    table += "| shape | depth | method | status | rel_err | us_graph |\n|---|---|---|---|---|---|\n"
    table += "".join(f"| {r['shape']} | {r['depth']} | {r['method']} | {r['status']} | {r['rel_err']} | "
                     f"{r['us_graph']} |\n" for r in steps)  # fmt: skip
    seconds = time.monotonic() - start
    result = {"device": torch.cuda.get_device_name(), "seconds": seconds, "variants": VARIANTS, "rows": rows,
              "path_index_us": index_us, "step_rows": steps, **verdict}  # fmt: skip
    (out_dir / "commit-latency.json").write_text(json.dumps(result, indent=1, default=str))
    text = f"# commit-latency on {result['device']} ({seconds:.0f} s)\n\n"
    text += "us per layer call (CUDA-graph median)\n\n"
    text += table
    (out_dir / "commit-latency.md").write_text(text)
    print(text)
    bad = [r for r in rows + steps if str(r.get("status", "")).startswith(("FAIL", "error"))]
    sys.exit(3 if bad else 0)


if __name__ == "__main__":
    main()
