"""Where the tree-verify time goes (issue 13 item 1): the split form's two phases timed apart.

    python3 scripts/gpu/tree-phases.py OUT_DIR      (one H200: < 90 s)

At Weaver's shape (T = 128, 64, 256) and SpecLA's (T = 128, 64), bf16 inputs, "tf32" dots, a draft tree
(repro.bench.shapes via repro.bench.kernels.make_case): CUDA-graph medians of the fused kernel, the split
form under its options (each phase-2 walk, ``terms``, 64-row blocks, 8 warps, commit tiles, ``p_apart`` on
and off), its phase 1
alone (``_tree_keys_kernel``: G, A / P blocks, diagonal inverses) over 32- and 64-row blocks and warps, its
phase 2 alone (``_tree_values_kernel`` on phase 1's blocks) over d_v tiles, warps and both walks, and an
empty Triton launch on the same grid (the launch floor inside a graph). Every split variant is checked
against the fused kernel's output before it is timed.

TREE_PHASES_PARTS (default "phases,knobs"; the tables are rewritten after every shape): "phases" the
variants and sweeps above, "knobs" phase 1 alone under knobs
that price its parts (:func:`keys_knobs`), "delayed" the split form with and without a pending commit
(phase 1's commit programs over commit_block_v 16 / 32 / 64, the path from the mask or a path index;
:func:`delayed`), "peel" the split form with and without node 0 peeled, whole and by phase
(:func:`peel`). TREE_PHASES_BLOCKS picks the blocks as ``part:shape:T`` items
(e.g. "knobs:specla:128,phases:specla:128"; default every block); a budget of TREE_PHASES_BUDGET seconds
(75) skips the blocks not started by then.

Writes OUT_DIR/tree-phases.json and OUT_DIR/tree-phases.md; prints the markdown.
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
import triton
import triton.language as tl
from _triton_resources import tree_resources  # this script's folder is first on sys.path

from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.timing import TimerConfig, graph_us
from repro.gdn import triton_tree as tt

TIMER = TimerConfig(warmup_ms=1.0, rep_ms=5.0, graph_replays=3)
PREC = "tf32"


@triton.jit
def _empty_kernel(x_ptr):
    if tl.program_id(0) < 0:  # never: the launch alone
        tl.store(x_ptr, 0.0)


def measure(
    r: dict[str, Any], fn: Callable[[], Any], dev: torch.device, est: float,
    check: Callable[[], tuple[float, bool]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Fill row ``r``: ``check``'s (error, ok) first (``rel_err_vs_fused``; not ok: status FAIL, not
    timed), then the CUDA-graph median of ``fn`` (``us``); an exception is recorded in the row, not
    raised, so that one variant cannot stop the rest."""
    try:
        if check is not None:
            r["rel_err_vs_fused"], ok = check()
            if not ok:
                r["status"] = "FAIL"
                return r
        r["us"] = graph_us([fn], dev, TIMER, est)
        r["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - one variant must not stop the rest
        r.update(status="error", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    return r


def phases(shape: str, t: int, dev: torch.device) -> list[dict[str, Any]]:
    spec = bk.RowSpec(shape, "verify", "draft", t, "tree_split", "bf16")
    cfg = bk.BenchConfig(timer=TIMER, bf16_precision=PREC)
    case = bk.make_case(spec, cfg, dev)
    x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "phases"), dev).to("bf16")
    scale = case.shape.scale
    anc = case.tree_mask
    ref = tt.tree_gdn_fused(x.q, x.k, x.v, x.g, x.beta, x.state, anc, scale, PREC)[0].float()
    rows: list[dict[str, Any]] = []

    def row(name: str, fn, est: float, out: torch.Tensor | None = None, **knobs: Any) -> None:
        def check() -> tuple[float, bool]:
            assert out is not None
            fn()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            return err, err < 1e-2

        r = measure(
            dict(shape=shape, T=t, variant=name, **knobs), fn, dev, est, None if out is None else check
        )
        rows.append(r)
        print(f"{shape:7s} T={t:<4d} {name:22s} {knobs} {r.get('status')} us={r.get('us')}")

    args = (x.q, x.k, x.v, x.g, x.beta, x.state, anc, scale, PREC)
    row("fused", lambda: tt.tree_gdn_fused(*args), 40.0)
    options = {  # tree_gdn_split's options; the memory walk only as the baseline of three
        "plain": dict(terms=False), "terms": dict(terms=True), "plain-br64": dict(terms=False, block_rows=64),
        "terms-br64": dict(terms=True, block_rows=64), "terms-w8": dict(terms=True, num_warps=8),
        "terms-br32": dict(terms=True, block_rows=32),
        "terms-cbv16": dict(terms=True, commit_block_v=16),
        "terms-cbv64": dict(terms=True, commit_block_v=64),
    }  # fmt: skip
    memory = ("plain", "terms", "terms-br64")
    variants = {f"split-{name}-memory": dict(options[name], walk="memory") for name in memory}
    variants |= {f"split-{name}-registers": dict(kw, walk="registers") for name, kw in options.items()}
    variants["split"] = {}
    variants |= {"split-p-apart": {"p_apart": True}, "split-no-p-apart": {"p_apart": False}}  # split_p_apart
    for name, kw in variants.items():
        err = ((tt.tree_gdn_split(*args, **kw)[0].float() - ref).norm() / ref.norm()).item()
        rows.append(dict(shape=shape, T=t, variant=f"{name} check", status="ok" if err < 1e-2 else "wrong",
                         rel_err_vs_fused=err))  # fmt: skip
        row(name, lambda kw=kw: tt.tree_gdn_split(*args, **kw), 40.0)
    for br in (32, 64):
        if br > max(16, t):
            continue
        c = tt._TreeCall.of(x.q, x.k, x.v, x.g, x.beta, x.state, anc, PREC, False, None, None)
        bk_ = tt._check_tiles(br, None, c.dk)
        for warps in (4, 8):
            row("phase1", lambda c=c, br=br, b=bk_, w=warps: tt._key_blocks(c, br, b, PREC, scale, w), 15.0,
                block_rows=br, num_warps=warps)  # fmt: skip
        a_blocks, p_blocks, npad = tt._key_blocks(c, br, bk_, PREC, scale, tt.SPLIT_WARPS)
        qs = torch.empty_like(c.delta)
        bv_default = tt.split_tiles(c.n, c.hv, c.dv, PREC, br)[1]
        # phase 2 on its own products, checked (once per walk); then with phase 1's (terms) over tiles
        sweep = [(bv_default, 4, "", k) for k in tt.WALKS]
        sweep += [(bv, w, "terms", k) for bv in (16, 32, 64) for w in (4, 8) for k in tt.WALKS if bv <= c.dv]
        for bv, warps, mode, walk in sweep:

            def values(
                c=c, br=br, b=bk_, bv=bv, w=warps, a=a_blocks, p=p_blocks, npad=npad, m=mode, s=qs, k=walk
            ) -> None:
                tt._value_walk(c, a, p, npad, br, b, bv, PREC, scale, w, s if m == "terms" else None, k)

            # terms: phase 1's products are not rewritten between replays (timing only, no check)
            out = None if mode == "terms" else c.o
            name = f"phase2-{mode}-{walk}" if mode else f"phase2-{walk}"
            row(name, values, 20.0, out=out, block_rows=br, block_v=bv, num_warps=warps)
        grid = (c.hv, c.dv // 64)
        dummy = torch.zeros(1, device=dev)
        row("empty-launch", lambda g=grid, d=dummy: _empty_kernel[g](d), 3.0, grid=list(grid))
        keys_grid = (c.hv, (npad // br) ** 2)
        row("empty-launch-keys", lambda g=keys_grid, d=dummy: _empty_kernel[g](d), 3.0, grid=list(keys_grid))
    return rows


def keys_knobs(shape: str, t: int, dev: torch.device) -> list[dict[str, Any]]:
    """Phase 1 (``_tree_keys_kernel``) alone under knobs, timing only (the variants marked so compute the
    wrong thing on purpose, to price one part): ``no-inverse`` (LOG2_BR = 0: the diagonal inverse
    skipped), ``no-mask-loads`` (CHAIN: the lower triangle instead of the ancestor mask, so the gate sums
    and the mask load no mask bytes), the unbatched diagonal inverse (``inverse0``), the d_k
    chunk BK, software pipelining stages, warps; and two that compute the right thing: ``write-k``
    (TreeFactors.k written, as the split form does) and dependent launch releasing the next launch at the
    start or the exit (``pdl-*``)."""
    spec = bk.RowSpec(shape, "verify", "draft", t, "tree_split", "bf16")
    case = bk.make_case(spec, bk.BenchConfig(timer=TIMER, bf16_precision=PREC), dev)
    x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "knobs"), dev).to("bf16")
    c = tt._TreeCall.of(x.q, x.k, x.v, x.g, x.beta, x.state, case.tree_mask, PREC, False, None, None)
    rows: list[dict[str, Any]] = []
    variants = [("default", {}), ("no-inverse", {"LOG2_BR": 0, "INV": 0}),
                ("no-mask-loads", {"CHAIN": True}),
                ("inverse0", {"INV": 0}),
                ("bk128", {"BK": 128}), ("stages3", {"num_stages": 3}), ("stages2", {"num_stages": 2}),
                ("w8", {"num_warps": 8}), ("w2", {"num_warps": 2}), ("write-k", {"WRITE_K": True}),
                ("pdl-start", {"PDL": 1, "launch_pdl": True}),
                ("pdl-exit", {"PDL": 2, "launch_pdl": True})]  # fmt: skip
    for br in (32, 64):
        if br > max(16, t):
            continue
        nr = triton.cdiv(c.n, br)
        npad = nr * br
        a = torch.empty(c.hv, npad, npad, dtype=torch.float32, device=dev)
        p = torch.empty_like(a)
        bk_default = tt._check_tiles(br, None, c.dk)
        for name, knobs in variants:
            kw = dict(H=c.h, HV=c.hv, DK=c.dk, DV=c.dv, BR=br, LOG2_BR=br.bit_length() - 1, BK=bk_default,
                      CHAIN=False, PREC=PREC, UPCAST_QK=c.upcast, INV=tt.inverse_scheme(br),
                      WRITE_K=False, PENDING=False, PNP=c.pnp, NCT=0, BVC=16, BKC=16, TERMS=False, RC=16,
                      **tt.gate_columns(c.n),
                      num_warps=tt.SPLIT_WARPS, PDL=0, launch_pdl=False)  # fmt: skip
            if knobs and all(kw.get(key) == val for key, val in knobs.items()):
                continue  # the default already (the "default" row itself is timed)
            kw.update(knobs)
            if kw["BK"] > c.dk:
                continue

            def launch(kw=kw, nr=nr, npad=npad, a=a, p=p) -> None:
                tt._tree_keys_kernel[(c.hv, nr * nr)](
                    c.q, c.k, c.g, c.beta, c.anc, a, p, a, c.gate_cum, c.k_exp, c.state, *c.p_ops, c.p_node,
                    c.p_n, c.delta, c.delta, c.n, c.anc_stride, npad, nr, 1.0, **kw,
                )  # fmt: skip

            r = measure(dict(shape=shape, T=t, variant=f"phase1:{name}", block_rows=br), launch, dev, 15.0)
            rows.append(r)
            print(f"{shape:7s} T={t:<4d} BR={br} {name:14s} {r['status']} us={r.get('us')}")
    return rows


def delayed(shape: str, t: int, dev: torch.device, depth: int = 4) -> list[dict[str, Any]]:
    """The split form at T nodes with a pending commit of a depth-``depth`` path of a previous T-node
    tree (the bench's step rows' inputs) against the same launch without one; each variant first checked:
    the committed state against :func:`repro.gdn.reference.apply_pending` (float32) and o against the
    fused kernel run from that state."""
    from repro.gdn import reference
    from repro.gdn.triton_commit import path_index_buffer, write_path_index

    spec = bk.RowSpec(shape, "step", "draft", t, "step_delayed_split", "bf16", depth)
    case = bk.make_case(spec, bk.BenchConfig(timer=TIMER, bf16_precision=PREC), dev)
    x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "delayed"), dev).to("bf16")
    prev = km.previous_inputs(case).to("bf16")
    prev.state = x.state
    f = km._factors(case, prev, snapshots=False)
    node = torch.tensor([case.accepted[-1]], device=dev)
    # the pending commit's mask as the engine's stash holds it; the verify's as its slot gives it
    anc, mask, scale = case.ancestors, case.tree_mask, case.shape.scale
    want_state = x.state.clone()
    reference.apply_pending(want_state, reference.PendingCommit(f.delta, f.k, f.gate_cum, anc, node))
    want_o = tt.tree_gdn_fused(x.q, x.k, x.v, x.g, x.beta, want_state, mask, scale, PREC)[0].float()
    rows: list[dict[str, Any]] = []
    state = x.state.clone()
    args = (x.q, x.k, x.v, x.g, x.beta, state, mask, scale, PREC)
    plain, terms, br64 = {"terms": False}, {"terms": True}, {"terms": True, "block_rows": 64}
    variants: list[tuple[str, dict[str, Any]]] = [("split, nothing pending", plain)]
    variants.append(("split + terms, nothing pending", terms))
    variants.append(("split + terms, 64-row blocks, nothing pending", br64))
    for index in (False, True):
        for cbv in (16, 32, 64):
            pending = reference.PendingCommit(f.delta, f.k, f.gate_cum, anc, node)
            if index:
                pending.path = path_index_buffer(case.n, dev)
                write_path_index(anc, node, pending.path)
            name = f"split, delayed{' (path index)' if index else ''}"
            variants.append((name, {"pending": pending, "commit_block_v": cbv, **plain}))
            if index:
                kw = {"pending": pending, "commit_block_v": cbv}
                variants.append((f"{name} + terms", {**kw, **terms}))
                variants.append((f"{name} + terms, 64-row blocks", {**kw, **br64}))
    for name, kw in variants:

        def check(kw: dict[str, Any] = kw) -> tuple[float, bool]:
            state.copy_(x.state)
            o = tt.tree_gdn_split(*args, **kw)[0].float()
            err_s = ((state - want_state).norm() / want_state.norm()).item()
            err_o = ((o - want_o).norm() / want_o.norm()).item()
            return max(err_s, err_o), err_s < 1e-5 and err_o < 1e-2

        # timed in place: every replay commits the same path again (the same work, other values)
        r = dict(shape=shape, T=t, variant=name, depth=depth, block_v=kw.get("commit_block_v"))
        measure(
            r, lambda kw=kw: tt.tree_gdn_split(*args, **kw), dev, 30.0, check if "pending" in kw else None
        )
        rows.append(r)
        print(f"{shape:7s} T={t:<4d} {name:32s} cbv={r['block_v']} {r.get('status')} us={r.get('us')}")
    rows += _delayed_parts(shape, t, dev, x, f, anc, mask, node, scale, state, depth)
    return rows


