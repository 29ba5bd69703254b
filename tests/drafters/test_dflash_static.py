"""The DFlash drafter on static buffers (repro.drafters.static_dflash) against the eager drafter.

CPU, float64: step by step over whole generations of the trained tiny pair (varied accepted paths),
the static drafter's block rows, logits, marginals, top ids and features equal the eager drafter's,
through buffer growth and prefills of several chunks, on both a HybridLM and a graphed target; the
step is capture-safe (no host read, no data-dependent shape, the same ops on the same shapes whatever
the data); routes on the graphed target switch to it and reproduce AR. GPU (``gpu``): the same in
float32 with CUDA graphs, and ``propose`` makes no host sync.
"""

from __future__ import annotations

import pytest
import torch
from conftest import sync_debug

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.drafters.base import DraftContext
from repro.drafters.dflash import DFlashDrafter, load_dflash
from repro.models.graphed import GraphedTarget
from repro.models.graphs import check_capture
from repro.models.loading import load_target
from repro.models.tokenizer import load_tokenizer
from repro.tree import Tree

FAMILY = "tiny-qwen35"
TOL = 1e-10
MAX_NEW = 48
LONG = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle, then explain in "
    "three numbered steps how tides work and why the moon matters for them. Keep the story under two "
    "hundred words, give the keeper a name, and end with a question for the reader about the sea."
)


def _load(dtype: torch.dtype, device: str = "cpu"):
    target = load_target(FAMILY, dtype=dtype, device=device)
    drafter = load_dflash(f"{FAMILY}-dflash", dtype=dtype, device=device)
    return target, drafter


@pytest.fixture(scope="module")
def pair():
    return _load(torch.float64)


@pytest.fixture(scope="module")
def prompts():
    tok = load_tokenizer(FAMILY)
    ids = [tok.chat_prompt([{"role": "user", "content": t}]) for t in ("What is 7 times 8?", LONG)]
    assert len(ids[1]) > 64  # more than one prefill chunk
    return ids


@pytest.fixture(scope="module")
def ar_outputs(pair, prompts):
    """AR's tokens (the graphed target's equal HybridLM's in float64: tests/models/test_graphed.py)."""
    target, _ = pair
    ar = build_route({"kind": "ar"}, target.config.vocab_size, "greedy", 0.0, 0)
    return [generate(target, ids, ar, MAX_NEW).output_ids for ids in prompts]


def _twin(static: DFlashDrafter, eager: DFlashDrafter, tol: float, log: list[int]) -> None:
    """Make ``static``'s propose check itself against ``eager`` on the same context, every step: block
    rows, logits, marginals, top ids, features. Steps alternate which call ingests the accepted path
    (``propose``: the ingest + marginals graph, or ``block_rows``: the ingest graph Weaver uses)."""
    propose = static.propose

    def rows_of(drafter, ctx):
        return [t.clone() for t in drafter.block_rows(ctx)]

    def checked(ctx):
        first = len(log) % 2
        if first:
            rows, ref_rows = rows_of(static, ctx), rows_of(eager, ctx)
        got, ref = propose(ctx), eager.propose(ctx)
        if not first:
            rows, ref_rows = rows_of(static, ctx), rows_of(eager, ctx)
        for a, b in zip(rows + [got.probs], ref_rows + [ref.probs]):
            assert (a - b).abs().max().item() < tol
        # the same ids, up to ties within tol (exactly the same ids in float64)
        chosen = ref.probs.gather(-1, got.top_ids) - ref.probs.gather(-1, ref.top_ids)
        assert chosen.abs().max().item() < tol
        assert static.committed == eager.committed
        assert (static.features - eager.features).abs().max().item() < tol
        log.append(len(ctx.accepted_path))
        return got

    static.propose = checked
    begin = static.begin

    def both_begin(prompt_ids, reference_ids):
        begin(prompt_ids, reference_ids)
        eager.begin(prompt_ids, reference_ids)

    static.begin = both_begin
    observe = static.observe_prefill

    def both_observe(ver):
        observe(ver)
        eager.observe_prefill(ver)

    static.observe_prefill = both_observe


CASES = [  # route kind, target, static: True, or None (auto: switched on by the graphed target)
    ("ddtree", "hybrid", True),
    ("ddtree", "graphed", True),
    ("dflash_chain", "graphed", True),
    ("ddtree", "graphed", None),
]


