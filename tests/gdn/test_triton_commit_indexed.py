"""The path-indexed commit (repro.gdn.triton_commit.write_path_index, commit_path_indexed) against the
pure-torch reference.

- interpreter (CPU, TRITON_INTERPRET=1, one subprocess): the path index of every path end (and node -1)
  equals the tree's path, newest first; commit_path_indexed in every contraction mode and several tile
  settings vs reference.commit_closed_form (float64 to rounding, float32 to float32's) and the conv
  history vs reference.conv_history_after (exact), every path end plus node -1 (a no-op; the ragged tree
  and the chain at some: SOME_ENDS), trees whose
  d_v / d_k / n are off the tiles, a 40-node chain (several blocks of path rows), a conv window
  reaching into the old history; the same results as commit_path_fused (float64, to rounding); stacked
  layers in one launch bit for bit as one launch per layer;
- gpu: the same at both paper shapes in float32, replayed from a CUDA graph for several path ends.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import run_in_interpreter

from repro.gdn import reference as gdn
from repro.tree import Tree

CASES = [  # (name, HV, d_v, d_k, n, tree kind, seed, conv width)
    ("small", 2, 16, 16, 9, "mixed", 0, 4),
    ("ragged", 3, 24, 40, 21, "random", 1, 4),
    ("deep", 2, 16, 16, 40, "chain", 8, 4),  # 40 path rows: 3 blocks of 16
    ("narrow", 2, 16, 16, 12, "mixed", 2, 2),
]
# the path ends of the per-dtype runs where not every end (each end costs a launch in the interpreter):
# the ragged tree at node -1, the root, its deepest node and a middle one; the chain at node -1 and
# paths of 1, 8, 16, 17, 32, 33 and 40 rows (around the 16-row blocks)
SOME_ENDS = {"ragged": [-1, 0, 19, 10], "deep": [-1, 0, 7, 15, 16, 31, 32, 39]}
# settings of the narrow case (conv width 2: the conv history's part does not depend on the tiles)
NARROW_SETTINGS = ("dot",)
SETTINGS = {  # commit_path_indexed keyword arguments per setting
    "dot": {},
    "rank1": {"mode": "rank1"},
    "rank1-w2": {"mode": "rank1", "num_warps": 2},
    "products": {"mode": "products", "block_v": 8, "block_m": 8},
    "dot-small": {"block_v": 8},  # dot below its smallest tile: products
    "wide": {"block_v": 64, "block_k": 128, "block_m": 32, "num_warps": 2},
    "rank1-bm4": {"mode": "rank1", "block_v": 32, "block_k": 32, "block_m": 4},
}


def _tree(n: int, kind: str, seed: int) -> Tree:
    from repro.bench.shapes import random_parents

    gen = torch.Generator().manual_seed(seed)
    return Tree(torch.zeros(n, dtype=torch.long), random_parents(n, kind, gen))


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


def index_mismatches(tree: Tree, ends: list[int], device: str) -> int:
    """Path ends whose path index is not [d, the path newest first] (node -1: d = 0)."""
    from repro.gdn.triton_commit import path_index_buffer, write_path_index

    n = tree.size
    path = path_index_buffer(n, device)
    path.fill_(-7)  # stale entries past the length are never read
    bad = 0
    for end in ends:
        want = tree.path_to(end)[::-1] if end >= 0 else []
        write_path_index(tree.ancestor_mask.to(device), torch.tensor([end], device=device), path)
        got = path.cpu().tolist()
        bad += got[0] != len(want) or got[1 : 1 + len(want)] != want
    return bad


def indexed_errors(
    hv: int, dv: int, dk: int, n: int, kind: str, seed: int, width: int, device: str, dtype: str,
    ends: list[int] | None = None, compare_fused: bool = False, **kw: object,
) -> dict[str, list[float]]:  # fmt: skip
    """commit_path_indexed (settings ``kw``) vs commit_closed_form (state: relative error) and
    conv_history_after (conv: mismatching elements), every path end (``ends``: those) and node -1 first;
    ``compare_fused``: also the largest difference from commit_path_fused on the same operands."""
    from repro.gdn.triton_commit import (
        commit_path_fused,
        commit_path_indexed,
        path_index_buffer,
        write_path_index,
    )

    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)
    tree = _tree(n, kind, seed)
    f = _factors(hv, dv, dk, n, gen)
    state = torch.randn(hv, dv, dk, generator=gen, dtype=torch.float64)
    channels = 2 * dk + dv
    history = torch.randn(width - 1, channels, generator=gen)
    inputs = torch.randn(n, channels, generator=gen).to(device)
    anc = tree.ancestor_mask.to(device)
    ops = [x.to(device=device, dtype=dt) for x in (f.delta, f.k, f.gate_cum)]
    path = path_index_buffer(n, device)
    out: dict[str, list[float]] = {"state": [], "conv": [], "vs_fused": []}
    for end in ends or [-1, *range(n)]:
        nodes = tree.path_to(end) if end >= 0 else []
        node = torch.tensor([end], device=device)
        path.fill_(1 << 20)  # entries past the length stay stale (here: far out of range): never dereferenced
        write_path_index(anc, node, path)
        ref = gdn.commit_closed_form(state, f, nodes)
        got, hist = state.to(device=device, dtype=dt), history.clone().to(device)
        commit_path_indexed(got, *ops, path, conv=(hist, inputs), **kw)
        out["state"].append(float((got.cpu().double() - ref).norm() / ref.norm()))
        out["conv"].append(int((hist.cpu() != gdn.conv_history_after(history, inputs.cpu(), nodes)).sum()))
        if compare_fused:
            old = state.to(device=device, dtype=dt)
            index = gdn.conv_gather_index(tree.parents, width).to(device)
            commit_path_fused(old, *ops, anc, node, conv=(history.clone().to(device), inputs, index))
            out["vs_fused"].append(float((old - got).norm() / old.norm()))
    return out


def stacked_mismatches(
    layers: int, device: str, dtype: torch.dtype = torch.float64, shape: tuple[int, ...] = (2, 24, 40, 13),
    ends: tuple[int, ...] = (-1, 0, 5, 12, 6), **kw: object,
) -> dict[str, int]:  # fmt: skip
    """commit_path_indexed on ``layers`` stacked layers (one launch) vs one launch per layer (``shape`` =
    HV, d_v, d_k, n), node -1 and path ends ``ends``: elements that differ (state, conv history)."""
    from repro.gdn.triton_commit import commit_path_indexed, path_index_buffer, write_path_index

    hv, dv, dk, n = shape
    tree, gen = _tree(n, "mixed", 4), torch.Generator().manual_seed(4)
    fs = [_factors(hv, dv, dk, n, gen) for _ in range(layers)]
    delta, k, gate = (
        torch.stack([getattr(f, a) for f in fs]).to(device, dtype) for a in ("delta", "k", "gate_cum")
    )
    state = torch.randn(layers, hv, dv, dk, generator=gen, dtype=torch.float64).to(device, dtype)
    hist = torch.randn(layers, 3, 2 * dk + dv, generator=gen).to(device)
    inputs = torch.randn(layers, n, 2 * dk + dv, generator=gen).to(device)
    path = path_index_buffer(n, device)
    bad = {"state": 0, "conv": 0}
    for end in ends:
        write_path_index(tree.ancestor_mask.to(device), torch.tensor([end], device=device), path)
        got, got_h = state.clone(), hist.clone()
        commit_path_indexed(got, delta, k, gate, path, conv=(got_h, inputs), **kw)
        for i in range(layers):
            one, one_h = state[i].clone(), hist[i].clone()
            commit_path_indexed(one, delta[i], k[i], gate[i], path, conv=(one_h, inputs[i]), **kw)
            bad["state"] += int((one != got[i]).sum())
            bad["conv"] += int((one_h != got_h[i]).sum())
    return bad


def _interpreter_main() -> None:
    """Subprocess entry (TRITON_INTERPRET=1): every case's results as JSON on the last line."""
    torch.set_num_threads(1)
    out: dict[str, object] = {}
    for name, hv, dv, dk, n, kind, seed, width in CASES:
        tree = _tree(n, kind, seed)
        out[f"index-{name}"] = index_mismatches(tree, [-1, *range(n), -1], "cpu")
        depth = tree.depth.tolist()
        ends = [-1, 0, max(range(n), key=lambda i: depth[i]), n // 2]
        if name == "ragged":
            assert SOME_ENDS[name] == [-1, 0, ends[2], n // 2]
        for dtype in ("float64", "float32"):
            some = SOME_ENDS.get(name)
            out[f"{name}-{dtype}"] = indexed_errors(hv, dv, dk, n, kind, seed, width, "cpu", dtype, some)
        for setting, kw in SETTINGS.items():
            if name == "narrow" and setting not in NARROW_SETTINGS:
                continue
            out[f"{name}-{setting}"] = indexed_errors(
                hv, dv, dk, n, kind, seed, width, "cpu", "float64", ends, compare_fused=setting == "dot", **kw
            )
    out["stacked"] = stacked_mismatches(3, "cpu")
    out["stacked-rank1"] = stacked_mismatches(2, "cpu", ends=(-1, 12, 6), mode="rank1", block_v=8)
    print(json.dumps(out))


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_path_index_is_the_path_newest_first(interp: dict, name: str) -> None:
    assert interp[f"index-{name}"] == 0


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-6)])
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_indexed_commit_matches_reference(interp: dict, name: str, dtype: str, tol: float) -> None:
    got = interp[f"{name}-{dtype}"]
    assert got["state"][0] < (1e-300 if dtype == "float64" else 1e-7)  # node -1: nothing changes
    assert max(got["state"]) < tol, got["state"]
    assert sum(got["conv"]) == 0  # the conv history: a copy, exact