def _delayed_parts(shape, t, dev, x, f, anc, mask, node, scale, state, depth) -> list[dict[str, Any]]:  # noqa: ANN001
    """The pieces of the delayed split step timed alone (timing only; the variants above checked the
    arithmetic): phase 1 with and without the commit programs, the commit programs alone (phase 1's
    launch with no key programs), phase 2 alone, and the separate indexed commit launch
    (repro.gdn.triton_commit.commit_path_indexed) on the same path."""
    from repro.gdn import reference
    from repro.gdn.triton_commit import commit_path_indexed, path_index_buffer, write_path_index

    pending = reference.PendingCommit(f.delta, f.k, f.gate_cum, anc, node)
    pending.path = path_index_buffer(len(f.delta), dev)
    write_path_index(anc, node, pending.path)
    args = (x.q, x.k, x.v, x.g, x.beta, state, mask, PREC, False)
    c0 = tt._TreeCall.of(*args, None, None)
    cp = tt._TreeCall.of(*args, pending, None)
    br, bv = tt.split_tiles(c0.n, c0.hv, c0.dv, PREC)
    bk_ = tt._check_tiles(br, None, c0.dk)
    warps = tt.SPLIT_WARPS
    a_blocks, p_blocks, npad = tt._key_blocks(c0, br, bk_, PREC, scale, warps)

    def commit_alone(cbv: int) -> None:
        tt._key_blocks(cp, br, bk_, PREC, scale, warps, True, cbv, key_programs=False)

    qs = torch.empty_like(c0.delta)

    def phase2(terms: bool = False) -> None:
        tt._value_walk(c0, a_blocks, p_blocks, npad, br, bk_, bv, PREC, scale, warps, qs if terms else None)

    def keys(c: tt._TreeCall, cbv: int | None, terms: bool = False) -> None:
        tt._key_blocks(c, br, bk_, PREC, scale, warps, c is cp, cbv, qs if terms else None)

    parts = [
        ("phase 1", None, lambda: keys(c0, None)),
        ("phase 1 + commit (path index)", 16, lambda: keys(cp, 16)),
        ("phase 1 + commit (path index)", 32, lambda: keys(cp, 32)),
        ("phase 1 + commit (path index)", 64, lambda: keys(cp, 64)),
        ("commit programs alone", 16, lambda: commit_alone(16)),
        ("commit programs alone", 32, lambda: commit_alone(32)),
        ("commit programs alone", 64, lambda: commit_alone(64)),
        ("phase 2", None, phase2),
        ("phase 1 + terms", 32, lambda: keys(c0, 32, True)),
        ("phase 1 + commit + terms (path index)", 32, lambda: keys(cp, 32, True)),
        ("phase 2 (terms from phase 1)", None, lambda: phase2(True)),
        # the same launches in sequence, no dependent launch: where the step's sum stops adding up
        ("seq: phase 1, phase 2", None, lambda: (keys(c0, None), phase2())),
        ("seq: phase 1 + commit, phase 2", 32, lambda: (keys(cp, 32), phase2())),
        ("seq: commit alone, phase 1, phase 2", 32, lambda: (commit_alone(32), keys(c0, None), phase2())),
        ("commit_path_indexed (own launch)", 16,
         lambda: commit_path_indexed(state, f.delta, f.k, f.gate_cum, pending.path)),
    ]  # fmt: skip
    rows: list[dict[str, Any]] = []
    for name, cbv, fn in parts:
        r = measure(dict(shape=shape, T=t, variant=name, depth=depth, block_v=cbv), fn, dev, 20.0)
        rows.append(r)
        print(f"{shape:7s} T={t:<4d} {name:32s} cbv={cbv} {r.get('status')} us={r.get('us')}")
    return rows


