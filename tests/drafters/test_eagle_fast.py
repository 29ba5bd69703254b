"""The static EAGLE drafter's fast forward (repro/drafters/eagle_fast.py, ``StaticEagleDrafter(fast=True)``)
pinned to the eager EagleDrafter.

- Interpreter (CPU, one TRITON_INTERPRET=1 subprocess, this file as a script): a small hybrid target (width
  40, no tile multiple, GQA) and random EAGLE drafters (one layer reading one target layer; two layers
  reading two); along greedy generations with buffers doubled from 16 positions, every chain proposal's
  candidates and every dynamic tree (tau pruning, padding) equal the eager drafter's, the distributions
  within 1e-12 (float64) / 1e-5 (float32) relative (float64: the chain, the two-layer tree; float32:
  chain, and a tree with the committed block on cuBLAS, ``row_tiled_width=0``); the fast device call
  capture-safe with the same trace for other inputs; the launches of a level forward, of the
  distributions and of a whole proposal call at the tiny family's drafter layout, eager vs fast.
- CPU: the default rule (off without graphs or in float32; on a GraphedTarget it follows the target's
  gemv), the ConfigError without CUDA or the interpreter, the row bounds equal to the kernels'.
- GPU (``gpu``): the tiny family's trained drafter in float32 with CUDA graphs at the routes' shapes: the
  fast drafter's proposals equal the eager drafter's at every step, no host sync after the capture; bf16:
  the fast chain distributions within bf16 tolerance of the eager static drafter's, the default on.
"""

from __future__ import annotations

import contextlib
import json
import sys

import pytest
import torch
from conftest import CountedLaunches, rel, run_in_interpreter, sync_debug
from conftest import drafting_target as small_target

from repro.errors import ConfigError

PROB_TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
SPECS = {
    "chain": ({"kind": "eagle_chain", "k": 5, "drafter": "random"}, {"width": 3}),
    "tree": (
        {"kind": "eagle_tree", "drafter": "random", "budget": 16, "topk": 3, "tau": 0.06, "depth": 4},
        {},
    ),
}
GPU_SPECS = {  # the routes' shapes: FLA-SD's chain, SpecLA's tree
    "chain": ({"kind": "eagle_chain", "k": 6, "drafter": "random"}, {"width": 2}),
    "tree": (
        {"kind": "eagle_tree", "drafter": "random", "budget": 32, "topk": 4, "tau": 0.05, "depth": 6},
        {},
    ),
}
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def shadowed(  # noqa: ANN001 - model: HybridLM, prompts: token lists, drafter: EagleDraftModel
    model, prompts, name: str, new_tokens: int, drafter=None, tiled_width: int | None = None, **static_kw
) -> dict:
    """Greedy generations with the eager EAGLE route of ``name`` (:data:`SPECS`, on CUDA :data:`GPU_SPECS`;
    ``drafter``: its model, else a random one), a static drafter (``static_kw``; ``tiled_width``: its fast
    forward's ``row_tiled_width``) fed the same and compared at every proposal: the count of proposals, of
    those that differ, the largest relative error of the chain distributions, the accepted lengths,
    paddings and the buffers' last capacity."""
    from repro.decoding.engine import generate
    from repro.decoding.routes import build_route
    from repro.drafters.eagle import EagleDrafter
    from repro.drafters.static_eagle import StaticEagleDrafter, real_nodes

    spec, extra = (GPU_SPECS if model.device.type == "cuda" else SPECS)[name]
    route = build_route(spec, model.config.vocab_size, "greedy", 0.0, 0, target=model)
    eager = route.drafter
    eager = route.drafter = EagleDrafter(drafter or eager.model, model, k=eager.k, tree=eager.tree, **extra)
    static = StaticEagleDrafter(
        eager.model, model, k=eager.k, width=eager.width, tree=eager.tree, **static_kw
    )
    if tiled_width is not None:
        static._fast.row_tiled_width = tiled_width
    out = {"proposals": 0, "differ": 0, "prob_err": 0.0, "pads": [], "capacity": 0}
    begin, observe, propose = eager.begin, eager.observe_prefill, eager.propose

    def both_begin(prompt, ref) -> None:  # noqa: ANN001
        begin(prompt, ref)
        static.begin(prompt, ref)

    def both_observe(ver) -> None:  # noqa: ANN001
        observe(ver)
        static.observe_prefill(ver)

    def both_propose(ctx):  # noqa: ANN001, ANN202
        ref = propose(ctx)
        guard = sync_debug() if static.graphs and out["proposals"] else contextlib.nullcontext()
        with guard:
            got = static.propose(ctx)
        out["proposals"] += 1
        if eager.tree is None:
            same = got.candidates == ref.candidates
            out["prob_err"] = max(out["prob_err"], rel(got.probs, ref.probs))
        else:
            host = got.tree.to_tree()
            real = real_nodes(host)
            same = real.tokens.tolist() == ref.tree.tokens.tolist()
            same = same and real.parents.tolist() == ref.tree.parents.tolist()
            out["pads"].append(host.size - real.size)
        out["differ"] += not same
        return ref

    eager.begin, eager.observe_prefill, eager.propose = both_begin, both_observe, both_propose
    out["lengths"] = [n for p in prompts for n in generate(model, p, route, new_tokens).accepted_lengths]
    out["capacity"] = static.capacity
    return out