@pytest.mark.parametrize(
    "name, setting",
    [(c[0], s) for c in CASES for s in SETTINGS if c[0] != "narrow" or s in NARROW_SETTINGS],
)
def test_every_indexed_setting_matches_reference(interp: dict, name: str, setting: str) -> None:
    got = interp[f"{name}-{setting}"]
    assert got["state"][0] < 1e-300 and max(got["state"]) < 1e-12, got["state"]
    assert sum(got["conv"]) == 0


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_indexed_commit_is_the_fused_commit(interp: dict, name: str) -> None:
    """The default (dot, 16 x 64 tiles, blocks of 16 rows) vs commit_path_fused on the same operands:
    the same float64 state to rounding (the rows of a block come newest first here, root first there)."""
    assert max(interp[f"{name}-dot"]["vs_fused"]) < 1e-14


@pytest.mark.parametrize("key", ["stacked", "stacked-rank1"])
def test_stacked_layers_in_one_launch_equal_one_launch_per_layer(interp: dict, key: str) -> None:
    assert interp[key] == {"state": 0, "conv": 0}  # the same arithmetic per layer: bit for bit


def test_indexed_commit_rejects_a_bad_path_index() -> None:
    pytest.importorskip("triton")
    from repro.gdn.triton_commit import commit_path_indexed, write_path_index

    state, f = torch.zeros(2, 16, 16), _factors(2, 16, 16, 4, torch.Generator().manual_seed(0))
    ops = [x.float() for x in (f.delta, f.k, f.gate_cum)]
    with pytest.raises(ValueError, match="int32 path index"):
        commit_path_indexed(state, *ops, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="mode must be"):
        commit_path_indexed(state, *ops, torch.zeros(5, dtype=torch.int32), mode="fast")
    with pytest.raises(ValueError, match="one leading layer dim"):
        commit_path_indexed(
            state[None], *(x[None] for x in ops[:2]), ops[2], torch.zeros(5, dtype=torch.int32)
        )
    with pytest.raises(ValueError, match="path index of a 4-node tree"):
        write_path_index(torch.eye(4, dtype=torch.bool), torch.zeros(1, dtype=torch.long), torch.zeros(4))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(48, 128, 128, 64, "random", 5), (8, 256, 256, 128, "mixed", 6)])
