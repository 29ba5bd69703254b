"""GraphedTarget (repro.models.graphed): HybridLM's decoding API on the static decoder.

CPU (float64, eager static path, no graphs): every route kind of the smoke experiment decodes the
same tokens through the graphed target as through HybridLM and as AR; padding a tree to its slot
size leaves the real nodes' logits and captured hidden states unchanged; the slot verify with
captured layers and the commits are capture-safe; stale states are refused.
GPU (``gpu``): float32 greedy decoding through the graphed target (CUDA graphs) equals AR for every
route of the gpu-smoke experiment, and the graphs were captured.
"""

from __future__ import annotations

import pytest
import torch
from conftest import SMALL_VOCAB, random_tree, small_hybrid, small_ids, sync_debug

from repro.data.suites import format_turn, load_suite
from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.errors import ConfigError
from repro.harness.experiment import load_experiment
from repro.models import graphed as graphed_module
from repro.models import graphs as graphs_module
from repro.models.graphed import GraphedState, GraphedTarget, resolve_engine, slot_size
from repro.models.graphs import check_capture
from repro.models.target import open_target
from repro.reporting.records import compare_to_reference
from repro.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")
F64 = torch.float64
VOCAB = SMALL_VOCAB
NEW_TOKENS = 24


def random_token_tree(n: int, kind: str, seed: int) -> Tree:
    gen = torch.Generator().manual_seed(seed)
    parents = random_tree(n, kind, gen)
    parents[0] = -1
    return Tree(torch.randint(0, VOCAB, (n,), generator=gen), parents)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def prompts(tok, per_suite: int = 1) -> list[list[int]]:  # noqa: ANN001 - the family tokenizer
    return [
        tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}])
        for suite in ("mt_bench", "gsm8k", "humaneval")
        for p in load_suite(suite, per_suite, 42)
    ]


def decode_routes(device: str, dtype: str, experiment: str, **graphed: object) -> dict[str, list[tuple]]:
    """Per route of ``experiment``: (AR tokens, eager tokens or None, graphed tokens) per prompt."""
    model, tok = open_target("default", dtype=dtype, device=device)
    if device == "cuda":
        model.set_gdn_backend("triton")
    target = GraphedTarget(model, **graphed)  # type: ignore[arg-type]
    vocab = model.config.vocab_size
    ar = build_route({"name": "ar", "kind": "ar"}, vocab, "greedy", 0.0, 42)
    out: dict[str, list[tuple]] = {}
    cases = prompts(tok, 1 if device == "cpu" else 2)
    refs = [generate(model, p, ar, NEW_TOKENS).output_ids for p in cases]
    for spec in load_experiment(experiment)["routes"]:
        route = build_route(spec, vocab, "greedy", 0.0, 42, target=model, family="tiny-qwen35")
        target.prepare((route.commit,), route.drafter.capture_layers if route.drafter else (), 64)
        rows = []
        for p, ref in zip(cases, refs):
            eager = (
                generate(model, p, route, NEW_TOKENS, reference_ids=ref).output_ids
                if device == "cpu"
                else None
            )
            rows.append((ref, eager, generate(target, p, route, NEW_TOKENS, reference_ids=ref).output_ids))
        out[spec["name"]] = rows
    out["_captures"] = [(target.captures,)]
    return out


# ------------------------------------------------------------------------------- CPU, float64


def test_every_smoke_route_through_the_graphed_target_equals_eager_and_ar():
    """ar, synthetic chain/tree, the three commits, dflash_chain, ddtree, eagle_chain, eagle_tree and
    weaver on the trained default target: identical tokens on the graphed target, HybridLM and AR."""
    results = decode_routes("cpu", "float64", "smoke", max_len=128, max_nodes=64)
    kinds = {r["kind"] for r in load_experiment("smoke")["routes"]}
    assert {"ar", "synthetic_chain", "synthetic_tree", "dflash_chain", "ddtree", "eagle_chain"} <= kinds
    assert {"eagle_tree", "weaver"} <= kinds
    for name, rows in results.items():
        if name == "_captures":
            continue
        for ref, eager, graphed in rows:
            assert graphed == eager, f"{name}: graphed vs eager {compare_to_reference(graphed, eager)}"
            assert graphed == ref, f"{name}: graphed vs AR {compare_to_reference(graphed, ref)}"
    assert results["_captures"] == [(0,)]  # no graphs on CPU: the same static path, eagerly


