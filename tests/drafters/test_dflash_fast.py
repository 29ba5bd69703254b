"""The static DFlash drafter's fast step (repro/drafters/dflash_fast.py, ``StaticDFlash(fast=True)``) pinned
to the eager DFlashDrafter.

- Interpreter (CPU, one TRITON_INTERPRET=1 subprocess, this file as a script): a small hybrid target (width
  40, GQA 4 / 2 heads) on the graphed engine (no graphs) and random DFlash drafters (one layer reading two
  target layers; float64 also two layers, and the block on cuBLAS: ``row_tiled_width=0``); along greedy
  chain DFlash and DDTree generations with buffers doubled from 16 positions, at every step the fast
  drafter's block rows (final-normed hidden states), logits and marginals equal the eager drafter's within
  1e-12 (float64) / 1e-5 (float32) relative, its top-k ids are the same, and its features too; steps
  alternate which call ingests (``propose``: marginals, or ``block_rows``: Weaver's rows and logits); the
  context keys and values written for 3, 8 and 300 rows (GEMV, row-tiled, cuBLAS) are the torch path's. The
  fast step is capture-safe with the same trace for other paths; the launches of a step, eager vs fast.
- CPU: the default (off without graphs), the ConfigError without CUDA or the interpreter, the row limits
  equal to the kernels'.
- GPU (``gpu``): the tiny family in float32 on the graphed engine with CUDA graphs: the fast drafter's
  proposals equal the eager drafter's at every step (DDTree and chain DFlash), the routes' tokens AR's; bf16:
  the fast step's marginals as close to float32's as the torch step's (within twice its error), the default
  turns the fast path on there, and a replayed fast step makes no host sync.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import CountedLaunches, rel, run_in_interpreter, sync_debug
from conftest import drafting_target as small_target

from repro.errors import ConfigError

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def shadowed(  # noqa: ANN001 - target: HybridLM, prompts: token lists, model: DFlashDraftModel
    target, prompts, kind: str, new_tokens: int, model, engine=None, tiled_width: int | None = None, **kw
) -> dict:
    """Greedy generations of route ``kind`` on ``engine`` (default: the graphed target without graphs) with
    a static DFlash drafter (``kw``; ``tiled_width``: its fast path's ``row_tiled_width``) checked at every
    step against an eager one fed the same: the steps, those whose top ids differ, the largest relative
    errors of rows, logits and marginals, the accepted lengths, whether the tokens are AR's, the capacity."""
    from repro.decoding.engine import generate
    from repro.decoding.routes import build_route
    from repro.drafters.dflash import DFlashDrafter
    from repro.models.graphed import GraphedTarget

    engine = engine or GraphedTarget(target, graphs=False)
    vocab = target.config.vocab_size
    spec = {"kind": kind, "drafter": "random", **({"budget": 16} if kind == "ddtree" else {})}
    route = build_route(spec, vocab, "greedy", 0.0, 0, target=target)
    top_k = route.drafter.top_k
    static = DFlashDrafter(model, target, static=True, top_k=top_k, **kw)
    if tiled_width is not None:
        static._static_buffers()._fast.row_tiled_width = tiled_width
    eager = DFlashDrafter(model, target, static=False, top_k=top_k)
    route.drafter = static
    out = {"steps": 0, "differ": 0, "rows": 0.0, "logits": 0.0, "probs": 0.0, "features": 0.0}
    propose, begin, observe = static.propose, static.begin, static.observe_prefill

    def checked(ctx):  # noqa: ANN001, ANN202
        first = out["steps"] % 2  # which call ingests the accepted path
        if first:
            rows = [t.clone() for t in static.block_rows(ctx)]
        got = propose(ctx)
        if not first:
            rows = [t.clone() for t in static.block_rows(ctx)]
        ref, ref_rows = eager.propose(ctx), eager.block_rows(ctx)
        out["steps"] += 1
        out["differ"] += not torch.equal(got.top_ids, ref.top_ids)
        pairs = {"rows": (rows[0], ref_rows[0]), "logits": (rows[1], ref_rows[1]),
                 "probs": (got.probs, ref.probs), "features": (static.features, eager.features)}  # fmt: skip
        for key, (a, b) in pairs.items():
            out[key] = max(out[key], rel(a, b))
        return got

    def both_begin(prompt, reference) -> None:  # noqa: ANN001
        begin(prompt, reference)
        eager.begin(prompt, reference)

    def both_observe(ver) -> None:  # noqa: ANN001
        observe(ver)
        eager.observe_prefill(ver)

    static.propose, static.begin, static.observe_prefill = checked, both_begin, both_observe
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 0)
    out["lengths"], out["ar"] = [], True
    for ids in prompts:
        res = generate(engine, ids, route, new_tokens)
        out["lengths"] += res.accepted_lengths
        out["ar"] = out["ar"] and res.output_ids == generate(engine, ids, ar, new_tokens).output_ids
    out["capacity"] = static._static.max_len
    fast = static._static._fast
    out["folded"] = bool(fast is not None and fast.fold)
    return out


