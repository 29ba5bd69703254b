"""The pipelined loop (repro.decoding.engine.pipelined): DFlash chain, DDTree, Weaver, EAGLE chain,
FLA-SD and SpecLA routes on the graphed target with each step launched before the previous one is read
(``engine.PIPELINE_DEPTH`` steps ahead of the read: 1-3).

CPU, float64, the trained tiny family on a graphed target without CUDA graphs (the same device path,
eagerly): the pipelined loop gives the step-by-step loop's tokens, accepted paths, accepted lengths and
tree sizes, which are AR's tokens, for every length limit and at stop tokens, at every depth (the
drafters' buffers growing with paths unsettled); one read a step plus the steps launched past the end; the
drafter's host count catches up with every read; the step after a
launched one reads nothing on the host; the sampling rules and the replayed acceptance pipeline with the same
records as their step-by-step loop; with ``graphed.FUSE_ACCEPT`` (verify, acceptance and commit in one
graph) the same records as without, and with ``engine.FUSE_TREE`` (DDTree's and chain DFlash's trees built
in the drafter's graph) too. GPU (``gpu``): the same in float32 on CUDA graphs, across the graphs
captured mid-generation (the drafter's step restores the length its warm-ups advanced), fused too.
"""

from __future__ import annotations

import pytest
import torch

import repro.decoding.engine as engine
from repro.decoding.engine import generate, pipelined
from repro.decoding.routes import build_route
from repro.decoding.tree_builders import BestFirst, Chain, tree_in_drafter
from repro.models.graphed import GraphedTarget
from repro.models.graphs import check_capture
from repro.models.loading import load_target
from repro.models.tokenizer import load_tokenizer

FAMILY = "tiny-qwen35"
SPECS = [
    {"name": "chain", "kind": "dflash_chain"},
    {"name": "ddtree", "kind": "ddtree", "budget": 16},
    {"name": "weaver", "kind": "weaver", "budget": 16},
    {"name": "eagle-chain", "kind": "eagle_chain", "k": 4},
    {"name": "fla-sd", "kind": "fla_sd", "k": 4},
    {"name": "specla", "kind": "specla", "budget": 16},
    {"name": "specla-delayed", "kind": "specla", "budget": 16, "commit": "delayed"},
]
TEXTS = ("What is 7 times 8?", "Name three colours of the sea and say why the sky looks blue at noon.")


def _routes(model: torch.nn.Module) -> dict:
    vocab = model.config.vocab_size
    return {s["name"]: build_route(s, vocab, "greedy", 0.0, 0, target=model, family=FAMILY) for s in SPECS}


@pytest.fixture(scope="module")
def setup():
    model = load_target(FAMILY, dtype=torch.float64)
    tok = load_tokenizer(FAMILY)
    prompts = [tok.chat_prompt([{"role": "user", "content": t}]) for t in TEXTS]
    ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, 0)
    reference = [generate(model, p, ar, 40).output_ids for p in prompts]
    return model, prompts, reference


def _unsettled(drafter) -> bool:
    """Whether the drafter (DFlash's static buffers, Weaver's DFlash, a static EAGLE) waits for a settle."""
    dflash = getattr(drafter, "dflash", drafter)
    static = getattr(dflash, "_static", None)
    return (static if static is not None else drafter)._unsettled


def _fields(res) -> tuple:
    return res.output_ids, res.accepted_paths, res.accepted_lengths, res.tree_sizes, res.finish_reason


def _past_end(res) -> int:
    """Steps launched past the end (read, folded in)."""
    return (res.launched_steps or res.steps) - res.steps