def test_fused_glue_only_at_small_widths(monkeypatch):
    """The graphed engine's kernel rule: the GEMV decode matmuls wherever asked (half precision on CUDA by
    default), the fused decode layer and the row-tiled verify linears only up to SMALL_WIDTH (measured:
    they lose at the 1.3B width), decode attention on the tree kernel above it (won at the 27B shape);
    without CUDA graphs, none of them by default."""
    from repro.gdn import backends
    from repro.models.config import ATTENTION, GDN, HybridConfig
    from repro.models.graphed import SMALL_WIDTH
    from repro.models.hybrid import HybridLM

    monkeypatch.setattr(backends, "interpreting", lambda: True)  # decoders built, never run (no CUDA)

    def target(hidden: int, gemv: bool | None) -> GraphedTarget:
        cfg = HybridConfig(
            vocab_size=SMALL_VOCAB, hidden_size=hidden, intermediate_size=64, layer_types=[GDN, ATTENTION],
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        )  # fmt: skip
        model = HybridLM(cfg).eval()
        for layer in model.model.layers:
            if layer.layer_type == GDN:
                layer.linear_attn.backend = "triton"
        return GraphedTarget(model, max_len=16, max_nodes=4, graphs=False, gemv=gemv)

    for hidden, small in ((32, True), (SMALL_WIDTH + 32, False)):
        dec = target(hidden, True).decoder
        assert (dec.gemv, dec.fuse_decode, dec.fuse_verify) == (True, small, small), hidden
        assert dec.tree_attention_decode == (not small), hidden  # wide: decode attention on the tree kernel
    dec = target(32, None).decoder  # no graphs: cuBLAS and the plain decode
    assert (dec.gemv, dec.fuse_decode, dec.fuse_verify, dec.tree_attention_decode) == (False,) * 4


@pytest.mark.parametrize("kind", ["random", "forest", "chain"])
def test_padding_leaves_real_nodes_unchanged(kind):
    """A tree of 11 nodes verified on slots of 11, 16 and 64 nodes (pads: extra roots, token 0): the real
    nodes' logits and captured layer outputs equal the unpadded ones and HybridLM's."""
    model = small_hybrid(1)
    state, _ = model.prefill(small_ids(9, 2))
    tree = random_token_tree(11, kind, 3)
    ref = model.verify(state, tree, capture=(0, 3))
    from repro.models.static import StaticDecoder, TreeSlot

    dec = StaticDecoder(model, max_len=32, max_nodes=64)
    dec.load(state)
    out = {}
    for size in (11, 16, 64):
        slot = TreeSlot(dec, size, capture=(0, 3))
        slot.set_tree(tree, pad=size != 11)
        logits = dec.verify(slot)[:11]
        out[size] = (logits, {i: slot.hidden[i][:11] for i in (0, 3)})
        assert rel(logits, ref.logits) < 1e-10
        for i in (0, 3):
            assert rel(slot.hidden[i][:11], ref.hidden[i]) < 1e-10
    for size in (16, 64):
        assert torch.allclose(out[size][0], out[11][0], rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="up to 8 nodes"):
        TreeSlot(dec, 8).set_tree(tree, pad=True)


def test_graphed_target_steps_match_hybrid_and_refuse_stale_states():
    """verify/commit of the graphed target against HybridLM on a few trees and strategies; the
    one-node tree (decode step) consumes its state; stale handles are refused."""
    model = small_hybrid(5)
    target = GraphedTarget(model, max_len=16, max_nodes=32)
    prompt = small_ids(13, 6)
    state, ver = target.prefill(prompt[:7])
    state, ver = target.prefill(prompt[7:], state)  # a second chunk continues the first
    ref, ref_ver = model.prefill(prompt)
    assert rel(ver.logits[-1], ref_ver.logits[-1]) < 1e-10 and state.position == 13
    for step, strategy in enumerate(("closed_form", "replay", "snapshot", "closed_form")):
        tree = random_token_tree(9, "mixed", 10 + step)
        got = target.verify(state, tree, (1,), strategy)
        want = model.verify(ref, tree, (1,), strategy)
        assert rel(got.logits, want.logits) < 1e-10 and rel(got.hidden[1], want.hidden[1]) < 1e-10
        path = tree.path_to(int(tree.depth.argmax()))
        again = target.verify(state, tree, (1,), strategy)  # verify leaves the state alone
        assert rel(again.logits, want.logits) < 1e-10
        state, ref = target.commit(state, again, path), model.commit(ref, want, path)
        assert state.committed_tokens == ref.committed_tokens
    assert target.max_len > 16  # grown past its first capacity, the state carried over
    single = target.verify(state, Tree.single(5))
    assert rel(single.logits, model.verify(ref, Tree.single(5)).logits) < 1e-10
    with pytest.raises(ValueError, match="stale state"):
        target.verify(state, Tree.single(5))  # the one-node verification folded the node in
    with pytest.raises(ValueError, match="path \\[0\\]"):
        target.commit(state, single, [])
    new = target.commit(state, single, [0])
    with pytest.raises(ValueError, match="stale state"):
        target.verify(GraphedState(new.position, [], new.epoch - 1), Tree.single(5))
    assert new.position == state.position + 1


