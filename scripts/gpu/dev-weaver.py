"""Weaver's tree growth on the H200: the host heap (`grow`) vs the device growth in one CUDA graph
(`GrowthStep`: pool top-K, marginals, growth), bf16, CUDA events.

    python scripts/gpu/dev-weaver.py OUT_DIR      writes OUT_DIR/dev-weaver.json and .md, prints a summary

Shapes:
- ``tiny``: the embedded tiny-qwen35 target with its trained DFlash (block 16) and Weaver (pool 512,
  d_model 64); DFlash rows of one real prompt; budget 32 (the smoke route's).
- ``paper``: Weaver at the paper's shape (Sec. 3.3: one layer, d_model 2048, 16 heads; pool K = 512,
  Sec. 3.2), random weights (``random_weaver_for``, intermediate 2 * d_model) for the Qwen3.6-27B target
  shape (``repro.bench.model.qwen36_27b``: hidden 5120, vocab 248320) and a DFlash drafter of block 16
  reading 5 target layers (feature width 25600; an assumption: the public DFlash configs of Qwen3
  targets read 5 layers); random embedding, DFlash rows and logits; budgets 64 and 128.
Host growth is timed with its width (4, the route default) and width 1; "device" is one graph replay
(inputs copied in) per step; "device_eager" the same ops without the graph. Trees of host and device
growth are compared (bf16: forwards of other shapes may order near-tied candidates differently).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from repro.bench.model import qwen36_27b
from repro.drafters.base import DraftContext
from repro.drafters.dflash import DFlashDrafter, load_dflash
from repro.drafters.dflash_model import DFlashConfig, spread_target_layers
from repro.drafters.pool import top_k_pool
from repro.drafters.weaver import GrowthStep, load_weaver, random_weaver_for
from repro.drafters.weaver_growth import grow, grow_on_device
from repro.models.graphs import count_ops
from repro.models.target import open_target

DEV = torch.device("cuda")
DTYPE = torch.bfloat16


def timed_ms(fn, reps: int) -> tuple[float, float]:  # noqa: ANN001
    """(device ms by CUDA events, wall ms) per call, after one warm call."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps, (time.perf_counter() - t0) * 1e3 / reps


def compare(weaver, emb, budget, pool, root, rows, logits, feature, reps: int) -> dict:  # noqa: ANN001
    pool_logits, pool_ids = top_k_pool(logits, pool)
    row: dict = {"budget": budget, "pool": pool, "depth": int(rows.shape[0])}
    for width in (4, 1):

        def host(width: int = width):  # noqa: ANN202 - what the host route does after block_rows
            pl, pi = top_k_pool(logits, pool)
            torch.softmax(logits.float(), -1)
            return grow(weaver, emb, budget, width, root, rows, pl, pi, feature)

        row[f"host_w{width}_device_ms"], row[f"host_w{width}_wall_ms"] = timed_ms(host, reps)
    graphed = GrowthStep(weaver, emb, budget, pool, graphs=True)
    t0 = time.perf_counter()
    graphed(root, rows, logits, feature)
    torch.cuda.synchronize()
    row["capture_s"] = time.perf_counter() - t0
    row["device_ms"], row["device_wall_ms"] = timed_ms(lambda: graphed(root, rows, logits, feature), 4 * reps)
    eager = GrowthStep(weaver, emb, budget, pool, graphs=False)
    eager_ms = timed_ms(lambda: eager(root, rows, logits, feature), 2)
    row["device_eager_ms"], row["device_eager_wall_ms"] = eager_ms
    at = torch.tensor([root], device=DEV)
    row["launches_per_growth"] = count_ops(
        lambda: grow_on_device(weaver, emb, budget, at, rows, pool_logits, pool_ids, feature)
    )
    ref = grow(weaver, emb, budget, 4, root, rows, pool_logits, pool_ids, feature)
    growth, _ = graphed(root, rows, logits, feature)
    n = ref.tree.size
    dev_nodes = list(zip(growth.tokens[:n].tolist(), growth.parents[:n].tolist()))
    host_nodes = list(zip(ref.tree.tokens.tolist(), ref.tree.parents.tolist()))
    row["host_nodes"] = n
    row["identical_tree"] = dev_nodes == host_nodes
    row["first_difference"] = next((i for i, (a, b) in enumerate(zip(dev_nodes, host_nodes)) if a != b), None)
    row["host_forwards_w4"] = len(ref.batches)
    row["speedup_vs_host_w4"] = row["host_w4_wall_ms"] / row["device_wall_ms"]
    return row