@pytest.mark.parametrize("name", [s["name"] for s in SPECS])
def test_pipelined_steps_equal_the_step_by_step_loop_and_ar(setup, monkeypatch, name):
    """Both loops on the same graphed target: identical records, AR's tokens, for a long limit and
    limits that end inside a step or at the prefill's token, with 1, 2 and 3 steps launched ahead of the
    read (``engine.PIPELINE_DEPTH``; the step-by-step loop's records made once for all three); the
    pipelined loop reads once a step, plus the steps launched past the end (at most the depth, none once the
    unread steps must reach the limit: limit 2, one step), and leaves no ingested path unsettled."""
    import repro.models.graphed as graphed

    model, prompts, reference = setup
    target = GraphedTarget(model, max_len=64, graphs=False)  # 64: the buffers grow during the run
    route = _routes(target)[name]
    assert pipelined(target, route) and not pipelined(model, route)
    assert route.commit == next(s for s in SPECS if s["name"] == name).get("commit", route.commit)
    reads: list[int] = []
    real = graphed.read_back
    monkeypatch.setattr(graphed, "read_back", lambda h, c: reads.append(1) or real(h, c))
    for prompt, ref in zip(prompts, reference):
        for limit in (40, 7, 2, 1):
            monkeypatch.setattr(engine, "PIPELINE", False)
            want = generate(target, prompt, route, limit)
            monkeypatch.setattr(engine, "PIPELINE", True)
            for depth in (1, 2, 3):
                monkeypatch.setattr(engine, "PIPELINE_DEPTH", depth)
                reads.clear()
                got = generate(target, prompt, route, limit)
                at = (name, limit, depth, got.launched_steps)
                assert _fields(got) == _fields(want), at
                assert got.output_ids == ref[:limit]
                assert len(reads) == got.steps + _past_end(got), at  # limit 1: the prefill's token, no step
                assert _past_end(got) <= (depth if got.steps else 0), at
                if limit == 2:  # the first step must reach the limit: nothing is launched behind it
                    assert got.steps == 1 and _past_end(got) == 0, at
                assert not _unsettled(route.drafter), at
                assert set(got.device_stage_s) == set(engine.STAGES)
    assert max(max(want.accepted_lengths) for want in [generate(target, prompts[1], route, 40)]) > 1


SAMPLED = ["chain", "ddtree", "weaver", "specla-delayed"]


def _rule_counters(route, since: tuple[int, int] = (0, 0)) -> tuple[int, int]:  # noqa: ANN001
    """The replayed rule's (steps, truncated) counters (0 for other rules), less ``since``."""
    steps, truncated = getattr(route.rule, "steps", 0), getattr(route.rule, "truncated", 0)
    return steps - since[0], truncated - since[1]


@pytest.mark.parametrize("rule", ["sample_match", "spec_sampling", "traversal", "replayed"])
def test_pipelined_sampling_steps_equal_the_step_by_step_loop(setup, monkeypatch, rule):
    """The sampling rules' device twins and the replayed acceptance pipeline too (their draws keyed by the
    root's position read on the device), one and two steps ahead of the read: the same records as the
    step-by-step loop, sample_match AR's sampled tokens, the replayed counters the same; one read a step
    plus those launched past the end."""
    import repro.models.graphed as graphed
    from repro.decoding.replayed import AcceptanceProcess
    from repro.decoding.scale_routes import replayed

    model, prompts, _ = setup
    target = GraphedTarget(model, max_len=64, graphs=False)
    vocab = model.config.vocab_size
    process = AcceptanceProcess("test", (0.9, 0.8, 0.7, 0.6, 0.5))
    name, temperature = ("greedy", 0.0) if rule == "replayed" else (rule, 0.9)
    ar = build_route({"kind": "ar"}, vocab, name, temperature, 7)
    sampled_ar = generate(model, prompts[1], ar, 30).output_ids
    reads: list[int] = []
    real = graphed.read_back
    monkeypatch.setattr(graphed, "read_back", lambda h, c: reads.append(1) or real(h, c))
    longest = 0
    for spec in (s for s in SPECS if s["name"] in SAMPLED):
        route = build_route(spec, vocab, name, temperature, 7, target=target, family=FAMILY)
        if rule == "replayed":
            route = replayed(route, process, 7)
        assert pipelined(target, route) and not engine.device_greedy(target, route)
        for limit, depths in ((30, (1, 2)), (5, (1,))):
            before = _rule_counters(route)
            monkeypatch.setattr(engine, "PIPELINE", False)
            want = generate(target, prompts[1], route, limit)
            wanted = _rule_counters(route, before)
            monkeypatch.setattr(engine, "PIPELINE", True)
            for depth in depths:
                monkeypatch.setattr(engine, "PIPELINE_DEPTH", depth)
                reads.clear()
                before = _rule_counters(route)
                got = generate(target, prompts[1], route, limit)
                counted = _rule_counters(route, before)
                assert _fields(got) == _fields(want), (spec["name"], limit, depth)
                assert len(reads) == got.steps + _past_end(got) and _past_end(got) <= depth
                if rule == "sample_match":
                    assert got.output_ids == sampled_ar[:limit], spec["name"]
                assert counted == wanted  # the replayed rule's counters: the same steps
                assert counted[0] == (got.steps if rule == "replayed" else 0)
                longest = max(longest, *got.accepted_lengths)
    assert longest > 1


