"""The static DFlash drafter's step, fast (repro/drafters/dflash_fast.py) vs current (torch), in CUDA graphs.

    python3 scripts/gpu/dflash-fast.py OUT_DIR     writes OUT_DIR/dflash-fast.json and .md, prints a summary

Drafters (:class:`~repro.drafters.static_dflash.StaticDFlash`, graphs on, ``fast`` False / True), each on a
steady-state step: ``context`` committed positions loaded (each of ``CONTEXTS``), then every call ingests
an accepted path of ``ACCEPTED`` rows at position ``context`` from static hidden tensors (as a verify slot
gives them; the path padded to 16 rows, as in routes) and drafts the block (16 rows):

- ``tiny``: the embedded family's trained drafter (tiny-qwen35-dflash: hidden 192, one layer, vocab 4096)
  with the tiny target's embedding and LM head; float32 (the check only) and bf16;
- ``qwen3.6-27b``: random bf16 weights at the public 27B DFlash shape (repro.drafters.shapes: 5 layers at
  width 5120, 32 / 8 heads of 128, intermediate 17408, 5 feature layers, vocab 248320), random embedding
  and LM head (the target itself is not built).

Checked first, fast vs current on the same inputs: logits (relative error), marginals (max abs difference),
the top-k ids (float32: identical expected), Weaver's final-normed rows. Timed (CUDA events over ``REPS``
replays of the step's graph, microseconds a step): ``ingest+block+probs`` (propose: DDTree and chain DFlash),
``block+probs`` (nothing to ingest), ``ingest+block+rows`` (Weaver's block_rows: DFlash-TfM); above
``SMALL_WIDTH`` also the first with the block's linears on the row-tiled kernels instead of cuBLAS
(``fast_tiled``: does the target side's rule hold for the drafter?).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from repro.bench.model import qwen36_27b
from repro.drafters.dflash import load_dflash
from repro.drafters.dflash_model import DFlashDraftModel
from repro.drafters.shapes import device_model, qwen27b_dflash_config
from repro.drafters.static_dflash import StaticDFlash
from repro.models.graphed import SMALL_WIDTH
from repro.models.target import open_target

CONTEXTS = (256, 2048)  # committed positions (the tree kernel walks them in one program per row block)
ACCEPTED = 4
SLOT = 32  # rows of the fake verify slot's hidden states
TOP_K = 8
REPS = {"tiny": 300, "qwen3.6-27b": 40}
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a dry run (interpreter)
STEPS = {"ingest+block+probs": (True, True), "block+probs": (False, True), "ingest+block+rows": (True, False)}


def tiny(dtype: torch.dtype) -> tuple[DFlashDraftModel, torch.Tensor, nn.Module]:
    target, _ = open_target("default", str(dtype)[6:], DEV.type)
    return (
        load_dflash("tiny-qwen35-dflash", dtype=dtype, device=DEV),
        target.model.embed_tokens.weight,
        target.lm_head,
    )


def qwen27b(dtype: torch.dtype) -> tuple[DFlashDraftModel, torch.Tensor, nn.Module]:
    tc = qwen36_27b()
    model = device_model(DFlashDraftModel, qwen27b_dflash_config(tc), DEV, dtype, seed=0)
    gen = torch.Generator(device=DEV).manual_seed(1)
    embed = torch.randn(tc.vocab_size, tc.hidden_size, generator=gen, device=DEV).to(dtype)
    head = nn.Linear(tc.hidden_size, tc.vocab_size, bias=False, device=DEV, dtype=dtype).requires_grad_(False)
    head.weight.copy_(torch.randn(head.weight.shape, generator=gen, device=DEV) / math.sqrt(tc.hidden_size))
    return model, embed, head


class Step:
    """A StaticDFlash with ``context`` loaded positions and its steady-state step inputs."""

    def __init__(
        self, model: DFlashDraftModel, embed: torch.Tensor, head: nn.Module, fast: bool, context: int
    ) -> None:
        cfg = model.config
        gen = torch.Generator(device=DEV).manual_seed(2)  # the same inputs for fast and current
        self.static = StaticDFlash(
            model,
            embed,
            head,
            cfg.block_size,
            TOP_K,
            max_len=2 * context,
            graphs=DEV.type == "cuda",
            fast=fast,
        )
        dtype = model.dtype
        self.static.load(torch.randn(context, cfg.feature_size, generator=gen, device=DEV).to(dtype))
        self.sources = tuple(
            torch.randn(SLOT, cfg.hidden_size, generator=gen, device=DEV).to(dtype)
            for _ in cfg.target_layer_ids
        )
        self.static._upload(7, context, list(range(ACCEPTED)))

    def __call__(self, ingest: bool, probs: bool) -> tuple[torch.Tensor, ...]:
        return self.static._call(self.sources if ingest else None, probs)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def check(current: Step, fast: Step) -> dict:
    """Fast vs current outputs of the same step."""
    (lc, pc, tc), (lf, pf, tf) = current(True, True), fast(True, True)
    (rc, _), (rf, _) = current(True, False), fast(True, False)
    return {
        "logits_rel": rel(lf, lc),
        "probs_max_abs": float((pf - pc).abs().max()),
        "top1_agree": float((tf[:, 0] == tc[:, 0]).float().mean()),
        "topk_identical": bool(torch.equal(tf, tc)),
        "rows_rel": rel(rf, rc),
    }


def replay_us(step: Step, ingest: bool, probs: bool, reps: int) -> float:
    step(ingest, probs)  # captured on first use
    calls = step.static._calls
    graph = next(c for k, c in calls.items() if k[0] == probs and (k[2] is not None) == ingest)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / reps


def _rounded(key: str, v: object) -> object:
    """Errors to 3 significant digits, times to 0.01 us."""
    if not isinstance(v, float):
        return v
    return float(f"{v:.3g}") if "rel" in key or "abs" in key else round(v, 2)


def measure(name: str, build, dtypes: tuple[torch.dtype, ...]) -> list[dict]:  # noqa: ANN001
    """Per dtype and context: the check, and (bf16 on CUDA) the device time of each step, current vs fast."""
    rows = []
    for dtype in dtypes:
        model, embed, head = build(dtype)
        cfg = model.config
        for context in CONTEXTS[:1] if dtype == torch.float32 else CONTEXTS:  # float32: the check only
            t0 = time.perf_counter()
            row: dict = {
                "drafter": name, "dtype": str(dtype)[6:], "context": context, "accepted": ACCEPTED,
                "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": embed.shape[0],
                "block": cfg.block_size,
            }  # fmt: skip
            current, fast = (Step(model, embed, head, f, context) for f in (False, True))
            row.update(check(current, fast))
            if dtype != torch.float32 and DEV.type == "cuda":
                for key, (ingest, probs) in STEPS.items():
                    cur = replay_us(current, ingest, probs, REPS[name])
                    fst = replay_us(fast, ingest, probs, REPS[name])
                    row[f"{key}_current_us"], row[f"{key}_fast_us"] = cur, fst
                    row[f"{key}_speedup"] = cur / fst
                if (
                    cfg.hidden_size > SMALL_WIDTH
                ):  # the block's linears on the row-tiled kernels instead of cuBLAS
                    tiled = Step(model, embed, head, True, context)
                    tiled.static._fast.row_tiled_width = cfg.hidden_size
                    row["ingest+block+probs_fast_tiled_us"] = replay_us(tiled, True, True, REPS[name])
                    del tiled
            row["wall_s"] = time.perf_counter() - t0
            rows.append({k: _rounded(k, v) for k, v in row.items()})
            del current, fast
            torch.cuda.empty_cache()
        del model, embed, head
        torch.cuda.empty_cache()
    return rows


def _cell(row: dict, col: str, cols: list[str]) -> str:
    """A table cell: the value, or a failed shape's error in its second column."""
    if "error" in row and col not in row:
        return row["error"] if col == cols[1] else ""
    return str(row.get(col, ""))


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for name, build, dtypes in (
        ("tiny", tiny, (torch.float32, torch.bfloat16)),
        ("qwen3.6-27b", qwen27b, (torch.bfloat16,)),
    ):
        try:
            rows += measure(name, build, dtypes)
        except Exception as exc:  # noqa: BLE001 - one failed shape still leaves the other's rows
            rows.append({"drafter": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        torch.cuda.empty_cache()
    device = torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu (dry run)"
    (out / "dflash-fast.json").write_text(
        json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1)
    )
    check_cols = ["drafter", "dtype", "context", "logits_rel", "probs_max_abs", "top1_agree",
                  "topk_identical", "rows_rel"]  # fmt: skip
    time_cols = ["drafter", "dtype", "context"] + [
        f"{k}_{s}" for k in STEPS for s in ("current_us", "fast_us", "speedup")
    ]
    time_cols.append("ingest+block+probs_fast_tiled_us")
    timed = [r for r in rows if "ingest+block+probs_fast_us" in r or "error" in r]
    lines = [
        f"# Static DFlash step, fast vs current, CUDA graphs ({device}; {ACCEPTED} accepted rows a step)",
        "",
    ]
    for title, cols, keep in (
        ("Check (fast vs current)", check_cols, rows),
        ("Device time per step (us)", time_cols, timed),
    ):
        lines += [f"## {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_cell(r, c, cols) for c in cols) + " |" for r in keep]
        lines.append("")
    text = "\n".join(lines)
    (out / "dflash-fast.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
