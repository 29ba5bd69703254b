"""Fused Triton commits (repro.gdn.triton_commit) against the pure-torch reference.

- interpreter (CPU, TRITON_INTERPRET=1, one subprocess): closed-form state commit vs
  reference.commit_closed_form (itself pinned to replay in float64 by tests/test_gdn_tree.py) and the
  conv-history commit vs reference.conv_history_after, on random trees, every kind of path end (the
  root, a leaf deeper than the conv window, a node whose window reaches into the history), shapes
  whose d_v / d_k / n are not multiples of the tiles;
  the path-only commit (commit_path_fused, conv commit in the same launch) vs the same references in
  float64 and float32, every path end, node < 0 (nothing accepted) a no-op; reference.apply_pending
  (the capturable torch form) vs commit_closed_form;
- gpu: the same at both paper layer shapes, float32 factors from the fused tree kernel.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
from conftest import run_in_interpreter

from repro.gdn import reference as gdn
from repro.tree import Tree

CASES = [  # (name, HV, d_v, d_k, n, tree kind, seed)
    ("small", 2, 16, 16, 9, "mixed", 0),
    ("ragged", 3, 24, 40, 21, "random", 1),  # d_v, d_k, n off the tiles
    ("chain", 2, 32, 16, 17, "chain", 2),
]


VARIANTS = {  # commit_path_fused settings beside the default (name: keyword arguments)
    "old": {"block_v": 32, "block_k": 64, "block_m": 16, "num_warps": 4, "peel": False},  # the earlier kernel
    "products": {"block_v": 8, "block_k": 64, "block_m": 8, "dot": False},  # broadcast products, small tiles
    "wide": {"block_v": 64, "block_k": 128, "block_m": 32, "num_warps": 2},
}


def _random_tree(n: int, kind: str, seed: int) -> Tree:
    from repro.bench.shapes import random_parents

    gen = torch.Generator().manual_seed(seed)
    return Tree(torch.zeros(n, dtype=torch.long), random_parents(n, kind, gen))


def _ends(tree: Tree) -> list[int]:
    """Path ends worth committing: the root, the deepest node, a shallow non-root node."""
    depth = tree.depth.tolist()
    deepest = max(range(tree.size), key=lambda i: depth[i])
    shallow = next((i for i in range(tree.size) if depth[i] == 2), deepest)
    return sorted({0, deepest, shallow})


def closed_form_errors(hv: int, dv: int, dk: int, n: int, kind: str, seed: int, device: str) -> list[float]:
    """Max relative state error of the fused closed form vs the reference, one per path end."""
    from repro.gdn.triton_commit import commit_closed_form_fused

    gen = torch.Generator().manual_seed(seed)
    tree = _random_tree(n, kind, seed)
    f = _factors(hv, dv, dk, n, gen)
    state = torch.randn(hv, dv, dk, generator=gen, dtype=torch.float64)
    errs = []
    for end in _ends(tree):
        path = tree.path_to(end)
        ref = gdn.commit_closed_form(state, f, path)
        got = state.float().to(device)
        commit_closed_form_fused(
            got, f.delta.float().to(device), f.k.float().to(device), f.gate_cum.float().to(device),
            tree.ancestor_mask.to(device), torch.tensor([end], device=device),
        )  # fmt: skip
        errs.append(float((got.cpu().double() - ref).norm() / ref.norm()))
    return errs


def _factors(hv: int, dv: int, dk: int, n: int, gen: torch.Generator) -> gdn.TreeFactors:
    f64 = torch.float64
    return gdn.TreeFactors(
        delta=torch.randn(n, hv, dv, generator=gen, dtype=f64),
        gate_cum=-torch.rand(n, hv, generator=gen, dtype=f64) * 3,
        k=torch.randn(n, hv, dk, generator=gen, dtype=f64),
        v=torch.empty(0),
        g=torch.empty(0),
        beta=torch.empty(0),
    )


def path_commit_errors(
    hv: int,
    dv: int,
    dk: int,
    n: int,
    kind: str,
    seed: int,
    device: str,
    dtype: str = "float64",
    width: int = 4,
    ends: list[int] | None = None,
    **tiles: object,
) -> dict[str, list[float]]:
    """commit_path_fused (with the tuning knobs ``tiles``) vs commit_closed_form (state: relative error)
    and conv_history_after (conv: mismatching elements), every path end plus node -1 (must leave both
    unchanged); ``ends``: those path ends only (-1 first)."""
    from repro.gdn.triton_commit import commit_path_fused

    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)
    tree = _random_tree(n, kind, seed)
    f = _factors(hv, dv, dk, n, gen)
    state = torch.randn(hv, dv, dk, generator=gen, dtype=torch.float64)
    channels = 2 * dk + dv
    history = torch.randn(width - 1, channels, generator=gen)
    inputs = _column_slice(n, channels, gen)
    index = gdn.conv_gather_index(tree.parents, width).to(device)
    anc = tree.ancestor_mask.to(device)
    ops = [x.to(device=device, dtype=dt) for x in (f.delta, f.k, f.gate_cum)]
    out: dict[str, list[float]] = {"state": [], "conv": []}
    for end in ends or [-1, *range(n)]:
        path = tree.path_to(end) if end >= 0 else []
        ref = gdn.commit_closed_form(state, f, path)
        got = state.to(device=device, dtype=dt)
        hist = history.clone().to(device)
        commit_path_fused(
            got, *ops, anc, torch.tensor([end], device=device), conv=(hist, inputs.to(device), index), **tiles
        )
        out["state"].append(float((got.cpu().double() - ref).norm() / ref.norm()))
        out["conv"].append(int((hist.cpu() != gdn.conv_history_after(history, inputs, path)).sum()))
    return out


def _column_slice(n: int, channels: int, gen: torch.Generator) -> torch.Tensor:
    """Conv inputs [n, channels] as the verify leaves them: a column slice of a wider projection output
    (rows further apart than ``channels``; the kernels read them at that stride, no copy)."""
    return torch.randn(n, channels + 7, generator=gen)[:, 3 : 3 + channels]


def conv_commit_mismatches(width: int, channels: int, n: int, kind: str, seed: int, device: str) -> int:
    """Elements where the fused conv commit differs from reference.conv_history_after (all path ends)."""
    from repro.gdn.triton_commit import commit_conv_fused

    gen = torch.Generator().manual_seed(seed)
    tree = _random_tree(n, kind, seed)
    history = torch.randn(width - 1, channels, generator=gen)
    inputs = _column_slice(n, channels, gen)
    index = gdn.conv_gather_index(tree.parents, width)
    bad = 0
    for end in range(n):
        ref = gdn.conv_history_after(history, inputs, tree.path_to(end))
        got = history.clone().to(device)
        commit_conv_fused(got, inputs.to(device), index.to(device), torch.tensor([end], device=device))
        bad += int((got.cpu() != ref).sum())
    return bad


def _interpreter_main() -> None:
    """Subprocess entry (TRITON_INTERPRET=1): every case's errors as JSON on the last line."""
    torch.set_num_threads(1)
    out = {name: closed_form_errors(*case, device="cpu") for name, *case in CASES}
    out["conv"] = [
        conv_commit_mismatches(4, 40, 12, "mixed", 3, "cpu"),
        conv_commit_mismatches(2, 8, 5, "chain", 4, "cpu"),
    ]
    for name, hv, dv, dk, n, kind, seed in CASES:
        for dtype in ("float64", "float32"):
            out[f"path-{name}-{dtype}"] = path_commit_errors(hv, dv, dk, n, kind, seed, "cpu", dtype)
    out["path-deep"] = path_commit_errors(2, 16, 16, 40, "chain", 8, "cpu", "float64", width=2)  # 3 blocks
    for name, tiles in VARIANTS.items():  # the other settings: a tree off the tiles, a deep chain
        tree = _random_tree(21, "random", 1)
        ends = [-1, *_ends(tree), 20]
        out[f"variant-{name}"] = path_commit_errors(3, 24, 40, 21, "random", 1, "cpu", ends=ends, **tiles)
        deep = path_commit_errors(2, 16, 16, 40, "chain", 8, "cpu", width=2, ends=[-1, 15, 16, 39], **tiles)
        out[f"variant-deep-{name}"] = deep
    print(json.dumps(out))


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_closed_form_commit_matches_reference_in_the_interpreter(interp: dict, name: str) -> None:
    errs = interp[name]
    assert len(errs) >= 2  # the root and at least one deeper end
    assert max(errs) < 1e-6, errs  # float32 state and factors vs float64


