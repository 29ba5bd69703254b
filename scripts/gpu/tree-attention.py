"""Issue 10: a tree verify's attention in one Triton kernel (StaticDecoder ``fuse_tree_attention``), H200.

    python3 scripts/gpu/tree-attention.py OUT_DIR      (one H200: < 90 s)

1. the kernel (:func:`repro.gdn.triton_attention.attention_tree`) against the torch path it replaces,
   at tiny-qwen35's attention shape (4 heads over 2, hd 48, rotary 12, hidden 192) and Qwen3.6-27B's
   (24 over 4, hd 256, rotary 64, hidden 5120; random weights), T = 16, 33, 64 nodes of draft trees
   (:func:`repro.bench.shapes.make_tree`) over a cache of 512 rows:
   - correctness in bf16 and float32: the layer core's gated output and the nodes' keys, fused vs the
     torch glue in the same dtype, and both vs the float64 torch glue;
   - time (bf16, CUDA-graph medians of :func:`repro.bench.timing.graph_us`): the kernel alone; the core
     of one layer from its input x, torch (the step's masks and rotary tables, ``attention_prologue``
     with its RMSNorm + q|k|v projection, ``attention_core``, the gate) vs fused (the same RMSNorm +
     projection, then the kernel);
2. the embedded tiny-qwen35 (bf16, the GraphedTarget decoder: gemv decode steps), cache 512: the verify
   graph at T = 33 with the flag off / on (median us, in fused decode steps, CUDA kernels of one eager
   verify by group), the logits on vs off (bf16 and float32) and their argmax agreement;
3. while time is left: the kernel alone (bf16, T = 33) at a few other (block_m, block_rows).

Writes OUT_DIR/tree-attention.json and OUT_DIR/tree-attention.md; prints the markdown. Without CUDA
(with TRITON_INTERPRET=1) a small smoke run of the same code: the tiny shape at T = 16, no graphs.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.model import profile_kernels, top1_agreement  # noqa: E402
from repro.bench.shapes import make_tree  # noqa: E402
from repro.bench.timing import TimerConfig, graph_us, median_us  # noqa: E402
from repro.gdn import triton_decode  # noqa: E402
from repro.gdn.triton_attention import attention_tree, rotary_table  # noqa: E402
from repro.models.config import ATTENTION, HybridConfig  # noqa: E402
from repro.models.default import init_random_weights  # noqa: E402
from repro.models.hybrid import HybridLM  # noqa: E402
from repro.models.layers import rms_norm, rotary_tables  # noqa: E402
from repro.models.static import StaticDecoder, TreeSlot  # noqa: E402
from repro.models.static_layers import (  # noqa: E402
    AttentionWeights,
    attention_core,
    attention_prologue,
    normed_linear,
)
from repro.models.target import open_target  # noqa: E402
from repro.tree import Tree, ancestor_matrix  # noqa: E402

GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if GPU else "cpu")
LENGTH = 512 if GPU else 40  # committed cache rows
SIZES = (16, 33, 64) if GPU else (16,)
MAX_NODES = 64
# name: (H, H_kv, head_dim, partial rotary factor, hidden)
SHAPES = {"tiny-qwen35": (4, 2, 48, 0.25, 192), "qwen3.6-27b": (24, 4, 256, 0.25, 5120)}
if not GPU:
    SHAPES = {"tiny-qwen35": SHAPES["tiny-qwen35"]}
CFG = TimerConfig(warmup_ms=2.0, rep_ms=10.0, graph_replays=7)
START = time.perf_counter()
BUDGET_S = 60.0  # kernel timing rows not started by then are skipped (the verify rows follow)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (
        float((a - b).norm() / b.norm().clamp_min(1e-300)) if bool(torch.isfinite(a).all()) else float("inf")
    )


def time_us(fn, estimate_us: float) -> float:  # noqa: ANN001
    """Median us per call: CUDA-graph replays on the GPU, a synchronised loop elsewhere (smoke only)."""
    return graph_us([fn], DEV, CFG, estimate_us) if GPU else median_us(fn, DEV, TimerConfig(0.0, 1.0))


def attention_layer(shape: tuple, dtype: torch.dtype):  # noqa: ANN201 - a DecoderLayer
    """One seeded attention DecoderLayer of the shape (random weights), built on the device."""
    h, hkv, hd, rot, hidden = shape
    cfg = HybridConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=64, layer_types=[ATTENTION],
        num_attention_heads=h, num_key_value_heads=hkv, head_dim=hd, partial_rotary_factor=rot,
    )  # fmt: skip
    with torch.device(DEV):
        model = HybridLM(cfg)
    return init_random_weights(model, 0).to(dtype).eval().model.layers[0]


class Core:
    """One attention layer's verify core on one tree (inputs on the device), torch and fused."""

    def __init__(self, layer, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, parents: list[int]):  # noqa: ANN001
        import numpy as np

        self.layer, self.w, self.x = layer, AttentionWeights.of(layer), x
        self.a = layer.self_attn
        self.keys, self.values = keys, values
        anc, depth = ancestor_matrix(np.array(parents, dtype=np.int64))
        self.anc, self.depth = torch.from_numpy(anc).to(DEV), torch.from_numpy(depth).to(DEV)
        self.length = torch.tensor([LENGTH], device=DEV)
        self.rows = torch.arange(keys.shape[1], device=DEV)
        self.rope = rotary_table(self.a.inv_freq, keys.shape[1], x.dtype, DEV)
        self.qkv = self.project()

    def project(self) -> torch.Tensor:
        eps = self.layer.input_layernorm.eps
        return normed_linear(self.x, self.w.input_norm, eps, self.w.qkv, self.w.bias, False)

    def torch_path(self) -> tuple[torch.Tensor, torch.Tensor]:
        """StaticDecoder._forward's glue for one attention layer (the fused decoder's Triton RMSNorm;
        the step's masks and rotary tables included)."""
        a = self.a
        cos, sin = rotary_tables(self.length + self.depth - 1, a.inv_freq, self.x.dtype)
        prefix_blocked = self.rows >= self.length
        tree_blocked = ~self.anc.repeat(a.num_heads // a.num_kv_heads, 1)
        norm = rms_norm if self.x.dtype == torch.float64 else triton_decode.rms_norm
        q, gate, k, v = attention_prologue(self.layer, self.w, self.x, cos, sin, norm)
        out = attention_core(q, k, v, self.keys, self.values, prefix_blocked, tree_blocked)
        return out * torch.sigmoid(gate), k

    def kernel(
        self, qkv: torch.Tensor | None = None, blocks: tuple[int | None, int | None] = (None, None)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a, w = self.a, self.w
        out, k, _ = attention_tree(
            self.project() if qkv is None else qkv, w.q_norm, w.k_norm, (a.q_norm.eps, a.k_norm.eps),
            self.rope, self.keys, self.values, self.length, self.depth, self.anc, a.num_heads, a.output_gate,
            block_m=blocks[0], block_rows=blocks[1],
        )  # fmt: skip
        return out, k


def kernel_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    checks, timings = [], []
    for name, shape in SHAPES.items():
        h, hkv, hd, _, hidden = shape
        base = attention_layer(shape, torch.float64)
        gen = torch.Generator(device=DEV).manual_seed(1)
        rows = LENGTH + MAX_NODES
        x64 = torch.randn(max(SIZES), hidden, generator=gen, device=DEV, dtype=torch.float64)
        kv64 = [torch.randn(hkv, rows, hd, generator=gen, device=DEV, dtype=torch.float64) for _ in "kv"]
        layers = {dt: copy.deepcopy(base).to(dt) for dt in (torch.float32, torch.bfloat16)}
        for layer in layers.values():  # the float64 frequencies (.to rounds the buffer): angles as f64's
            layer.self_attn.inv_freq = base.self_attn.inv_freq
        for n in SIZES:
            parents = make_tree("draft", n, seed=n)
            ref = Core(base, x64[:n], *kv64, parents).torch_path()
            for dt, layer in layers.items():
                core = Core(layer, x64[:n].to(dt), *(t.to(dt) for t in kv64), parents)
                fused, mine = core.kernel(), core.torch_path()
                checks.append(
                    dict(
                        shape=name, T=n, dtype=str(dt).split(".")[-1],
                        out_vs_torch=rel(fused[0], mine[0]), k_vs_torch=rel(fused[1], mine[1]),
                        fused_vs_f64=rel(fused[0], ref[0]), torch_vs_f64=rel(mine[0], ref[0]),
                    )
                )  # fmt: skip
                if dt != torch.bfloat16:
                    continue
                if time.perf_counter() - START > BUDGET_S:
                    timings.append(dict(shape=name, T=n, skipped="time budget"))
                    continue
                timings.append(
                    dict(
                        shape=name, T=n,
                        kernel_us=time_us(lambda c=core: c.kernel(c.qkv), 10.0),
                        projection_us=time_us(core.project, 10.0),
                        fused_us=time_us(core.kernel, 20.0),
                        torch_us=time_us(core.torch_path, 100.0),
                    )
                )  # fmt: skip
        del base, layers
    return checks, timings


SWEEP = {
    "tiny-qwen35": ((16, 64), (32, 128), (64, 128), (64, 32)),
    "qwen3.6-27b": ((16, 16), (32, 16), (64, 32), (16, 64)),
}


def sweep_rows() -> list[dict[str, Any]]:
    """The kernel alone (bf16, T = 33) at other (block_m, block_rows) than the defaults, while time lasts."""
    rows: list[dict[str, Any]] = []
    if not GPU:
        return rows
    for name, blocks in SWEEP.items():
        _, hkv, hd, _, hidden = SHAPES[name]
        layer = attention_layer(SHAPES[name], torch.bfloat16)
        gen = torch.Generator(device=DEV).manual_seed(2)
        x = torch.randn(33, hidden, generator=gen, device=DEV).bfloat16()
        kv = [torch.randn(hkv, LENGTH + MAX_NODES, hd, generator=gen, device=DEV).bfloat16() for _ in "kv"]
        core = Core(layer, x, *kv, make_tree("draft", 33, seed=33))
        for bm, br in blocks:
            if time.perf_counter() - START > 80.0:
                rows.append(dict(shape=name, block_m=bm, block_rows=br, skipped="time budget"))
                continue
            us = time_us(lambda c=core, m=bm, r=br: c.kernel(c.qkv, blocks=(m, r)), 10.0)
            rows.append(dict(shape=name, block_m=bm, block_rows=br, kernel_us=us))
    return rows


def decode_step_us(dec: StaticDecoder, state, reps: int = 32) -> float:  # noqa: ANN001
    """Median us per decode step over replays of one graph of ``reps`` steps (the state reloaded)."""
    if not GPU:
        dec.load(state)
        return median_us(dec.decode_pick, DEV, TimerConfig(0.0, 1.0))
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


def verify_rows() -> list[dict[str, Any]]:
    """tiny-qwen35's verify at T = 33 (16 off the GPU) with the flag off and on."""
    n = 33 if GPU else 16
    rows = []
    for dtype in ("bfloat16", "float32"):
        if dtype == "float32" and time.perf_counter() - START > 75.0:
            rows.append(dict(dtype=dtype, T=n, skipped="time budget"))
            continue
        model, _ = open_target("default", dtype, str(DEV))
        if GPU:
            model.set_gdn_backend("triton")  # the prefill's GDN layers
        gen = torch.Generator().manual_seed(3)
        prompt = torch.randint(5, model.config.vocab_size, (LENGTH,), generator=gen).tolist()
        state, _ = model.prefill(prompt)
        tree = Tree(torch.randint(5, model.config.vocab_size, (n,), generator=gen), make_tree("draft", n, 5))
        logits = {}
        for fuse in (False, True):
            dec = StaticDecoder(
                model, LENGTH + 64, MAX_NODES, kernel="triton", gemv=True, fuse_tree_attention=fuse
            )
            dec.load(state)
            slot = TreeSlot(dec, n)
            slot.set_tree(tree)
            logits[fuse] = dec.verify(slot).clone()
            row: dict[str, Any] = dict(dtype=dtype, T=n, fuse_tree_attention=fuse)
            if dtype == "bfloat16":
                prof = profile_kernels(lambda d=dec, s=slot: d.verify(s), DEV)
                verify_us = time_us(lambda d=dec, s=slot: d.verify(s), 600.0)
                step_us = decode_step_us(dec, state)
                row.update(
                    verify_us=verify_us, decode_step_us=step_us, verify_in_steps=verify_us / step_us,
                    kernels=prof.kernels if prof else None, groups=prof.summary() if prof else None,
                )  # fmt: skip
            rows.append(row)
        err, top1 = rel(logits[True], logits[False]), top1_agreement(logits[True], logits[False])
        for row in rows[-2:]:
            row.update(logits_on_vs_off=err, top1_on_vs_off=top1)
        del model
    return rows


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"# tree-attention: one Triton kernel per attention layer's verify ({res['device']})",
        "",
        f"## correctness (cache {LENGTH} rows; relative errors)",
        "",
        "| shape | T | dtype | out fused vs torch | k fused vs torch | fused vs f64 | torch vs f64 |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in res["checks"]:
        lines.append(
            f"| {c['shape']} | {c['T']} | {c['dtype']} | {c['out_vs_torch']:.2e} | {c['k_vs_torch']:.2e} | "
            f"{c['fused_vs_f64']:.2e} | {c['torch_vs_f64']:.2e} |"
        )
    lines += [
        "",
        "## one layer's core, bf16 (us, CUDA-graph medians)",
        "",
        "| shape | T | kernel alone | projection | fused (projection + kernel) | torch | torch / fused |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in res["timing"]:
        if "skipped" in t:
            lines.append(f"| {t['shape']} | {t['T']} | skipped ({t['skipped']}) |")
            continue
        lines.append(
            f"| {t['shape']} | {t['T']} | {t['kernel_us']:.1f} | {t['projection_us']:.1f} | "
            f"{t['fused_us']:.1f} | {t['torch_us']:.1f} | {t['torch_us'] / t['fused_us']:.2f}x |"
        )
    lines += [
        "",
        f"## tiny-qwen35 verify (cache {LENGTH}; GraphedTarget's decoder: gemv decode steps)",
        "",
        "| dtype | T | fuse_tree_attention | verify us | decode step us | verify / step | kernels | "
        "logits on vs off | top1 | groups |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["verify"]:
        if "skipped" in r:
            lines.append(f"| {r['dtype']} | {r['T']} | skipped ({r['skipped']}) |")
            continue
        timed = "verify_us" in r
        lines.append(
            f"| {r['dtype']} | {r['T']} | {r['fuse_tree_attention']} | "
            + (
                f"{r['verify_us']:.1f} | {r['decode_step_us']:.1f} | {r['verify_in_steps']:.2f} | "
                if timed
                else "| | | "
            )
            + f"{r.get('kernels')} | {r['logits_on_vs_off']:.2e} | {r['top1_on_vs_off']:.3f} | "
            + f"{r.get('groups')} |"
        )
    lines += [
        "",
        "## the kernel alone at other blocks (bf16, T = 33; the defaults are in the table above)",
        "",
        "| shape | block_m | block_rows | kernel us |",
        "|---|---|---|---|",
    ]
    for r in res["sweep"]:
        us = f"{r['kernel_us']:.1f}" if "kernel_us" in r else f"skipped ({r['skipped']})"
        lines.append(f"| {r['shape']} | {r['block_m']} | {r['block_rows']} | {us} |")
    lines += ["", f"total {res['seconds']:.0f} s"]
    return "\n".join(lines) + "\n"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if GPU else "cpu (interpreter smoke run)"}
    with torch.no_grad():
        res["checks"], res["timing"] = kernel_rows()
        res["verify"] = verify_rows()
        res["sweep"] = sweep_rows()
    res["seconds"] = time.perf_counter() - t0
    (out / "tree-attention.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "tree-attention.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
