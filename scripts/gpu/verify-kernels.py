"""Where the tiny family's verify step goes, kernel by kernel, beside the decode step (issue 10: 2x), H200.

    python3 scripts/gpu/verify-kernels.py OUT_DIR      (one H200: < 60 s)

In `results/2026-12-04-h200-drafter-launches/routes` a 33-node verify costs 0.237 ms of graph time, about 2.1
AR decode steps (0.114 ms); its graph launches 65 kernels against the decode step's 43
(`results/2026-12-04-h200-host-loop-profiles/callBF`). That verify alone caps DDTree near 2x at its MAL. This
script asks which kernels make the difference. It uses the embedded tiny-qwen35 in bf16
on the StaticDecoder that `repro run` builds (its GDN backend, `GraphedTarget`'s options with graphs on), with
a 64-token prefill. Calls:
- the decode step;
- verify of a device tree on a deriving slot, as the engine's verify graph runs it: a chain of 16 nodes
  (chain DFlash's block) and best-first trees of 33 and 65 nodes (DDTree / DFlash-TfM at budgets 32 and 64;
  `repro.bench.shapes.draft_tree`);
- after the 33-node verify, the engine's greedy accept graph on its logits: accept, the accepted path's
  result and the closed-form commit (each replay commits again and moves the length on; the work per call
  is the same).

For each call it reports:
- the median CUDA-graph time per call (`repro.bench.timing.graph_us`);
- the kernels of one eager call (torch profiler), summed by name, with their count. Eager kernel times
  leave out the gaps a graph replay has between kernels; `gaps` = graph time minus the eager kernel sum.

With VERIFY_KERNELS_FORMS=1 it also times the whole verify step of the chain of 17 nodes (chain DFlash's
slot) and the tree of 33 (budget 32's) under each of TREE_FORMS: the split tree kernel at its default tiles
(32-row blocks, 16-wide d_v tiles at this width), on one 64-row block, on 64-wide d_v tiles (one program a
value head in phase 2), and the fused kernel; each step's logits against the default's (max abs difference,
top-1 agreement). Routes A/B `fused_tree` (results/2026-12-04-h200-derive-rows/callCH) had chain DFlash's
verify faster on the fused kernel and the 33-node verifies slower.

VERIFY_KERNELS_GATED=1 (or 0) turns ``static_layers.GATED_OUT_PROJ`` on (off) for every call: the GDN layers'
output gated norm inside their out_proj's row-tiled launch (one launch a layer fewer).

Writes OUT_DIR/verify-kernels.json and OUT_DIR/verify-kernels.md; prints the markdown.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.model import profile_kernels  # noqa: E402
from repro.bench.shapes import draft_tree  # noqa: E402
from repro.bench.timing import TimerConfig, graph_us  # noqa: E402
from repro.gdn import triton_tree  # noqa: E402
from repro.gdn.backends import default_backend  # noqa: E402
from repro.models import static, static_layers  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402
from repro.models.static import TreeSlot  # noqa: E402
from repro.models.target import open_target  # noqa: E402
from repro.tree import DeviceTree  # noqa: E402

DEV = torch.device("cuda")
TIMER = TimerConfig(warmup_ms=2.0, rep_ms=10.0, graph_replays=5)
TOP = 14


def row(name: str, fn: Any, estimate_us: float) -> dict[str, Any]:
    prof = profile_kernels(fn, DEV, key=lambda kernel: kernel[:90])  # by name (truncated)
    if prof is None:
        raise RuntimeError(f"{name}: the profiler saw no CUDA kernel")
    ks, eager = prof.groups, prof.busy_us
    us = graph_us([fn], DEV, TIMER, estimate_us=estimate_us)
    return {"call": name, "graph_us": us, "launches": prof.kernels, "kernel_us": eager,
            "gaps_us": us - eager, "kernels": ks}  # fmt: skip


def _tiles(block_rows: int | None = None, block_v: int | None = None) -> Any:
    """split_tiles with its block rows / d_v tile forced (where the tree fits them)."""
    base = triton_tree.split_tiles

    def tiles(n: int, hv: int, dv: int, precision: str, br: int | None = None, bv: int | None = None) -> Any:
        got = base(n, hv, dv, precision, br, bv)
        return (block_rows or got[0], min(block_v, triton.next_power_of_2(dv)) if block_v else got[1])

    return tiles


TREE_FORMS = {  # name: (patches of (module, attribute, value))
    "split (default tiles)": (),
    "split, one 64-row block": ((triton_tree, "split_tiles", _tiles(block_rows=64)),),
    "split, 64-wide d_v tiles": ((triton_tree, "split_tiles", _tiles(block_v=64)),),
    "fused": ((static, "select_tree_kernel", lambda *args: "fused"),),
}


def tree_forms(dec: Any, vocab: int, gen: torch.Generator) -> list[dict[str, Any]]:
    """The verify step at 17 (chain) and 33 (tree) nodes under each of TREE_FORMS."""
    out = []
    for name, parents in (("chain 17", [-1] + list(range(16))), ("tree 33", draft_tree(33, 33))):
        n = len(parents)
        tokens = torch.randint(0, vocab, (n,), generator=gen)
        slot = TreeSlot(dec, n, derive=True)
        slot.set_device_tree(DeviceTree(tokens.to(DEV), torch.tensor(parents, device=DEV)))
        want = None
        for form, patches in TREE_FORMS.items():
            saved = [(m, a, getattr(m, a)) for m, a, _ in patches]
            for m, a, v in patches:
                setattr(m, a, v)
            try:
                logits = dec.verify(slot).float().clone()
                us = graph_us([partial(dec.verify, slot)], DEV, TIMER, estimate_us=200.0)
            except Exception as exc:  # a form the kernels refuse at this shape: recorded, not fatal
                out.append({"verify": name, "form": form, "error": f"{type(exc).__name__}: {exc}"[:200]})
                print(json.dumps(out[-1]), flush=True)
                continue
            finally:
                for m, a, v in saved:
                    setattr(m, a, v)
            want = logits if want is None else want
            err = float((logits - want).abs().max())
            top1 = float((logits.argmax(-1) == want.argmax(-1)).float().mean())
            out.append({"verify": name, "form": form, "graph_us": us, "max_abs_diff": err, "top1": top1})
            print(json.dumps(out[-1]), flush=True)
    return out


def accept_commit(dec: Any, slot: TreeSlot) -> None:
    """What GraphedTarget's greedy accept graph runs after a verify (its ``_accept_call``), closed form."""
    dec.accept(slot)
    dec.accepted_path(slot)
    dec.commit(slot, "closed_form")


