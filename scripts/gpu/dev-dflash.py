"""DFlash propose on the GPU: the eager drafter vs the static-buffer drafter (one CUDA graph per step).

    python3 scripts/gpu/dev-dflash.py OUT_DIR        writes OUT_DIR/dev-dflash.json and .md, prints a summary

Two drafters, bf16, on one steady-state step (a context of ``CONTEXT`` committed tokens; each call
ingests an accepted path of ``ACCEPTED`` nodes of a verification whose hidden states are static device
tensors, as the graphed target's verify slot gives them, then drafts one block):

- ``tiny``: the embedded family's trained pair (tiny-qwen35 + tiny-qwen35-dflash: 1 layer, block 16);
- ``qwen3.6-27b``: random weights at the shape of z-lab's DFlash drafter for a 64-layer, 5120-wide
  Qwen3.5/3.6-27B target (vocab 248320): 5 layers, hidden 5120, 32 heads / 8 KV heads of 128,
  intermediate 17408, features of target layers [1, 16, 31, 46, 61], block 16, rope theta 1e7 (from a
  public copy of such a config.json; the target's embedding and LM head are random too, the target
  itself is not built).

Per drafter (CUDA events over ``REPS`` calls, milliseconds per call): ``eager`` (DFlashDrafter on the
eager path), ``static_graph`` (the static drafter, graphs: what the graphed engine runs),
``static_eager`` (the same step code without graphs) and ``graph_replay`` (the step graph alone,
device time). Checked before timing: the static drafter's marginals against the eager drafter's (max
abs difference, top-1 agreement per depth) and that a static ``propose`` makes no host sync
(``torch.cuda.set_sync_debug_mode("error")``).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from repro.bench.model import qwen36_27b
from repro.drafters.base import DraftContext
from repro.drafters.dflash import DFlashDrafter, load_dflash
from repro.drafters.dflash_model import DFlashConfig, DFlashDraftModel
from repro.models.graphed import GraphedVerification
from repro.models.target import open_target
from repro.tree import Tree

CONTEXT = 1024
ACCEPTED = 4
SLOT = 32  # nodes of the fake verify slot (a ddtree budget of 31)
REPS = {"tiny": 200, "qwen3.6-27b": 30}
DTYPE = torch.bfloat16
DEV = torch.device("cuda")


def qwen36_27b_drafter() -> tuple[DFlashDraftModel, SimpleNamespace]:
    """Random bf16 weights (drawn on the device) at the 27B DFlash shape, and a stand-in target with
    what the drafter reads: config, device, dtype, the embedding and the LM head."""
    tc = qwen36_27b()
    cfg = DFlashConfig(
        hidden_size=5120, num_hidden_layers=5, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=17408, vocab_size=tc.vocab_size, num_target_layers=tc.num_hidden_layers,
        target_layer_ids=[1, 16, 31, 46, 61], mask_token_id=248070, block_size=16, rope_theta=1e7,
    )  # fmt: skip
    with torch.device("meta"):
        model = DFlashDraftModel(cfg)
    model = model.to(DTYPE).to_empty(device=DEV)
    embed = nn.Embedding(tc.vocab_size, tc.hidden_size, device=DEV, dtype=DTYPE)
    head = nn.Linear(tc.hidden_size, tc.vocab_size, bias=False, device=DEV, dtype=DTYPE)
    gen = torch.Generator(device=DEV).manual_seed(0)
    with torch.no_grad():
        for p in [*model.parameters(), embed.weight, head.weight]:
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=gen)
            else:
                p.normal_(1.0, 0.1, generator=gen)
    target = SimpleNamespace(
        config=tc, device=DEV, dtype=DTYPE, model=SimpleNamespace(embed_tokens=embed), lm_head=head
    )
    return model.eval(), target


def tiny_drafter() -> tuple[DFlashDraftModel, object]:
    target, _ = open_target("default", "bfloat16", "cuda")
    return load_dflash("tiny-qwen35-dflash", dtype=DTYPE, device="cuda"), target


class Steps:
    """Steady-state contexts: each call re-ingests ACCEPTED rows at position CONTEXT of a fresh
    verification (fresh object, same static hidden tensors) and drafts the next block."""

    def __init__(self, drafter: DFlashDrafter, hidden_size: int, vocab: int) -> None:
        gen = torch.Generator(device=DEV).manual_seed(1)
        self.hidden = {
            i: torch.randn(SLOT, hidden_size, generator=gen, device=DEV, dtype=DTYPE)
            for i in drafter.capture_layers
        }
        self.prompt = list(range(CONTEXT))
        self.out = [int(t) for t in torch.randint(0, vocab, (ACCEPTED + 1,), generator=gen, device=DEV).cpu()]
        self.tree = Tree.chain(list(range(SLOT)))
        self.logits = torch.zeros(SLOT, 1, device=DEV)
        drafter.begin(self.prompt, None)
        prefill = torch.randn(CONTEXT, hidden_size, generator=gen, device=DEV, dtype=DTYPE)
        ver = GraphedVerification(
            Tree.chain(self.prompt), self.logits, {i: prefill for i in self.hidden}, [], 0
        )
        drafter.observe_prefill(ver)

    def ctx(self) -> DraftContext:
        ver = GraphedVerification(self.tree, self.logits, self.hidden, [], CONTEXT)
        return DraftContext(self.prompt, self.out, ver, list(range(ACCEPTED)))


def per_call_ms(fn, reps: int) -> float:  # noqa: ANN001
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def measure(name: str, model: DFlashDraftModel, target) -> dict:  # noqa: ANN001
    t0 = time.perf_counter()
    cfg, tc = model.config, target.config
    row: dict = {
        "drafter": name, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
        "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "intermediate": cfg.intermediate_size, "vocab": tc.vocab_size, "feature_layers": cfg.target_layer_ids,
        "block_size": cfg.block_size, "context": CONTEXT, "accepted": ACCEPTED, "dtype": "bf16",
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
    }  # fmt: skip
    reps = REPS[name]
    eager = DFlashDrafter(model, target, static=False, top_k=8)
    static = DFlashDrafter(model, target, static=True, top_k=8)
    plain = DFlashDrafter(model, target, static=True, top_k=8)
    plain._static_buffers().graphs = False
    runs = {
        k: Steps(d, tc.hidden_size, tc.vocab_size)
        for k, d in (("eager", eager), ("static", static), ("plain", plain))
    }
    got, ref = static.propose(runs["static"].ctx()), eager.propose(runs["eager"].ctx())
    row["max_abs_probs_diff"] = float((got.probs - ref.probs).abs().max())
    row["top1_agree"] = float((got.top_ids[:, 0] == ref.top_ids[:, 0]).float().mean())
    ctx = runs["static"].ctx()
    static.propose(ctx)  # same key: a replay
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        static.propose(runs["static"].ctx())
        row["propose_host_sync"] = "none"
    except RuntimeError as exc:
        row["propose_host_sync"] = f"FOUND: {str(exc).splitlines()[0][:160]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    row["eager_ms"] = per_call_ms(lambda: eager.propose(runs["eager"].ctx()), reps)
    row["static_graph_ms"] = per_call_ms(lambda: static.propose(runs["static"].ctx()), reps)
    row["static_eager_ms"] = per_call_ms(lambda: plain.propose(runs["plain"].ctx()), reps)
    buffers = static._static
    graph = next(c for k, c in buffers._calls.items() if k[0] and k[2] is not None)
    row["graph_replay_ms"] = per_call_ms(graph.replay, reps)
    row["graphs_captured"] = buffers.captures
    row["speedup_graph_vs_eager"] = row["eager_ms"] / row["static_graph_ms"]
    row["wall_s"] = time.perf_counter() - t0
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, build in (("tiny", tiny_drafter), ("qwen3.6-27b", qwen36_27b_drafter)):
        try:
            rows.append(measure(name, *build()))
        except Exception as exc:  # noqa: BLE001 - one failed drafter still leaves the other's row
            rows.append({"drafter": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        torch.cuda.empty_cache()
    device = torch.cuda.get_device_name()
    (out / "dev-dflash.json").write_text(
        json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1)
    )
    cols = [
        "drafter", "eager_ms", "static_graph_ms", "static_eager_ms", "graph_replay_ms",
        "speedup_graph_vs_eager", "max_abs_probs_diff", "top1_agree", "propose_host_sync",
    ]  # fmt: skip
    lines = [
        f"# DFlash propose, eager vs static buffers + CUDA graph ({device}, bf16, context {CONTEXT}, "
        f"{ACCEPTED} accepted rows ingested per step)",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, r.get("error", ""))) for c in cols) + " |")
    text = "\n".join(lines) + "\n"
    (out / "dev-dflash.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
