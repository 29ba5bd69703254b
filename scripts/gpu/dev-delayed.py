"""SpecLA's delayed commit on the graphed engine (commit="delayed", repro.models.static / graphed), H200.

    python scripts/gpu/dev-delayed.py OUT_DIR          (one H200: < 90 s)
    python scripts/gpu/dev-delayed.py OUT_DIR cpu      (a short CPU dry run: float64, small shapes)

(a) exactness: the embedded tiny-qwen35 in float32 (Triton kernels, CUDA graphs), the specla route from
    the route registry on a GraphedTarget (delayed by default there) and DDTree with commit delayed, on
    2 prompts: tokens equal AR's, and the state left by the delayed run (flushed at the end of the
    generation) vs the path commit's (max abs difference);
(b) whole step at the SpecLA shape (GDN-1.3B's layer: HV = 8, d_k = d_v = 256, hidden 2048; random
    weights, LAYERS GDN layers, bf16, float32 state) through the static decoder, T = 64 (a draft tree),
    accepted depths 2, 4, 8: CUDA-graph median per step of verify alone, verify + token replay commit,
    verify + the separate path commit (state and conv in one launch per layer), and the delayed step
    (verify with the pending commit in its tree kernel + the conv commit), steps alternating parities;
    also the state after 6 delayed steps vs 6 path-commit steps;
(c) tokens/s of the tiny-qwen35 specla route in bf16 with commit delayed vs closed_form (the path
    commit), same run, 8 suite prompts x 64 tokens, alternating which goes first per prompt.

Writes OUT_DIR/dev-delayed.json and OUT_DIR/dev-delayed.md; prints the markdown; exit 3 when (a) fails.
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

from repro.bench.model import build_model  # noqa: E402
from repro.bench.shapes import make_tree  # noqa: E402
from repro.bench.timing import TimerConfig, graph_us, median_us  # noqa: E402
from repro.data.suites import format_turn, load_suite  # noqa: E402
from repro.decoding.engine import generate  # noqa: E402
from repro.decoding.routes import build_route, prepare_graphs  # noqa: E402
from repro.models.config import HybridConfig  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402
from repro.models.static import StaticDecoder, TreeSlot  # noqa: E402
from repro.models.target import open_target  # noqa: E402
from repro.reporting.records import compare_to_reference  # noqa: E402
from repro.tree import Tree  # noqa: E402

CPU = sys.argv[2:3] == ["cpu"]
DEVICE = "cpu" if CPU else "cuda"
FAMILY = "tiny-qwen35"
SPECLA = {"name": "specla", "kind": "specla", "budget": 32, "topk": 4, "tau": 0.05, "depth": 6}
DDTREE = {"name": "ddtree-b32", "kind": "ddtree", "budget": 32, "commit": "delayed"}
LAYERS = 2 if CPU else 4
DEPTHS = [2, 4] if CPU else [2, 4, 8]
T = 16 if CPU else 64
HEAD, HIDDEN, VOCAB = (32, 256, 1000) if CPU else (256, 2048, 32000)  # gdn-1.3b: 8 heads of 256
EXACT_TOKENS, SPEED_PROMPTS, SPEED_TOKENS = (16, 2, 16) if CPU else (48, 8, 64)
BUDGET_S = 1e9 if CPU else 80.0  # (c) stops starting prompts after this (2 at least)
START = time.monotonic()


def suite_prompts(tok, n: int) -> list[list[int]]:  # noqa: ANN001 - the family tokenizer
    per = -(-n // 3)
    out = [
        tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}])
        for suite in ("mt_bench", "gsm8k", "humaneval")
        for p in load_suite(suite, per, 42)
    ]
    return out[:n]


def state_diff(a, b) -> float:  # noqa: ANN001 - two ModelStates
    worst = 0.0
    for x, y in zip(a.layers, b.layers):
        for name, t in vars(x).items():
            u = getattr(y, name)
            worst = max(worst, float((t.double() - u.double()).abs().max()) if t.numel() else 0.0)
    return worst


def family_target(dtype: str) -> tuple[GraphedTarget, Any]:
    model, tok = open_target("default", dtype="float64" if CPU else dtype, device=DEVICE)
    if not CPU:
        model.set_gdn_backend("triton")
    return GraphedTarget(model, max_nodes=64), tok


# ------------------------------------------------------------------------------------ (a)


def exactness() -> list[dict[str, Any]]:
    target, tok = family_target("float32")
    vocab = target.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 42)
    routes = [
        build_route(s, vocab, "greedy", 0.0, 42, target=target, family=FAMILY) for s in (SPECLA, DDTREE)
    ]
    rows = []  # no prepare: graphs are captured on first use, for the slot sizes these trees take
    for route in routes:
        for i, p in enumerate(suite_prompts(tok, 2)):
            ref = generate(target, p, ar, EXACT_TOKENS).output_ids
            got = generate(target, p, route, EXACT_TOKENS, reference_ids=ref)
            delayed_state = target.decoder.export()
            commit = route.commit
            route.commit = "closed_form"
            path = generate(target, p, route, EXACT_TOKENS, reference_ids=ref)
            route.commit = commit
            rows.append(
                {
                    "route": route.name, "prompt": i, "commit": commit,
                    "identical_to_ar": got.output_ids == ref,
                    "vs_ar": compare_to_reference(got.output_ids, ref),
                    "mal": len(got.output_ids) / max(got.steps, 1), "steps": got.steps,
                    "same_paths_as_path_commit": got.accepted_paths == path.accepted_paths,
                    "state_vs_path_commit": state_diff(delayed_state, target.decoder.export()),
                }
            )  # fmt: skip
            print("(a)", rows[-1])
    return rows


# ------------------------------------------------------------------------------------ (b)


def specla_layers_model() -> Any:
    """gdn-1.3b's layers (repro.bench.model.gdn_1p3b), LAYERS of them, random weights."""
    cfg = HybridConfig.from_fla_dict(
        {
            "model_type": "gated_deltanet",
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_heads": 8,
            "head_dim": HEAD,
            "expand_v": 1.0,
            "conv_size": 4,
            "use_gate": True,
            "hidden_ratio": 4,
            "vocab_size": VOCAB,
            "tie_word_embeddings": False,
            "norm_eps": 1e-6,
        }
    )
    return build_model(cfg, torch.device(DEVICE), torch.float64 if CPU else torch.bfloat16, 0)


