"""A verify slot's derive kernel (repro/models/slot_kernels.py: depths, ancestors, conv index, first flags)
at each launch choice, and the accept kernels at theirs, on the routes' slot sizes, H200.

    python3 scripts/gpu/slot-bench.py OUT_DIR      (one H200: < 30 s)

Trees of 17 / 33 / 65 nodes (chain DFlash's, budget-32's and budget-64's slots), each a chain (the deepest
walk) and a bushy tree (parents among the last 3 nodes: DDTree-like depths). ``derive_slot`` runs at every
(rows a program, warps) of GRID, each checked equal to the default launch's outputs first, then timed as a
CUDA graph of one call (``repro.bench.timing.graph_us``, median us per call); ``greedy_node`` and
``path_result`` at their defaults beside, and ``greedy_node`` at every (rows a step, warps) of GREEDY_GRID
(each checked equal to its default's node and bonus). Writes OUT_DIR/slot-bench.json and
OUT_DIR/slot-bench.md; prints the markdown. Exit 3 on a mismatch.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.timing import TimerConfig, graph_us  # noqa: E402
from repro.models import slot_kernels  # noqa: E402

DEV = torch.device("cuda")
TIMER = TimerConfig(warmup_ms=2.0, rep_ms=10.0, graph_replays=5)
SIZES = (17, 33, 65)
GRID = [(rows, warps) for rows in (1, 2, 4, 8, 16) for warps in (1, 2, 4)]
GREEDY_GRID = [(rows, warps) for rows in (8, 16, 32, 64) for warps in (1, 2, 4)]
CONV = 4  # the conv kernel width (tiny-qwen35's and the real shapes')


def tree(n: int, kind: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, parents) on the device: a chain, or each node's parent among the 3 nodes before it."""
    if kind == "chain":
        parents = torch.arange(-1, n - 1)
    else:
        back = torch.randint(1, 4, (n,), generator=gen)
        parents = (torch.arange(n) - back).clamp(min=0)
        parents[0] = -1
    tokens = torch.randint(0, 5, (n,), generator=gen)
    return tokens.to(DEV), parents.to(DEV)


def outputs(n: int) -> tuple[torch.Tensor, ...]:
    """Fresh depth, ancestors, conv index and first buffers of an n-node slot."""
    return (
        torch.zeros(n, dtype=torch.long, device=DEV),
        torch.zeros(n, n, dtype=torch.bool, device=DEV),
        torch.zeros(n, CONV, dtype=torch.long, device=DEV),
        torch.zeros(n, dtype=torch.bool, device=DEV),
    )


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    rows, bad = [], []
    for n in SIZES:
        for kind in ("chain", "bushy"):
            tokens, parents = tree(n, kind, gen)
            want = outputs(n)
            slot_kernels.derive_slot(tokens, parents, *want)
            depth = int(want[0].max())
            row = {"nodes": n, "tree": kind, "depth": depth, "derive_us": {}}
            default = partial(slot_kernels.derive_slot, tokens, parents, *want)
            row["default_us"] = graph_us([default], DEV, TIMER, estimate_us=10.0)
            for br, warps in GRID:
                got = outputs(n)
                call = partial(
                    slot_kernels.derive_slot, tokens, parents, *got, block_rows=br, num_warps=warps
                )
                call()
                if not all(torch.equal(g, w) for g, w in zip(got, want)):
                    bad.append(f"n {n} {kind} rows {br} warps {warps}")
                row["derive_us"][f"{br}/{warps}"] = graph_us([call], DEV, TIMER, estimate_us=5.0)
            choice = torch.randint(0, 5, (n,), generator=gen, device="cpu").to(DEV)
            node, bonus = (torch.zeros(1, dtype=torch.long, device=DEV) for _ in range(2))
            result = torch.zeros(2 + 2 * depth, dtype=torch.long, device=DEV)
            d, anc, _, first = want
            greedy = partial(slot_kernels.greedy_node, choice, tokens, parents, first, d, anc, node, bonus)
            path = partial(slot_kernels.path_result, node, bonus, tokens, d, anc, result)
            row["greedy_node_us"] = graph_us([greedy], DEV, TIMER, estimate_us=5.0)
            row["greedy_us"] = {}
            want_node = (node.clone(), bonus.clone())
            for br, warps in GREEDY_GRID:
                node.fill_(-1)
                bonus.fill_(-1)
                call = partial(greedy, block_rows=br, num_warps=warps)
                call()
                if not (torch.equal(node, want_node[0]) and torch.equal(bonus, want_node[1])):
                    bad.append(f"greedy_node n {n} {kind} rows {br} warps {warps}")
                row["greedy_us"][f"{br}/{warps}"] = graph_us([call], DEV, TIMER, estimate_us=5.0)
            row["path_result_us"] = graph_us([path], DEV, TIMER, estimate_us=5.0)
            rows.append(row)
            print(json.dumps(row), flush=True)
    names = [f"{br}/{w}" for br, w in GRID]
    lines = [
        "# slot-bench: a slot's derive kernel by (rows a program / warps), CUDA-graph median us a call",
        "",
        f"against the default launch: {'**mismatches: ' + ', '.join(bad) + '**' if bad else 'all equal'}",
        "",
        "| nodes | tree | depth | default | " + " | ".join(names) + " | greedy_node | path_result |",
        "|--:|---|--:|--:|" + "--:|" * len(names) + "--:|--:|",
    ]
    for row in rows:
        cells = [f"{row['derive_us'][name]:.1f}" for name in names]
        lines.append(
            f"| {row['nodes']} | {row['tree']} | {row['depth']} | {row['default_us']:.1f} | "
            + " | ".join(cells)
            + f" | {row['greedy_node_us']:.1f} | {row['path_result_us']:.1f} |"
        )
    greedy_names = [f"{br}/{w}" for br, w in GREEDY_GRID]
    lines += [
        "",
        "greedy_node by (rows a step / warps), us:",
        "",
        "| nodes | tree | default | " + " | ".join(greedy_names) + " |",
        "|--:|---|--:|" + "--:|" * len(greedy_names),
    ]
    for row in rows:
        cells = [f"{row['greedy_us'][name]:.1f}" for name in greedy_names]
        lines.append(
            f"| {row['nodes']} | {row['tree']} | {row['greedy_node_us']:.1f} | " + " | ".join(cells) + " |"
        )
    md = "\n".join(lines) + "\n"
    (out / "slot-bench.md").write_text(md)
    (out / "slot-bench.json").write_text(json.dumps({"rows": rows, "mismatches": bad}, indent=1))
    print(md)
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