def test_slots_grow_their_captured_layers():
    """A slot made for fewer captured layers is made again when a verify (or prepare) asks for more (the
    H200 run's KeyError: prepare recorded the union before the slot was remade)."""
    model = small_hybrid(9)
    target = GraphedTarget(model, max_len=32, max_nodes=8)
    state, _ = target.prefill(small_ids(6, 9))
    tree = random_token_tree(5, "mixed", 4)
    assert set(target.verify(state, tree, (1,)).hidden) == {1}
    target.prepare(capture=(1, 2))  # no graphs on CPU: records nothing
    for capture in ((2,), (1, 3), (0,)):
        got = target.verify(state, tree, capture)
        want = model.verify(target._exported(state), tree, capture)
        assert set(got.hidden) == set(capture)
        assert all(rel(got.hidden[i], want.hidden[i]) < 1e-10 for i in capture)


def test_slot_steps_with_captured_layers_are_capture_safe():
    """The slot verify with captured hidden states and every commit: no host read, no data-dependent
    shape, and the same ops on the same shapes for trees of different sizes padded to one slot."""
    model = small_hybrid(7)
    target = GraphedTarget(model, max_len=32, max_nodes=16)
    state, _ = target.prefill(small_ids(6, 8))
    traces = []
    for n in (6, 8):  # one slot of 8 nodes, padded and not
        tree = random_token_tree(n, "mixed", n)
        for snapshots, strategies in ((False, ("replay", "closed_form")), (True, ("snapshot",))):
            slot = target._slot(slot_size(n, 16), snapshots, (1, 3))
            slot.set_tree(tree, pad=True)
            verify = check_capture(lambda s=slot: target.decoder.verify(s))
            assert verify.hazards == [] and set(slot.hidden) == {1, 3}
            traces.append(verify.trace)
            slot.set_accepted(tree.path_to(n - 1))
            for strategy in strategies:
                with target._preserved():
                    commit = check_capture(lambda s=slot, st=strategy: target.decoder.commit(s, st))
                assert commit.hazards == [], (strategy, commit.hazards)
    assert traces[0] == traces[2] and traces[1] == traces[3]


def test_a_root_and_a_power_of_two_budget_fill_their_slot(monkeypatch):
    """Trees of 2^k + 1 nodes (a root and a budget of 2^k) verify on a slot of exactly that size, whose
    verify and commit graphs ``prepare`` captured ahead: verifying and committing one captures nothing."""
    import repro.models.graphs as graphs

    assert [slot_size(n, 1024) for n in (2, 3, 5, 9, 17, 33, 65, 129)] == [2, 3, 5, 9, 17, 33, 65, 129]
    assert [slot_size(n, 1024) for n in (6, 34, 66, 130)] == [8, 64, 128, 256]
    monkeypatch.setattr(graphs, "GraphedCall", lambda fn, device: fn)
    target = GraphedTarget(small_hybrid(2), max_len=64, max_nodes=64, graphs=False)
    state, _ = target.prefill(small_ids(5, 3))
    target.graphs = True
    target.prepare(("closed_form",), (), 64)
    captured = target.captures
    tree = random_token_tree(33, "mixed", 33)
    ver = target.verify(state, tree)
    assert ver.slot is not None and ver.slot.size == 33
    target.commit(state, ver, tree.path_to(32))
    assert target.captures == captured


def test_engine_names():
    assert resolve_engine("auto", "cpu") == "eager" and resolve_engine("auto", "cuda") == "graphed"
    assert resolve_engine("graphed", "cpu") == "graphed"
    with pytest.raises(ConfigError, match="unknown engine 'fast'"):
        resolve_engine("fast", "cpu")
    with pytest.raises(ConfigError, match="exceeds the graphed engine's 16 nodes"):
        slot_size(17, 16)


# ------------------------------------------------------------ the greedy device path (one read a step)


