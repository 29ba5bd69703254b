"""Fused Triton tree-verification kernels (repro.gdn.triton_tree) vs the float64 reference.

Two groups:
- interpreter tests (CPU, Triton's interpreter): small shapes, every tree kind, several row blocks,
  d_k chunks and d_v tiles. Triton reads TRITON_INTERPRET when a kernel is *decorated* (at import of
  repro.gdn.triton_tree), so these run in one subprocess started with TRITON_INTERPRET=1 (this file
  run as a script), which reports every case's errors as JSON; a test per case checks them. That
  keeps them independent of whatever this process imported first, and lets the GPU tests below use
  the compiled kernels in the same session.
- GPU tests (``@pytest.mark.gpu``, skipped without CUDA): the paper shapes (Weaver H=16, HV=48,
  d_k=d_v=128; SpecLA HV=8, d_k=d_v=256), fresh random inputs every run (the seed is in the failure
  message): every shape in bf16/"tf32" (production) and float32/"ieee" (exactness), plus float32
  "tf32x3"/"tf32" and bf16 "ieee" on three shapes: 49 cases. The 47 of them then listed took ~2 min on
  one H200 (mostly compiles and the float64 references) and all passed there on 2026-11 (torch 2.11,
  triton 3.6). By default only ``GPU_QUICK`` runs (12 cases: both shapes, tree and chain APIs, ragged
  and largest sizes, every precision pair), so that the whole gpu-marked suite stays near 150 s;
  REPRO_GPU_FULL=1 runs all 49.

Errors are ||x - ref|| / ||ref|| against repro.gdn.reference.tree_gdn run in float64 on the upcast
inputs (so input rounding is not counted); outputs are poisoned with NaN before every call and must
come back finite everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import gpu_full_only, leaves, random_tree, run_in_interpreter, seed_of

from repro.gdn import reference as gdn
from repro.tree import Tree

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
F64 = torch.float64
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# ---------------------------------------------------------------------------------------------
# one case: inputs, fused call, reference, errors (shared by the interpreter and the GPU tests)


def make_inputs(spec: dict, device: str):
    """Fresh random GDN inputs from the case's seed (unit q/k, g <= 0, beta in (0, beta_max), S0 != 0).

    ``hard`` draws keys around a shared direction (|cos| ~ 0.8) with slow decays and beta near its
    maximum: the triangular system is then far from the identity (large T entries).
    """
    gen = torch.Generator().manual_seed(spec["seed"])
    n, h, hv, dk, dv = spec["n"], spec["H"], spec["HV"], spec["dk"], spec["dv"]
    q = F.normalize(torch.randn(n, h, dk, generator=gen), dim=-1)
    if spec.get("hard"):
        base = torch.randn(1, h, dk, generator=gen)
        k = F.normalize(base + 0.5 * torch.randn(n, h, dk, generator=gen) / dk**0.5 * base.norm(), dim=-1)
        g = -0.05 * torch.rand(n, hv, generator=gen)
        beta = spec.get("beta_max", 1.0) * (0.7 + 0.3 * torch.rand(n, hv, generator=gen))
    else:
        k = F.normalize(torch.randn(n, h, dk, generator=gen), dim=-1)
        g = -torch.rand(n, hv, generator=gen) * (0.05 + 0.8 * torch.rand(1, hv, generator=gen))
        beta = spec.get("beta_max", 1.0) * torch.rand(n, hv, generator=gen).clamp(0.02, 0.98)
    v = torch.randn(n, hv, dv, generator=gen)
    s0 = torch.randn(hv, dv, dk, generator=gen)
    dtype = DTYPES[spec.get("dtype", "float32")]
    parents = random_tree(n, spec["kind"], gen)
    ins = [x.to(device=device, dtype=dtype) for x in (q, k, v, g, beta)]
    return ins, s0.to(device), parents


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def make_pending(spec: dict, s0: torch.Tensor, device: str) -> tuple[gdn.PendingCommit, torch.Tensor]:
    """A previous step's factors (float32 values) on a ``pending_n``-node tree and its path end
    (``pending_node``: an index, or "deep" for the deepest node); returns (the pending commit on
    ``device``, the committed state in float64 by reference.commit_closed_form)."""
    gen = torch.Generator().manual_seed(spec["seed"] + 1)
    n, hv, dv, dk = spec.get("pending_n", 23), spec["HV"], spec["dv"], spec["dk"]
    tree = Tree(torch.zeros(n, dtype=torch.long), random_tree(n, "mixed", gen))
    f = gdn.TreeFactors(
        delta=torch.randn(n, hv, dv, generator=gen).double(),
        gate_cum=-(torch.rand(n, hv, generator=gen) * 2).double(),
        k=F.normalize(torch.randn(n, hv, dk, generator=gen), dim=-1).double(),
        v=torch.empty(0), g=torch.empty(0), beta=torch.empty(0),
    )  # fmt: skip
    end = spec.get("pending_node", "deep")
    if end == "deep":
        end = max(range(n), key=lambda i: len(tree.path_to(i)))
    path = tree.path_to(end) if end >= 0 else []
    committed = gdn.commit_closed_form(s0.cpu().double(), f, path)
    ops = [x.float().to(device) for x in (f.delta, f.k, f.gate_cum)]
    node = torch.tensor([end], device=device)
    pending = gdn.PendingCommit(*ops, tree.ancestor_mask.to(device), node)
    if spec.get("pending_index"):  # the path as a path index too (stale past the path: never read)
        from repro.gdn.triton_commit import write_path_index

        pending.path = torch.full((n + 1,), 7, dtype=torch.int32, device=device)
        write_path_index(pending.ancestors, torch.tensor([max(end, 0)], device=device), pending.path)
    return pending, committed.to(device)


def run_case(spec: dict, device: str) -> dict:
    """Run the fused kernels on one case; return errors against the float64 reference.

    ``pending`` cases verify with a delayed commit (make_pending): the references then start from the
    committed state, and ``committed`` is the error of the state the kernel wrote back. ``states``
    (default True) also runs tree_states_fused, and reports its error as ``states``.
    """
    from repro.gdn.triton_tree import (
        chain_gdn_fused,
        tree_gdn_blocked,
        tree_gdn_fused,
        tree_gdn_split,
        tree_states_fused,
    )

    (q, k, v, g, beta), s0, parents = make_inputs(spec, device)
    pending, s_ref = None, s0.to(F64)
    if spec.get("pending"):
        pending, s_ref = make_pending(spec, s0, device)
        knobs_p = {"pending": pending}
    else:
        knobs_p = {}
    n, hv, dv, dk = spec["n"], spec["HV"], spec["dv"], spec["dk"]
    tree = Tree(torch.zeros(n, dtype=torch.long), parents)
    anc = tree.ancestor_mask.to(device)
    mask = anc  # what the kernels get: with mask_stride a view of wider rows (a slot's aligned copy)
    if "mask_stride" in spec:
        mask = torch.zeros(n, spec["mask_stride"], dtype=torch.bool, device=device)[:, :n]
        mask.copy_(anc)
    scale = dk**-0.5
    tuning = ("block_rows", "block_v", "block_k", "num_warps", "inverse", "block_rows_v", "block_cols",
              "precompute_x0", "commit_block_v", "terms", "walk", "peel", "p_apart")  # fmt: skip
    knobs = {key: spec[key] for key in tuning if key in spec}
    nan = float("nan")
    o = torch.full((n, hv, dv), nan, dtype=q.dtype, device=device)
    delta = torch.full((n, hv, dv), nan, dtype=torch.float32, device=device)
    gcum = torch.full((n, hv), nan, dtype=torch.float32, device=device)
    prec = spec.get("precision", "ieee")
    out = (o, delta, gcum)
    if spec.get("blocked"):  # the three-launch kernels with T explicit (chain_api: the mask from indices)
        knobs.pop("inverse", None)
        ancestors = None if spec.get("chain_api") else mask
        o, f = tree_gdn_blocked(q, k, v, g, beta, s0, ancestors, scale, prec, out=out, **knobs, **knobs_p)
    elif spec.get("split"):  # the two-phase kernels (chain_api: the mask from indices)
        ancestors = None if spec.get("chain_api") else mask
        o, f = tree_gdn_split(
            q, k, v, g, beta, s0, ancestors, scale, prec, out=(o, delta, gcum), **knobs, **knobs_p
        )
        if knobs.get("p_apart") and not knobs_p:  # the same arithmetic in other programs: bitwise the same
            apart_off = {**knobs, "p_apart": False}
            o2, f2 = tree_gdn_split(q, k, v, g, beta, s0, ancestors, scale, prec, **apart_off)
            bitwise = bool(torch.equal(o, o2) and torch.equal(f.delta, f2.delta))
    elif spec.get("chain_api"):
        assert spec["kind"] == "chain"
        o, f = chain_gdn_fused(q, k, v, g, beta, s0, scale, prec, out=out, **knobs, **knobs_p)
    else:
        o, f = tree_gdn_fused(
            q, k, v, g, beta, s0, mask, scale, prec, out=(o, delta, gcum), **knobs, **knobs_p
        )
    states = None
    if spec.get("states", True):
        states = torch.full((n, hv, dv, dk), nan, dtype=torch.float32, device=device)
        states = tree_states_fused(k, v, g, beta, s0, parents.to(device), out=states)
    if device != "cpu":
        torch.cuda.synchronize()

    ro, rf = gdn.tree_gdn(*(x.to(F64) for x in (q, k, v, g, beta)), s_ref, anc, scale, keep_snapshots=True)
    paths = [[]] + [tree.path_to(i) for i in leaves(parents)[:4]] + [tree.path_to(0), tree.path_to(n - 1)]
    commit = max(rel(gdn.commit_closed_form(s0, f, p), gdn.commit_closed_form(s_ref, rf, p)) for p in paths)
    written = (o, f.delta, f.gate_cum) + (() if states is None else (states,))
    return {
        **({"p_apart_bitwise": bitwise} if spec.get("p_apart") and not knobs_p else {}),
        "committed": rel(s0, s_ref),
        "o": rel(o, ro),
        "delta": rel(f.delta, rf.delta),
        "gate_cum": rel(f.gate_cum, rf.gate_cum),
        "commit": commit,
        **({} if states is None else {"states": rel(states, rf.snapshots)}),
        "k_exact": bool(torch.equal(f.k, gdn.expand_key_heads(k.float(), hv))),
        "unwritten": int(sum((~torch.isfinite(x)).sum() for x in written)),
        "dtypes_ok": bool(
            o.dtype == q.dtype
            and f.delta.dtype == torch.float32
            and f.gate_cum.dtype == torch.float32
            and tuple(f.k.shape) == (n, hv, dk)
            and f.snapshots is None
        ),
    }


# ---------------------------------------------------------------------------------------------
# interpreter cases: small shapes (H=2, HV=4 grouped unless said), every tree kind, n in 1..64

_SMALL = {"H": 2, "HV": 4, "dk": 16, "dv": 16}
# the split form on three row blocks, two d_k chunks (with and without phase 1's state products)
_SPLIT_N40 = {**_SMALL, "n": 40, "kind": "mixed", "dk": 32, "block_k": 16, "block_rows": 16, "split": True}
# node 0 peeled with a pending commit from a path index (with and without p_apart below)
INTERP_PEEL_PENDING = {
    **_SMALL, "n": 33, "kind": "fan", "split": True, "peel": True, "pending": True, "pending_index": True,
}  # fmt: skip
INTERP_CASES = {
    "n1-single": {**_SMALL, "n": 1, "kind": "chain"},
    "n5-random": {**_SMALL, "n": 5, "kind": "random"},
    "n16-fan": {**_SMALL, "n": 16, "kind": "fan"},
    "n16-chain-api": {**_SMALL, "n": 16, "kind": "chain", "chain_api": True},
    # n = 2^k + 1: the gates over the strict ancestors (gate_columns' STRICT), on the chain API's mask too
    "n17-chain-api-strict-gates": {**_SMALL, "n": 17, "kind": "chain", "chain_api": True},
    # the mask as a view of wider rows (row stride != n: mask_rows reads it in place), every form
    "n20-random-mask-stride27": {**_SMALL, "n": 20, "kind": "random", "mask_stride": 27},
    "split-n40-mixed-br16-mask-stride45": {**_SPLIT_N40, "mask_stride": 45},
    "split-peel-n33-fan-mask-stride48": {
        **_SMALL,
        "n": 33,
        "kind": "fan",
        "split": True,
        "peel": True,
        "mask_stride": 48,
    },  # fmt: skip
    "blocked-n24-random-mask-stride31": {
        **_SMALL,
        "n": 24,
        "kind": "random",
        "blocked": True,
        "mask_stride": 31,
    },  # fmt: skip
    "n33-random-br16-dk32": {**_SMALL, "n": 33, "kind": "random", "dk": 32, "block_rows": 16, "block_k": 16},
    "n33-mixed-dv32-bv16": {**_SMALL, "n": 33, "kind": "mixed", "dv": 32, "block_v": 16},
    "n48-chain-tree-api-br16": {**_SMALL, "n": 48, "kind": "chain", "block_rows": 16},
    "n64-chain-api-br32": {**_SMALL, "n": 64, "kind": "chain", "chain_api": True, "block_rows": 32},
    "n64-random-dk32-dv16-br64": {
        **_SMALL,
        "n": 64,
        "kind": "random",
        "dk": 32,
        "block_k": 16,
        "block_rows": 64,
    },
    "n64-random-unbatched-base": {**_SMALL, "n": 64, "kind": "random", "inverse": 0},
    "n48-forest-br16-h1": {**_SMALL, "H": 1, "n": 48, "kind": "forest", "block_rows": 16},
    "n64-fan-br32": {**_SMALL, "n": 64, "kind": "fan", "block_rows": 32},
    # tf32's defaults (BR=64, batched 16-block base); the interpreter's dots are exact fp32 anyway
    "n60-random-tf32-defaults": {**_SMALL, "n": 60, "kind": "random", "precision": "tf32"},
    "n48-mixed-hard-beta2": {
        **_SMALL,
        "n": 48,
        "kind": "mixed",
        "hard": True,
        "beta_max": 2.0,
        "block_rows": 16,
    },
    "n40-random-bf16": {**_SMALL, "n": 40, "kind": "random", "dtype": "bfloat16", "block_rows": 16},
    "n24-mixed-fp16": {**_SMALL, "n": 24, "kind": "mixed", "dtype": "float16"},
    "n20-random-dk24-dv20": {**_SMALL, "n": 20, "kind": "random", "dk": 24, "dv": 20},
    # delayed commit: the previous step's path folded into S0 by the verification's own launch
    "pending-n20-random-dk32-bk16": {
        **_SMALL,
        "n": 20,
        "kind": "random",
        "dk": 32,
        "block_k": 16,
        "pending": True,
    },
    "pending-n20-chain-api-deep40": {
        **_SMALL,
        "n": 20,
        "kind": "chain",
        "chain_api": True,
        "pending": True,
        "pending_n": 40,
    },  # fmt: skip
    # two-phase kernels (tree_gdn_split): several row blocks, ragged n, narrow d_v tiles, bf16, chains
    "split-n20-random-br16-bv16": {
        **_SMALL,
        "n": 20,
        "kind": "random",
        "split": True,
        "block_rows": 16,
        "block_v": 16,
    },
    "split-n40-mixed-dk32-bk16-br32": {
        **_SMALL,
        "n": 40,
        "kind": "mixed",
        "dk": 32,
        "block_k": 16,
        "block_rows": 32,
        "split": True,
    },  # fmt: skip
    "split-n33-chain-api-dv32": {
        **_SMALL,
        "n": 33,
        "kind": "chain",
        "chain_api": True,
        "dv": 32,
        "split": True,
    },
    "split-n24-forest-bf16-h1": {
        **_SMALL,
        "H": 1,
        "n": 24,
        "kind": "forest",
        "dtype": "bfloat16",
        "split": True,
        "block_rows": 16,
    },  # fmt: skip
    "split-pending-n20-fan-tf32-cbv8": {  # the commit in phase 1: two S0 tiles per head
        **_SMALL,
        "n": 20,
        "kind": "fan",
        "split": True,
        "pending": True,
        "precision": "tf32",
        "commit_block_v": 8,  # tiles too narrow for the state products: phase 2 computes them
    },
    "split-noterms-n40-mixed-dk32-br16": {**_SPLIT_N40, "terms": False},  # products in phase 2's walk
    # phase 2's walk with Delta in registers (split_walk's default at two 64-row blocks; asked for below)
    "split-registers-n40-mixed-dk32-br16": {**_SPLIT_N40, "walk": "registers"},
    "split-registers-noterms-n20-random-bv16": {
        **_SMALL,
        "n": 20,
        "kind": "random",
        "split": True,
        "block_rows": 16,
        "block_v": 16,
        "terms": False,
        "walk": "registers",
    },
    "split-br64-n80-mixed": {**_SMALL, "n": 80, "kind": "mixed", "split": True, "block_rows": 64},
    # 64-row blocks (the split form's default for tf32 at 64 < n <= 256), the inverse with and without
    # its batched base
    "split-br64-n64-mixed-hard-beta2": {
        **_SMALL,
        "n": 64,
        "kind": "mixed",
        "hard": True,
        "beta_max": 2.0,
        "split": True,
        "block_rows": 64,
    },
    "n64-mixed-br64-inverse0": {**_SMALL, "n": 64, "kind": "mixed", "block_rows": 64, "inverse": 0},
    "split-br64-n100-random-inverse0": {
        **_SMALL,
        "n": 100,
        "kind": "random",
        "split": True,
        "block_rows": 64,
        "inverse": 0,
    },
    "split-n96-chain-api-tf32-defaults": {  # chain.py's path for few heads up to 128 tokens
        **_SMALL,
        "n": 96,
        "kind": "chain",
        "chain_api": True,
        "split": True,
        "precision": "tf32",
    },
    "split-n176-mixed-tf32-defaults": {  # three 64-row blocks walked in registers (NRP 4)
        **_SMALL,
        "n": 176,
        "kind": "mixed",
        "split": True,
        "precision": "tf32",
    },
    "split-n80-random-tf32-defaults": {  # 32-row blocks: the last 64-row block would hold 16 rows
        **_SMALL,
        "n": 80,
        "kind": "random",
        "split": True,
        "precision": "tf32",
    },
    "pending-n16-mixed-none": {**_SMALL, "n": 16, "kind": "mixed", "pending": True, "pending_node": -1},
    # the pending path read from a path index (the static decoder's stash); node -1 with a live index:
    # the node decides (nothing pending)
    "pending-index-n20-random-dk32-bk16": {
        **_SMALL,
        "n": 20,
        "kind": "random",
        "dk": 32,
        "block_k": 16,
        "pending": True,
        "pending_index": True,
    },
    "pending-index-n20-chain-api-deep40": {
        **_SMALL,
        "n": 20,
        "kind": "chain",
        "chain_api": True,
        "pending": True,
        "pending_n": 40,
        "pending_index": True,
    },
    "pending-index-n16-mixed-none": {
        **_SMALL,
        "n": 16,
        "kind": "mixed",
        "pending": True,
        "pending_node": -1,
        "pending_index": True,
    },
    "split-terms-pending-index-n40-mixed-dk32-br16": {  # phase 2's state products from phase 1
        **_SPLIT_N40,
        "terms": True,
        "pending": True,
        "pending_index": True,
        "commit_block_v": 16,
    },
    "split-terms-n80-chain": {  # two row chunks of the products (64 rows each)
        **_SMALL,
        "n": 80,
        "kind": "chain",
        "split": True,
        "terms": True,
    },
    # node 0 solved before the row blocks (peel): 2^k + 1 nodes on whole blocks of the other 2^k, both
    # walks, with and without the state products, the mask from indices, a forest (node 0 not every
    # node's ancestor), bf16, a pending commit
    "split-peel-n17-random": {**_SMALL, "n": 17, "kind": "random", "split": True, "peel": True},
    "split-peel-n33-mixed-dk32-bk16-br16": {**_SPLIT_N40, "n": 33, "peel": True},
    "split-peel-n33-chain-api": {
        **_SMALL,
        "n": 33,
        "kind": "chain",
        "chain_api": True,
        "split": True,
        "peel": True,
    },  # fmt: skip
    "split-peel-n33-forest-bf16-h1": {
        **_SMALL,
        "H": 1,
        "n": 33,
        "kind": "forest",
        "dtype": "bfloat16",
        "split": True,
        "peel": True,
    },  # fmt: skip
    "split-peel-noterms-registers-n33-br16": {
        **_SMALL,
        "n": 33,
        "kind": "random",
        "block_rows": 16,
        "split": True,
        "peel": True,
        "terms": False,
        "walk": "registers",
    },  # fmt: skip
    "split-peel-pending-index-n33-fan": INTERP_PEEL_PENDING,
    "split-peel-n65-random-tf32": {
        **_SMALL,
        "n": 65,
        "kind": "random",
        "split": True,
        "peel": True,
        "precision": "tf32",
    },  # fmt: skip
    # the diagonal blocks' P in programs of their own (p_apart): three row blocks and two d_k chunks, with
    # node 0 peeled and a pending commit, with the state products and the registers walk, bf16
    "split-p-apart-n40-mixed-dk32-bk16-br16": {**_SPLIT_N40, "p_apart": True},
    "split-p-apart-peel-pending-index-n33-fan": {**INTERP_PEEL_PENDING, "p_apart": True},
    "split-p-apart-terms-registers-n32-random-bf16": {
        **_SMALL,
        "n": 32,
        "kind": "random",
        "dtype": "bfloat16",
        "block_rows": 16,
        "split": True,
        "terms": True,
        "walk": "registers",
        "p_apart": True,
    },  # fmt: skip
    "split-pending-index-n20-fan": {
        **_SMALL,
        "n": 20,
        "kind": "fan",
        "split": True,
        "pending": True,
        "pending_index": True,
    },
    "pending-n24-fan-root-bf16": {
        **_SMALL,
        "n": 24,
        "kind": "fan",
        "dtype": "bfloat16",
        "pending": True,
        "pending_node": 0,
    },  # fmt: skip
    # T explicit (tree_gdn_blocked): several key / value row blocks, ragged n, BRV != BR, bf16, chains
    "blocked-n20-random-defaults": {**_SMALL, "n": 20, "kind": "random", "blocked": True},
    "blocked-n40-mixed-br16-brv32-bc16-bv16": {
        **_SMALL,
        "n": 40,
        "kind": "mixed",
        "dv": 32,
        "blocked": True,
        "block_rows": 16,
        "block_rows_v": 32,
        "block_cols": 16,
        "block_v": 16,
    },  # fmt: skip
    "blocked-n40-mixed-br16-brv32-bc16-bv16-x0-in-values": {
        **_SMALL,
        "n": 40,
        "kind": "mixed",
        "dv": 32,
        "blocked": True,
        "precompute_x0": False,
        "block_rows": 16,
        "block_rows_v": 32,
        "block_cols": 16,
        "block_v": 16,
    },  # fmt: skip
    "blocked-n48-chain-api-br16-brv16-bc32": {  # 3 row blocks, a ragged column panel
        **_SMALL,
        "n": 48,
        "kind": "chain",
        "chain_api": True,
        "blocked": True,
        "block_rows": 16,
        "block_rows_v": 16,
        "block_cols": 32,
    },  # fmt: skip
    "blocked-n48-mixed-hard-beta2-br16": {
        **_SMALL,
        "n": 48,
        "kind": "mixed",
        "hard": True,
        "beta_max": 2.0,
        "blocked": True,
        "block_rows": 16,
    },  # fmt: skip
    "blocked-n33-forest-bf16-h1-dk32-bk16": {
        **_SMALL,
        "H": 1,
        "n": 33,
        "kind": "forest",
        "dtype": "bfloat16",
        "dk": 32,
        "block_k": 16,
        "blocked": True,
        "block_rows": 16,
        "precision": "tf32",
    },  # fmt: skip
    "blocked-pending-index-n20-mixed": {  # the commit in phase 1, as in the split form
        **_SMALL,
        "n": 20,
        "kind": "mixed",
        "blocked": True,
        "pending": True,
        "pending_index": True,
    },  # fmt: skip
    "blocked-n24-fan-br32-brv16": {
        **_SMALL,
        "n": 24,
        "kind": "fan",
        "blocked": True,
        "block_rows": 32,
        "block_rows_v": 16,
    },  # fmt: skip
}
# float32 "ieee" must reach float64 to 1e-5; bf16/fp16 outputs o are rounded to the input dtype
# (bf16: 2^-9 relative per element, ~1e-3 in norm; fp16: 2^-11), everything else stays float32.
O_TOL = {"float32": 1e-5, "bfloat16": 5e-3, "float16": 1.5e-3}


# tree_states_fused (one program per value head and d_v tile walking the nodes in order: no row blocks, no
# tuning knobs, no pending commit) depends only on the inputs, not on the verification kernel, so it runs
# on a subset of the one-launch kernel's inputs that holds every tree kind (forest: H = 1), n = 1
# and ragged n up to 60, bf16 / fp16, ragged d_k / d_v (d_k 24, d_v 20; d_k 32, d_v 32) and hard inputs;
# the other cases (the same kinds of inputs again) skip it
STATES_CASES = (
    "n1-single", "n5-random", "n16-fan", "n16-chain-api", "n33-random-br16-dk32", "n33-mixed-dv32-bv16",
    "n48-forest-br16-h1", "n60-random-tf32-defaults", "n48-mixed-hard-beta2", "n40-random-bf16",
    "n24-mixed-fp16", "n20-random-dk24-dv20",
)  # fmt: skip
assert set(STATES_CASES) <= set(INTERP_CASES)


def _interp_specs(names: tuple[str, ...]) -> dict[str, dict]:
    return {
        name: {**INTERP_CASES[name], "seed": seed_of("interp", name), "states": name in STATES_CASES}
        for name in names
    }


def _interpreter_main() -> None:
    """Subprocess entry (TRITON_INTERPRET=1): every case (~1 min in all); JSON on the last line."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    results = {}
    for name, spec in _interp_specs(tuple(INTERP_CASES)).items():
        try:
            res = run_case(spec, "cpu")
        except Exception as exc:  # report, so that one broken case does not hide the others
            res = {"error": f"{type(exc).__name__}: {exc}"}
        results[name] = res
    print(json.dumps(results))