PROMPT = list(range(7, 40, 2))  # 17 tokens: buffers of 16 positions double at the prefill


def proposal_cases() -> dict[str, dict]:
    """Fast vs eager per dtype, drafter layout and route (float64: also two layers, cuBLAS, and the norm
    scales folded into the block's matrices)."""
    from repro.drafters import dflash_fast
    from repro.drafters.dflash import random_dflash_for

    out = {}
    default = dflash_fast.FOLD_NORMS
    dflash_fast.FOLD_NORMS = False  # the scaled rows, but in the one case that folds them
    try:
        for dtype in (torch.float64, torch.float32):
            target = small_target(dtype)
            one = random_dflash_for(target, seed=1, block_size=8)
            chain = shadowed(target, [PROMPT], "dflash_chain", 8, one, max_len=16, fast=True)
            out[f"{str(dtype)[6:]}/one/chain"] = chain
            if dtype == torch.float64:
                two = random_dflash_for(target, seed=2, num_layers=2, block_size=8, target_layer_ids=[0, 2])
                out["float64/two/ddtree"] = shadowed(
                    target, [PROMPT], "ddtree", 8, two, max_len=16, fast=True
                )
                out["float64/one/ddtree/cublas"] = shadowed(
                    target, [PROMPT], "ddtree", 8, one, tiled_width=0, max_len=16, fast=True
                )
                dflash_fast.FOLD_NORMS = True  # the block's normed matrices with the scales folded in
                out["float64/one/ddtree/folded"] = shadowed(
                    target, [PROMPT], "ddtree", 8, one, max_len=16, fast=True
                )
                dflash_fast.FOLD_NORMS = False
    finally:
        dflash_fast.FOLD_NORMS = default
    return out


def ingest_errors() -> dict[str, float]:
    """The context keys/values that a fast and a torch static drafter write for the same feature rows
    (float64; two layers): relative error per row count (3: the GEMV kernels, 8: row-tiled, 300: cuBLAS)."""
    from repro.drafters.dflash import random_dflash_for
    from repro.drafters.static_dflash import StaticDFlash

    target = small_target(torch.float64)
    model = random_dflash_for(target, seed=6, num_layers=2, block_size=8)
    emb, head = target.model.embed_tokens.weight, target.lm_head
    out = {}
    for n in (3, 8, 300):
        rows = torch.randn(n, model.config.feature_size, dtype=torch.float64)
        fast, ref = (StaticDFlash(model, emb, head, 8, 1, max_len=16, fast=f) for f in (True, False))
        fast.load(rows, start=5)
        ref.load(rows, start=5)
        out[str(n)] = max(
            rel(a[:, :, 5 : 5 + n], b[:, :, 5 : 5 + n]) for a, b in zip(fast.stacks, ref.stacks)
        )
    return out


def capture_facts() -> dict[str, object]:
    """The fast step (ingest + block + marginals; block + rows) under CaptureCheck: no hazards, the same
    trace for another accepted path, root and length."""
    from repro.drafters.dflash import DFlashDrafter, random_dflash_for
    from repro.models.graphed import GraphedTarget
    from repro.models.graphs import check_capture
    from repro.tree import Tree

    target = small_target(torch.float32)
    engine = GraphedTarget(target, graphs=False)
    drafter = DFlashDrafter(random_dflash_for(target, seed=3, block_size=8), target, static=True, fast=True)
    ids = list(range(3, 30))
    drafter.begin(ids, None)
    state, ver = engine.prefill(ids, None, drafter.capture_layers)
    drafter.observe_prefill(ver)
    buffers = drafter._static
    traces, hazards = [], []
    for root, path in ((5, [0, 1]), (9, [0, 1, 2, 3])):
        ver = engine.verify(state, Tree.chain([root, 1, 2, 3, 4, 5]), drafter.capture_layers)
        buffers._upload(root, ver.position, path)
        sources = tuple(ver.hidden[i] for i in buffers.layers)
        for probs in (True, False):
            check = check_capture(lambda s=sources, p=probs: buffers._run(s, p))
            hazards += check.hazards
            traces.append(check.trace)
    return {"hazards": hazards, "same_trace": traces[:2] == traces[2:]}