class MarginalDrafter:
    """Device proposals as the graphed drafters give them: per-depth marginals (``probs``) and their
    top ids (``top_ids``), no host candidates; the marginals put most mass on AR's next tokens."""

    capture_layers: tuple[int, ...] = ()

    def __init__(self, depth: int, seed: int, vocab: int = VOCAB) -> None:
        self.depth, self.vocab, self.gen = depth, vocab, torch.Generator().manual_seed(seed)

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        self.reference = list(reference_ids or [])

    def propose(self, ctx):  # noqa: ANN001, ANN201 - the Drafter protocol
        from repro.drafters.base import Proposal

        probs = torch.softmax(torch.randn(self.depth, self.vocab, generator=self.gen, dtype=F64), dim=-1)
        ahead = self.reference[ctx.next_position : ctx.next_position + self.depth]
        for d, t in enumerate(ahead):
            probs[d, t] += 0.5 if d % 3 < 2 else 0.0
        probs = probs / probs.sum(-1, keepdim=True)
        return Proposal(probs=probs, top_ids=probs.topk(3, dim=-1).indices)


def device_routes(vocab: int = VOCAB) -> list:
    from repro.decoding.acceptance import TargetMatch
    from repro.decoding.engine import Route
    from repro.decoding.tree_builders import BestFirst, Chain, SingleNode

    rule = TargetMatch(0.0, 0)
    return [
        Route("ar", None, SingleNode(), rule),
        Route("chain", MarginalDrafter(5, 1, vocab), Chain(), rule),
        Route("ddtree", MarginalDrafter(6, 2, vocab), BestFirst(20), rule, commit="replay"),
        Route("ddtree-snap", MarginalDrafter(4, 3, vocab), BestFirst(9), rule, commit="snapshot"),
    ]


def test_greedy_graphed_steps_read_the_device_once_and_keep_the_records(monkeypatch):
    """AR, a device chain and device DDTrees (BestFirst on the marginals) on the graphed target: the
    same tokens, accepted paths, accepted lengths and tree sizes as the host path on HybridLM (float64),
    exactly one ``read_back`` per step (AR: per group of decode steps), and neither the host acceptance walk
    nor the host commit runs."""
    import repro.models.graphed as graphed
    from repro.decoding.acceptance import TargetMatch
    from repro.decoding.engine import STAGES, device_greedy

    model = small_hybrid(11)
    target = GraphedTarget(model, max_len=64, max_nodes=32)
    prompt = small_ids(10, 12)
    reference = generate(model, prompt, device_routes()[0], 30).output_ids
    eager = {r.name: generate(model, prompt, r, 30, reference_ids=reference) for r in device_routes()}
    reads = []
    real_read = graphed.read_back
    monkeypatch.setattr(graphed, "read_back", lambda h, c: reads.append(h.numel()) or real_read(h, c))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the host path ran on the device path")

    monkeypatch.setattr(TargetMatch, "accept", refuse)
    monkeypatch.setattr(GraphedTarget, "commit", refuse)
    for route in device_routes():
        assert device_greedy(target, route) and not device_greedy(model, route)
        reads.clear()
        got = generate(target, prompt, route, 30, reference_ids=reference)
        want = eager[route.name]
        assert got.output_ids == want.output_ids == reference, route.name
        assert got.accepted_paths == want.accepted_paths, route.name
        assert (got.accepted_lengths, got.tree_sizes) == (want.accepted_lengths, want.tree_sizes)
        if route.drafter:
            assert len(reads) == got.steps, (route.name, len(reads), got.steps)
        else:  # AR reads each group of decode steps once, a group behind the device (greedy_decode)
            assert sum(reads) == got.steps and max(reads) == graphed.AR_GROUP, reads
            assert len(reads) < got.steps, reads
        assert set(got.device_stage_s) == set(STAGES) == set(got.stage_s)
        assert got.device_stage_s == got.stage_s  # CPU: the device times are the clocks'
    assert max(eager["ddtree"].accepted_lengths) > 2 and max(eager["ddtree"].tree_sizes) == 21


def test_greedy_graphed_steps_read_nothing_else_on_the_host(monkeypatch):
    """Every aten op of the device-path steps under CaptureCheck (the CPU stand-in for a sync check):
    outside ``read_back`` (and prefill with its first pick, before the steps; slots made on first use)
    no op reads a device value on the host, makes a data-dependent shape or copies host data in."""
    import repro.decoding.engine as engine
    import repro.models.graphed as graphed
    from repro.decoding.acceptance import TargetMatch
    from repro.models.graphs import CaptureCheck

    def unchecked(fn):  # noqa: ANN001, ANN202
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(graphed, "read_back", unchecked(graphed.read_back))
    monkeypatch.setattr(engine, "_prefill", unchecked(engine._prefill))
    monkeypatch.setattr(TargetMatch, "pick", unchecked(TargetMatch.pick))
    target = GraphedTarget(small_hybrid(11), max_len=64, max_nodes=32)
    prompt = small_ids(10, 12)
    for route in device_routes()[1:]:  # AR's one-node tree is a host Tree (its token goes in by fill_)
        propose = route.drafter.propose
        route.drafter.propose = unchecked(propose)
        # the slots are made first (prepare's job on CUDA)
        generate(target, prompt, route, 20, reference_ids=small_ids(40, 13))
        with CaptureCheck() as check:
            got = generate(target, prompt, route, 20, reference_ids=small_ids(40, 13))
        assert got.steps > 3 and check.hazards == [], (route.name, check.hazards)


