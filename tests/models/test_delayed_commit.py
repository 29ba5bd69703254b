"""SpecLA's delayed commit on the graphed target (``commit="delayed"``, repro.models.static / graphed).

CPU, float64 (the static decoder without graphs, the torch reference of the pending application): every
step equals the closed-form commit to 1e-12 (logits, and the states once flushed) while the commit
itself leaves the GDN states untouched; every other reader of the states (decode steps, other
strategies, export, prefill continuing a state, growing the buffers) sees the flushed state; the
delayed steps are capture-safe; generate() with the delayed commit reproduces AR's tokens for the
specla route (its default on the graphed target) and DDTree on the trained family, and leaves the same
state as the closed-form commit. Interpreter (float32, a TRITON_INTERPRET=1 subprocess): the pending
commit inside the fused and split Triton tree kernels, against the path commit.
GPU (``gpu``): float32 CUDA graphs, the delayed routes equal AR and the flushed state the path commit's.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import SMALL_VOCAB, random_tree, run_in_interpreter, small_hybrid, small_ids
from test_graphed import device_routes

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.errors import ConfigError
from repro.models.graphed import GraphedTarget
from repro.models.graphs import check_capture
from repro.models.state import ModelState
from repro.models.static import StaticDecoder, TreeSlot
from repro.models.static_layers import GDNBuffers
from repro.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")


def token_tree(n: int, seed: int, vocab: int = SMALL_VOCAB) -> Tree:
    gen = torch.Generator().manual_seed(seed)
    parents = random_tree(n, "mixed", gen)
    parents[0] = -1
    return Tree(torch.randint(0, vocab, (n,), generator=gen), parents)


def state_diff(a: ModelState, b: ModelState) -> float:
    """Largest absolute difference over every buffer of two states (positions must agree)."""
    assert a.position == b.position
    worst = 0.0
    for x, y in zip(a.layers, b.layers):
        for name, t in vars(x).items():
            worst = max(worst, float((t - getattr(y, name)).abs().max()) if t.numel() else 0.0)
    return worst


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-12) -> bool:
    """Equal to float64 rounding: the pending commit sums over its stash's rows (zeros off the path),
    the closed form over the slot's, so the order of the float64 additions may differ."""
    return float((a - b).abs().max()) <= tol


def gdn_states(target: GraphedTarget) -> list[torch.Tensor]:
    return [b.recurrent.clone() for b in target.decoder.buffers if isinstance(b, GDNBuffers)]


def twins(seed: int, **kw: object) -> tuple[torch.nn.Module, GraphedTarget, GraphedTarget, list[int]]:
    model = small_hybrid(seed)
    prompt = small_ids(11, seed + 1)
    return model, GraphedTarget(model, **kw), GraphedTarget(model, **kw), prompt  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- CPU, float64


def test_delayed_steps_equal_closed_form_and_defer_only_the_gdn_state():
    """Trees of 3..40 nodes (slots of 4 to 64, both parities), host commits: each verification's logits
    and captured outputs equal the closed form's (to 1e-12: float64 rounding); after a delayed commit
    the GDN states are still the old ones (conv, attention and length are committed), and once flushed
    every buffer equals the closed form's (to 1e-12)."""
    _, delayed, eager, prompt = twins(21, max_len=128, max_nodes=64)
    sd, _ = delayed.prefill(prompt)
    sc, _ = eager.prefill(prompt)
    for step, n in enumerate((5, 9, 16, 3, 33, 12, 40, 7)):
        tree = token_tree(n, 100 + step)
        vd = delayed.verify(sd, tree, (1,), "delayed")
        vc = eager.verify(sc, tree, (1,), "closed_form")
        assert close(vd.logits, vc.logits) and close(vd.hidden[1], vc.hidden[1]), step
        assert vd.slot is not None and vd.slot.parity == step % 2
        path = tree.path_to(int(tree.depth.argmax()) if step % 3 else n - 1)
        before = gdn_states(delayed)
        sd, sc = delayed.commit(sd, vd, path), eager.commit(sc, vc, path)
        after = gdn_states(delayed)
        assert all(torch.equal(a, b) for a, b in zip(before, after)), "the delayed commit wrote a state"
        assert not all(torch.equal(a, b) for a, b in zip(after, gdn_states(eager)))
        assert sd.committed_tokens == sc.committed_tokens
    assert delayed._pending is not None
    assert state_diff(delayed._exported(sd), eager._exported(sc)) <= 1e-12  # export flushes
    assert delayed._pending is None
    assert {k[1] for k in delayed._slots} == {"delayed0", "delayed1"}