def peel(shape: str, t: int, dev: torch.device) -> list[dict[str, Any]]:
    """The split form with and without node 0 peeled (``peel``) at its default tiles for each (those of t
    and of t - 1 rows), and peeled on 32-row blocks where its default is 64, whole and phase by phase
    (phase 1 with its state products, phase 1 without its node-0 programs, phase 2 on them), each whole
    form first checked against the fused kernel: where the peeled form's time goes
    (results/2026-12-06-h100-peel-root: at 64-row blocks phase 1 took 3-4x the unpeeled one's)."""
    spec = bk.RowSpec(shape, "verify", "draft", t, "tree_split", "bf16")
    case = bk.make_case(spec, bk.BenchConfig(timer=TIMER, bf16_precision=PREC), dev)
    x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "peel"), dev).to("bf16")
    anc, scale = case.tree_mask, case.shape.scale
    args = (x.q, x.k, x.v, x.g, x.beta, x.state, anc, scale, PREC)
    ref = tt.tree_gdn_fused(*args)[0].float()
    c = tt._TreeCall.of(x.q, x.k, x.v, x.g, x.beta, x.state, anc, PREC, False, None, None)
    rows: list[dict[str, Any]] = []
    configs = [(False, None), (True, None)]
    if tt.split_tiles(c.n - 1, c.hv, c.dv, PREC)[0] > 32:
        configs.append((True, 32))
    for peeled, rows_ in configs:
        br, bv = tt.split_tiles(c.n - peeled, c.hv, c.dv, PREC, rows_)
        bk_ = tt._check_tiles(br, None, c.dk)
        c0 = torch.empty(2, c.hv, c.n, dtype=torch.float32, device=dev) if peeled else None
        qs = torch.empty_like(c.delta)
        a, p, npad = tt._key_blocks(c, br, bk_, PREC, scale, tt.SPLIT_WARPS, False, None, qs, c0=c0)
        name = ("peeled" if peeled else "split") + (f" BR={rows_}" if rows_ else "")

        def whole(peeled: bool = peeled, r: int | None = rows_) -> None:
            tt.tree_gdn_split(*args, peel=peeled, block_rows=r)

        def check(peeled: bool = peeled, r: int | None = rows_) -> tuple[float, bool]:
            o = tt.tree_gdn_split(*args, peel=peeled, block_rows=r)[0].float()
            err = ((o - ref).norm() / ref.norm()).item()
            return err, err < 1e-2

        def keys(c0=c0, br=br, b=bk_, s=qs, node0: bool = True) -> None:  # noqa: ANN001
            tt._key_blocks(c, br, b, PREC, scale, tt.SPLIT_WARPS, False, None, s, c0=c0, node0_programs=node0)

        def values(c0=c0, a=a, p=p, n=npad, br=br, b=bk_, bv=bv, s=qs) -> None:  # noqa: ANN001
            tt._value_walk(c, a, p, n, br, b, bv, PREC, scale, tt.SPLIT_WARPS, s, None, c0)

        parts = [(name, whole, check), (f"{name}: phase 1 + terms", keys, None),
                 (f"{name}: phase 2 (terms)", values, None)]  # fmt: skip
        if peeled:
            parts.append((f"{name}: phase 1 w/o node-0 programs", lambda k=keys: k(node0=False), None))
        for variant, fn, chk in parts:
            r = measure(
                dict(shape=shape, T=t, variant=variant, block_rows=br, block_v=bv), fn, dev, 30.0, chk
            )
            rows.append(r)
            print(f"{shape:7s} T={t:<4d} {variant:28s} BR={br} {r.get('status')} us={r.get('us')}")
    return rows