def _split_inputs(n: int, hv: int, dv: int, h: int = 2, dk: int = 16) -> tuple:
    """q, k, v, g, beta, S0 and a chain's ancestor mask on CPU (the CPU tests of the split form's host
    side: nothing is launched)."""
    q, k, v = torch.randn(n, h, dk), torch.randn(n, h, dk), torch.randn(n, hv, dv)
    g, beta, s0 = -torch.rand(n, hv), torch.rand(n, hv), torch.zeros(hv, dv, dk)
    return q, k, v, g, beta, s0, torch.ones(n, n, dtype=torch.bool).tril()


class _GridSpy:
    """Stands in for a Triton kernel: records each launch's grid, launches nothing."""

    def __init__(self) -> None:
        self.grids: list[tuple[int, ...]] = []
        self.args: list[tuple] = []
        self.kwargs: list[dict] = []

    def __getitem__(self, grid):  # noqa: ANN001, ANN204
        self.grids.append(grid)
        return lambda *args, **kwargs: (self.args.append(args), self.kwargs.append(kwargs))


@pytest.mark.parametrize(
    ("n", "block_rows", "walk", "regs", "nrp"),
    [(128, 64, None, True, 2), (65, 64, None, True, 2), (129, 64, None, True, 4), (256, 64, None, True, 4),
     (257, 64, None, False, 8), (128, 32, None, False, 4), (33, 32, None, False, 2),
     (96, 32, "registers", True, 4), (128, 64, "memory", False, 2)],
)  # fmt: skip
def test_split_walk_in_registers_for_up_to_four_64_row_blocks(
    monkeypatch, n, block_rows, walk, regs, nrp
) -> None:
    """Phase 2 keeps Delta in registers by default only at 64-row blocks, at most four of them (split_walk:
    measured faster there, slower at 32-row blocks and at eight); a given walk is kept; NRP is the number
    of row blocks rounded up to a power of two (three 32-row blocks at n = 96: 4)."""
    from repro.gdn import triton_tree as tt

    values = _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", _GridSpy())
    monkeypatch.setattr(tt, "_tree_values_kernel", values)
    tt.tree_gdn_split(*_split_inputs(n, 4, 16), 0.25, "tf32", block_rows=block_rows, walk=walk)
    (kw,) = values.kwargs
    assert (kw["REGS"], kw["NRP"], kw["BR"]) == (regs, nrp, block_rows)
    with pytest.raises(ValueError, match="walk must be one of"):
        tt.tree_gdn_split(*_split_inputs(n, 4, 16), 0.25, "tf32", block_rows=block_rows, walk="stack")