def test_every_other_reader_sees_the_flushed_state():
    """After a delayed commit: a decode step (one-node tree), a verification by another strategy, a
    prefill continuing the state and growing the buffers each see the committed state (logits equal to
    the closed-form twin's bitwise); a stale delayed verification is not committed; a new prefill drops
    what was pending."""
    model, delayed, eager, prompt = twins(22, max_len=32, max_nodes=32)
    sd, _ = delayed.prefill(prompt)
    sc, _ = eager.prefill(prompt)

    def step(n: int, seed: int, strategy: str = "delayed") -> None:
        nonlocal sd, sc
        tree = token_tree(n, seed)
        vd, vc = delayed.verify(sd, tree, (), strategy), eager.verify(sc, tree, (), "closed_form")
        assert close(vd.logits, vc.logits), (n, seed, strategy)
        path = tree.path_to(int(tree.depth.argmax()))
        sd, sc = delayed.commit(sd, vd, path), eager.commit(sc, vc, path)

    step(9, 1)
    single, twin = delayed.verify(sd, Tree.single(7)), eager.verify(sc, Tree.single(7))
    assert close(single.logits, twin.logits)  # the decode step: flushed first
    sd, sc = delayed.commit(sd, single, [0]), eager.commit(sc, twin, [0])
    step(6, 2)
    step(7, 3, "replay")  # another strategy: flushed first
    step(12, 4)
    sd, ver = delayed.prefill(small_ids(4, 9), sd)  # continues the exported (flushed) state
    sc, ref = eager.prefill(small_ids(4, 9), sc)
    assert close(ver.logits, ref.logits)
    for seed in range(5, 9):  # past max_len 32: the buffers grow, the state is exported (flushed) first
        step(10, seed)
    assert delayed.max_len > 32
    assert state_diff(delayed._exported(sd), eager._exported(sc)) <= 1e-12
    tree = token_tree(6, 20)
    first = delayed.verify(sd, tree, (), "delayed")
    delayed.verify(sd, tree, (), "delayed")
    with pytest.raises(ValueError, match="commit the latest"):
        delayed.commit(sd, first, [0])
    step(5, 21)  # the pending commit of this step is dropped by the next prefill
    fresh, ver = delayed.prefill(prompt)
    assert delayed._pending is None and close(ver.logits, model.prefill(prompt)[1].logits)
    tree = token_tree(8, 22)
    vd = delayed.verify(fresh, tree, (), "delayed")
    assert close(vd.logits, model.verify(model.prefill(prompt)[0], tree).logits, 1e-10)


class WarmedCall:
    """GraphedCall's protocol on CPU: its two warm-up calls (their writes to the state are the target's to
    undo), then every call runs the function again (a replay)."""

    def __init__(self, fn, device, warmup: int = 2) -> None:  # noqa: ANN001 - GraphedCall's signature
        for _ in range(warmup):
            fn()
        self.fn = fn

    def __call__(self) -> object:
        return self.fn()