def dump(out_dir: Path, rows: list[dict[str, Any]], start: float) -> str:
    """Write the JSON and markdown of the rows so far (after every block: a timed-out run keeps them)."""
    result = {"device": torch.cuda.get_device_name(), "seconds": time.monotonic() - start, "rows": rows}
    (out_dir / "tree-phases.json").write_text(json.dumps(result, indent=1, default=str))
    cols = ["shape", "T", "variant", "block_rows", "block_v", "num_warps", "status", "us", "rel_err_vs_fused"]
    lines = [f"# tree-phases on {result['device']} ({result['seconds']:.0f} s)", "",
             "CUDA-graph medians per call (bf16 inputs, tf32 dots); phase2 checked against the fused output.",
             "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]  # fmt: skip

    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))

    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    (out_dir / "tree-phases.md").write_text(text)
    return text


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    dev = torch.device("cuda")
    parts = os.environ.get("TREE_PHASES_PARTS", "phases,knobs").split(",")
    blocks = [
        ("phases", shape, t)
        for shape, t in (("weaver", 128), ("specla", 128), ("specla", 64), ("weaver", 64), ("weaver", 256))
    ]
    blocks += [("knobs", shape, t) for shape, t in (("weaver", 128), ("weaver", 64), ("specla", 128))]
    blocks += [("delayed", shape, t) for shape, t in (("specla", 64), ("specla", 128))]
    blocks += [("peel", shape, t) for shape in ("weaver", "tiny-qwen35") for t in (33, 65, 129, 128)]
    if os.environ.get("TREE_PHASES_BLOCKS"):
        items = (b.split(":") for b in os.environ["TREE_PHASES_BLOCKS"].split(","))
        blocks = [(part, shape, int(t)) for part, shape, t in items]
    budget = float(os.environ.get("TREE_PHASES_BUDGET", "75"))
    rows: list[dict[str, Any]] = []
    for part, shape, t in blocks:
        if part not in parts:
            continue
        if time.monotonic() - start > budget:
            print(f"budget spent: {part} {shape} T={t} skipped")
            continue
        rows += {"phases": phases, "knobs": keys_knobs, "delayed": delayed, "peel": peel}[part](shape, t, dev)
        dump(out_dir, rows, start)
    print(dump(out_dir, rows, start))
    tree_resources(out_dir)


if __name__ == "__main__":
    main()