def test_fused_verify_and_acceptance_give_the_same_records(setup, monkeypatch):
    """graphed.FUSE_ACCEPT: each pipelined step's verify, acceptance, accepted path and commit as one graph
    (its own slots): the same records as the separate graphs for every route (greedy; sample_match through
    its device twin; the delayed commit; fla_sd's chain slots), no separate acceptance graph on them, and
    ``launch_accepted`` refuses an acceptance other than the one that ran."""
    import repro.models.graphed as graphed

    model, prompts, _ = setup
    vocab = model.config.vocab_size
    cases = [(spec, "greedy", 0.0) for spec in SPECS] + [
        (spec, "sample_match", 0.9) for spec in SPECS if spec["name"] in ("ddtree", "specla-delayed")
    ]
    for spec, rule, temperature in cases:
        runs = []
        for fuse in (False, True):
            monkeypatch.setattr(graphed, "FUSE_ACCEPT", fuse)
            target = GraphedTarget(model, max_len=64, graphs=False)
            route = build_route(spec, vocab, rule, temperature, 7, target=target, family=FAMILY)
            runs.append(_fields(generate(target, prompts[1], route, 30)))
            names = {key[0] for key in target._calls}
            fused = {"fused_greedy", "fused_accept"} & names
            assert bool(fused) == fuse, (spec["name"], rule, names)
            if fuse:  # the fused slots have no graphs of their own besides the fused one
                slots = [key for key in target._calls if key[0] in graphed.SLOT_GRAPHS]
                assert all(str(key[2]).endswith("+accept") == key[0].startswith("fused") for key in slots)
        assert runs[0] == runs[1], (spec["name"], rule)
    monkeypatch.setattr(graphed, "FUSE_ACCEPT", True)
    target = GraphedTarget(model, max_len=64, graphs=False)
    route = build_route(SPECS[1], vocab, "greedy", 0.0, 7, target=target, family=FAMILY)
    state, ver = target.prefill(prompts[0], None, route.drafter.capture_layers)
    route.drafter.begin(prompts[0], None)
    route.drafter.observe_prefill(ver)
    tree = route.builder.build_device(
        int(ver.logits[-1].argmax()), route.drafter.propose(_context(prompts[0], ver))
    )
    fused_ver = target.verify(state, tree, route.drafter.capture_layers, route.commit, then=(None, ()))
    assert fused_ver.accepted == (None, ())
    with pytest.raises(ValueError, match="another device acceptance"):
        target.launch_accepted(state, fused_ver, lambda slot, length: None, ("other",))