@pytest.mark.parametrize("group", [8, 3])
@pytest.mark.parametrize("stop_at", [None, 0, 5, 17, 38])
def test_ar_one_group_ahead_stops_where_the_host_loop_stops(stop_at, group, monkeypatch):
    """AR on the device path runs ``AR_GROUP`` decode steps a graph and launches the next group before
    reading the last one's tokens: the same tokens, finish reason and per-step records as HybridLM's
    loop, with a stop token (the first occurrence of AR's token number ``stop_at``: in the first group,
    inside a later one, in the single-step tail), at the token limit, and across a buffer growth."""
    monkeypatch.setattr(graphed_module, "AR_GROUP", group)
    model = small_hybrid(13)
    ar = device_routes()[0]
    prompt = small_ids(9, 14)
    full = generate(model, prompt, ar, 40).output_ids
    stops = {full[stop_at]} if stop_at is not None else set()
    want = generate(model, prompt, ar, 40, stop_ids=stops)
    target = GraphedTarget(model, max_len=32, max_nodes=16)  # 9 + 40 positions: the buffers grow
    got = generate(target, prompt, ar, 40, stop_ids=stops)
    assert got.output_ids == want.output_ids and got.finish_reason == want.finish_reason
    assert (got.accepted_lengths, got.tree_sizes, got.accepted_paths) == (
        want.accepted_lengths, want.tree_sizes, want.accepted_paths
    )  # fmt: skip
    if stop_at is not None:
        assert got.finish_reason == "stop" and got.output_ids[-1] in stops and len(got.output_ids) < 40
    # the steps launched ahead of a stop ran and are in decode_s: the record counts them
    assert want.launched_steps is None
    if got.launched_steps is not None:
        assert got.steps < got.launched_steps <= got.steps + 2 * group
    assert (got.launched_steps is not None) == (stop_at is not None and group > 1 and got.steps > 0)
    for steps in (6, 2 * group + 1):  # the single-step tail alone, then groups and a tail
        state = target.prefill(prompt)[0]
        new, picked = target.greedy_decode(state, full[0], steps, lambda t: False)
        assert picked == full[1 : steps + 1] and new.position == len(prompt) + steps
        assert new.committed_tokens == prompt + full[:steps]
    # a stop inside the first group: the groups launched past it are folded in and committed
    state = target.prefill(prompt)[0]
    new, picked = target.greedy_decode(state, full[0], 30, lambda t: t == full[2])
    assert picked == full[1:3]
    folded = new.position - len(prompt)
    assert 2 <= folded <= min(30, 2 * group) and new.committed_tokens == prompt + full[:folded]
    probe = target.verify(new, Tree.single(full[folded]))  # the state holds exactly what it says
    want = model.verify(model.prefill(prompt + full[:folded])[0], Tree.single(full[folded]))
    assert torch.allclose(probe.logits.float(), want.logits.float(), atol=1e-5)


class WarmedCall(graphs_module.GraphedCall):
    """GraphedCall on the CPU: its capture is the two warm-up calls of ``fn`` (as GraphedCall makes, for
    real) and one more for the output; every call then runs ``fn``."""

    def _capture(self, fn, device, warmup):  # noqa: ANN001, ANN202 - GraphedCall's
        self.fn = fn
        for _ in range(warmup):
            fn()
        return None, fn()

    def __call__(self):  # noqa: ANN204
        return self.fn()

    def replay(self) -> None:
        self.fn()


