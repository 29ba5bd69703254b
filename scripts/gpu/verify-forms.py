"""A verify's linears in three variants on the H200, at the tiny-qwen35 width: the row-tiled tl.dot kernel
on weights with the norm scales folded in ("dot", the default: x enters the dots as it is), the same
kernel scaling x in every K step ("dot-scaled": hi + lo parts, two dots), and the GEMV kernel over groups
of 4 rows ("gemv").

    python3 scripts/gpu/verify-forms.py OUT_DIR      (one H200: about 90 s)

1. Each of tiny-qwen35's six verify matrices (GDN in_proj, out_proj, gate|up, down, attention q|k|v,
   lm_head) at the engine's slot sizes of budgets 16, 32, 64 (17, 33, 65 rows), bf16: us per call in a
   CUDA graph (repro.bench.timing.graph_us) for "dot-scaled" (its tuned or default tiles), "dot" on the
   folded weight (normed kinds; the same tiles) and "gemv" (its default grouped configuration, then
   block_n 4..64), and each one's error against torch in float64 (the folded call's against torch on
   the folded weight; its distance to the unfolded result beside).
2. The verify step of the StaticDecoder on the embedded tiny-qwen35 (bf16, the GEMV decode, fuse_verify
   on: what GraphedTarget runs) for best-first trees of 17, 33 and 65 nodes: us per verify graph in
   each variant, beside the decode step, and each variant's logits against "dot-scaled"'s (relative
   error, top-1 agreement).

Writes OUT_DIR/verify-forms.json and OUT_DIR/verify-forms.md; prints the markdown. Exit 3 when a form's
error is over the bf16 bound of tests/gdn/test_triton_linear_rows.py (5e-3) or the logits' top-1
agreement is under 0.95.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.timing import TimerConfig, graph_us  # noqa: E402
from repro.gdn import triton_linear as tlin  # noqa: E402
from repro.models.graphs import GraphedCall  # noqa: E402
from repro.models.layers import rms_norm  # noqa: E402
from repro.models.static import StaticDecoder, TreeSlot  # noqa: E402
from repro.models.target import open_target  # noqa: E402

DEV = torch.device("cuda")
TIMER = TimerConfig(warmup_ms=2.0, rep_ms=10.0, graph_replays=5)
ROWS = (17, 33, 65)
MATRICES = [  # (name, kind, N (I for gate|up), K)
    ("gdn in_proj", "norm_linear", 584, 192),
    ("gdn out_proj", "linear_residual", 192, 192),
    ("gate|up", "norm_gate_up", 384, 192),
    ("down", "linear_residual", 192, 384),
    ("attn q|k|v", "norm_linear", 576, 192),
    ("lm_head", "norm_linear", 4096, 192),
]
BLOCK_N = (4, 8, 16, 32, 64)
VARIANTS = {"dot": ("dot", True), "dot-scaled": ("dot", False), "gemv": ("gemv", False)}  # (form, fold_norms)
TOL, TOP1 = 5e-3, 0.95
_spec = importlib.util.spec_from_file_location("verify_rows", Path(__file__).with_name("verify-rows.py"))
assert _spec is not None and _spec.loader is not None
verify_rows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(verify_rows)  # its trees, prefill and decode timing (one setup for both scripts)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def matrix_call(kind: str, n: int, k: int, rows: int, seed: int):  # noqa: ANN201
    """(call(**blocks) -> output, the float64 torch result, and for the normed kinds the folded call and
    its float64 result on the folded weight, else None, None) on random bf16 inputs."""
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(rows, k, generator=gen)).bfloat16().to(DEV)
    scale = (1 + 0.2 * torch.randn(k, generator=gen)).bfloat16().to(DEV)
    h = rms_norm(x.double(), scale.double(), 1e-6)
    h1 = rms_norm(x.double(), torch.ones(k, dtype=torch.float64, device=DEV), 1e-6)  # the folded call's row
    if kind == "norm_gate_up":
        w = (torch.randn(2 * n, k, generator=gen) * k**-0.5).bfloat16().to(DEV)
        wf = tlin.fold_norm(w, scale)
        gu, guf = F.linear(h, w.double()), F.linear(h1, wf.double())
        return (
            partial(tlin.norm_gate_up, x, scale, 1e-6, w), F.silu(gu[:, :n]) * gu[:, n:],
            partial(tlin.norm_gate_up, x, scale, 1e-6, w, folded=wf), F.silu(guf[:, :n]) * guf[:, n:],
        )  # fmt: skip
    w = (torch.randn(n, k, generator=gen) * k**-0.5).bfloat16().to(DEV)
    if kind == "norm_linear":
        wf = tlin.fold_norm(w, scale)
        return (
            partial(tlin.norm_linear, x, scale, 1e-6, w), F.linear(h, w.double()),
            partial(tlin.norm_linear, x, scale, 1e-6, w, folded=wf), F.linear(h1, wf.double()),
        )  # fmt: skip
    res = torch.randn(rows, n, generator=gen).bfloat16().to(DEV)
    out = res.double() + F.linear(x.double(), w.double())
    return partial(tlin.linear_residual, x, w, res), out, None, None


def matrix_rows() -> list[dict[str, Any]]:
    out = []
    for i, (name, kind, n, k) in enumerate(MATRICES):
        for rows in ROWS:
            call, ref, folded, ref_folded = matrix_call(kind, n, k, rows, i * 100 + rows)
            row: dict[str, Any] = {"matrix": name, "kind": kind, "N": n, "K": k, "rows": rows}
            for form in ("dot", "gemv"):
                fn = partial(call, form=form)
                row[f"{form}_err"] = rel(fn(), ref)
                row[f"{form}_us"] = graph_us([fn], DEV, TIMER, estimate_us=5.0)
            if folded is not None:
                fn = partial(folded, form="dot")
                row["folded_err"] = rel(fn(), ref_folded)
                row["folded_vs_unfolded"] = rel(fn(), ref)
                row["folded_us"] = graph_us([fn], DEV, TIMER, estimate_us=5.0)
            groups = -(-rows // tlin.MAX_ROWS)
            row["gemv_default_block_n"] = tlin.grouped_config(kind, n, k, groups, DEV).block_n
            for bn in BLOCK_N:
                fn = partial(call, form="gemv", block_n=bn)
                row[f"gemv_bn{bn}_us"] = graph_us([fn], DEV, TIMER, estimate_us=5.0)
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def verify_steps() -> list[dict[str, Any]]:
    """The verify step in each form per tree size (verify-rows.py's trees, prefill and decode timing)."""
    model, _ = open_target("default", "bfloat16", "cuda", need_tokenizer=False)
    model.set_gdn_backend("triton")
    state = verify_rows.prefilled(model)
    decode = verify_rows.decode_us(model, state, True)
    out = []
    for t in ROWS:
        tree = verify_rows.tree(t, model.config.vocab_size, t)
        row: dict[str, Any] = {"T": t, "decode_us": decode}
        logits = {}
        for variant, (form, fold) in VARIANTS.items():
            with tlin.verify_form(form):
                dec = StaticDecoder(model, 512, 128, gemv=True, fuse_verify=True, fold_norms=fold)
                dec.load(state)
                slot = TreeSlot(dec, t, max_depth=int(tree.depth.max()))
                slot.set_tree(tree)
                fn = partial(dec.verify, slot)
                logits[variant] = GraphedCall(fn, DEV)().float().clone()
                row[f"{variant}_us"] = graph_us([fn], DEV, TIMER, estimate_us=200.0)
            del dec, slot
        base = logits["dot-scaled"]
        for variant in ("dot", "gemv"):
            row[f"{variant}_logits_rel"] = rel(logits[variant], base)
            row[f"{variant}_top1"] = float((logits[variant].argmax(-1) == base.argmax(-1)).float().mean())
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# verify-forms: a verify's linears on the row-tiled kernel (scaled rows, or folded weights: the "
        "default) or the GEMV kernel in groups of 4 rows (gemv), tiny-qwen35 width, bf16, H200",
        "",
        "## Each matrix, us per call in a CUDA graph (error vs torch float64)",
        "",
        "| matrix | N x K | rows | dot-scaled us | dot (folded) us | folded / scaled | gemv us (default "
        "block_n) | gemv / dot-scaled | best gemv block_n: us | dot-scaled err | folded err (vs unfolded) | "
        "gemv err |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|",
    ]
    for r in res["matrices"]:
        tried = {int(k[len("gemv_bn") : -len("_us")]): v for k, v in r.items() if k.startswith("gemv_bn")}
        bn = min(tried, key=tried.get) if tried else None
        folded = r.get("folded_us", r["dot_us"])  # unnormed kinds: no folded weight, the same call
        fold_err = f"{r['folded_err']:.1e} ({r['folded_vs_unfolded']:.1e})" if "folded_err" in r else "-"
        lines.append(
            f"| {r['matrix']} | {r['N']} x {r['K']} | {r['rows']} | {r['dot_us']:.2f} | {folded:.2f} | "
            f"{folded / r['dot_us']:.2f} | {r['gemv_us']:.2f} ({r['gemv_default_block_n']}) | "
            f"{r['gemv_us'] / r['dot_us']:.2f} | "
            + (f"{bn}: {tried[bn]:.2f}" if bn else "-")
            + f" | {r['dot_err']:.1e} | {fold_err} | {r['gemv_err']:.1e} |"
        )
    for rows in ROWS:
        at = [r for r in res["matrices"] if r["rows"] == rows]
        dot, gemv = sum(r["dot_us"] for r in at), sum(r["gemv_us"] for r in at)
        folded = sum(r.get("folded_us", r["dot_us"]) for r in at)
        lines.append(
            f"\n- {rows} rows, the six matrices once each: dot-scaled {dot:.1f} us, dot (folded) "
            f"{folded:.1f} us, gemv {gemv:.1f} us"
        )
    lines += [
        "",
        "## The StaticDecoder's verify step (tiny-qwen35, bf16, fuse_verify on), us per verify graph",
        "",
        "| nodes | decode step us | dot-scaled us | dot (folded) us | gemv us | folded / scaled | "
        "folded / decode | logits folded vs scaled (top-1) | logits gemv vs scaled (top-1) |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in res["verify"]:
        lines.append(
            f"| {r['T']} | {r['decode_us']:.1f} | {r['dot-scaled_us']:.1f} | {r['dot_us']:.1f} | "
            f"{r['gemv_us']:.1f} | {r['dot_us'] / r['dot-scaled_us']:.2f} | "
            f"{r['dot_us'] / r['decode_us']:.2f} | {r['dot_logits_rel']:.1e} ({r['dot_top1']:.3f}) | "
            f"{r['gemv_logits_rel']:.1e} ({r['gemv_top1']:.3f}) |"
        )
    lines += ["", f"verdict: {'ok' if res['ok'] else 'FAILED'} (errors <= {TOL}, top-1 >= {TOP1})", ""]
    return "\n".join(lines)


@torch.no_grad()
def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"matrices": matrix_rows()}
    res["verify"] = verify_steps()
    res["ok"] = all(
        r["dot_err"] <= TOL and r["gemv_err"] <= TOL and r.get("folded_err", 0.0) <= TOL
        for r in res["matrices"]
    ) and all(r["dot_top1"] >= TOP1 and r["gemv_top1"] >= TOP1 for r in res["verify"])
    (out / "verify-forms.json").write_text(json.dumps(res, indent=1))
    text = markdown(res)
    (out / "verify-forms.md").write_text(text)
    print(text)
    return 0 if res["ok"] else 3


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