def test_gpu_indexed_commit_in_a_graph(shape: tuple) -> None:
    """float32 at the paper shapes, every setting; then the index writer and the commit captured in one
    CUDA graph and replayed for several path ends (the node set on the device between replays)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from repro.gdn.triton_commit import commit_path_indexed, path_index_buffer, write_path_index

    hv, dv, dk, n, kind, seed = shape
    for kw in SETTINGS.values():
        got = indexed_errors(hv, dv, dk, n, kind, seed, 4, "cuda", "float32", [-1, 0, n - 1, n // 2], **kw)
        assert max(got["state"]) < 1e-6 and sum(got["conv"]) == 0, kw
    tree, gen = _tree(n, kind, seed), torch.Generator().manual_seed(seed)
    f = _factors(hv, dv, dk, n, gen)
    ops = [x.cuda().float() for x in (f.delta, f.k, f.gate_cum)]
    anc, node = tree.ancestor_mask.cuda(), torch.zeros(1, dtype=torch.long, device="cuda")
    path = path_index_buffer(n, "cuda")
    s0 = torch.randn(hv, dv, dk, generator=gen, dtype=torch.float64)
    hist0 = torch.randn(3, 2 * dk + dv, generator=gen)
    inputs = torch.randn(n, 2 * dk + dv, generator=gen).cuda()
    state, hist = s0.float().cuda(), hist0.cuda()

    def step() -> None:
        write_path_index(anc, node, path)
        commit_path_indexed(state, *ops, path, conv=(hist, inputs))

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for end in [n - 1, 0, -1, n // 2]:
        node.fill_(end)
        state.copy_(s0)
        hist.copy_(hist0)
        graph.replay()
        torch.cuda.synchronize()
        nodes = tree.path_to(end) if end >= 0 else []
        ref = gdn.commit_closed_form(s0, f, nodes)
        assert float((state.cpu().double() - ref).norm() / ref.norm()) < 1e-6, end
        assert torch.equal(hist.cpu(), gdn.conv_history_after(hist0, inputs.cpu(), nodes)), end
    # 3 stacked layers in one launch: bit for bit the per-layer launches (float32)
    assert stacked_mismatches(3, "cuda", torch.float32, (hv, dv, dk, n)) == {"state": 0, "conv": 0}


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