@pytest.mark.parametrize("group", [8, 1])
def test_graphs_captured_mid_generation_leave_greedy_ar_exact(group, monkeypatch):
    """A graph captured during a generation (here: after the buffers grew) runs its warm-ups on the live
    decoder: the state, the token and the last pick they write are restored, so greedy AR's groups (which
    read the token or the last pick) still give HybridLM's tokens."""
    monkeypatch.setattr(graphed_module, "AR_GROUP", group)
    monkeypatch.setattr(graphs_module, "GraphedCall", WarmedCall)
    model = small_hybrid(13)
    prompt = small_ids(9, 14)
    ar = device_routes()[0]
    want = generate(model, prompt, ar, 40).output_ids
    target = GraphedTarget(model, max_len=24, max_nodes=16, graphs=False)
    target.graphs = True  # graph calls through the stand-in
    assert generate(target, prompt, ar, 40).output_ids == want  # the buffers grow: graphs captured anew
    assert generate(target, prompt, ar, 40).output_ids == want


def test_prepared_graphs_leave_nothing_to_capture_in_greedy_ar(monkeypatch):
    """``prepare`` captures greedy AR's group graphs and then every slot's: making a slot drops only that
    slot's graphs, so AR's first generation after it captures nothing (AR's keys ("ar", size, first)
    once matched slots' (size, snapshots) and were dropped: the first timed AR record captured them)."""
    monkeypatch.setattr(graphs_module, "GraphedCall", WarmedCall)
    target = GraphedTarget(small_hybrid(13), max_len=64, max_nodes=16, graphs=False)
    target.graphs = True  # graph calls through the stand-in
    target.prepare(("closed_form", "snapshot"), (), 16)
    got = generate(target, small_ids(9, 14), device_routes()[0], 20)
    assert got.graph_captures == 0 and len(got.output_ids) == 20


def test_graphs_captured_inside_a_decode_are_counted_in_its_result_and_record(monkeypatch):
    """The captures a generation's decode loop makes (graphs first needed there) are counted in its
    result and record (prefill's are not), and the run report lists them; a generation after them
    captures nothing."""
    from repro.data.suites import Prompt
    from repro.harness.runner import make_record
    from repro.reporting.report import _captures_section

    monkeypatch.setattr(graphs_module, "GraphedCall", WarmedCall)
    model = small_hybrid(13)
    prompt = small_ids(9, 14)
    ar = device_routes()[0]
    target = GraphedTarget(model, max_len=64, max_nodes=16, graphs=False)
    target.graphs = True  # graph calls through the stand-in
    first = generate(target, prompt, ar, 20)
    assert first.graph_captures >= 2  # greedy AR's first group and a later one
    second = generate(target, prompt, ar, 20)
    assert second.graph_captures == 0 and second.output_ids == first.output_ids
    cfg = {"temperature": 0.0, "seed": 0}
    item = Prompt("s", "p", ["text"])
    recs = [make_record(ar, item, 0, prompt, res, cfg, "lossless") for res in (first, second)]
    assert [r.graph_captures for r in recs] == [first.graph_captures, 0]
    lines = _captures_section(recs)
    assert lines[0] == "## Graphs captured inside the timed decode"
    assert lines[2] == f"- {ar.name}: {first.graph_captures} capture(s) in 1 record(s)"
    assert _captures_section(recs[1:]) == []


def test_ar_groups_only_at_small_widths(monkeypatch):
    """AR_GROUP steps a graph up to SMALL_WIDTH (where the host's loop would pace the decode step); one
    step a graph above it (a stop wastes at most one step there), with the same tokens."""
    model = small_hybrid(13)
    prompt = small_ids(9, 14)
    ar = device_routes()[0]
    want = generate(model, prompt, ar, 20).output_ids
    target = GraphedTarget(model, max_len=64, max_nodes=16)
    assert target.ar_group == graphed_module.AR_GROUP
    monkeypatch.setattr(graphed_module, "SMALL_WIDTH", model.config.hidden_size - 1)
    assert target.ar_group == 1
    state = target.prefill(prompt)[0]
    new, picked = target.greedy_decode(state, want[0], 30, lambda t: t == want[3])
    assert picked == want[1:4] and new.position == len(prompt) + 4  # one step past the stop
    assert generate(target, prompt, ar, 20).output_ids == want


def test_graphed_sampling_routes_keep_the_host_path():
    """A sampling rule (and sampled trees) on the graphed target: the host walk, as before."""
    from repro.decoding.engine import Route, device_greedy
    from repro.decoding.tree_builders import BestFirst, SingleNode

    target = GraphedTarget(small_hybrid(12), max_len=64, max_nodes=32)
    route = build_route({"kind": "ar"}, VOCAB, "sample_match", 0.8, 3)
    assert not device_greedy(target, route)
    sampled = Route("s", MarginalDrafter(3, 1), BestFirst(5, sample=True), device_routes()[0].rule)
    assert not device_greedy(target, sampled)
    assert device_greedy(target, Route("g", None, SingleNode(), device_routes()[0].rule))