def whole_step() -> dict[str, Any]:
    model = specla_layers_model()
    parents = torch.tensor(make_tree("draft", T, 7))
    gen = torch.Generator().manual_seed(3)
    tree = Tree(torch.randint(0, VOCAB, (T,), generator=gen), parents)
    depth = tree.depth.tolist()
    timer = TimerConfig(warmup_ms=2.0, rep_ms=8.0 if not CPU else 1.0, graph_replays=5)
    dev = torch.device(DEVICE)
    dec = StaticDecoder(model, max_len=8192, max_nodes=T)
    init = [torch.randn_like(b.recurrent) * 0.05 for b in dec.buffers]

    def reset() -> None:
        for b, s in zip(dec.buffers, init):
            b.recurrent.copy_(s)
            b.conv.zero_()
        dec.length.zero_()
        for stash in dec.pending_sets:
            stash.node.fill_(-1)

    def slot(**kw: Any) -> TreeSlot:
        s = TreeSlot(dec, T, **kw)
        s.set_tree(tree)
        return s

    plain = slot()
    pair = [slot(parity=0), slot(parity=1)]
    rows: list[dict[str, Any]] = []

    def timed(name: str, d: int, fns: list) -> None:  # noqa: ANN001
        reset()
        if CPU:
            us = statistics.median(median_us(f, dev, timer) for f in fns)
        else:
            us = graph_us(fns, dev, timer, 100.0 * LAYERS)
        rows.append({"method": name, "depth": d, "us_per_step": us, "us_per_layer": us / LAYERS})
        print(f"(b) d={d} {name:22s} {us:8.1f} us/step  {us / LAYERS:6.1f} us/layer")

    timed("verify_only", 0, [lambda: dec.verify(plain)])
    for d in DEPTHS:
        path = tree.path_to(depth.index(d))
        for s in (plain, *pair):
            s.set_accepted(path)

        def step(s: TreeSlot, strategy: str):  # noqa: ANN202
            return lambda: (dec.verify(s), dec.commit(s, strategy))

        timed("verify+replay", d, [step(plain, "replay")])
        timed("verify+path_commit", d, [step(plain, "closed_form")])
        timed("delayed", d, [step(pair[0], "delayed"), step(pair[1], "delayed")])
    kernels = {} if CPU else {
        "verify+path_commit": kernel_times(lambda: step(plain, "closed_form")()),
        "delayed": kernel_times(lambda: (step(pair[0], "delayed")(), step(pair[1], "delayed")()), per=2),
    }  # fmt: skip
    # the state after 6 steps: delayed (flushed) vs the path commit
    states = {}
    for strategy, slots in (("closed_form", [plain] * 6), ("delayed", [pair[i % 2] for i in range(6)])):
        reset()
        for s in slots:
            dec.verify(s)
            dec.commit(s, strategy)
        states[strategy] = dec.export()
    return {
        "shape": {"hidden": HIDDEN, "HV": 8, "dk": HEAD, "dv": HEAD, "gdn_layers": LAYERS, "T": T,
                  "dtype": "float64" if CPU else "bfloat16", "tree_kernel": dec.tree_kernel},
        "rows": rows,
        "kernels": kernels,
        "state_delayed_vs_path_commit_after_6_steps": state_diff(states["delayed"], states["closed_form"]),
    }  # fmt: skip


