"""fla_sd's chain verifier on the static decoder (repro.models.static_chain) and the graphed target.

CPU (float64, no graphs; fla's kernels do not run on CPU, the torch chunked chain form does): chain
slots verify and commit as HybridLM's chain verify + replay commit (logits, captured layers, every
buffer), padding at the chain's end never reaches the accept or the commit, the steps are capture-safe,
``prepare`` captures chain slots for a chain route, and the fla_sd route decodes AR's tokens through
the graphed target (and through the experiment runner's graphed engine).
GPU (``gpu``): float32 on CUDA with graphs, fla's chunk kernel captured in the chain slots' graphs:
fla_sd == AR.
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import SMALL_VOCAB, run_in_interpreter, small_hybrid, small_ids

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.errors import ConfigError
from repro.gdn.backends import chain_function
from repro.models import graphed
from repro.models.graphed import GraphedTarget
from repro.models.graphs import check_capture
from repro.models.hybrid import check_verifier_name
from repro.models.state import GDNLayerState
from repro.models.static import StaticDecoder
from repro.models.static_chain import ChainSlot, chain_evaluator
from repro.models.static_layers import GDNSaved
from repro.models.target import open_target
from repro.reporting.records import compare_to_reference
from repro.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")
VOCAB = SMALL_VOCAB


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def same_state(a, b) -> None:  # noqa: ANN001 - two ModelStates
    assert a.position == b.position
    for x, y in zip(a.layers, b.layers):
        pairs = ((x.recurrent, y.recurrent), (x.conv, y.conv)) if isinstance(x, GDNLayerState) else (
            (x.keys, y.keys), (x.values, y.values)
        )  # fmt: skip
        for p, q in pairs:
            assert p.shape == q.shape and rel(p, q) < 1e-12


# ------------------------------------------------------------------------------- CPU, float64


def test_chain_slots_verify_and_commit_as_hybrid_chain_verify_and_replay():
    """Chains of 2..8 nodes on slots of 2, 4 and 8 (padded at the end), accepted prefixes of every length:
    the graphed target's logits, captured layers and committed buffers equal HybridLM's chain verify and
    replay commit, and the GDN layers ran the chain evaluator (no tree factors)."""
    model = small_hybrid(3)
    target = GraphedTarget(model, max_len=64, max_nodes=16, graphs=False)
    prompt = small_ids(11, 4)
    state, _ = target.prefill(prompt)
    ref, _ = model.prefill(prompt)
    for step, (n, accept) in enumerate(((5, 3), (8, 8), (2, 1), (3, 3), (6, 1), (7, 5))):
        chain = Tree.chain(small_ids(n, 20 + step))
        got = target.verify(state, chain, (1, 3), "replay", "chain")
        want = model.verify(ref, chain, (1, 3), "replay", "chain")
        assert isinstance(got.slot, ChainSlot) and got.slot.size >= n
        assert rel(got.logits, want.logits) < 1e-10
        assert all(rel(got.hidden[i], want.hidden[i]) < 1e-10 for i in (1, 3))
        saved = [s for s in got.slot.saved if isinstance(s, GDNSaved)]
        assert saved and all(s.factors.delta.numel() == 0 for s in saved)  # the chain core ran
        path = list(range(accept))
        state, ref = target.commit(state, got, path), model.commit(ref, want, path)
        assert state.committed_tokens == ref.committed_tokens
        same_state(target.decoder.export(), ref)


def test_chain_verifier_refusals():
    model = small_hybrid(1)
    target = GraphedTarget(model, max_len=32, max_nodes=8, graphs=False)
    state, _ = target.prefill(small_ids(5, 1))
    assert check_verifier_name("chain") == "chain"
    with pytest.raises(ConfigError, match="unknown verifier 'fla'"):
        check_verifier_name("fla")
    with pytest.raises(ConfigError, match="commits by replay only"):
        target.verify(state, Tree.chain([1, 2, 3]), (), "closed_form", "chain")
    with pytest.raises(ConfigError, match="verifies chains only"):
        target.verify(state, Tree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 0])), (), "replay", "chain")
    slot = target._slot(4, False, (), "chain")
    with pytest.raises(ConfigError, match="verifies chains only"):
        slot.set_tree(Tree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 0])), pad=True)
    with pytest.raises(ConfigError, match="chains of up to 4 nodes"):
        slot.set_tree(Tree.chain([1] * 5), pad=True)
    slot.set_tree(Tree.chain([1, 2, 3]), pad=True)
    target.decoder.verify(slot)
    with pytest.raises(ConfigError, match="commits by replay only"):
        target.decoder.commit(slot, "closed_form")
    with pytest.raises((ConfigError, IndexError)):
        slot.set_accepted([0, 1, 2, 3])  # the pad node is not part of the real chain


def test_padding_never_enters_the_device_accept():
    """A chain of 3 whose every node's argmax is token 0 (so are the pad tokens): the device accept stops
    at the last real node, the bonus is that node's argmax, and the commit folds in 3 tokens."""
    model = small_hybrid(2)
    target = GraphedTarget(model, max_len=32, max_nodes=8, graphs=False)
    state, _ = target.prefill(small_ids(6, 2))
    slot = target._slot(8, False, (), "chain")
    slot.set_tree(Tree.chain([5, 0, 0]), pad=True)
    dec = target.decoder
    logits = dec.verify(slot)
    logits.zero_()[:, 0] = 1.0  # every node predicts token 0
    dec.accept(slot)
    assert slot.accepted() == ([0, 1, 2], 0)
    before = int(dec.length)
    dec.commit(slot, "replay")
    assert int(dec.length) == before + 3