PROMPT = list(range(7, 40, 2))  # 17 tokens: buffers of 16 positions double at the prefill


def proposal_cases() -> dict[str, dict]:
    """Fast vs eager: float64 chain of the one-layer drafter and tree of the two-layer one (the features
    repeated per target layer; the one-layer tree: float32's), float32 chain, and float32 tree with the
    committed block on cuBLAS (``row_tiled_width`` 0)."""
    from repro.drafters.eagle import random_eagle_for

    cases = [("one", "chain", None), ("two", "tree", None)]
    out = {}
    for dtype, todo in (
        (torch.float64, cases),
        (torch.float32, [("one", "chain", None), ("one", "tree", 0)]),
    ):
        model = small_target(dtype)
        layouts = {
            "one": random_eagle_for(model, seed=1),
            "two": random_eagle_for(model, seed=2, num_layers=2, target_layer_ids=[0, 2]),
        }
        for layout, name, width in todo:
            res = shadowed(model, [PROMPT], name, 7, layouts[layout], width, fast=True, capacity=16)
            out[f"{str(dtype)[6:]}/{layout}/{name}{'/cublas' if width == 0 else ''}"] = res
    return out


def capture_facts() -> dict[str, object]:
    """The fast device call under CaptureCheck: no hazards, the same trace for other inputs."""
    from repro.drafters.base import DraftContext
    from repro.drafters.eagle import DynamicTree, random_eagle_for
    from repro.drafters.static_eagle import StaticEagleDrafter
    from repro.models.graphs import check_capture

    model = small_target(torch.float32)
    out: dict[str, object] = {}
    for name, tree in (("chain", None), ("tree", DynamicTree(9, 3, 0.01, 3))):
        drafter = StaticEagleDrafter(
            random_eagle_for(model, seed=3), model, k=2, width=2, tree=tree, fast=True
        )
        ids = list(range(3, 30))
        _, ver = model.prefill(ids, capture=drafter.capture_layers)
        drafter.observe_prefill(ver)
        drafter.propose(DraftContext(ids, [5]))
        first = check_capture(drafter._step)
        drafter.inputs[:3] = torch.tensor([20, 22, 9])
        second = check_capture(drafter._step)
        out[name] = {"hazards": first.hazards + second.hazards, "same_trace": first.trace == second.trace}
    return out