@pytest.mark.parametrize(
    ("n", "precision", "want"),
    [(128, "tf32", 64), (97, "tf32", 64), (96, "tf32", 32), (65, "tf32", 32), (64, "tf32", 32),
     (129, "tf32", 32), (160, "tf32", 32), (161, "tf32", 64), (224, "tf32", 64), (225, "tf32", 64),
     (256, "tf32", 64), (257, "tf32", 32), (128, "ieee", 32), (128, "tf32x3", 32), (20, "tf32", 32),
     (10, "ieee", 16)],
)  # fmt: skip
def test_split_rows_64_for_two_to_four_tf32_blocks(n: int, precision: str, want: int) -> None:
    """The split form's default row blocks: 64 rows for "tf32" where that makes two to four blocks (64 < n
    <= 256) unless the last would hold at most 32 rows at n <= 160 (the 65 / 129 slots), else 32 (16 below
    17 nodes); a given block_rows is kept."""
    from repro.gdn import triton_tree as tt

    assert tt.split_tiles(n, 8, 256, precision)[0] == want
    assert tt.split_tiles(n, 8, 256, precision, block_rows=16)[0] == 16


@pytest.mark.parametrize(
    ("block_rows", "inverse", "want"),
    [(16, None, 0), (32, None, 1), (64, None, 1), (64, 0, 0), (32, 0, 0), (16, 1, None), (64, 2, None)],
)
def test_inverse_scheme_by_block_rows(monkeypatch, block_rows: int, inverse, want) -> None:
    """The diagonal inverse (INV): the 16-row batched base from 32-row blocks; a given scheme is kept where
    it fits and refused where it does not; the split form launches both phases with 4 warps by default."""
    from repro.gdn import triton_tree as tt

    if want is None:
        with pytest.raises(ValueError, match="does not fit"):
            tt.inverse_scheme(block_rows, inverse)
        return
    assert tt.inverse_scheme(block_rows, inverse) == want
    keys, values = _GridSpy(), _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", keys)
    monkeypatch.setattr(tt, "_tree_values_kernel", values)
    q, k, v, g, beta, s0, _ = _split_inputs(block_rows * 2, 2, 16)
    tt.tree_gdn_split(q, k, v, g, beta, s0, None, 0.25, "tf32", chain=True, block_rows=block_rows,
                      inverse=inverse)  # fmt: skip
    assert keys.kwargs[0]["INV"] == want
    assert keys.kwargs[0]["num_warps"] == values.kwargs[0]["num_warps"] == 4