@torch.no_grad()
def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    gated = os.environ.get("VERIFY_KERNELS_GATED")
    static_layers.GATED_OUT_PROJ = static_layers.GATED_OUT_PROJ if gated is None else gated == "1"
    model, _ = open_target("default", "bfloat16", "cuda")
    model.set_gdn_backend(default_backend(DEV, model.dtype))  # as `repro run` (harness/runner.py) sets it
    target = GraphedTarget(model, max_len=4096, max_nodes=128)  # graphs on: the engine's kernel options
    gen = torch.Generator().manual_seed(1)
    target.prefill(torch.randint(0, model.config.vocab_size, (64,), generator=gen).tolist())
    dec = target.decoder
    rows = []
    dec.set_token(7)
    rows.append(row("decode step", dec.decode_pick, 120.0))
    vocab = model.config.vocab_size
    for name, parents in (
        ("verify chain 16", [-1] + list(range(15))),
        ("verify tree 33", draft_tree(33, 33)),
        ("verify tree 65", draft_tree(65, 65)),
    ):
        n = len(parents)
        tokens = torch.randint(0, vocab, (n,), generator=gen)
        slot = TreeSlot(dec, n, derive=True)
        slot.set_device_tree(DeviceTree(tokens.to(DEV), torch.tensor(parents, device=DEV)))
        rows.append(row(name, partial(dec.verify, slot), 250.0))
        if n == 33:  # the engine's greedy accept graph after it: accept, the path's result, the commit
            rows.append(row("accept + commit tree 33", partial(accept_commit, dec, slot), 40.0))
    base = rows[0]["graph_us"]
    lines = [
        "# verify-kernels: tiny-qwen35, bf16, H200",
        "",
        "| call | graph us | x decode | launches | eager kernel us | gaps us (graph - kernels) |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['call']} | {r['graph_us']:.1f} | {r['graph_us'] / base:.2f} | {r['launches']} | "
            f"{r['kernel_us']:.1f} | {r['gaps_us']:.1f} |"
        )
    for r in rows:
        lines += [
            "",
            f"## {r['call']}: kernels by summed device time (eager)",
            "",
            "| kernel | n | us |",
            "|---|--:|--:|",
        ]
        top = sorted(r["kernels"].items(), key=lambda kv: -kv[1][1])[:TOP]
        lines += [f"| `{k}` | {n} | {us:.1f} |" for k, (n, us) in top]
    forms = tree_forms(dec, vocab, gen) if os.environ.get("VERIFY_KERNELS_FORMS") == "1" else []
    if forms:
        lines += [
            "",
            "## The verify step by tree kernel form (graph us)",
            "",
            "| verify | form | graph us | max abs diff vs default | top-1 agreement |",
            "|---|---|--:|--:|--:|",
        ]
        lines += [
            f"| {f['verify']} | {f['form']} | {f['graph_us']:.1f} | {f['max_abs_diff']:.2e} | "
            f"{f['top1']:.3f} |"
            if "error" not in f
            else f"| {f['verify']} | {f['form']} | {f['error']} | | |"
            for f in forms
        ]
    md = "\n".join(lines) + "\n"
    (out / "verify-kernels.md").write_text(md)
    (out / "verify-kernels.json").write_text(json.dumps({"calls": rows, "tree_forms": forms}, indent=1))
    print(md)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