def test_captures_between_delayed_steps_keep_the_pending_commit(monkeypatch):
    """The target's graph bookkeeping on CPU (GraphedCall replaced by warm-ups + eager replays): prepare
    for delayed slots (both parities, the flushes), then delayed steps that capture new slot sizes while
    a commit is pending (flushed first, warm-ups undone), a decode step and the device path: every
    step's logits equal the closed-form twin's and the final states agree."""
    import repro.models.graphs as graphs

    monkeypatch.setattr(graphs, "GraphedCall", WarmedCall)
    _, delayed, eager, prompt = twins(27, max_len=64, max_nodes=32)
    delayed.graphs = True
    delayed.prepare(("delayed",), (1,), 8)
    assert {("flush", 0), ("flush", 1), ("verify", 8, "delayed1")} <= set(delayed._calls)
    sd, _ = delayed.prefill(prompt)
    sc, _ = eager.prefill(prompt)
    for step, n in enumerate((6, 20, 5, 30, 1, 12)):  # 20 and 30 nodes: slots captured mid-sequence
        tree = token_tree(n, 200 + step)
        vd = delayed.verify(sd, tree, (1,), "delayed")
        vc = eager.verify(sc, tree, (1,), "closed_form")
        assert close(vd.logits, vc.logits), step
        path = tree.path_to(int(tree.depth.argmax()))
        sd, sc = delayed.commit(sd, vd, path), eager.commit(sc, vc, path)
    captured = delayed.captures
    assert captured > 30 and any(k[:2] == ("verify", 32) for k in delayed._calls)
    assert state_diff(delayed._exported(sd), eager._exported(sc)) <= 1e-12
    for route, twin in zip(device_routes()[1:], device_routes()[1:]):  # twin drafters: the same draws
        route.commit, twin.commit = "delayed", "closed_form"
        got = generate(delayed, prompt, route, 20, reference_ids=small_ids(40, 13))
        want = generate(eager, prompt, twin, 20, reference_ids=small_ids(40, 13))
        assert got.output_ids == want.output_ids and got.accepted_paths == want.accepted_paths
        assert state_diff(delayed.decoder.export(), eager.decoder.export()) <= 1e-12
    assert delayed.captures > captured


def test_delayed_steps_are_capture_safe():
    """The delayed verify (pending applied in torch), commit and flush: no host read, no data-dependent
    shape, and the same ops on the same shapes for trees of 5 and 8 nodes on one slot."""
    model = small_hybrid(23)
    dec = StaticDecoder(model, max_len=32, max_nodes=16)
    dec.load(model.prefill(small_ids(6, 8))[0])
    traces = []
    for n in (5, 8):
        tree = token_tree(n, n)
        for parity in (0, 1):
            slot = TreeSlot(dec, 8, capture=(1,), derive=True, parity=parity)
            slot.set_tree(tree, pad=True)
            verify = check_capture(lambda s=slot: dec.verify(s))
            slot.set_accepted(tree.path_to(n - 1))
            commit = check_capture(lambda s=slot: dec.commit(s, "delayed"))
            flush = check_capture(lambda p=parity: dec.flush(p))
            assert verify.hazards == commit.hazards == flush.hazards == [], (n, parity)
            traces.append((verify.trace, commit.trace))
    assert traces[0] == traces[2] and traces[1] == traces[3]
    with pytest.raises(ConfigError, match="needs a slot made with a parity"):
        dec.commit(TreeSlot(dec, 4), "delayed")
    with pytest.raises(ConfigError, match="tree slot without snapshots"):
        TreeSlot(dec, 4, snapshots=True, parity=0)