@pytest.mark.parametrize(
    ("n", "peel", "br", "nr", "np_", "regs"),
    [(129, True, 64, 2, 128, True), (129, False, 32, 5, 160, False), (65, True, 32, 2, 64, False),
     (33, True, 32, 1, 32, False), (17, True, 16, 1, 16, False), (2, True, 16, 1, 16, False)],
)  # fmt: skip
def test_peeled_node_0_leaves_whole_row_blocks(monkeypatch, n, peel, br, nr, np_, regs) -> None:
    """With node 0 peeled, the row blocks, their tiles and walk are those of the other n - 1 rows (129
    nodes: two 64-row blocks in registers instead of five 32-row ones), the scratch holds those rows alone
    (aligned tiles), node 0's columns of A and P go to a [2, HV, n] buffer both phases are given, written
    by one more phase-1 program per row block."""
    from repro.gdn import triton_tree as tt

    keys, values = _GridSpy(), _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", keys)
    monkeypatch.setattr(tt, "_tree_values_kernel", values)
    tt.tree_gdn_split(*_split_inputs(n, 4, 16), 0.25, "tf32", peel=peel, terms=False, p_apart=False)
    (kw,), (vw,) = keys.kwargs, values.kwargs
    assert keys.grids == [(4, nr * nr + nr * peel)] and (kw["BR"], kw["PEEL"]) == (br, int(peel))
    assert kw["NPG"] == max(16, 1 << (n - 2).bit_length())  # n = 2^k + 1: the last node's strict ancestors
    assert kw["STRICT"] == (n in (17, 33, 65, 129))
    assert (vw["BR"], vw["NR"], vw["REGS"], vw["PEEL"]) == (br, nr, regs, int(peel))
    (ka,), (va,) = keys.args, values.args
    a_blocks, c0 = ka[5], ka[7]
    assert a_blocks.shape == (4, np_, np_) and va[5] is a_blocks and va[7] is c0
    assert (c0.shape == (2, 4, n)) if peel else (c0 is a_blocks)