def test_conv_commit_matches_reference_in_the_interpreter(interp: dict) -> None:
    assert interp["conv"] == [0, 0]  # a copy of existing values: exact


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-6)])
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_path_commit_matches_reference_in_the_interpreter(
    interp: dict, name: str, dtype: str, tol: float
) -> None:
    got = interp[f"path-{name}-{dtype}"]
    # node -1: nothing changes (float32: only the state's own rounding to float32)
    assert got["state"][0] < (1e-300 if dtype == "float64" else 1e-7) and got["conv"][0] == 0
    assert max(got["state"]) < tol, got["state"]
    assert sum(got["conv"]) == 0  # conv history: a copy, exact


def test_path_commit_walks_several_blocks_of_a_deep_path(interp: dict) -> None:
    assert max(interp["path-deep"]["state"]) < 1e-12  # a 40-node chain: 3 blocks of 16 path rows
    assert sum(interp["path-deep"]["conv"]) == 0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_path_commit_settings_all_match_the_reference(interp: dict, name: str) -> None:
    """Every tile, block, peel and contraction setting gives the reference commit (float64: to rounding),
    on a tree off the tiles and on a 40-node chain (several blocks of path rows past the peeled one)."""
    for key in (f"variant-{name}", f"variant-deep-{name}"):
        got = interp[key]
        assert got["state"][0] < 1e-300 and max(got["state"]) < 1e-12, (key, got["state"])
        assert sum(got["conv"]) == 0, key