def kernel_times(fn, per: int = 1) -> list[dict[str, Any]]:  # noqa: ANN001 - a step to run
    """Device microseconds per step by kernel name (torch profiler, 5 eager runs of ``fn`` after one
    warm-up; ``fn`` holds ``per`` steps), the largest first: where the delayed step's time goes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    total: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total.setdefault(e.name[:60], []).append(e.device_time)
    rows = [{"kernel": k, "calls_per_step": len(v) / (5 * per), "us_per_step": sum(v) / (5 * per)}
            for k, v in total.items()]  # fmt: skip
    return sorted(rows, key=lambda r: -r["us_per_step"])


# ------------------------------------------------------------------------------------ (c)


def tokens_per_s() -> dict[str, Any]:
    target, tok = family_target("bfloat16")
    vocab = target.config.vocab_size
    delayed = build_route(SPECLA, vocab, "greedy", 0.0, 42, target=target, family=FAMILY)
    path = build_route(
        {**SPECLA, "commit": "closed_form"}, vocab, "greedy", 0.0, 42, target=target, family=FAMILY
    )
    prepare_graphs(target, [delayed, path])
    cases = suite_prompts(tok, SPEED_PROMPTS)
    generate(target, cases[0], delayed, 8)  # warm-ups: drafter graphs, first-use work
    generate(target, cases[0], path, 8)
    out: dict[str, dict[str, float]] = {
        r: {"tokens": 0, "decode_s": 0.0, "steps": 0} for r in ("delayed", "path")
    }
    same = done = 0
    for i, p in enumerate(cases):
        if i >= 2 and time.monotonic() - START > BUDGET_S:  # two prompts at least
            print(f"(c) budget of {BUDGET_S:g} s spent after {i} prompts")
            break
        order = [("delayed", delayed), ("path", path)]
        got = {}
        for name, route in order if i % 2 == 0 else order[::-1]:
            res = generate(target, p, route, SPEED_TOKENS)
            out[name]["tokens"] += len(res.output_ids)
            out[name]["decode_s"] += res.decode_s
            out[name]["steps"] += res.steps
            got[name] = res.output_ids
        same += got["delayed"] == got["path"]
        done += 1
    for v in out.values():
        v["tokens_per_s"] = v["tokens"] / v["decode_s"]
        v["mal"] = v["tokens"] / max(v["steps"], 1)
    ratio = out["delayed"]["tokens_per_s"] / out["path"]["tokens_per_s"]
    print(
        f"(c) delayed {out['delayed']['tokens_per_s']:.0f} tok/s vs path "
        f"{out['path']['tokens_per_s']:.0f}: {ratio:.3f}x"
    )
    return {
        "per_commit": out,
        "delayed_over_path": ratio,
        "prompts_with_same_tokens": same,
        "prompts": done,
    }


def fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = START
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if not CPU else "cpu"}
    result["exactness"] = exactness()
    result["t_exactness_s"] = time.monotonic() - start
    result["whole_step"] = whole_step()
    result["t_whole_step_s"] = time.monotonic() - start
    result["tokens_per_s"] = tokens_per_s()
    result["seconds"] = time.monotonic() - start
    (out_dir / "dev-delayed.json").write_text(json.dumps(result, indent=1, default=str))
    ok = all(r["identical_to_ar"] for r in result["exactness"])
    lines = [f"# dev-delayed on {result['device']} ({result['seconds']:.0f} s)", "",
             f"## (a) float32 tiny-qwen35, delayed commit vs AR: {'all identical' if ok else 'DIVERGED'}", "",
             "| route | prompt | identical | MAL | same paths as path commit | state vs path commit |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["exactness"]:
        lines.append(f"| {r['route']} | {r['prompt']} | {r['vs_ar']} | {r['mal']:.2f} | "
                     f"{r['same_paths_as_path_commit']} | {r['state_vs_path_commit']:.3g} |")  # fmt: skip
    ws = result["whole_step"]
    lines += ["", f"## (b) whole step at the SpecLA shape: {ws['shape']}", "",
              "| depth | method | us per step | us per layer |", "|---|---|---|---|"]  # fmt: skip
    lines += [
        f"| {r['depth']} | {r['method']} | {r['us_per_step']:.1f} | {r['us_per_layer']:.1f} |"
        for r in ws["rows"]
    ]
    for name, ks in ws["kernels"].items():
        lines += ["", f"device us per step by kernel, {name} (profiler, eager; top 14)", "",
                  "| kernel | calls | us |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {r['kernel']} | {r['calls_per_step']:.2f} | {r['us_per_step']:.1f} |" for r in ks[:14]]
    lines.append(
        "\nstate after 6 delayed steps vs path commit: "
        f"{ws['state_delayed_vs_path_commit_after_6_steps']:.3g}"
    )
    tp = result["tokens_per_s"]
    lines += ["", "## (c) tiny-qwen35 specla route, bf16, tokens/s", "",
              "| commit | tokens/s | MAL | tokens |", "|---|---|---|---|"]  # fmt: skip
    for name, v in tp["per_commit"].items():
        lines.append(f"| {name} | {v['tokens_per_s']:.0f} | {v['mal']:.2f} | {v['tokens']} |")
    lines.append(f"\ndelayed / path: {tp['delayed_over_path']:.3f}x; same tokens on "
                 f"{tp['prompts_with_same_tokens']}/{tp['prompts']} prompts (bf16)")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out_dir / "dev-delayed.md").write_text(text)
    print(text)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