def test_chain_slot_steps_are_capture_safe():
    """Chain verify (captured layers) and replay commit: no host read or data-dependent shape, and the
    same ops on the same shapes for a padded and a full chain on one slot."""
    model = small_hybrid(7)
    target = GraphedTarget(model, max_len=32, max_nodes=16, graphs=False)
    target.prefill(small_ids(6, 8))
    traces = []
    for n in (3, 4):
        slot = target._slot(4, False, (1,), "chain")
        slot.set_tree(Tree.chain(small_ids(n, n)), pad=True)
        verify = check_capture(lambda s=slot: target.decoder.verify(s))
        slot.set_accepted(list(range(n - 1)))
        with target._preserved():
            commit = check_capture(lambda s=slot: target.decoder.commit(s, "replay"))
        assert verify.hazards == [] and commit.hazards == []
        traces.append((verify.trace, commit.trace))
    assert traces[0] == traces[1]


def test_prepare_captures_chain_slots(monkeypatch):
    """With graphs (a stand-in for GraphedCall on CPU), ``prepare(chain=True)`` captures each chain slot's
    verify, replay commit and greedy accept+commit up to ``max_size`` (with ``graphed.FUSE_ACCEPT``, the
    default, also the pipelined loop's verify + accept + commit graph), and no tree slot when no strategy
    is asked for."""
    import repro.models.graphs as graphs

    monkeypatch.setattr(graphs, "GraphedCall", lambda fn, device: fn)
    target = GraphedTarget(small_hybrid(4), max_len=32, max_nodes=16, graphs=False)
    target.prefill(small_ids(4, 4))
    target.graphs = True
    target.prepare((), (2,), max_size=8, chain=True)
    ar = {("ar", size, first) for size in (graphed.AR_GROUP, 1) for first in (True, False)}  # AR's groups
    assert ar <= set(target._calls)
    keys = set(target._calls) - {("decode",)} - ar
    sizes = (1, 2, 3, 4, 5, 8)  # SLOT_SIZES up to 8
    verifies = {("verify", s, "chain") for s in sizes}
    commits = {(step, s, "chain", "replay") for s in sizes for step in ("commit", "greedy")}
    fused = {("fused_greedy", s, "chain+accept", "replay") for s in sizes} if graphed.FUSE_ACCEPT else set()
    assert keys == verifies | commits | fused
    assert all(isinstance(target._slots[(s, "chain")], ChainSlot) for s in sizes)
    assert target.captures == len(keys) + 1 + len(ar)


def test_chain_evaluator_choice():
    cpu = torch.device("cpu")
    assert chain_evaluator("triton", cpu) is chain_function("reference", cpu)  # interpreter: torch form
    assert chain_evaluator("reference", cpu) is chain_function("reference", cpu)