def launch_counts() -> dict[str, dict[str, int]]:
    """Launches (aten ops that launch work + Triton launches) of a step at the tiny family's drafter layout
    (one layer, 4 / 2 heads, two feature layers, block 16; smaller widths: launches do not depend on them),
    eager vs fast: ingest of a 4-row path + block + marginals, the block + marginals alone, and Weaver's
    ingest + block (final-normed rows and logits)."""
    from repro.drafters import ingest_kernels
    from repro.drafters.dflash import DFlashDrafter, random_dflash_for
    from repro.gdn import triton_attention, triton_decode, triton_linear
    from repro.models.graphed import GraphedTarget
    from repro.models.graphs import count_ops
    from repro.tree import Tree

    counter = [0]
    for module in (triton_decode, triton_linear, triton_attention, ingest_kernels):
        for name in dir(module):
            if name.endswith("_kernel"):
                setattr(module, name, CountedLaunches(getattr(module, name), counter))

    def counted(fn) -> dict[str, int]:  # noqa: ANN001
        counter[0] = 0
        ops = count_ops(fn)
        return {"aten": ops, "triton": counter[0], "total": ops + counter[0]}

    target = small_target(torch.float32)
    engine = GraphedTarget(target, graphs=False)
    model = random_dflash_for(target, seed=4, block_size=16)
    ids = list(range(3, 30))
    out: dict[str, dict[str, int]] = {}
    for fast in (False, True):
        drafter = DFlashDrafter(model, target, static=True, fast=fast)
        drafter.begin(ids, None)
        state, ver = engine.prefill(ids, None, drafter.capture_layers)
        drafter.observe_prefill(ver)
        buffers = drafter._static
        ver = engine.verify(state, Tree.chain([5, 1, 2, 3, 4, 5]), drafter.capture_layers)
        buffers._upload(5, ver.position, [0, 1, 2, 3])
        sources = tuple(ver.hidden[i] for i in buffers.layers)
        key = "fast" if fast else "eager"
        run = buffers._run
        out[f"{key}/ingest+block+probs"] = counted(lambda s=sources, r=run: r(s, True))
        out[f"{key}/block+probs"] = counted(lambda r=run: r(None, True))
        out[f"{key}/ingest+block+rows"] = counted(lambda s=sources, r=run: r(s, False))
    return out


# ------------------------------------------------------------------------------------ interpreter


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__)


def test_fast_steps_equal_the_eager_drafters_in_the_interpreter(interpreted):
    cases = interpreted["proposals"]
    assert len(cases) == 5
    assert [key for key, res in cases.items() if res["folded"]] == ["float64/one/ddtree/folded"]
    for key, res in cases.items():
        tol = TOL[torch.float64 if key.startswith("float64") else torch.float32]
        assert res["differ"] == 0 and res["steps"] >= 3 and res["ar"], (key, res)
        assert max(res[k] for k in ("rows", "logits", "probs", "features")) <= tol, (key, res)
        assert res["capacity"] > 16, (key, res)  # buffers grew
    assert min(res["logits"] for res in cases.values()) > 0  # really another path
    assert max(max(res["lengths"]) for res in cases.values()) > 1


def test_fast_ingest_writes_the_torch_keys_and_values(interpreted):
    errors = interpreted["ingest"]
    assert set(errors) == {"3", "8", "300"}  # the GEMV, row-tiled and cuBLAS branches
    assert all(0 < e <= TOL[torch.float64] for e in errors.values()), errors


def test_fast_step_is_capture_safe(interpreted):
    assert interpreted["capture"] == {"hazards": [], "same_trace": True}


def test_fast_step_launches_fewer_kernels(interpreted):
    """The tiny family's layout (the module docstring of repro/drafters/dflash_fast.py has these numbers)."""
    n = {key: v["total"] for key, v in interpreted["launches"].items()}
    assert (n["eager/ingest+block+probs"], n["fast/ingest+block+probs"]) == (124, 14), n
    assert (n["eager/block+probs"], n["fast/block+probs"]) == (83, 9), n
    # rows: the final norm and the root's feature (feat[length - 1] into ``tail``, Weaver's) one launch each,
    # the LM head a matmul; no softmax or top-k
    assert (n["eager/ingest+block+rows"], n["fast/ingest+block+rows"]) == (126, 14), n
    # the block's input rows; q|k|v, attention, o_proj, gate|up, down; the final norm + LM head
    assert interpreted["launches"]["fast/block+probs"]["triton"] == 7, n


# --------------------------------------------------------------------------------------------- CPU


