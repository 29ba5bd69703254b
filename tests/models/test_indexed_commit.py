"""The static decoder's closed-form commit reading the path from a path index (StaticDecoder.indexed_commit,
repro.gdn.triton_commit.commit_path_indexed) equals the earlier one (each layer gathering the path from the
ancestor row: indexed_commit False) and HybridLM's commit.

Interpreter (one TRITON_INTERPRET=1 subprocess), a float32 model with three GDN layers and one attention
layer: for several accepted paths (the root, the deepest node, a shallow one) verify + closed-form commit
on two decoders, one per path source, and HybridLM's commit; then two delayed steps on both (the first
folded in by the second verification's tree kernel, from the stash's path index; the second flushed);
the Triton launches of one indexed commit (one path index, one commit per GDN layer).
GPU: the same two decoders on CUDA graphs (GraphedTarget: accept + commit captured), float32.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import CountedLaunches, run_in_interpreter

from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights
from repro.models.hybrid import HybridLM
from repro.models.state import ModelState
from repro.models.static import StaticDecoder, TreeSlot
from repro.tree import Tree

LAYERS = [GDN, GDN, ATTENTION, GDN]


def _model(dtype: torch.dtype = torch.float32, device: str = "cpu") -> HybridLM:
    cfg = HybridConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, layer_types=LAYERS, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), 41).to(device=device, dtype=dtype).eval()


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 61, (n,), generator=torch.Generator().manual_seed(seed))


def _tree(seed: int) -> Tree:
    # a chain of 4 under the root with a side branch, then a second branch: depths 1..5
    parents = torch.tensor([-1, 0, 1, 2, 3, 1, 0, 6, 2])
    return Tree(_ids(9, seed), parents)


def state_diff(a: ModelState, b: ModelState) -> float:
    """Largest relative difference over every buffer of two states."""
    assert a.position == b.position
    out = 0.0
    for x, y in zip(a.layers, b.layers):
        for u, v in zip(vars(x).values(), vars(y).values()):
            u, v = u.double().cpu(), v.double().cpu()
            out = max(out, float((u - v).norm() / v.norm().clamp_min(1e-300)))
    return out


def compare(device: str) -> dict[str, float | dict[str, int]]:
    """Largest state differences: indexed vs earlier path source, indexed vs HybridLM (closed form and
    flushed delayed commits); Triton launches of one indexed closed-form commit."""
    from repro.gdn import triton_commit

    model = _model(device=device)
    state, _ = model.prefill(_ids(7, 42).to(device))
    tree = _tree(43)
    ver = model.verify(state, tree)
    depth = tree.depth.tolist()
    decs = [StaticDecoder(model, 32, 16, kernel="triton", fused=False) for _ in "ab"]
    decs[1].indexed_commit = False
    out: dict[str, float | dict[str, int]] = {"vs_earlier": 0.0, "vs_model": 0.0}
    for end in (0, max(range(9), key=lambda i: depth[i]), 6, 8):
        path = tree.path_to(end)
        exported = []
        for dec in decs:
            dec.load(state)
            slot = TreeSlot(dec, 9)
            slot.set_tree(tree)
            dec.verify(slot)
            slot.set_accepted(path)
            dec.commit(slot, "closed_form")
            exported.append(dec.export())
        out["vs_earlier"] = max(out["vs_earlier"], state_diff(*exported))
        out["vs_model"] = max(out["vs_model"], state_diff(exported[0], model.commit(state, ver, path)))
    # delayed: two steps; the first step's commit (stash 0) folded in by the second verification (the
    # tree kernel's prologue, from the stash's path index), the second's (stash 1) flushed by export
    paths = [tree.path_to(4), tree.path_to(7)]
    exported = []
    for dec in decs:
        dec.load(state)
        for step, path in enumerate(paths):
            slot = TreeSlot(dec, 9, parity=step)
            slot.set_tree(tree)
            dec.verify(slot)
            slot.set_accepted(path)
            dec.commit(slot, "delayed")
        exported.append(dec.export())
    ref = model.commit(state, ver, paths[0])
    ref = model.commit(ref, model.verify(ref, tree), paths[1])
    out["delayed_vs_earlier"] = state_diff(*exported)
    out["delayed_vs_model"] = state_diff(exported[0], ref)
    counters: dict[str, list[int]] = {}
    for name in ("_path_index_kernel", "_indexed_commit_kernel", "_path_commit_kernel"):
        counters[name] = [0]
        setattr(triton_commit, name, CountedLaunches(getattr(triton_commit, name), counters[name]))
    for key, dec in zip(("launches", "launches_earlier"), decs):
        for c in counters.values():
            c[0] = 0
        dec.load(state)
        slot = TreeSlot(dec, 9)
        slot.set_tree(tree)
        dec.verify(slot)
        slot.set_accepted(path)
        dec.commit(slot, "closed_form")
        out[key] = {name: c[0] for name, c in counters.items()}
    return out


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


def test_indexed_commit_equals_the_earlier_path_commit(interp: dict) -> None:
    # float32: the rows of a block are summed newest first here, root first there
    assert interp["vs_earlier"] < 1e-6 and interp["delayed_vs_earlier"] < 1e-6, interp
    assert interp["vs_model"] < 1e-5 and interp["delayed_vs_model"] < 1e-5, interp


def test_indexed_commit_writes_the_path_once_per_commit(interp: dict) -> None:
    gdn_layers = LAYERS.count(GDN)
    want = {"_path_index_kernel": 1, "_indexed_commit_kernel": gdn_layers, "_path_commit_kernel": 0}
    assert interp["launches"] == want, interp
    earlier = {"_path_index_kernel": 0, "_indexed_commit_kernel": 0, "_path_commit_kernel": gdn_layers}
    assert interp["launches_earlier"] == earlier, interp


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_indexed_commit_on_graphs() -> None:
    """float32 on CUDA: eager decoders as above, then GraphedTarget greedy steps (accept + the indexed
    commit captured) give the same state as the earlier path source."""
    from repro.models.graphed import GraphedTarget

    got = compare("cuda")
    assert got["vs_earlier"] < 1e-5 and got["vs_model"] < 1e-4, got
    model = _model(device="cuda")
    model.set_gdn_backend("triton")
    prompt = _ids(7, 44).tolist()
    states = []
    for indexed in (True, False):
        target = GraphedTarget(model, max_len=64, max_nodes=16)
        state, _ = target.prefill(prompt)
        target.decoder.indexed_commit = indexed  # before the commit graphs are captured
        tree = _tree(45)
        for _ in range(3):
            ver = target.verify(state, tree, strategy="closed_form")
            state = target.commit_greedy(state, ver)[0]
        target.flush()
        states.append(target.decoder.export())
    assert state_diff(*states) < 1e-5


if __name__ == "__main__" and "--interpret" in sys.argv:
    torch.set_num_threads(1)
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    print(json.dumps(compare("cpu")))