def launch_counts() -> dict[str, dict[str, int]]:
    """Launches (aten ops that launch work + Triton launches) at the tiny family's drafter layout (one layer
    reading one target layer, 4 / 2 heads; smaller widths: launches do not depend on them): a tree level's
    forward (4 rows) and its distributions, and the whole proposal call of a chain (k = 6) and of a dynamic
    tree (budget 32, topk 4, depth 6), eager vs fast."""
    from repro.drafters import eagle_attention, frontier_kernels
    from repro.drafters.base import DraftContext
    from repro.drafters.eagle import DynamicTree, EagleConfig, EagleDraftModel
    from repro.drafters.static_eagle import StaticEagleDrafter
    from repro.gdn import triton_decode, triton_linear
    from repro.models.graphs import count_ops

    counter = [0]
    for module in (triton_decode, triton_linear, eagle_attention, frontier_kernels):
        for name in dir(module):
            if name.endswith("_kernel"):
                setattr(module, name, CountedLaunches(getattr(module, name), counter))
    model = small_target(torch.float32)
    tc = model.config
    cfg = EagleConfig(
        hidden_size=tc.hidden_size, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=56, vocab_size=tc.vocab_size, target_layer_ids=[2],
        target_hidden_size=tc.hidden_size,
    )  # fmt: skip
    eagle = EagleDraftModel(cfg).eval()

    def counted(fn) -> dict[str, int]:  # noqa: ANN001
        counter[0] = 0
        ops = count_ops(fn)
        return {"aten": ops, "triton": counter[0], "total": ops + counter[0]}

    out: dict[str, dict[str, int]] = {}
    ids = list(range(3, 30))
    _, ver = model.prefill(ids, capture=(2,))
    for fast in (False, True):
        key = "fast" if fast else "eager"
        for name, tree in (("chain", None), ("tree", DynamicTree(32, 4, 0.0, 6))):
            d = StaticEagleDrafter(eagle, model, k=6, tree=tree, fast=fast)
            d.observe_prefill(ver)
            d.propose(DraftContext(ids, [5]))
            out[f"{key}/{name}/step"] = counted(d._step)
            if tree is not None:
                context = d._draft_context(d.inputs[1:2])
                tokens = torch.tensor([5, 6, 7, 8])
                preds = torch.randn(4, tc.hidden_size)
                anc = torch.zeros(4, d.draft_slots, dtype=torch.bool)
                out[f"{key}/level"] = counted(lambda: d._level(1, tokens, preds, anc, context))  # noqa: B023
                out[f"{key}/probs"] = counted(lambda: d._probs(preds))  # noqa: B023
    return out


# ------------------------------------------------------------------------------------ interpreter


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__)


def test_fast_proposals_equal_the_eager_drafters_in_the_interpreter(interpreted):
    cases = interpreted["proposals"]
    assert len(cases) == 4
    for key, res in cases.items():
        dtype = torch.float64 if key.startswith("float64") else torch.float32
        assert res["differ"] == 0 and res["proposals"] >= 5, (key, res)
        assert res["prob_err"] <= PROB_TOL[dtype], (key, res)
    chains = [res for key, res in cases.items() if key.endswith("chain")]
    assert min(r["prob_err"] for r in chains) > 0  # really another path
    assert all(r["capacity"] > 16 for r in cases.values())  # buffers grew
    trees = [res for key, res in cases.items() if "/tree" in key]
    assert max(max(r["pads"]) for r in trees) > 0  # tau pruned some trees below their size
    assert max(max(r["lengths"]) for r in cases.values()) > 1


def test_fast_call_is_capture_safe(interpreted):
    assert interpreted["capture"] == {
        "chain": {"hazards": [], "same_trace": True},
        "tree": {"hazards": [], "same_trace": True},
    }


def test_fast_forward_launches_fewer_kernels(interpreted):
    """The tiny family's layout (the module docstring of repro/drafters/eagle_fast.py has these numbers), the
    attention on repro/drafters/eagle_attention.py's kernel (float32 in the interpreter): a tree level's
    forward (4 rows, the step's mask and positions made once) 60 -> 8 launches (19 with the eager attention
    glue, 65 before the glue was made once a step), its distributions 9 -> 2, the whole proposal call of a
    chain (k = 6) 423 -> 80 (135 with the eager attention glue, 451 before; one launch is the committed
    count's copy that the pipelined loop's step reads), of a dynamic tree (depth 6) 487 -> 134 (199 with
    the eager attention glue; 576 -> 289 with the legacy tree glue and the eager
    attention glue, 629 before; tests/drafters/test_eagle_tree_glue.py)."""
    n = {key: v["total"] for key, v in interpreted["launches"].items()}
    assert (n["eager/level"], n["fast/level"]) == (60, 8), n
    assert interpreted["launches"]["fast/level"]["triton"] == 6, n  # fc, qkv, attention, o, gate|up, down
    assert (n["eager/probs"], n["fast/probs"]) == (9, 2), n
    assert (n["eager/chain/step"], n["fast/chain/step"]) == (423, 80), n
    assert (n["eager/tree/step"], n["fast/tree/step"]) == (487, 81), n