def tiny() -> list[dict]:
    model, tok = open_target("default", "bfloat16", "cuda")
    dflash = DFlashDrafter(load_dflash("tiny-qwen35-dflash", DTYPE, DEV), model)
    weaver = load_weaver("tiny-qwen35-weaver", dflash.model, model).to(DEV, DTYPE)
    prompt = tok.chat_prompt([{"role": "user", "content": "Write a short poem about the sea and a boat."}])
    dflash.begin(prompt, None)
    _, ver = model.prefill(prompt, capture=dflash.capture_layers)
    dflash.observe_prefill(ver)
    first = int(ver.logits[-1].argmax())
    rows, logits = dflash.block_rows(DraftContext(prompt, [first], ver, list(range(ver.tree.size))))
    emb = model.model.embed_tokens.weight
    return [compare(weaver, emb, 32, weaver.config.pool_size, first, rows, logits, dflash.features[-1], 20)]


def paper() -> list[dict]:
    tcfg = qwen36_27b()
    layers = spread_target_layers(tcfg.num_hidden_layers, 5)
    target = SimpleNamespace(config=tcfg, device=DEV, dtype=DTYPE)
    dcfg = DFlashConfig(
        hidden_size=tcfg.hidden_size, num_hidden_layers=5, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=tcfg.intermediate_size, vocab_size=tcfg.vocab_size,
        num_target_layers=tcfg.num_hidden_layers, target_layer_ids=layers,
        mask_token_id=tcfg.vocab_size - 1, block_size=16,
    )  # fmt: skip
    dflash = SimpleNamespace(config=dcfg)  # random_weaver_for reads only the drafter's config
    weaver = random_weaver_for(dflash, target, seed=0, d_model=2048, heads=16, pool_size=512)
    gen = torch.Generator(DEV).manual_seed(0)
    emb = torch.randn(tcfg.vocab_size, tcfg.hidden_size, device=DEV, dtype=DTYPE, generator=gen) * 0.02
    rows = torch.randn(15, dcfg.hidden_size, device=DEV, dtype=DTYPE, generator=gen)
    logits = 3 * torch.randn(15, tcfg.vocab_size, device=DEV, dtype=DTYPE, generator=gen)
    feature = torch.randn(dcfg.feature_size, device=DEV, dtype=DTYPE, generator=gen)
    params = sum(p.numel() for p in weaver.parameters()) / 1e6
    out = []
    for budget in (64, 128):
        row = compare(weaver, emb, budget, 512, 1234, rows, logits, feature, 3)
        out.append({**row, "weaver_params_millions": params})
    return out


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = {"tiny": tiny(), "paper": paper()}
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": "bfloat16",
        "rows": rows,
        "seconds": time.perf_counter() - started,
    }
    (out_dir / "dev-weaver.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# Weaver growth: host heap vs device graph ({result['device']}, bf16)",
        "",
        "| shape | budget | pool | host w4 ms | host w1 ms | device graph ms (wall) | device eager ms |"
        " speedup | launches | same tree |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for shape, items in rows.items():
        for r in items:
            lines.append(
                f"| {shape} | {r['budget']} | {r['pool']} | {r['host_w4_wall_ms']:.2f} "
                f"| {r['host_w1_wall_ms']:.2f} "
                f"| {r['device_ms']:.3f} ({r['device_wall_ms']:.3f}) | {r['device_eager_wall_ms']:.2f} "
                f"| {r['speedup_vs_host_w4']:.1f}x | {r['launches_per_growth']} | {r['identical_tree']} "
                f"(first diff {r['first_difference']}) |"
            )
    text = "\n".join(lines) + "\n"
    (out_dir / "dev-weaver.md").write_text(text)
    print(text)
    print(f"total {result['seconds']:.1f} s")


if __name__ == "__main__":
    main()