@pytest.mark.parametrize(
    ("n", "npg", "strict"),
    [(129, 128, True), (128, 128, False), (65, 64, True), (64, 64, False), (17, 16, True), (16, 16, False),
     (2, 16, False), (100, 128, False)],
)  # fmt: skip
def test_gate_load_narrows_only_at_a_power_of_two_plus_one(n: int, npg: int, strict: bool) -> None:
    """The gates' load is a power of two >= n columns, or >= n - 1 (each row's own g apart) where that is
    narrower: the engine's slots of 2^k + 1 nodes load 2^k columns; elsewhere the full form (registers)."""
    from repro.gdn import triton_tree as tt

    assert tt.gate_columns(n) == {"NPG": npg, "STRICT": strict}


def test_a_tree_of_one_node_is_not_peeled() -> None:
    """The split form's node 0 peel needs a row block after it."""
    from repro.gdn import triton_tree as tt

    with pytest.raises(ValueError, match="peel needs at least two nodes"):
        tt.tree_gdn_split(*_split_inputs(1, 4, 16), 0.25, "tf32", peel=True)


@pytest.mark.parametrize(("n", "stride", "copied", "want"), [
    (129, 129, True, 144), (97, 97, True, 112), (65, 65, False, 65), (64, 64, False, 64),
    (128, 128, False, 128), (33, 33, False, 33), (129, 144, False, 144), (129, 150, True, 144),
    (33, 40, False, 40),
])  # fmt: skip
def test_mask_rows_aligned_where_an_unaligned_stride_costs_registers(n, stride, copied, want) -> None:
    """mask_rows: the kernels read a mask's rows at its row stride (a view of wider rows in place); above 65
    nodes (gate loads of >= 128 columns) a stride that is no multiple of 16 bytes (ptxas: 229-255 registers
    and spills at 129 nodes, 153-171 aligned) is copied into aligned rows, the same flags; aligned_mask gives
    the engine's slots that buffer where a contiguous mask would be copied."""
    from repro.gdn import triton_tree as tt

    anc = torch.rand(n, n) < 0.5
    given = torch.zeros(n, stride, dtype=torch.bool)[:, :n]
    given.copy_(anc)
    rows = tt.mask_rows(given)
    assert rows.dtype == torch.uint8 and rows.stride() == (want, 1) and torch.equal(rows.bool(), anc)
    assert (rows.data_ptr() != given.data_ptr()) == copied
    slot_rows = tt.aligned_mask(n, torch.device("cpu"))
    assert (slot_rows is not None) == (n > 65 and n % 16 != 0)
    if slot_rows is not None:
        assert slot_rows.dtype == torch.bool and slot_rows.stride() == (want, 1) and not slot_rows.any()
    assert torch.equal(tt.mask_rows(anc.t()).bool(), anc.t())  # columns not contiguous: made so