# --------------------------------------------------------------------------------------------- CPU


def test_fast_default_and_config_errors(monkeypatch):
    from repro.drafters.eagle import random_eagle_for
    from repro.drafters.fast_rules import GEMV_ROWS, TILED_ROWS
    from repro.drafters.static_eagle import StaticEagleDrafter
    from repro.gdn.triton_linear import MAX_ROWS, MAX_VERIFY_ROWS

    assert (GEMV_ROWS, TILED_ROWS) == (MAX_ROWS, MAX_VERIFY_ROWS)
    from repro.drafters.static_eagle import eagle_drafter_for
    from repro.models.graphed import GraphedTarget

    model = small_target(torch.float64)
    eagle = random_eagle_for(model)
    assert not StaticEagleDrafter(eagle, model).fast
    graphed = GraphedTarget(model, max_len=512, graphs=False)
    made = eagle_drafter_for(eagle, graphed)
    assert not made.fast  # follows the target's gemv
    assert made.capacity == 512  # as long as the target's buffers: it grows only when they do
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="fast=True runs Triton kernels"):
        StaticEagleDrafter(eagle, model, fast=True)


# ---------------------------------------------------------------------------------------------- GPU


def family(dtype: str):  # noqa: ANN201 - (HybridLM, prompts, the trained EAGLE model)
    from repro.decoding.routes import build_route
    from repro.models.target import open_target

    model, tok = open_target("default", dtype=dtype, device="cuda")
    model.set_gdn_backend("triton")
    texts = ["Write a short story about a cat and a boat.", "List three facts about the moon and the tides."]
    prompts = [tok.chat_prompt([{"role": "user", "content": t}]) for t in texts]
    route = build_route({"kind": "eagle_chain", "k": 6}, model.config.vocab_size, "greedy", 0.0, 0,
                        target=model, family="tiny-qwen35")  # fmt: skip
    return model, prompts, route.drafter.model


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("name", list(SPECS))
def test_gpu_fast_graphed_proposals_equal_eager_in_float32(name):
    model, prompts, eagle = family("float32")
    res = shadowed(model, prompts, name, 48, eagle, fast=True, graphs=True, capacity=1024)
    print(json.dumps(res))
    assert res["differ"] == 0 and res["prob_err"] <= 1e-5 and max(res["lengths"]) > 2


@pytest.mark.gpu
@cuda
def test_gpu_fast_bf16_within_tolerance():
    """bf16, graphed: the fast and the eager static drafter's chain distributions agree to bf16 accuracy,
    and the default turns the fast path on there (on a GraphedTarget: with its GEMV decode)."""
    from repro.drafters.base import DraftContext
    from repro.drafters.static_eagle import StaticEagleDrafter, eagle_drafter_for
    from repro.models.graphed import GraphedTarget

    model, prompts, eagle = family("bfloat16")
    ids = prompts[0]
    drafters = [StaticEagleDrafter(eagle, model, k=6, fast=f) for f in (False, None)]
    assert drafters[1].fast and eagle_drafter_for(eagle, GraphedTarget(model), k=6).fast
    _, ver = model.prefill(ids, capture=drafters[0].capture_layers)
    probs = []
    for d in drafters:
        d.observe_prefill(ver)
        probs.append(d.propose(DraftContext(ids, [7])).probs.float())
    assert (probs[0] - probs[1]).abs().max().item() < 3e-2


def _interpreter_main() -> None:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    out = {"proposals": proposal_cases(), "capture": capture_facts(), "launches": launch_counts()}
    print(json.dumps(out))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