# ------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_every_route_through_graphs_equals_ar_in_float32():
    results = decode_routes("cuda", "float32", "gpu-smoke")
    captures = results.pop("_captures")[0][0]
    print(f"graphs captured: {captures}")
    assert captures > 0
    for name, rows in results.items():
        for ref, _, graphed in rows:
            assert graphed == ref, f"{name}: {compare_to_reference(graphed, ref)}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_trees_of_128_nodes_through_graphs_equal_ar_in_float32():
    """Budget-128 trees verify in 129-node slots, whose GDN tree kernels read the slot's copy of the ancestor
    mask in aligned rows (triton_tree.mask_rows, refreshed by each verify): DDTree, SpecLA and DFlash-TfM
    through graphs give AR's tokens in float32."""
    model, tok = open_target("default", dtype="float32", device="cuda")
    model.set_gdn_backend("triton")
    target = GraphedTarget(model, max_nodes=129)
    vocab = model.config.vocab_size
    ar = build_route({"name": "ar", "kind": "ar"}, vocab, "greedy", 0.0, 42)
    cases = prompts(tok)
    refs = [generate(model, p, ar, NEW_TOKENS).output_ids for p in cases]
    specs = [
        {"name": "ddtree", "kind": "ddtree", "budget": 128},
        {"name": "dflash_tfm", "kind": "dflash_tfm", "budget": 128},
        {"name": "specla", "kind": "specla", "budget": 128, "topk": 8, "depth": 8},
    ]
    for spec in specs:
        route = build_route(spec, vocab, "greedy", 0.0, 42, target=model, family="tiny-qwen35")
        target.prepare((route.commit,), route.drafter.capture_layers if route.drafter else (), 128)
        for p, ref in zip(cases, refs):
            got = generate(target, p, route, NEW_TOKENS, reference_ids=ref)
            assert got.output_ids == ref, f"{spec['name']}: {compare_to_reference(got.output_ids, ref)}"
    slots = [s for s in target._slots.values() if s.size == 129]
    assert target.captures > 0 and slots and all(s.gdn_rows is not None for s in slots)


def allowing_syncs(fn):  # noqa: ANN001, ANN201
    def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        with sync_debug(0):
            return fn(*args, **kwargs)

    return wrapped


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_greedy_graphed_step_syncs_only_in_read_back(monkeypatch):
    """The trained default target in float32 on CUDA graphs: the device routes equal the graphed AR, and
    under torch's sync debug mode ("error": a synchronizing call raises) a step syncs nowhere but in
    ``read_back``, once. Allowed
    outside the steps: prefill and its first pick, the engine's start/end clocks, the event reads; the
    test drafter's host-made marginals are moved to CUDA before the step's own work."""
    import repro.decoding.engine as engine
    import repro.models.graphed as graphed
    from repro.decoding.acceptance import TargetMatch

    model, _ = open_target("default", dtype="float32", device="cuda")
    model.set_gdn_backend("triton")
    vocab = model.config.vocab_size
    target = GraphedTarget(model, max_len=128, max_nodes=32)
    target.prepare(("closed_form", "replay", "snapshot"), (), 32)
    prompt = small_ids(10, 12)
    reference = generate(target, prompt, device_routes(vocab)[0], 30).output_ids
    reads = []
    real_read = graphed.read_back
    monkeypatch.setattr(graphed, "read_back", allowing_syncs(lambda h, c: reads.append(1) or real_read(h, c)))
    monkeypatch.setattr(engine, "_clock", allowing_syncs(engine._clock))
    monkeypatch.setattr(engine, "_prefill", allowing_syncs(engine._prefill))
    monkeypatch.setattr(engine.StageClock, "device_s", allowing_syncs(engine.StageClock.device_s))
    # event queries of done steps wait for nothing (allowed should torch's debug mode count them)
    monkeypatch.setattr(engine.StageClock, "_harvest", allowing_syncs(engine.StageClock._harvest))
    monkeypatch.setattr(TargetMatch, "pick", allowing_syncs(TargetMatch.pick))
    for route in device_routes(vocab):
        if route.drafter is not None:
            propose = route.drafter.propose

            def on_cuda(ctx, propose=propose):  # noqa: ANN001, ANN202
                with sync_debug(0):
                    proposal = propose(ctx)
                    proposal.probs = proposal.probs.to("cuda", torch.float32)
                    proposal.top_ids = proposal.top_ids.to("cuda")
                    torch.cuda.synchronize()
                return proposal

            route.drafter.propose = on_cuda
        reads.clear()
        with sync_debug():
            got = generate(target, prompt, route, 30, reference_ids=reference)
        assert got.output_ids == reference, route.name
        if route.drafter:
            assert len(reads) == got.steps, route.name
        else:  # AR: one read a group of decode steps (greedy_decode)
            assert 0 < len(reads) < got.steps, reads
        assert got.device_stage_s is not None and all(v >= 0 for v in got.device_stage_s.values())