def test_split_state_products_need_tiles_of_16_rows() -> None:
    """tree_gdn_split's state products from phase 1 (``terms``) run tensor-core dots on the commit tiles:
    asked for with tiles under 16 rows it refuses before any launch; by default it then leaves them to
    phase 2 (the interpreter case split-pending-n20-fan-tf32-cbv8 runs that)."""
    from repro.gdn.triton_tree import tree_gdn_split

    with pytest.raises(ValueError, match="terms needs commit tiles of >= 16 rows"):
        tree_gdn_split(*_split_inputs(8, 4, 16), 0.25, terms=True, commit_block_v=8)


@pytest.mark.parametrize("key_programs", [True, False])
def test_phase_one_grid_holds_commit_and_product_programs_first(monkeypatch, key_programs: bool) -> None:
    """Phase 1's launch: HV x (commit/product programs + NR^2 key programs); without its key programs
    (timing the others' share, scripts/gpu/tree-phases.py) only the first kind."""
    from repro.gdn import triton_tree as tt

    spy = _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", spy)
    hv = 4
    c = tt._TreeCall.of(*_split_inputs(40, hv, 64), "tf32", False, None, None)
    qs = torch.empty_like(c.delta)
    tt._key_blocks(c, 16, 16, "tf32", 0.25, 4, False, 32, qs, key_programs=key_programs)
    assert spy.grids == [(hv, 2 + (9 if key_programs else 0))]  # d_v 64 / 32-row tiles; NR = 3 row blocks


@pytest.mark.parametrize("keys_only", [False, True])
def test_split_keys_only_launches_phase_one_alone(monkeypatch, keys_only: bool) -> None:
    """``keys_only`` (`repro bench kernels`' phase1_us_graph): phase 1's launch as in the whole form, and
    no phase 2."""
    from repro.gdn import triton_tree as tt

    keys, values = _GridSpy(), _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", keys)
    monkeypatch.setattr(tt, "_tree_values_kernel", values)
    q, k, v, g, beta, s0, mask = _split_inputs(40, 4, 64)
    tt.tree_gdn_split(q, k, v, g, beta, s0, mask, 0.25, "tf32", keys_only=keys_only)
    assert len(keys.grids) == 1 and len(values.grids) == (0 if keys_only else 1)


@pytest.mark.parametrize(("node0", "extra"), [(True, 3), (False, 0)])
def test_peeled_phase_one_adds_a_node_0_program_per_row_block(monkeypatch, node0: bool, extra: int) -> None:
    """Peeled, phase 1 has one more program per row block (node 0's column of its rows) after the NR^2 key
    programs; without them (timing their share, scripts/gpu/tree-phases.py) the grid is the unpeeled one's."""
    from repro.gdn import triton_tree as tt

    spy = _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", spy)
    c = tt._TreeCall.of(*_split_inputs(41, 4, 64), "tf32", False, None, None)
    c0, qs = torch.empty(2, 4, 41), torch.empty_like(c.delta)
    tt._key_blocks(c, 16, 16, "tf32", 0.25, 4, False, 32, qs, c0=c0, node0_programs=node0)
    assert spy.grids == [(4, 2 + 9 + extra)]  # 40 rows after node 0: NR = 3 blocks of 16


@pytest.mark.parametrize(
    ("hv", "block_rows", "row_blocks", "want"),
    [(8, 32, 2, True), (4, 32, 1, False), (16, 32, 2, True), (48, 32, 2, False), (8, 64, 2, False),
     (8, 32, 3, False), (8, 16, 2, False)],
)  # fmt: skip
def test_p_apart_by_default_on_two_32_row_blocks_of_few_heads(hv, block_rows, row_blocks, want) -> None:
    """split_p_apart: on where it measured faster (<= 16 value heads, two 32-row blocks), else off."""
    from repro.gdn import triton_tree as tt

    assert tt.split_p_apart(hv, block_rows, row_blocks) is want