@pytest.mark.parametrize("pipeline", [True, False])
def test_prepare_graphs_makes_what_each_loop_replays_and_nothing_else(setup, monkeypatch, pipeline):
    """``prepare_graphs`` (CUDA graphs stood in by their functions on CPU) makes every graph each route's
    decode then replays (the decodes capture nothing) and no slot graph that none replays: with the
    pipelined loop (``engine.PIPELINE``) the fused verify + acceptance + commit graphs and no separate
    verify, acceptance or commit graph; step by step the separate ones and no fused one. Greedy routes and
    two sampling ones (their device twins' graphs), AR beside them."""
    import repro.models.graphed as graphed
    import repro.models.graphs as graphs
    from repro.decoding.routes import prepare_graphs

    monkeypatch.setattr(graphs, "GraphedCall", lambda fn, device: fn)
    monkeypatch.setattr(engine, "PIPELINE", pipeline)
    model, prompts, reference = setup
    target = GraphedTarget(model, max_len=256, graphs=False)  # 256: no buffer grows during the decodes
    vocab = model.config.vocab_size
    routes = [build_route({"kind": "ar"}, vocab, "greedy", 0.0, 0), *_routes(target).values()]
    twins = ("ddtree", "specla-delayed")
    sampled = [s | {"name": s["name"] + "-sampled"} for s in SPECS if s["name"] in twins]
    routes += [build_route(s, vocab, "sample_match", 0.9, 7, target=target, family=FAMILY) for s in sampled]
    target.graphs = True  # after the drafters are built: theirs stay eager
    loops = {engine.decode_loop(target, r) for r in routes[1:]}
    assert loops == {"pipelined" if pipeline else "stepwise"}
    prepare_graphs(target, routes)
    prepared, captured = set(target._calls), target.captures
    used: set[tuple] = set()
    real = target._call
    monkeypatch.setattr(target, "_call", lambda key, *args: used.add(key) or real(key, *args))
    for route in routes:
        got = generate(target, prompts[1], route, 40)
        if route.rule.temperature == 0:
            assert got.output_ids == reference[1], route.name
    assert target.captures == captured and set(target._calls) == prepared

    def families(keys: set[tuple]) -> set[tuple]:  # a slot graph's key without the slot's size
        return {(k[0], *k[2:]) for k in keys if k[0] in graphed.SLOT_GRAPHS}

    assert families(prepared) == families(used)
    names = {k[0] for k in families(prepared)}
    assert names == ({"fused_greedy", "fused_accept"} if pipeline else {"verify", "greedy", "accept"})


def test_tree_in_the_drafter_graph_gives_the_same_records(setup, monkeypatch):
    """engine.FUSE_TREE: a pipelined DDTree or chain DFlash step builds its tree inside the DFlash drafter's
    step (BestFirst / Chain ``device_tree`` on its marginals and top-k ids, rooted at the launched step's
    bonus): the same records as the tree built after it (greedy; DDTree's sample_match through its device
    twin), the builder's own call made for the first step only (drafted from the prefill, before any
    launched step)."""
    model, prompts, _ = setup
    vocab = model.config.vocab_size
    specs = {s["name"]: s for s in SPECS}
    cases = [("ddtree", "greedy", 0.0), ("ddtree", "sample_match", 0.9), ("chain", "greedy", 0.0)]
    for name, rule, temperature in cases:
        spec = specs[name]
        runs, built = [], []
        for fuse in (False, True):
            monkeypatch.setattr(engine, "FUSE_TREE", fuse)
            target = GraphedTarget(model, max_len=64, graphs=False)
            route = build_route(spec, vocab, rule, temperature, 7, target=target, family=FAMILY)
            assert isinstance(route.builder, (BestFirst, Chain)) and tree_in_drafter(
                route.builder, route.drafter
            )
            calls = [0]
            build = route.builder.build_device

            def counted(*args, build=build, calls=calls):  # noqa: ANN002, ANN202
                calls[0] += 1
                return build(*args)

            monkeypatch.setattr(route.builder, "build_device", counted)
            res = generate(target, prompts[1], route, 30)
            runs.append(_fields(res))
            built.append((calls[0], res.steps))
        assert runs[0] == runs[1], (name, rule)
        (separate, steps), (fused, _) = built
        assert separate >= steps > 2 and fused == 1, (name, rule, built)


def _context(prompt: list[int], ver) -> object:  # noqa: ANN001
    from repro.drafters.base import DraftContext

    return DraftContext(list(prompt), [int(ver.logits[-1].argmax())], ver, list(range(ver.tree.size)))


def test_pipelined_loop_stops_at_a_stop_token_inside_a_step(setup, monkeypatch):
    """A stop token in the middle of an accepted path: the output ends there (stop), the same as the
    step-by-step loop's, although one more step was launched and folded in on the device."""
    model, prompts, reference = setup
    target = GraphedTarget(model, max_len=256, graphs=False)
    route = _routes(target)["ddtree"]
    full = generate(target, prompts[1], route, 40)
    long_step = next(i for i, n in enumerate(full.accepted_lengths) if n > 2)
    at = 1 + sum(full.accepted_lengths[:long_step]) + 1  # inside that step's accepted tokens
    stop = full.output_ids[at]
    assert stop not in full.output_ids[:at]
    got = generate(target, prompts[1], route, 40, stop_ids=[stop])
    monkeypatch.setattr(engine, "PIPELINE", False)
    want = generate(target, prompts[1], route, 40, stop_ids=[stop])
    assert _fields(got) == _fields(want)
    assert got.output_ids == reference[1][: at + 1] and got.finish_reason == "stop"