def test_specla_defaults_to_the_delayed_commit_on_the_graphed_target_only():
    """specla's default commit: ``delayed`` on the graphed target, ``closed_form`` (the same commit at
    commit time) on HybridLM; an explicit ``delayed`` on HybridLM runs as ``closed_form`` too."""
    model = small_hybrid(24)
    target = GraphedTarget(model, max_len=32, max_nodes=16)
    spec = {"kind": "specla", "drafter": "random", "budget": 8}
    assert build_route(spec, SMALL_VOCAB, "greedy", 0.0, 0, target).commit == "delayed"
    assert build_route(spec, SMALL_VOCAB, "greedy", 0.0, 0, model).commit == "closed_form"
    ddtree = {"kind": "ddtree", "drafter": "random", "budget": 8, "commit": "delayed"}
    assert build_route(ddtree, SMALL_VOCAB, "greedy", 0.0, 0, target).params["commit"] == "delayed"
    assert build_route(ddtree, SMALL_VOCAB, "greedy", 0.0, 0, model).params["commit"] == "closed_form"
    with pytest.raises(ConfigError, match="commit must be one of"):
        build_route({**ddtree, "commit": "later"}, SMALL_VOCAB, "greedy", 0.0, 0, target)


def test_generate_with_the_delayed_commit_equals_ar_on_the_trained_family():
    """The trained tiny-qwen35 in float64 on the graphed target (no graphs on CPU): specla (delayed by
    default there) and DDTree with ``commit: delayed`` reproduce AR's tokens, speculate (fewer steps
    than tokens), run on delayed slots, and leave the same state (flushed at the end of generation) as
    the closed-form commit (to 1e-12)."""
    from repro.models.target import open_target

    model, tok = open_target("default", dtype="float64", device="cpu")
    target = GraphedTarget(model, max_len=256, max_nodes=64)
    vocab = model.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 42)
    prompt = tok.chat_prompt([{"role": "user", "content": "What is 12 times 7? Explain."}])
    ref = generate(model, prompt, ar, 40).output_ids
    specs = [
        {"kind": "specla", "budget": 16, "topk": 4, "tau": 0.05, "depth": 6},
        {"kind": "ddtree", "budget": 16, "commit": "delayed"},
    ]
    for spec in specs:
        route = build_route(spec, vocab, "greedy", 0.0, 42, target=target, family="tiny-qwen35")
        assert route.commit == "delayed", spec
        got = generate(target, prompt, route, 40, reference_ids=ref)
        assert got.output_ids == ref, spec
        assert got.steps < len(ref) - 5 and target._pending is None, (spec, got.steps)
        delayed_state = target.decoder.export()
        route.commit = "closed_form"
        again = generate(target, prompt, route, 40, reference_ids=ref)
        assert again.output_ids == ref and again.accepted_paths == got.accepted_paths
        assert state_diff(target.decoder.export(), delayed_state) <= 1e-12, spec
    assert any(str(k[1]).startswith("delayed") for k in target._slots)


def test_sampling_on_the_device_path_with_the_delayed_commit_equals_ar():
    """sample_match (AR's keyed samples) on specla's delayed commit through the device sampling path:
    AR's sampled tokens (float64), the pending commit recorded like the greedy path's; spec_sampling on
    the delayed and the closed-form commit: the same tokens (the same keyed uniforms, the same states)."""
    from repro.decoding.engine import device_sampling
    from repro.models.target import open_target

    model, tok = open_target("default", dtype="float64", device="cpu")
    target = GraphedTarget(model, max_len=256, max_nodes=64)
    vocab = model.config.vocab_size
    prompt = tok.chat_prompt([{"role": "user", "content": "Write a short poem about the sea."}])
    ar = build_route({"kind": "ar"}, vocab, "sample_match", 0.8, 7)
    ref = generate(model, prompt, ar, 40).output_ids
    spec = {"kind": "specla", "budget": 16, "topk": 4, "tau": 0.05, "depth": 6}
    route = build_route(spec, vocab, "sample_match", 0.8, 7, target=target, family="tiny-qwen35")
    assert route.commit == "delayed" and device_sampling(target, route)
    got = generate(target, prompt, route, 40, reference_ids=ref)
    assert got.output_ids == ref and got.steps < len(ref) - 5 and target._pending is None
    outputs = []
    for commit in ("delayed", "closed_form"):
        sampled = {**spec, "commit": commit}
        route = build_route(sampled, vocab, "spec_sampling", 0.8, 7, target=target, family="tiny-qwen35")
        outputs.append(generate(target, prompt, route, 40).output_ids)
    assert outputs[0] == outputs[1]