def test_path_commit_tiles_fill_the_gpu() -> None:
    """The default grid: many programs at both paper shapes (one per 16 x 64 state tile)."""
    from repro.gdn.triton_commit import path_commit_programs

    assert path_commit_programs(8, 256, 256) == 512  # SpecLA: 8 heads x 16 value tiles x 4 key tiles
    assert path_commit_programs(48, 128, 128) == 768
    assert path_commit_programs(8, 256, 256, block_v=32, block_k=64) == 256  # the earlier kernel


def test_apply_pending_is_the_closed_form() -> None:
    gen = torch.Generator().manual_seed(3)
    tree = _random_tree(13, "mixed", 3)
    f = _factors(3, 8, 5, 13, gen)
    state = torch.randn(3, 8, 5, generator=gen, dtype=torch.float64)
    for end in [-1, 0, 7, 12]:
        got = state.clone()
        gdn.apply_pending(
            got, gdn.PendingCommit(f.delta, f.k, f.gate_cum, tree.ancestor_mask, torch.tensor([end]))
        )
        ref = gdn.commit_closed_form(state, f, tree.path_to(end) if end >= 0 else [])
        torch.testing.assert_close(got, ref, rtol=1e-13, atol=1e-13)


def test_commit_rejects_mismatched_factors() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is needed")
    from repro.gdn.triton_commit import commit_closed_form_fused

    state = torch.zeros(2, 16, 16)
    with pytest.raises(ValueError, match="factors do not match"):
        commit_closed_form_fused(
            state, torch.zeros(4, 2, 8), torch.zeros(4, 2, 16), torch.zeros(4, 2),
            torch.eye(4, dtype=torch.bool), torch.zeros(1, dtype=torch.long),
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(48, 128, 128, 64, "random", 5), (8, 256, 256, 128, "mixed", 6)])
def test_gpu_commits_at_paper_shapes(shape: tuple) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert max(closed_form_errors(*shape, device="cuda")) < 1e-6
    path = path_commit_errors(*shape, device="cuda", dtype="float32")
    assert max(path["state"]) < 1e-6 and sum(path["conv"]) == 0
    for tiles in VARIANTS.values():
        path = path_commit_errors(*shape, device="cuda", dtype="float32", **tiles)
        assert max(path["state"]) < 1e-6 and sum(path["conv"]) == 0, tiles
    assert conv_commit_mismatches(4, 6144, 64, "random", 7, "cuda") == 0


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