def test_step_after_a_launched_step_reads_nothing_on_the_host(setup):
    """The DFlash step after a launched, unread step takes its root, start and path from the device
    result: no host read, no data-dependent shape, the same ops whatever the accepted path."""
    from repro.drafters.base import DraftContext

    model, prompts, _ = setup
    target = GraphedTarget(model, graphs=False)
    route = _routes(target)["ddtree"]
    drafter = route.drafter
    drafter.static = True
    drafter.begin(prompts[0], None)
    state, ver = target.prefill(prompts[0], capture=drafter.capture_layers)
    drafter.observe_prefill(ver)
    out = [int(ver.logits[-1].argmax())]
    proposal = drafter.propose(DraftContext(prompts[0], out, ver, list(range(ver.tree.size))))
    tree = route.builder.build_device(out[-1], proposal)
    ver = target.verify(state, tree, drafter.capture_layers)
    step = target.launch_accepted(state, ver)
    static = drafter._static
    static._resize_inputs(16)
    traces = []
    for n in (1, 3):  # the same trace for different accepted lengths
        step.result[0] = n
        check = check_capture(
            lambda: static._run(tuple(ver.hidden[i] for i in static.layers), True, (step.result, 5))
        )
        assert check.hazards == []
        traces.append(check.trace)
    assert traces[0] == traces[1]


@pytest.mark.parametrize("name", ["eagle-chain", "specla"])
def test_eagle_step_after_a_launched_step_reads_nothing_on_the_host(setup, name):
    """The static EAGLE drafter's step after a launched step (ingest, inputs and drafting from the device
    result and its committed count): no host read, no data-dependent shape, one trace for any n."""
    from repro.drafters.base import DraftContext

    model, prompts, _ = setup
    target = GraphedTarget(model, graphs=False)
    route = _routes(target)[name]
    drafter = route.drafter
    drafter.begin(prompts[0], None)
    state, ver = target.prefill(prompts[0], capture=drafter.capture_layers)
    drafter.observe_prefill(ver)
    out = [int(ver.logits[-1].argmax())]
    proposal = drafter.propose(DraftContext(prompts[0], out, ver, list(range(ver.tree.size))))
    ver = target.verify(state, route.builder.build_device(out[-1], proposal), drafter.capture_layers)
    step = target.launch_accepted(state, ver)
    sources = tuple(ver.hidden[i] for i in drafter.capture_layers)
    traces = []
    for n in (1, 3):
        step.result[0] = n
        committed = drafter._committed.clone()
        check = check_capture(lambda: drafter._step_after(sources, step.result, step.depth))
        drafter._committed.copy_(committed)
        assert check.hazards == []
        traces.append(check.trace)
    assert traces[0] == traces[1]


def test_settle_needs_an_ingested_path(setup):
    """``settle`` with nothing ingested raises; a device root for a builder that makes host trees raises."""
    model, prompts, _ = setup
    target = GraphedTarget(model, graphs=False)
    drafter = _routes(target)["ddtree"].drafter
    drafter.static = True
    drafter.begin(prompts[0], None)
    with pytest.raises(ValueError, match="settle"):
        drafter.settle(2)
    with pytest.raises(ValueError, match="host"):
        Chain(sample=True).build_device(torch.tensor([3]), None)
    with pytest.raises(ValueError, match="host"):
        BestFirst(4).build_device(torch.tensor([3]), None)