@pytest.mark.parametrize("kind,engine,mode", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_static_drafter_equals_eager_step_by_step(pair, prompts, ar_outputs, kind, engine, mode, monkeypatch):
    import repro.decoding.engine

    # the step-by-step loop: the twin checks every propose (the pipelined loop's propose_after:
    # tests/decoding/test_pipelined.py)
    monkeypatch.setattr(repro.decoding.engine, "PIPELINE", False)
    target, model = pair
    spec = {"name": "r", "kind": kind, "drafter": "random"}
    if kind == "ddtree":
        spec["budget"] = 24
    route = build_route(spec, target.config.vocab_size, "greedy", 0.0, 0, target=target)
    static = DFlashDrafter(model, target, static=mode, max_len=16, top_k=3)
    eager = DFlashDrafter(model, target, static=False, top_k=3)
    route.drafter = static
    log: list[int] = []
    _twin(static, eager, TOL, log)
    if mode:
        assert static._static is not None and static._static.max_len == 32  # at least two blocks
    for ids, ar in zip(prompts, ar_outputs):
        decoder = GraphedTarget(target, graphs=False) if engine == "graphed" else target
        assert generate(decoder, ids, route, MAX_NEW).output_ids == ar
        assert static.on_static
    assert len(set(log)) >= 3  # accepted paths of several lengths
    assert static._static.max_len == 256  # grew in the long prompt's prefill (128) and while decoding (256)


def test_graphed_target_switches_routes_to_the_static_buffers(pair, prompts, ar_outputs):
    """Routes built as usual (static=None) draft on the static buffers once the graphed target's
    verifications arrive, and stay token-identical to AR; on a HybridLM they stay eager."""
    target, _ = pair
    engine = GraphedTarget(target, graphs=False)
    vocab = target.config.vocab_size
    for spec in ({"kind": "dflash_chain"}, {"kind": "ddtree", "budget": 16}):
        route = build_route(spec, vocab, "greedy", 0.0, 0, target=target, family=FAMILY)
        for ids, ar in zip(prompts, ar_outputs):
            res = generate(engine, ids, route, 32)
            assert res.output_ids == ar[:32]
            assert route.drafter.on_static
            assert route.drafter.committed > len(ids)  # the last verification is not ingested yet
        generate(target, prompts[0], route, 8)
        assert not route.drafter.on_static


def _prefilled(engine, drafter: DFlashDrafter, ids: list[int]):
    """Prefill ``ids`` chunk by chunk into ``engine`` and ``drafter``: (state, last verification)."""
    drafter.begin(ids, None)
    state = None
    for start in range(0, len(ids), 64):
        state, ver = engine.prefill(ids[start : start + 64], state, drafter.capture_layers)
        drafter.observe_prefill(ver)
    return state, ver


def test_step_is_capture_safe(pair, prompts):
    """The step (ingest of a padded path + block) reads nothing on the host and runs the same ops on
    the same shapes for different paths, roots and lengths."""
    target, model = pair
    engine = GraphedTarget(target, graphs=False)
    drafter = DFlashDrafter(model, target, static=True)
    state, _ = _prefilled(engine, drafter, prompts[1])
    buffers = drafter._static
    traces = []
    for root, path in ((5, [0, 1]), (9, [0, 1, 2, 3])):
        ver = engine.verify(state, Tree.chain([root, 1, 2, 3, 4, 5]), drafter.capture_layers)
        buffers._upload(root, ver.position, path)
        sources = tuple(ver.hidden[i] for i in buffers.layers)
        check = check_capture(lambda s=sources: buffers._run(s, True))
        assert check.hazards == [] and check_capture(lambda: buffers._run(None, False)).hazards == []
        traces.append(check.trace)
    assert traces[0] == traces[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_graphs_equal_eager_in_float32_and_propose_never_syncs():
    target, model = _load(torch.float32, "cuda")
    target.set_gdn_backend("triton")
    ids = load_tokenizer(FAMILY).chat_prompt([{"role": "user", "content": LONG}])
    engine = GraphedTarget(target)
    vocab = target.config.vocab_size
    spec = {"kind": "ddtree", "budget": 24, "drafter": "random"}
    route = build_route(spec, vocab, "greedy", 0.0, 0, target=target)
    static = DFlashDrafter(model, target, static=True, max_len=64, top_k=3)
    route.drafter = static
    log: list[int] = []
    _twin(static, DFlashDrafter(model, target, static=False, top_k=3), 1e-4, log)
    res = generate(engine, ids, route, 64)
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 0)
    assert res.output_ids == generate(engine, ids, ar, 64).output_ids
    assert static._static.graphs and static._static.captures >= 2 and len(set(log)) >= 2

    # steps on the same verify slot replay one graph: the third propose runs under the sync detector
    drafter = DFlashDrafter(model, target, static=True)
    state, ver = _prefilled(engine, drafter, ids)
    out = [int(ver.logits[-1].argmax())]
    path = list(range(ver.tree.size))
    for step in range(3):
        ctx = DraftContext(ids, list(out), ver, path)
        torch.cuda.synchronize()
        with sync_debug("error" if step == 2 else 0):
            proposal = drafter.propose(ctx)
        assert proposal.top_ids.is_cuda and proposal.probs.is_cuda
        ver = engine.verify(state, Tree.chain([out[-1], 1, 2, 3]), drafter.capture_layers)
        path = [0, 1]
        state = engine.commit(state, ver, path)
        out += [1, int(ver.logits[1].argmax())]
    assert drafter._static.captures == 2  # the block after prefill, then ingest + block on the 4-node slot