@pytest.mark.parametrize(("n", "hv", "want"), [(64, 4, 1), (64, 48, 0), (96, 4, 0)])
def test_split_form_takes_p_apart_by_its_rule(monkeypatch, n: int, hv: int, want: int) -> None:
    """tree_gdn_split without p_apart launches phase 1 as split_p_apart says (n = 64: two 32-row blocks)."""
    from repro.gdn import triton_tree as tt

    keys, values = _GridSpy(), _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", keys)
    monkeypatch.setattr(tt, "_tree_values_kernel", values)
    tt.tree_gdn_split(*_split_inputs(n, hv, 16), 0.25, "tf32", terms=False)
    nr = -(-n // 32)
    assert keys.kwargs[-1]["P_APART"] == want and keys.grids == [(hv, nr * nr + nr * want)]


@pytest.mark.parametrize(("peel", "p_apart", "extra"), [(False, True, 3), (True, True, 6), (True, False, 3)])
def test_phase_one_adds_a_p_program_per_diagonal_block(monkeypatch, peel: bool, p_apart: bool, extra) -> None:
    """With p_apart, phase 1 has one more program per row block (its diagonal P) after the key programs and
    node 0's; it refuses to run without node 0's programs when peeled (its programs' ids follow theirs)."""
    from repro.gdn import triton_tree as tt

    spy = _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", spy)
    c = tt._TreeCall.of(*_split_inputs(41 if peel else 40, 4, 64), "tf32", False, None, None)
    c0 = torch.empty(2, 4, 41) if peel else None
    tt._key_blocks(c, 16, 16, "tf32", 0.25, 4, False, 32, torch.empty_like(c.delta), c0=c0, p_apart=p_apart)
    assert spy.grids == [(4, 2 + 9 + extra)] and spy.kwargs[-1]["P_APART"] == int(p_apart)
    if peel:
        with pytest.raises(ValueError, match="node0_programs"):
            tt._key_blocks(c, 16, 16, "tf32", 0.25, 4, False, 32, c0=c0, node0_programs=False, p_apart=True)


@pytest.mark.parametrize(
    ("n", "pending", "given", "want"),
    [(65, True, None, 16), (64, True, None, 32), (65, False, None, 32), (65, True, 32, 32)],
)
def test_split_commit_tiles_narrow_above_64_nodes(monkeypatch, n: int, pending: bool, given, want) -> None:
    """With a pending commit and the state products, trees of more than 64 nodes get 16-row commit tiles
    (measured faster there, slower at 64: commit_tiles' docstring); a given commit_block_v is kept. Read
    from phase 1's grid: d_v / rows commit-and-product programs per head before the key programs."""
    from repro.gdn import triton_tree as tt
    from repro.gdn.reference import PendingCommit

    keys, values = _GridSpy(), _GridSpy()
    monkeypatch.setattr(tt, "_tree_keys_kernel", keys)
    monkeypatch.setattr(tt, "_tree_values_kernel", values)
    hv, dv, dk = 4, 64, 16
    inputs = _split_inputs(n, hv, dv, dk=dk)
    anc = inputs[-1]
    pend = PendingCommit(
        torch.zeros(n, hv, dv), torch.zeros(n, hv, dk), torch.zeros(n, hv), anc, torch.tensor([n - 1])
    )
    tt.tree_gdn_split(
        *inputs, 0.25, "tf32", pending=pend if pending else None, commit_block_v=given, p_apart=False
    )
    nr = -(-n // tt.split_tiles(n, hv, dv, "tf32")[0])  # row blocks
    assert keys.grids == [(hv, dv // want + nr * nr)] and len(values.grids) == 1


@pytest.fixture(scope="module")
def interp_results() -> dict[str, dict]:
    return run_in_interpreter(__file__)


@needs_triton
@pytest.mark.parametrize("name", list(INTERP_CASES))
def test_interpreter_case(interp_results: dict, name: str) -> None:
    res = interp_results[name]
    assert "error" not in res, res.get("error")
    assert ("states" in res) == (name in STATES_CASES), res
    dtype = INTERP_CASES[name].get("dtype", "float32")
    assert res["unwritten"] == 0, f"{res['unwritten']} output elements left unwritten (NaN poison)"
    assert res["dtypes_ok"]
    assert res["k_exact"], "TreeFactors.k is not the float32 keys expanded to value heads"
    assert res["o"] <= O_TOL[dtype], res
    if INTERP_CASES[name].get("p_apart") and not INTERP_CASES[name].get("pending"):
        assert res["p_apart_bitwise"], "p_apart changed the results: the same dots in other programs"
    for key in ("delta", "gate_cum", "commit", "states", "committed"):
        assert res.get(key, 0.0) <= 1e-5, (key, res)


# ---------------------------------------------------------------------------------------------
# GPU: the paper shapes, fresh inputs every run


def _gpu_ok() -> bool:
    if not (HAS_TRITON and torch.cuda.is_available()):
        return False
    import triton

    return not triton.knobs.runtime.interpret


WEAVER = {"H": 16, "HV": 48, "dk": 128, "dv": 128}
SPECLA = {"H": 8, "HV": 8, "dk": 256, "dv": 256}
# (o tolerance, delta/commit tolerance). Measured on the H200: ieee and tf32x3 ~1e-7; tf32 delta
# 4-6e-4 and o 8e-4 (a 10-bit mantissa per dot operand, through the triangular solve); bf16 inputs:
# o itself is rounded to bf16, 1.7e-3 in norm, whatever the precision. About 10x margin each.
GPU_TOL = {
    ("float32", "ieee"): (1e-5, 1e-5),
    ("float32", "tf32x3"): (1e-5, 1e-5),
    ("float32", "tf32"): (5e-3, 5e-3),
    ("bfloat16", "tf32"): (1e-2, 5e-3),
    ("bfloat16", "ieee"): (5e-3, 1e-5),
}
GPU_SHAPES = (
    [("weaver", n, kind) for n in (16, 32, 64, 128, 256) for kind in ("random", "mixed")]
    + [("weaver", 128, "chain"), ("weaver", 129, "mixed")]
    + [("specla", n, "chain") for n in (16, 64, 128)]
    + [("specla", n, kind) for n in (31, 128) for kind in ("random", "mixed")]
    + [("specla", 256, "random")]  # per-node states at n = 256 gave NaN on an intermediate kernel version
)
# every shape on the production path (bf16 inputs, tf32) and the exactness path (fp32, ieee);
# the other precision pairs on a few shapes
GPU_CASES = [(*shape, "bfloat16", "tf32") for shape in GPU_SHAPES] + [
    (*shape, "float32", "ieee") for shape in GPU_SHAPES
]
GPU_CASES += [
    (*shape, dtype, prec)
    for shape in (("weaver", 64, "mixed"), ("weaver", 256, "random"), ("specla", 128, "chain"))
    for dtype, prec in (("float32", "tf32x3"), ("float32", "tf32"), ("bfloat16", "ieee"))
]
GPU_QUICK = {
    ("weaver", 64, "mixed", "bfloat16", "tf32"),
    ("weaver", 256, "random", "bfloat16", "tf32"),
    ("weaver", 128, "chain", "bfloat16", "tf32"),  # the chain API
    ("weaver", 129, "mixed", "float32", "ieee"),  # a ragged last row block
    ("weaver", 64, "mixed", "float32", "ieee"),
    ("weaver", 64, "mixed", "float32", "tf32x3"),
    ("weaver", 64, "mixed", "float32", "tf32"),
    ("weaver", 64, "mixed", "bfloat16", "ieee"),
    ("specla", 31, "random", "bfloat16", "tf32"),
    ("specla", 128, "mixed", "bfloat16", "tf32"),
    ("specla", 128, "chain", "float32", "ieee"),
    ("specla", 256, "random", "bfloat16", "tf32"),
}
assert set(GPU_CASES) >= GPU_QUICK


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


@pytest.mark.parametrize(
    ("shape", "n", "kind", "dtype", "precision"),
    [pytest.param(*case, marks=() if case in GPU_QUICK else gpu_full_only) for case in GPU_CASES],
)
@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
def test_gpu_tree(shape: str, n: int, kind: str, dtype: str, precision: str) -> None:
    base = WEAVER if shape == "weaver" else SPECLA
    spec = {**base, "n": n, "kind": kind, "dtype": dtype, "precision": precision, "seed": _fresh_seed()}
    spec["chain_api"] = kind == "chain" and n % 2 == 0
    res = run_case(spec, "cuda")
    o_tol, d_tol = GPU_TOL[(dtype, precision)]
    msg = f"seed={spec['seed']} {res}"
    assert res["unwritten"] == 0, msg
    assert res["dtypes_ok"], msg
    assert res["k_exact"], msg
    assert res["o"] <= o_tol, msg
    assert res["delta"] <= d_tol, msg
    assert res["gate_cum"] <= 1e-5, msg
    assert res["commit"] <= d_tol, msg
    assert res["states"] <= 1e-5, msg
    assert res["committed"] <= 1e-5, msg


@pytest.mark.parametrize(
    ("shape", "n", "kind", "dtype", "precision", "pending", "terms"),
    [("specla", 128, "mixed", "bfloat16", "tf32", False, True),
     ("specla", 64, "chain", "float32", "ieee", True, True),
     ("specla", 64, "mixed", "bfloat16", "tf32", 16, True),  # 16-row commit tiles: one d_k chunk
     ("specla", 129, "random", "float32", "ieee", False, False),
     ("weaver", 128, "random", "bfloat16", "tf32", False, True),
     ("weaver", 128, "random", "bfloat16", "tf32", True, False),
     ("weaver", 64, "mixed", "float32", "ieee", True, True),
     ("specla", 256, "random", "bfloat16", "tf32", False, True),
     ("specla", 128, "mixed", "bfloat16", "tf32", True, False),
     ("specla", 129, "random", "float32", "ieee", 16, True),
     ("weaver", 256, "random", "bfloat16", "tf32", False, False),
     ("specla", 65, "random", "bfloat16", "tf32", False, True),  # 2^k + 1 slots: 32-row blocks
     ("weaver", 129, "mixed", "bfloat16", "tf32", True, True)],
)  # fmt: skip
@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
def test_gpu_tree_split(
    shape: str, n: int, kind: str, dtype: str, precision: str, pending: bool | int, terms: bool
) -> None:
    """The two-phase kernels (tree_gdn_split) at the paper shapes, with and without a delayed commit (an
    int: its commit_block_v), with phase 2's state products from phase 1 (``terms``) or in its walk."""
    base = WEAVER if shape == "weaver" else SPECLA
    spec = {**base, "n": n, "kind": kind, "dtype": dtype, "precision": precision, "seed": _fresh_seed()}
    spec.update(split=True, pending=bool(pending), pending_n=64, terms=terms)
    if not isinstance(pending, bool):
        spec["commit_block_v"] = pending
    res = run_case(spec, "cuda")
    o_tol, d_tol = GPU_TOL[(dtype, precision)]
    msg = f"seed={spec['seed']} {res}"
    assert res["unwritten"] == 0 and res["dtypes_ok"] and res["k_exact"], msg
    assert res["o"] <= o_tol and res["delta"] <= d_tol and res["commit"] <= d_tol, msg
    assert res["gate_cum"] <= 1e-5 and res["states"] <= 1e-5 and res["committed"] <= 1e-5, msg


@pytest.mark.parametrize(
    ("shape", "n", "kind", "dtype", "precision", "knobs"),
    [("specla", 128, "mixed", "bfloat16", "tf32", {}), ("weaver", 128, "random", "bfloat16", "tf32", {}),
     ("specla", 64, "chain", "float32", "ieee", {"pending": True, "pending_n": 64}),
     ("specla", 129, "random", "bfloat16", "tf32", {"peel": True}),
     ("weaver", 256, "mixed", "bfloat16", "tf32", {"terms": False})],
)  # fmt: skip
@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
def test_gpu_tree_split_p_apart(shape: str, n: int, kind: str, dtype: str, precision: str, knobs) -> None:
    """The split form with the diagonal blocks' P in programs of their own (p_apart) at the paper shapes,
    with a pending commit, node 0 peeled, phase 2 computing the state products, against float64."""
    _check_gpu_case(shape, n, kind, dtype, precision, split=True, p_apart=True, chain_api=kind == "chain",
                    **knobs)  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "n", "kind", "dtype", "precision", "pending"),
    [("weaver", 65, "mixed", "bfloat16", "tf32", False), ("weaver", 129, "random", "float32", "ieee", False),
     ("weaver", 129, "mixed", "bfloat16", "tf32", True), ("specla", 33, "random", "bfloat16", "tf32", True),
     ("specla", 65, "chain", "float32", "ieee", False), ("specla", 129, "mixed", "bfloat16", "tf32", False),
     ("specla", 257, "random", "bfloat16", "tf32", False)],
)  # fmt: skip
@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
def test_gpu_tree_split_with_node_0_peeled(
    shape: str, n: int, kind: str, dtype: str, precision: str, pending: bool
) -> None:
    """The split form with node 0 solved before its row blocks (peel) at the engine's 2^k + 1 slots and the
    paper shapes, against float64."""
    _check_gpu_case(shape, n, kind, dtype, precision, split=True, peel=True, chain_api=kind == "chain",
                    pending=pending, pending_n=64)  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "n", "kind", "dtype", "precision"),
    [("specla", 64, "mixed", "bfloat16", "tf32"), ("specla", 64, "chain", "float32", "ieee"),
     ("weaver", 64, "random", "float32", "ieee"), ("weaver", 128, "mixed", "bfloat16", "tf32")],
)  # fmt: skip
@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
def test_gpu_tree_with_pending_commit(shape: str, n: int, kind: str, dtype: str, precision: str) -> None:
    base = WEAVER if shape == "weaver" else SPECLA
    spec = {**base, "n": n, "kind": kind, "dtype": dtype, "precision": precision, "seed": _fresh_seed()}
    for index in (False, True):  # the pending path from the mask, then from a path index
        spec.update(pending=True, pending_n=64, pending_index=index)
        res = run_case(spec, "cuda")
        o_tol, d_tol = GPU_TOL[(dtype, precision)]
        msg = f"seed={spec['seed']} index={index} {res}"
        assert res["unwritten"] == 0, msg
        assert res["committed"] <= 1e-5, msg  # the commit's dots are "ieee" whatever the verification's
        assert res["o"] <= o_tol and res["delta"] <= d_tol and res["states"] <= 1e-5, msg