def test_three_steps_ahead_read_their_results_from_rows_of_their_own(setup, monkeypatch, tagged_stores):
    """graphed.HOST_WRITES's path on the CPU (the kernel's tagged stores stood in by torch ops: a step's
    result lands when the step is launched): three steps ahead of the read, a step's row is read after the
    three launched behind it stored theirs, and the records are the step-by-step loop's. Were two of the
    four in one row (two rows, as before the depth), the read would wait for a tag its row no longer holds."""
    import repro.models.graphed as graphed

    model, prompts, _ = setup
    target = GraphedTarget(model, max_len=64, graphs=False)
    for name in ("chain", "ddtree"):
        route = _routes(target)[name]
        monkeypatch.setattr(engine, "PIPELINE", False)
        want = generate(target, prompts[1], route, 40)
        monkeypatch.setattr(engine, "PIPELINE", True)
        monkeypatch.setattr(engine, "PIPELINE_DEPTH", 3)
        tagged_stores.clear()
        got = generate(target, prompts[1], route, 40)
        assert _fields(got) == _fields(want), name
        assert set(tagged_stores) == {graphed.HostWrite} and len(tagged_stores) == got.steps + _past_end(got)
        assert got.steps > 4, name  # steps enough for the rows to come round


@pytest.mark.parametrize("depth", [0, 4])
def test_a_depth_past_the_host_rows_is_refused(setup, monkeypatch, depth):
    """``engine.PIPELINE_DEPTH`` outside 1 .. TAG_ROWS - 1 (the host rows a result lands in) is one clear
    error, not a result read from a row a later step overwrote."""
    from repro.errors import ConfigError

    model, prompts, _ = setup
    target = GraphedTarget(model, graphs=False)
    monkeypatch.setattr(engine, "PIPELINE_DEPTH", depth)
    with pytest.raises(ConfigError, match=r"PIPELINE_DEPTH must be 1 \.\. 3"):
        generate(target, prompts[0], _routes(target)["chain"], 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("host_writes,depth", [(False, 1), (True, 1), (False, 2), (True, 2)])
def test_gpu_pipelined_routes_equal_ar_in_float32_on_cuda_graphs(monkeypatch, host_writes, depth):
    """The trained tiny family in float32 on CUDA graphs (Triton GDN kernels): every pipelined route gives
    AR's tokens and the step-by-step loop's records; the drafter graphs are
    captured inside the generations (no prepare), so their warm-ups run mid-generation. ``host_writes``:
    every step's result read from the kernel's tagged stores (graphed.HOST_WRITES), not a stream copy;
    ``depth``: steps launched ahead of the read (engine.PIPELINE_DEPTH)."""
    import repro.models.graphed as graphed

    monkeypatch.setattr(graphed, "HOST_WRITES", host_writes)
    monkeypatch.setattr(engine, "PIPELINE_DEPTH", depth)
    model, target, prompts = _cuda_float32()
    ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, 0)
    for name, route in _routes(target).items():
        _equal_ar_and_step_by_step(target, prompts, ar, route, name, monkeypatch)


class _Forgetful(dict):
    """A graph cache that never finds a graph: every call captures its graph again (warm-ups included)."""

    def get(self, key, default=None):  # noqa: ANN001, ANN201 - dict's signature
        return None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("depth", [1, 2])