# --------------------------------------------------------- the Triton kernels through the interpreter


def _interpreter_errors() -> dict[str, float]:
    """float32 decoders on the Triton kernels (fused and split tree kernels, pending inside them; flush by
    the path commit) vs closed-form twins (the path commit): the largest logit and state differences
    over delayed steps."""
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    model = small_hybrid(25).to(torch.float32)
    state, _ = model.prefill(small_ids(7, 26))
    errs: dict[str, float] = {}
    for kernel in ("fused", "split"):
        # the torch glue around the Triton tree kernel (fused=False): the fused prologue is slow to interpret
        decs = [StaticDecoder(model, 32, 16, kernel="triton", fused=False, tree_kernel=kernel) for _ in "ab"]
        for d in decs:
            d.load(state)
        logit_err = 0.0
        for step, n in enumerate((6, 9, 4)):
            tree = token_tree(n, 30 + step)
            path = tree.path_to(int(tree.depth.argmax()))
            slots = [TreeSlot(decs[0], 16, derive=True, parity=step % 2), TreeSlot(decs[1], 16, derive=True)]
            out = []
            for d, slot, strategy in zip(decs, slots, ("delayed", "closed_form")):
                slot.set_tree(tree, pad=True)
                out.append(d.verify(slot)[:n].clone())
                slot.set_accepted(path)
                d.commit(slot, strategy)
            logit_err = max(logit_err, float((out[0] - out[1]).abs().max()))
        errs[f"{kernel}_logits"] = logit_err
        errs[f"{kernel}_state"] = state_diff(decs[0].export(), decs[1].export())
        errs[f"{kernel}_pending_after_export"] = float(decs[0].pending_sets[0].node.max())
    return errs


def test_pending_commit_inside_the_triton_tree_kernels_through_the_interpreter():
    errs = run_in_interpreter(__file__, "--interpret-delayed")
    for kernel in ("fused", "split"):
        # float32: the path commit (the twins' flush) sums its rows in another order than the kernels
        assert errs[f"{kernel}_logits"] < 1e-5 and errs[f"{kernel}_state"] < 1e-5, errs
        assert errs[f"{kernel}_pending_after_export"] == -1, errs


# ------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_delayed_routes_equal_ar_in_float32_on_graphs():
    """tiny-qwen35 in float32 on CUDA graphs: specla (delayed by default) and DDTree (delayed) equal AR
    on two prompts; the flushed state is the path commit's to float32 rounding."""
    from repro.models.target import open_target

    model, tok = open_target("default", dtype="float32", device="cuda")
    model.set_gdn_backend("triton")
    target = GraphedTarget(model, max_len=256, max_nodes=64)
    vocab = model.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 42)
    prompts = [tok.chat_prompt([{"role": "user", "content": c}]) for c in ("Count to ten.", "Add 3 and 4.")]
    for spec in ({"kind": "specla", "budget": 32}, {"kind": "ddtree", "budget": 32, "commit": "delayed"}):
        route = build_route(spec, vocab, "greedy", 0.0, 42, target=target, family="tiny-qwen35")
        target.prepare(("delayed", "closed_form"), route.drafter.capture_layers, 64)
        for p in prompts:
            ref = generate(target, p, ar, 48).output_ids
            got = generate(target, p, route, 48, reference_ids=ref)
            assert route.commit == "delayed" and got.output_ids == ref, spec
            delayed_state = target.decoder.export()
            route.commit = "closed_form"
            generate(target, p, route, 48, reference_ids=ref)
            route.commit = "delayed"
            assert state_diff(target.decoder.export(), delayed_state) < 1e-5, spec
    assert target.captures > 0


if __name__ == "__main__" and sys.argv[-1] == "--interpret-delayed":
    print(json.dumps(_interpreter_errors()))