def test_fast_default_and_config_errors(monkeypatch):
    from repro.drafters.dflash import DFlashDrafter, random_dflash_for
    from repro.drafters.fast_rules import GEMV_ROWS
    from repro.drafters.fast_rules import TILED_ROWS as MAX_TILED_ROWS
    from repro.gdn.triton_linear import MAX_ROWS, MAX_VERIFY_ROWS

    assert (GEMV_ROWS, MAX_TILED_ROWS) == (MAX_ROWS, MAX_VERIFY_ROWS)
    target = small_target(torch.float64)
    model = random_dflash_for(target)
    assert not DFlashDrafter(model, target, static=True)._static_buffers().fast  # no graphs on CPU
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="fast=True runs Triton kernels"):
        DFlashDrafter(model, target, static=True, fast=True)._static_buffers()


# ---------------------------------------------------------------------------------------------- GPU


def family(dtype: str):  # noqa: ANN201 - (HybridLM, prompts, the trained DFlash model)
    from repro.drafters.dflash import load_dflash
    from repro.models.target import open_target

    model, tok = open_target("default", dtype=dtype, device="cuda")
    model.set_gdn_backend("triton")
    texts = ["Write a short story about a cat and a boat.", "List three facts about the moon and the tides."]
    prompts = [tok.chat_prompt([{"role": "user", "content": t}]) for t in texts]
    return model, prompts, load_dflash("tiny-qwen35-dflash", dtype=getattr(torch, dtype), device="cuda")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind,fold", [("ddtree", False), ("dflash_chain", True), ("ddtree", True)])
def test_gpu_fast_graphed_proposals_equal_eager_in_float32(kind, fold, monkeypatch):
    from repro.drafters import dflash_fast
    from repro.models.graphed import GraphedTarget

    monkeypatch.setattr(dflash_fast, "FOLD_NORMS", fold)
    target, prompts, model = family("float32")
    engine = GraphedTarget(target)
    res = shadowed(target, prompts, kind, 48, model, engine=engine, max_len=64)
    print(json.dumps(res))
    assert res["folded"] == fold, res
    assert res["differ"] == 0 and res["ar"] and max(res["lengths"]) > 2, res
    assert max(res[k] for k in ("rows", "logits", "probs")) <= 1e-4, res


@pytest.mark.gpu
@cuda
def test_gpu_fast_bf16_within_tolerance_and_no_sync():
    """bf16, graphed: the fast step's marginals are as close to float32's (the torch path's, same inputs) as
    the bf16 torch step's are (twice its error: the fast path rounds less), the default turns the fast path
    on, and a replayed fast step makes no host sync."""
    from repro.drafters.base import DraftContext
    from repro.drafters.dflash import DFlashDrafter
    from repro.models.graphed import GraphedTarget
    from repro.tree import Tree

    target, prompts, model = family("bfloat16")
    target32, _, model32 = family("float32")
    engine = GraphedTarget(target)
    ids = prompts[0]
    drafters = {
        "current": DFlashDrafter(model, target, static=True, fast=False, top_k=4),
        "fast": DFlashDrafter(model, target, static=True, top_k=4),
        "float32": DFlashDrafter(model32, target32, static=True, fast=False, top_k=4),
    }
    assert drafters["fast"]._static_buffers().fast
    state, ver = engine.prefill(ids, None, drafters["fast"].capture_layers)
    out = [int(ver.logits[-1].argmax())]
    probs = {}
    for name, d in drafters.items():
        d.begin(ids, None)
        d.observe_prefill(ver)  # bf16 hidden states, cast to the drafter's dtype
        probs[name] = d.propose(DraftContext(ids, list(out))).probs.float()
    err = {k: (probs[k] - probs["float32"]).abs().max().item() for k in ("current", "fast")}
    print(json.dumps(err))
    assert err["fast"] <= 2 * err["current"] + 1e-3, err
    fast, path = drafters["fast"], list(range(ver.tree.size))
    for step in range(3):  # steps on one verify slot replay one graph: the third runs under the detector
        ctx = DraftContext(ids, list(out), ver, path)
        torch.cuda.synchronize()
        with sync_debug("error" if step == 2 else 0):
            fast.propose(ctx)
        ver = engine.verify(state, Tree.chain([out[-1], 1, 2, 3]), fast.capture_layers)
        path = [0, 1]
        state = engine.commit(state, ver, path)
        out += [1, int(ver.logits[1].argmax())]


def _interpreter_main() -> None:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)  # as the static drafter's steps run
    out = {"proposals": proposal_cases(), "ingest": ingest_errors(), "capture": capture_facts()}
    out["launches"] = launch_counts()
    print(json.dumps(out))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