def test_gpu_captures_between_a_launch_and_its_read_keep_the_stored_results(monkeypatch, depth):
    """graphed.HOST_WRITES: step graphs captured again on every call, so that each capture's warm-up calls
    (real calls of a storing graph) run while the steps launched before are unread on the host (one or two:
    engine.PIPELINE_DEPTH), give AR's tokens and the records of graphs captured once: the warm-ups neither
    store into the host rows nor move the tags (the stand-ins of GraphedTarget._store). AR's groups, a tree
    route and a chain route."""
    import repro.models.graphed as graphed

    monkeypatch.setattr(graphed, "HOST_WRITES", True)
    monkeypatch.setattr(engine, "PIPELINE_DEPTH", depth)
    model, target, prompts = _cuda_float32()
    vocab = model.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 0)
    routes = _routes(target)
    for name in ("ddtree", "chain"):
        route = routes[name]
        assert pipelined(target, route)
        for prompt in prompts[:2]:
            reference, want = generate(target, prompt, ar, 40), generate(target, prompt, route, 40)
            target._calls = _Forgetful()
            captured = target.captures
            got_ar, got = generate(target, prompt, ar, 40), generate(target, prompt, route, 40)
            assert target.captures - captured > len(got.accepted_lengths), name  # a capture a step at least
            target._calls = {}
            assert got_ar.output_ids == reference.output_ids == got.output_ids, name
            assert _fields(got) == _fields(want), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fused_verify_and_acceptance_equal_ar_in_float32_on_cuda_graphs(monkeypatch):
    """graphed.FUSE_ACCEPT on CUDA graphs, float32: the pipelined routes whose slots differ (a tree, a
    chain, the delayed commit's parities, fla_sd's chain slots) give AR's tokens and the step-by-step
    loop's records with each step's verify, acceptance and commit in one graph."""
    import repro.models.graphed as graphed

    monkeypatch.setattr(graphed, "FUSE_ACCEPT", True)
    model, target, prompts = _cuda_float32()
    ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, 0)
    for name, route in _routes(target).items():
        if name in ("chain", "ddtree", "fla-sd", "specla-delayed"):
            _equal_ar_and_step_by_step(target, prompts, ar, route, name, monkeypatch)
    assert any(key[0] == "fused_greedy" for key in target._calls)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_tree_in_the_drafter_graph_equals_ar_in_float32_on_cuda_graphs(monkeypatch):
    """engine.FUSE_TREE on CUDA graphs, float32: pipelined DDTree and chain DFlash with their trees built
    inside the DFlash drafter's step graph give AR's tokens and the step-by-step loop's records; those
    graphs are the ones run."""
    monkeypatch.setattr(engine, "FUSE_TREE", True)
    model, target, prompts = _cuda_float32()
    ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, 0)
    for name in ("ddtree", "chain"):
        route = _routes(target)[name]
        _equal_ar_and_step_by_step(target, prompts, ar, route, name, monkeypatch)
        static = route.drafter._static
        assert any(key[-1] is not None for key in static._calls), name  # a graph with the tree builder


def _cuda_float32() -> tuple:
    """The trained tiny family in float32 on CUDA (Triton GDN kernels), its graphed target, the prompts."""
    model = load_target(FAMILY, dtype=torch.float32, device="cuda")
    model.set_gdn_backend("triton")
    tok = load_tokenizer(FAMILY)
    prompts = [tok.chat_prompt([{"role": "user", "content": t}]) for t in TEXTS]
    return model, GraphedTarget(model, max_len=128), prompts


def _equal_ar_and_step_by_step(target, prompts, ar, route, name, monkeypatch) -> None:  # noqa: ANN001
    """``route`` pipelined on ``target``: AR's tokens and the step-by-step loop's records on every prompt."""
    assert pipelined(target, route)
    for prompt in prompts:
        reference = generate(target, prompt, ar, 48).output_ids
        got = generate(target, prompt, route, 48)
        monkeypatch.setattr(engine, "PIPELINE", False)
        want = generate(target, prompt, route, 48)
        monkeypatch.setattr(engine, "PIPELINE", True)
        assert got.output_ids == reference, name
        assert _fields(got) == _fields(want), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_pipelined_sample_match_gives_ar_sampled_tokens_on_cuda_graphs(monkeypatch):
    """sample_match at temperature 0.9 on CUDA graphs, float32: AR picking on the device gives the host AR's
    tokens with its graphs captured ahead; the pipelined DDTree, Weaver and delayed SpecLA routes give the
    sampled AR's tokens and the step-by-step loop's records (the draws keyed by the
    root's position read on the device, across graphs captured mid-generation)."""
    model, target, prompts = _cuda_float32()
    vocab = model.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "sample_match", 0.9, 3)
    engine.prepare_sampling(target, [ar])  # sampled AR's group graphs, picking on the device
    captured = target.captures
    for prompt in prompts:  # the device picks are the host's (HybridLM's eager AR, float32)
        assert generate(target, prompt, ar, 48).output_ids == generate(model, prompt, ar, 48).output_ids
    assert target.captures == captured
    for spec in (s for s in SPECS if s["name"] in ("ddtree", "weaver", "specla-delayed")):
        route = build_route(spec, vocab, "sample_match", 0.9, 3, target=target, family=FAMILY)
        _equal_ar_and_step_by_step(target, prompts, ar, route, spec["name"], monkeypatch)