def test_host_uploads_copy_values_through_a_ring_of_buffers():
    """HostUploads (the static drafters' host-to-device inputs): into ``out``'s head or a new tensor, the
    ring's buffers reused in turn and grown for longer values, earlier results untouched."""
    from repro.models.graphs import HostUploads

    up = HostUploads(torch.device("cpu"), ring=2)
    out = torch.full((6,), -1, dtype=torch.long)
    assert up.put([4, 5, 6], out) is out and out.tolist() == [4, 5, 6, -1, -1, -1]
    first = up.put([1, 2])
    long = up.put(list(range(40)))  # the first buffer again, grown
    assert first.tolist() == [1, 2] and long.tolist() == list(range(40)) and first.dtype == torch.long
    assert up.put([9], out).tolist() == [9, 5, 6, -1, -1, -1]


def test_read_back_polls_a_host_write_until_every_element_has_landed(monkeypatch):
    """A HostWrite's result (tagged_to_host's stores, here written by a thread) is read once all its
    elements carry the tag, whatever order they land in; one never landing raises after the wait (the
    device synchronized once first)."""
    import threading
    import time

    from repro.models.graphed import HostWrite, read_back
    from repro.models.slot_kernels import TAG_BITS

    values = [5, -1, 123456789, 0, 42]
    host = torch.zeros(len(values), dtype=torch.long)
    words = host.numpy()

    def land() -> None:
        for i in (3, 0, 4, 1, 2):
            time.sleep(0.002)
            words[i] = (values[i] << TAG_BITS) | 9

    writer = threading.Thread(target=land)
    writer.start()
    assert read_back(host, HostWrite(9)) == values
    writer.join()
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(1))
    words[2] = 0  # never lands
    with pytest.raises(RuntimeError, match="never reached the host"):
        read_back(host, HostWrite(9), wait_s=0.01)
    assert synced == [1]


def test_results_read_from_tagged_stores_give_the_same_generations(request):
    """graphed.HOST_WRITES's path on the CPU (the kernel's tagged stores stood in by torch ops): AR's groups
    of decode steps, a device chain and device DDTrees give the same records as the stream copies, each
    result read through the tags (one ``read_back`` of a HostWrite per read)."""
    import repro.models.graphed as graphed

    model = small_hybrid(11)
    prompt = small_ids(10, 12)
    runs = []
    for tagged in (False, True):
        kinds = request.getfixturevalue("tagged_stores") if tagged else []
        target = GraphedTarget(model, max_len=64, max_nodes=32)
        kinds.clear()
        got = [generate(target, prompt, route, 30) for route in device_routes()]
        runs.append([(g.output_ids, g.accepted_paths, g.accepted_lengths) for g in got])
        if tagged:
            assert kinds and set(kinds) == {graphed.HostWrite}, kinds
    assert runs[0] == runs[1]


def test_read_back_counts_only_the_time_a_result_was_still_on_its_way():
    """``read_wait_s``: a result already on the host adds nothing; one whose tagged stores land 50 ms
    after the read began adds that wait (the host ahead of the device). A generation on the graphed
    target records its waits (``host_wait_s``; none on the CPU, whose copies are done when made), one on
    a HybridLM none."""
    import threading
    import time

    from repro.models.graphed import HostWrite, read_back, read_wait_s
    from repro.models.slot_kernels import TAG_BITS

    landed = (torch.arange(4) << TAG_BITS) | 7
    before = read_wait_s()
    assert read_back(landed.clone(), HostWrite(7)) == [0, 1, 2, 3] and read_wait_s() == before
    row = torch.zeros(4, dtype=torch.long)

    def land() -> None:
        time.sleep(0.05)
        row.copy_(landed)

    writer = threading.Thread(target=land)
    writer.start()
    assert read_back(row, HostWrite(7)) == [0, 1, 2, 3]
    writer.join()
    assert read_wait_s() - before >= 0.04
    model, prompt = small_hybrid(11), small_ids(10, 12)
    route = device_routes()[0]
    assert generate(GraphedTarget(model, max_len=64, max_nodes=32), prompt, route, 8).host_wait_s == 0
    assert generate(model, prompt, route, 8).host_wait_s is None
