"""The static decoder with its GDN states, factors and conv histories stacked (StaticDecoder(stacked_commit=
True)): the closed-form commit of every GDN layer in one launch (repro.gdn.triton_commit.commit_path_indexed
over the stack) gives bitwise the states, logits and tokens of the per-layer commit.

Interpreter (one TRITON_INTERPRET=1 subprocess; float32, the Triton path commit), a model of three GDN
layers and one attention layer, stacked vs per-layer (indexed) decoders side by side: steps on a tree
(accepted paths ending at every depth 1..5, i.e. 0..4 accepted drafts), a chain-shaped tree (depth 6)
and a one-node tree (greedy only), forced paths and the device's greedy accept (the fused decoder and
the split tree kernel: one step each, seconds a verify here); every step's logits, accepted node and
bonus and the committed state equal bitwise, and the state equals HybridLM's commit; then decode steps
and a replay and a snapshot commit (per layer on the views), two delayed steps with the flush (the
stacked flush in one launch), and the launches of a stacked commit (one path index, one commit); the
stacked kernel reading conv inputs at their strides (a column slice of a wider tensor) bitwise as from a
contiguous copy.
CPU float64 (the reference kernels: the views and the factor outputs, commits per layer): the same steps,
bitwise; GraphedTarget (no graphs) generate() on chain and DDTree routes, closed-form and delayed: AR's
tokens, the same paths and bitwise the same state as the per-layer target.
GPU (``gpu``): the same through GraphedTarget's CUDA graphs, float32: AR's tokens, the same state.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import CountedLaunches, run_in_interpreter, small_hybrid, small_ids
from test_graphed import device_routes

from repro.decoding.engine import generate
from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights
from repro.models.hybrid import HybridLM
from repro.models.state import ModelState
from repro.models.static import StaticDecoder, TreeSlot
from repro.models.static_layers import GDNBuffers
from repro.tree import Tree

LAYERS = [GDN, GDN, ATTENTION, GDN]
VOCAB = 61


def _model(dtype: torch.dtype, device: str = "cpu") -> HybridLM:
    cfg = HybridConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, layer_types=LAYERS, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), 51).to(device=device, dtype=dtype).eval()


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


TREES = {  # parents: a tree with depths 1..5, a chain of 6, one node
    "tree": [-1, 0, 1, 2, 3, 1, 0, 6, 2],
    "chain": [-1, 0, 1, 2, 3, 4],
    "one": [-1],
}


def _steps() -> list[tuple[str, int | None]]:
    """(tree, accepted end node or None: the device's greedy accept): every depth of each tree."""
    depth = {name: Tree(_ids(len(p), 0), torch.tensor(p)).depth.tolist() for name, p in TREES.items()}
    out: list[tuple[str, int | None]] = []
    for name, d in depth.items():
        ends = [max(i for i in range(len(d)) if d[i] == k) for k in range(1, max(d) + 1)]
        ends = {"tree": ends, "chain": ends[-1:], "one": []}[name]  # depths 1..5 on the tree
        out += [(name, end) for end in ends] + [(name, None)]
    return out


def bitwise(a: ModelState, b: ModelState) -> bool:
    return a.position == b.position and all(
        torch.equal(u, v)
        for x, y in zip(a.layers, b.layers)
        for u, v in zip(vars(x).values(), vars(y).values())
    )


def rel_diff(a: ModelState, b: ModelState) -> float:
    out = 0.0
    for x, y in zip(a.layers, b.layers):
        for u, v in zip(vars(x).values(), vars(y).values()):
            u, v = u.double().cpu(), v.double().cpu()
            out = max(out, float((u - v).norm() / v.norm().clamp_min(1e-300)))
    return out


def compare(
    device: str,
    dtype: torch.dtype,
    kernel: str,
    fused: bool,
    short: bool = False,
    tree_kernel: str | None = None,
) -> dict:
    """Stacked vs per-layer decoders over :func:`_steps` and more (the module docstring): the steps that
    differed (must be none), the largest difference to HybridLM, the launches of one stacked commit.
    ``short``: one tree step only (the fused decoder under the interpreter: seconds a verify);
    ``tree_kernel``: the Triton tree kernel forced ("split": the half-precision decoders' at few heads)."""
    model = _model(dtype, device)
    state, _ = model.prefill(_ids(7, 52).to(device))
    decs = [
        StaticDecoder(model, 64, 16, kernel=kernel, fused=fused, tree_kernel=tree_kernel, stacked_commit=s)
        for s in (False, True)
    ]
    assert (
        decs[1].gdn_states is not None
        and decs[1].buffers[0].recurrent.data_ptr() == decs[1].gdn_states.data_ptr()
    )
    for dec in decs:
        dec.load(state)
    slots = [{name: TreeSlot(dec, len(p)) for name, p in TREES.items()} for dec in decs]
    out: dict = {"differ": [], "vs_model": 0.0}
    eager = state
    steps = [("tree", 4)] if short else _steps()
    for step, (name, end) in enumerate(steps):
        tree = Tree(_ids(len(TREES[name]), 100 + step), torch.tensor(TREES[name]))
        got = []
        for dec, slot in zip(decs, (s[name] for s in slots)):
            slot.set_tree(tree)
            logits = dec.verify(slot).clone()
            if end is None:
                dec.accept(slot)
            else:
                slot.set_accepted(tree.path_to(end))
            dec.commit(slot, "closed_form")
            got.append((logits, slot.node.clone(), slot.bonus.clone(), dec.export()))
        (la, na, ba, sa), (lb, nb, bb, sb) = got
        if not (torch.equal(la, lb) and torch.equal(na, nb) and torch.equal(ba, bb) and bitwise(sa, sb)):
            out["differ"].append(step)
        path = tree.path_to(int(na))
        eager = model.commit(eager, model.verify(eager, tree), path)
        out["vs_model"] = max(out["vs_model"], rel_diff(sb, eager))
    if short:
        return out
    # other readers and writers of the views: decode steps, replay and snapshot commits (per layer)
    tree = Tree(_ids(9, 90), torch.tensor(TREES["tree"]))
    for dec in decs:
        dec.set_token(5)
        dec.decode_step()
        for strategy, end in (("replay", 4), ("snapshot", 7)):
            slot = TreeSlot(dec, 9, snapshots=strategy == "snapshot")
            slot.set_tree(tree)
            dec.verify(slot)
            slot.set_accepted(tree.path_to(end))
            dec.commit(slot, strategy)
    out["other_strategies_equal"] = bitwise(decs[0].export(), decs[1].export())
    # delayed: the first step folded in by the second verification, the second flushed
    for dec in decs:
        for parity, end in enumerate((4, 7)):
            slot = TreeSlot(dec, 9, parity=parity)
            slot.set_tree(tree)
            dec.verify(slot)
            slot.set_accepted(tree.path_to(end))
            dec.commit(slot, "delayed")
    out["delayed_equal"] = bitwise(decs[0].export(), decs[1].export())
    return out


def _launches() -> dict[str, dict[str, int]]:
    """Triton launches of one stacked closed-form commit and of one stacked flush (the interpreter run:
    the kernels stay wrapped for the rest of the process)."""
    from repro.gdn import triton_commit

    dec = StaticDecoder(_model(torch.float32), 64, 16, kernel="triton", fused=False, stacked_commit=True)
    dec.ensure_pending(9)
    tree = Tree(_ids(9, 90), torch.tensor(TREES["tree"]))
    counters: dict[str, list[int]] = {}
    for name in (
        "_path_index_kernel",
        "_indexed_commit_kernel",
        "_path_commit_kernel",
        "_conv_commit_kernel",
    ):
        counters[name] = [0]
        setattr(triton_commit, name, CountedLaunches(getattr(triton_commit, name), counters[name]))
    out = {}
    slot = TreeSlot(dec, 9)
    slot.set_tree(tree)
    dec.verify(slot)
    slot.set_accepted(tree.path_to(4))
    for key, step in (("commit", lambda: dec.commit(slot, "closed_form")), ("flush", lambda: dec.flush(0))):
        for c in counters.values():
            c[0] = 0
        step()
        out[key] = {name: c[0] for name, c in counters.items()}
    return out


def strided_inputs() -> int:
    """Elements that differ between stacked commits (states and conv histories) from conv inputs given as
    a column slice of a wider [L, n, P] tensor (read at its strides) and from a contiguous copy."""
    from repro.gdn.triton_commit import commit_path_indexed, write_path_index

    gen = torch.Generator().manual_seed(7)
    layers, n, hv, d, hist, c = 3, 9, 2, 16, 3, 20
    tree = Tree(_ids(n, 8), torch.tensor(TREES["tree"]))
    path = torch.zeros(n + 1, dtype=torch.int32)
    write_path_index(tree.ancestor_mask, torch.tensor([4]), path)
    delta, k = (torch.randn(layers, n, hv, d, generator=gen) for _ in "dk")
    gate = -torch.rand(layers, n, hv, generator=gen)
    wide = torch.randn(layers, n, c + 7, generator=gen)
    state0, hist0 = torch.randn(layers, hv, d, d, generator=gen), torch.randn(layers, hist, c, generator=gen)
    out = []
    for inputs in (wide[..., :c], wide[..., :c].contiguous()):
        state, history = state0.clone(), hist0.clone()
        commit_path_indexed(state, delta, k, gate, path, conv=(history, inputs))
        out.append((state, history))
    (s1, h1), (s2, h2) = out
    return int((s1 != s2).sum() + (h1 != h2).sum()) + int(torch.equal(h1, hist0))  # + 1 if nothing moved


# ----------------------------------------------------------------------------- interpreter, float32


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


def test_stacked_commit_is_bitwise_the_per_layer_commit(interp: dict) -> None:
    got, short = interp["unfused"], (interp["fused"], interp["split"])
    assert got["differ"] == [] and got["other_strategies_equal"] and got["delayed_equal"], got
    assert all(r["differ"] == [] for r in short), short
    assert max(r["vs_model"] for r in (got, *short)) < 1e-5, interp  # and right: HybridLM's commit


def test_stacked_commit_is_one_launch(interp: dict) -> None:
    one = {
        "_path_index_kernel": 1,
        "_indexed_commit_kernel": 1,
        "_path_commit_kernel": 0,
        "_conv_commit_kernel": 0,
    }
    assert interp["launches"] == {"commit": one, "flush": one}, interp["launches"]


def test_stacked_commit_reads_strided_conv_inputs(interp: dict) -> None:
    assert interp["strided_inputs"] == 0, interp["strided_inputs"]


# ------------------------------------------------------------------------------- CPU, float64


def test_stacked_views_float64_reference_bitwise() -> None:
    got = compare("cpu", torch.float64, "reference", False)
    assert got["differ"] == [] and got["other_strategies_equal"] and got["delayed_equal"], got
    assert got["vs_model"] < 1e-12, got


def test_graphed_target_stacked_generates_ar_tokens_and_the_same_state() -> None:
    from repro.models.graphed import GraphedTarget

    model = small_hybrid(61)
    prompt = small_ids(10, 62)
    ar = generate(model, prompt, device_routes()[0], 24).output_ids
    targets = [GraphedTarget(model, max_len=64, max_nodes=32, stacked_commit=s) for s in (False, True)]
    assert [t.decoder.gdn_states is not None for t in targets] == [False, True]  # unstacked vs stacked
    for commit in ("closed_form", "delayed"):
        for route, twin in zip(device_routes()[1:3], device_routes()[1:3]):  # twin drafters: the same draws
            route.commit = twin.commit = commit
            want = generate(targets[0], prompt, twin, 24, reference_ids=ar)  # drafts near AR's tokens
            got = generate(targets[1], prompt, route, 24, reference_ids=ar)
            assert got.output_ids == want.output_ids == ar and got.accepted_paths == want.accepted_paths
            assert got.steps < len(ar) - 6, (commit, route.name, got.steps)  # paths deeper than the root
            assert bitwise(targets[0].decoder.export(), targets[1].decoder.export()), (commit, route.name)


def test_stacked_buffers_are_views_and_need_one_gdn_shape() -> None:
    dec = StaticDecoder(small_hybrid(3), 16, 8, stacked_commit=True)
    gdn = [b for b in dec.buffers if isinstance(b, GDNBuffers)]
    assert dec.gdn_states is not None and dec.gdn_conv is not None
    for j, buf in enumerate(gdn):
        assert buf.recurrent.data_ptr() == dec.gdn_states[j].data_ptr()
        assert buf.conv.data_ptr() == dec.gdn_conv[j].data_ptr()
    slot = TreeSlot(dec, 4)
    assert slot.stack is not None and slot.stack.delta.shape[:2] == (len(gdn), 4)
    assert TreeSlot(dec, 4, parity=0).stack is None and dec.pending_sets[0].stacked is not None


# ----------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_stacked_commit_on_graphs() -> None:
    """float32 on CUDA: the eager comparison (Triton kernels, fused), then GraphedTarget greedy routes on
    CUDA graphs, closed-form and delayed: AR's tokens and the per-layer target's state."""
    from repro.models.graphed import GraphedTarget

    got = compare("cuda", torch.float32, "triton", True)
    assert got["differ"] == [] and got["other_strategies_equal"] and got["delayed_equal"], got
    model = small_hybrid(61).to(device="cuda", dtype=torch.float32)
    model.set_gdn_backend("triton")
    prompt = small_ids(10, 62)
    ar = generate(model, prompt, device_routes()[0], 24).output_ids
    targets = [GraphedTarget(model, max_len=64, max_nodes=32, stacked_commit=s) for s in (False, True)]
    for commit in ("closed_form", "delayed"):
        for route, twin in zip(device_routes()[1:3], device_routes()[1:3]):
            route.commit = twin.commit = commit
            want = generate(targets[0], prompt, twin, 24, reference_ids=small_ids(40, 63))
            got_ = generate(targets[1], prompt, route, 24, reference_ids=small_ids(40, 63))
            assert got_.output_ids == want.output_ids == ar and got_.accepted_paths == want.accepted_paths
            assert rel_diff(targets[0].decoder.export(), targets[1].decoder.export()) == 0.0


if __name__ == "__main__" and "--interpret" in sys.argv:
    torch.set_num_threads(1)
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    unfused = compare("cpu", torch.float32, "triton", False)
    fused = compare("cpu", torch.float32, "triton", True, short=True)
    split = compare("cpu", torch.float32, "triton", False, short=True, tree_kernel="split")
    launches = _launches()
    print(json.dumps({"unfused": unfused, "fused": fused, "split": split, "launches": launches,
                      "strided_inputs": strided_inputs()}))  # fmt: skip