@pytest.mark.parametrize(
    ("shape", "n", "kind", "dtype", "precision", "block_rows", "walk"),
    [("specla", 128, "mixed", "bfloat16", "tf32", 64, None),  # split_walk: registers
     ("weaver", 128, "random", "bfloat16", "tf32", 64, None),
     ("specla", 65, "random", "float32", "ieee", 64, None),
     ("weaver", 96, "mixed", "float32", "ieee", 32, "registers"),  # three blocks: NRP = 4
     ("specla", 256, "random", "bfloat16", "tf32", 32, "registers"),
     ("weaver", 256, "mixed", "bfloat16", "tf32", 64, None),
     ("specla", 192, "random", "bfloat16", "tf32", 64, None)],
)  # fmt: skip
@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
def test_gpu_tree_split_walk_in_registers(
    shape: str, n: int, kind: str, dtype: str, precision: str, block_rows: int, walk: str | None
) -> None:
    """The split form's phase 2 with Delta in registers (by default at two 64-row blocks, or asked for)
    at the paper shapes, against float64."""
    _check_gpu_case(shape, n, kind, dtype, precision, split=True, block_rows=block_rows,
                    **({"walk": walk} if walk else {}))  # fmt: skip


def _check_gpu_case(shape: str, n: int, kind: str, dtype: str, precision: str, **knobs: object) -> None:
    """Run one paper-shape case (fresh seed, ``knobs`` added to its spec) and check it within GPU_TOL."""
    base = WEAVER if shape == "weaver" else SPECLA
    spec = {**base, "n": n, "kind": kind, "dtype": dtype, "precision": precision, "seed": _fresh_seed()}
    res = run_case({**spec, **knobs}, "cuda")
    o_tol, d_tol = GPU_TOL[(dtype, precision)]
    msg = f"seed={spec['seed']} {res}"
    assert res["unwritten"] == 0 and res["dtypes_ok"] and res["k_exact"], msg
    assert res["o"] <= o_tol and res["delta"] <= d_tol and res["commit"] <= d_tol, msg
    assert res["gate_cum"] <= 1e-5 and res["states"] <= 1e-5 and res["committed"] <= 1e-5, msg


@pytest.mark.parametrize(
    ("shape", "n", "kind", "dtype", "precision"),
    [("weaver", 128, "mixed", "bfloat16", "tf32"), ("weaver", 129, "mixed", "float32", "ieee"),
     ("weaver", 256, "random", "bfloat16", "tf32"), ("weaver", 64, "mixed", "float32", "tf32x3"),
     ("specla", 128, "random", "bfloat16", "tf32"), ("specla", 256, "random", "bfloat16", "tf32"),
     ("specla", 64, "chain", "float32", "ieee"), ("specla", 31, "random", "bfloat16", "ieee")],
)  # fmt: skip
@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
def test_gpu_tree_blocked(shape: str, n: int, kind: str, dtype: str, precision: str) -> None:
    """The blocked kernels (tree_gdn_blocked, T explicit) at the paper shapes, default tiles."""
    _check_gpu_case(shape, n, kind, dtype, precision, blocked=True, chain_api=kind == "chain")


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