def fla_sd_outputs(device: str, dtype: str, prompts: int, new_tokens: int, **graphed: object) -> list[tuple]:
    """(AR tokens, fla_sd tokens through the graphed target) per prompt of the default family."""
    from repro.data.suites import format_turn, load_suite

    model, tok = open_target("default", dtype=dtype, device=device)
    if device == "cuda":
        model.set_gdn_backend("triton")
    target = GraphedTarget(model, **graphed)  # type: ignore[arg-type]
    vocab = model.config.vocab_size
    ar = build_route({"name": "ar", "kind": "ar"}, vocab, "greedy", 0.0, 42)
    route = build_route(
        {"name": "f", "kind": "fla_sd", "k": 4}, vocab, "greedy", 0.0, 42, target=model, family="tiny-qwen35"
    )
    assert route.verifier == "chain" and route.commit == "replay"
    target.prepare((), route.drafter.capture_layers, 64, chain=True)
    cases = [
        tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}])
        for suite in ("mt_bench", "gsm8k", "humaneval")
        for p in load_suite(suite, 1, 42)
    ][:prompts]
    rows = []
    for p in cases:
        ref = generate(model, p, ar, new_tokens).output_ids
        rows.append((ref, generate(target, p, route, new_tokens, reference_ids=ref).output_ids))
    return rows, target


def test_fla_sd_through_the_graphed_target_equals_ar():
    rows, target = fla_sd_outputs("cpu", "float64", 3, 24, max_len=256, max_nodes=64)
    for ref, got in rows:
        assert got == ref, compare_to_reference(got, ref)
    assert any(key[1] == "chain" for key in target._slots)  # verified on chain slots


def test_the_experiment_runner_runs_fla_sd_on_the_graphed_engine():
    from repro.harness.experiment import resolve
    from repro.harness.runner import ExperimentRunner

    routes = [{"name": "ar", "kind": "ar"}, {"name": "f", "kind": "fla_sd", "k": 3}]
    raw = {"name": "g", "device": "cpu", "dtype": "float64", "suites": ["gsm8k"], "limit": 1}
    raw["routes"] = routes
    runner = ExperimentRunner(resolve(raw, {"engine": "graphed"}))
    assert isinstance(runner.target, GraphedTarget) and runner.routes[1].verifier == "chain"


# --------------------------------------------- the Triton/fla kernel path through Triton's interpreter


def _interpreter_case(fused: bool) -> dict[str, float]:
    """A chain slot of a kernel="triton" decoder (``fused``: the fused Triton prologue and gated norm
    around the chain core; unfused, the torch glue runs in the float64 tests) on CPU tensors, float32:
    verify, then the replay commit through fla's fused recurrence, vs HybridLM's chain verify and replay
    commit."""
    model = small_hybrid(11).float()
    state, _ = model.prefill(small_ids(9, 12))
    chain = Tree.chain(small_ids(5, 13))
    ver = model.verify(state, chain, (), "replay", "chain")
    dec = StaticDecoder(model, max_len=32, max_nodes=8, kernel="triton", fused=fused)
    dec.load(state)
    slot = ChainSlot(dec, 8)
    slot.set_tree(chain, pad=True)
    errs = {"verify": rel(dec.verify(slot)[:5], ver.logits)}
    gdn_saved = [saved for saved in slot.saved if isinstance(saved, GDNSaved)]
    errs["tree_core_ran"] = float(not gdn_saved or any(saved.factors.delta.numel() for saved in gdn_saved))
    slot.set_accepted([0, 1, 2])
    dec.commit(slot, "replay")
    ref, got = model.commit(state, ver, [0, 1, 2]), dec.export()
    errs["commit"] = max(
        rel(u, v) for x, y in zip(got.layers, ref.layers) for u, v in zip(vars(x).values(), vars(y).values())
    )
    return errs


def test_chain_slots_on_the_triton_kernel_path_through_the_interpreter():
    errs = run_in_interpreter(__file__, "--interpret", needs=("triton", "fla"))
    for case, found in errs.items():
        assert all(err < 1e-5 for err in found.values()), (case, found)


# ------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fla_sd_through_graphs_equals_ar_in_float32():
    """float32 on CUDA, CUDA graphs: fla_sd's chain slots (fla's chunk kernel, autotuned in GraphedCall's
    warm-up before capture; replay through fla's fused recurrence) decode AR's tokens."""
    rows, target = fla_sd_outputs("cuda", "float32", 2, 32)
    assert target.captures > 0
    chain_slots = [slot for key, slot in target._slots.items() if key[1] == "chain"]
    assert chain_slots and all(s.evaluate is chain_function("triton", target.device) for s in chain_slots)
    assert ("verify", 8, "chain") in target._calls  # 5 nodes (k = 4) on the slot of 8
    for ref, got in rows:
        assert got == ref, compare_to_reference(got, ref)


if __name__ == "__main__" and sys.argv[-1] == "--interpret":
    import json

    import repro.gdn.triton_common  # noqa: F401 - applies the interpreter's NumPy patch before fla loads

    torch.set_num_threads(1)
    print(json.dumps({"fused": _interpreter_case(True)}))
