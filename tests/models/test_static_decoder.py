"""Static-buffer decoder (repro.models.static) against HybridLM, and its CUDA graphs.

CPU tests (reference kernels, float64): decode_step, verify, the three commits and device-side
acceptance agree with HybridLM.verify / commit / TargetMatch to 1e-10, and greedy decoding through
the static steps (AR and speculative, eager) reproduces AR's tokens exactly.
GPU tests (``gpu``): the same steps eager and as CUDA graphs on the Triton/fla kernels, against
HybridLM (reference GDN path) in float32 (1e-4) and bfloat16 (looser; the errors are printed), with the
selected and the forced other tree kernel.
Interpreter tests (one TRITON_INTERPRET=1 subprocess for all): the Triton kernel paths on CPU tensors,
among them the split tree kernel and the path commit, and which tree kernel the decoder picks.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import CountedLaunches, random_tree, run_in_interpreter, seed_of

from repro.decoding.acceptance import TargetMatch
from repro.decoding.engine import Route, generate
from repro.decoding.tree_builders import SingleNode
from repro.errors import ConfigError
from repro.gdn.chain import select_tree_kernel
from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights
from repro.models.graphs import check_capture, count_ops, diagnose
from repro.models.hybrid import HybridLM
from repro.models.state import ModelState
from repro.models.static import StaticDecoder, TreeSlot
from repro.models.static_layers import AttentionWeights, GDNWeights
from repro.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")
VOCAB = 61
F64 = torch.float64


def config(layers: list[str] | None = None, output_gate: bool = True) -> HybridConfig:
    return HybridConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        layer_types=layers or [GDN, ATTENTION, GDN, GDN, ATTENTION],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_output_gate=output_gate,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        partial_rotary_factor=0.5,
    )


def build(cfg: HybridConfig, dtype: torch.dtype = F64, device: str = "cpu", seed: int = 0) -> HybridLM:
    return init_random_weights(HybridLM(cfg), seed).to(device=device, dtype=dtype).eval()


@pytest.fixture(scope="module")
def model() -> HybridLM:
    return build(config())


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def state_err(a: ModelState, b: ModelState) -> float:
    """Largest relative error over every buffer of two states (positions must match)."""
    assert a.position == b.position
    errs = [rel(u, v) for x, y in zip(a.layers, b.layers) for u, v in zip(vars(x).values(), vars(y).values())]
    return max(errs)


def random_token_tree(n: int, kind: str, seed: int) -> Tree:
    gen = torch.Generator().manual_seed(seed)
    parents = random_tree(n, kind, gen)
    parents[0] = -1
    return Tree(torch.randint(0, VOCAB, (n,), generator=gen), parents)


# ------------------------------------------------------------------------------- CPU, exact


def test_decode_steps_match_hybrid_verify_and_commit(model):
    state, _ = model.prefill(ids(13, 1))
    dec = StaticDecoder(model, max_len=32, max_nodes=8)
    dec.load(state)
    for tok in ids(5, 2).tolist():
        dec.set_token(tok)
        logits = dec.decode_step()
        ver = model.verify(state, Tree.single(tok))
        state = model.commit(state, ver, [0])
        assert rel(logits, ver.logits) < 1e-10
        assert state_err(dec.export(), state) < 1e-10
    assert int(dec.length) == 18


@pytest.mark.parametrize("kind", ["random", "mixed", "forest", "chain", "fan"])
def test_verify_matches_hybrid_on_random_trees(model, kind):
    state, _ = model.prefill(ids(9, 3))
    dec = StaticDecoder(model, max_len=40, max_nodes=16)
    dec.load(state)
    tree = random_token_tree(13, kind, seed_of(kind))
    slot = TreeSlot(dec, 13)
    slot.set_tree(tree)
    logits = dec.verify(slot)
    assert rel(logits, model.verify(state, tree).logits) < 1e-10
    assert state_err(dec.export(), state) == 0.0  # verify never writes the state


@pytest.mark.parametrize("strategy", ["replay", "closed_form", "snapshot"])
def test_commit_strategies_match_hybrid(strategy):
    model = build(config(), seed=4)
    state, _ = model.prefill(ids(11, 5), strategy=strategy)
    dec = StaticDecoder(model, max_len=48, max_nodes=16)
    tree = random_token_tree(14, "mixed", 6)
    slot = TreeSlot(dec, 14, max_depth=int(tree.depth.max()), snapshots=strategy == "snapshot")
    slot.set_tree(tree)
    ver = model.verify(state, tree, strategy=strategy)
    deepest = int(tree.depth.argmax())
    for end in (0, deepest, 13):  # the root alone, the deepest path, a path ending at the last node
        path = tree.path_to(end)
        dec.load(state)
        dec.verify(slot)
        slot.set_accepted(path)
        dec.commit(slot, strategy)
        ref = model.commit(state, ver, path)
        assert state_err(dec.export(), ref) < 1e-10, path
        dec.set_token(7)  # the next step reads the committed KV rows, conv window and state
        assert rel(dec.decode_step(), model.verify(ref, Tree.single(7)).logits) < 1e-10


def test_pure_gdn_without_output_gate():
    model = build(config([GDN, GDN], output_gate=False), seed=8)
    state, _ = model.prefill(ids(6, 9))
    dec = StaticDecoder(model, max_len=16, max_nodes=8)
    dec.load(state)
    tree = random_token_tree(6, "random", 10)
    slot = TreeSlot(dec, 6)
    slot.set_tree(tree)
    assert rel(dec.verify(slot), model.verify(state, tree).logits) < 1e-10


def planted_tree(model: HybridLM, state: ModelState, root: int, seed: int) -> Tree:
    """Node 0 = root, then per level two children of the path's node: the target's greedy token and
    a random one (sometimes the same token again, listed after the first: TargetMatch takes the first)."""
    gen = torch.Generator().manual_seed(seed)
    tokens, parents, prev = [root], [-1], 0
    for t in generate_greedy(model, state, root, 4):
        side = (
            t
            if int(torch.randint(0, 3, (), generator=gen)) == 0
            else int(torch.randint(0, VOCAB, (), generator=gen))
        )
        pair = [t, side] if int(torch.randint(0, 2, (), generator=gen)) else [side, t]
        tokens += pair
        parents += [prev, prev]
        prev = len(tokens) - 2 + pair.index(t)
    return Tree(torch.tensor(tokens), torch.tensor(parents))


def generate_greedy(model: HybridLM, state: ModelState, root: int, n: int) -> list[int]:
    out, tok = [], root
    for _ in range(n):
        ver = model.verify(state, Tree.single(tok))
        state = model.commit(state, ver, [0])
        tok = int(ver.logits[0].argmax())
        out.append(tok)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_accept_matches_target_match(model, seed):
    state, _ = model.prefill(ids(8, 20 + seed))
    tree = planted_tree(model, state, 5, seed)
    dec = StaticDecoder(model, max_len=32, max_nodes=16)
    dec.load(state)
    slot = TreeSlot(dec, tree.size)
    slot.set_tree(tree)
    dec.verify(slot)
    dec.accept(slot)
    ref = TargetMatch(0.0, 0).accept(tree, model.verify(state, tree).logits, 0)
    assert slot.accepted() == (ref.path, ref.bonus)
    assert len(ref.path) > 1  # the planted continuation was accepted at least one level deep


def test_accept_takes_the_first_matching_sibling(model):
    """Two children carry the target's token; only the second continues the greedy chain. The walk
    (TargetMatch) enters the first and stops there; a deeper match below the second does not count."""
    state, _ = model.prefill(ids(8, 24))
    t1, t2 = generate_greedy(model, state, 5, 2)
    wrong = (t2 + 1) % VOCAB
    tree = Tree(torch.tensor([5, t1, t1, wrong, t2]), torch.tensor([-1, 0, 0, 1, 2]))
    dec = StaticDecoder(model, max_len=32, max_nodes=8)
    dec.load(state)
    slot = TreeSlot(dec, 5)
    slot.set_tree(tree)
    dec.verify(slot)
    dec.accept(slot)
    assert slot.accepted() == ([0, 1], t2)


def test_static_greedy_decoding_equals_ar(model):
    """AR through decode_step, and speculative decoding through step() on planted trees, both give
    exactly the tokens of the engine's AR route (float64)."""
    prompt = ids(10, 30).tolist()
    rule = TargetMatch(0.0, 0)
    want = generate(model, prompt, Route("ar", None, SingleNode(), rule), 24).output_ids
    state, ver = model.prefill(prompt)
    first = int(ver.logits[-1].argmax())

    dec = StaticDecoder(model, max_len=64, max_nodes=16)
    dec.load(state)
    out = [first]
    while len(out) < 24:
        dec.set_token(out[-1])
        out.append(int(dec.decode_step()[0].argmax()))
    assert out == want

    dec.load(state)
    out, steps, ref_state = [first], 0, state
    slot = TreeSlot(dec, 9)
    while len(out) < 24:
        tree = planted_tree(model, ref_state, out[-1], steps)
        slot.set_tree(tree)
        dec.step(slot, "replay")
        path, bonus = slot.accepted()
        out += tree.tokens[path[1:]].tolist() + [bonus]
        ref_state = model.commit(ref_state, model.verify(ref_state, tree), path)
        steps += 1
    assert out[:24] == want
    assert steps < 23  # several tokens per step


def test_length_saturates_at_max_len(model):
    state, _ = model.prefill(ids(4, 40))
    dec = StaticDecoder(model, max_len=6, max_nodes=4)
    dec.load(state)
    slot = TreeSlot(dec, 4)
    slot.set_tree(Tree.chain(ids(4, 41)))
    dec.verify(slot)
    slot.set_accepted([0, 1, 2, 3])
    dec.commit(slot, "replay")  # 4 + 4 > 6: clamped, writes stay in bounds
    for _ in range(3):
        dec.decode_step()
    assert int(dec.length) == 6


def test_bad_inputs_are_config_errors(model):
    state, _ = model.prefill(ids(5, 50))
    dec = StaticDecoder(model, max_len=8, max_nodes=4)
    with pytest.raises(ConfigError, match="tree size 5"):
        TreeSlot(dec, 5)
    slot = TreeSlot(dec, 4, max_depth=3)
    with pytest.raises(ConfigError, match="slot verifies trees of 4"):
        slot.set_tree(Tree.chain([1, 2, 3]))
    with pytest.raises(ConfigError, match="exceeds the slot's max_depth"):
        slot.set_tree(Tree.chain([1, 2, 3, 4]))
    slot.set_tree(Tree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, 0, 1])))
    with pytest.raises(ConfigError, match="not a root-to-node path"):
        slot.set_accepted([0, 3])
    with pytest.raises(ConfigError, match="snapshots=True"):
        dec.commit(slot, "snapshot")
    with pytest.raises(ConfigError, match="unknown commit strategy"):
        dec.commit(slot, "teleport")
    with pytest.raises(ConfigError, match="max_len is 4"):
        StaticDecoder(model, max_len=4).load(state)
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        StaticDecoder(model, max_len=8, kernel="triton")
    with pytest.raises(ConfigError, match="fused=True needs the triton GDN kernels"):
        StaticDecoder(model, max_len=8, fused=True)
    with pytest.raises(ConfigError, match="choose fused or compile"):
        StaticDecoder(model, max_len=8, kernel="triton", fused=True, compile=True)
    assert not StaticDecoder(model, max_len=8).fused  # the reference kernel: the unfused glue
    with pytest.raises(ConfigError, match="gemv=True runs inside the fused decoder"):
        StaticDecoder(model, max_len=8, gemv=True)


# ------------------------------------------------------------- capture safety and op counts (CPU)


def step_calls(dec: StaticDecoder, slot: TreeSlot) -> dict[str, object]:
    calls = {
        "decode_step": dec.decode_step,
        "verify": lambda: dec.verify(slot),
        "accept": lambda: dec.accept(slot),
    }
    for strategy in ("replay", "closed_form", "snapshot"):
        calls[f"commit_{strategy}"] = lambda s=strategy: dec.commit(slot, s)
    calls["step"] = lambda: dec.step(slot, "replay")
    return calls


@pytest.mark.parametrize(
    "dtype,heads,want",
    [
        (torch.bfloat16, 8, "split"),  # SpecLA's GDN-1.3B: 17.8 vs 22.9 us (T = 64), 27.4 vs 50.0 (T = 128)
        (torch.float16, 16, "split"),
        (torch.bfloat16, 17, "fused"),
        (torch.bfloat16, 48, "fused"),  # Weaver's shape outside the size window
        (torch.float32, 8, "fused"),  # float32 inputs: split loses badly
        (torch.float64, 4, "fused"),
    ],
)
def test_tree_kernel_selection_rule(dtype, heads, want):
    assert select_tree_kernel(dtype, heads) == want


def test_tree_kernel_by_tree_size_at_many_heads(monkeypatch):
    """At Weaver's 48 heads the split form wins for 64 < n <= 256 only (32.8 vs 41.5 us at T = 128, 92.1 vs
    99.6 at 256; a tie at 64); float32 stays fused; few heads stay split at every size. The static decoder
    picks per slot size unless a kernel is forced."""
    bf16 = torch.bfloat16
    assert [select_tree_kernel(bf16, 48, n) for n in (33, 64, 65, 128, 129, 256, 257)] == [
        "fused", "fused", "split", "split", "split", "split", "fused"
    ]  # fmt: skip
    assert select_tree_kernel(torch.float32, 48, 128) == "fused"
    assert select_tree_kernel(bf16, 8, 256) == "split"
    from repro.gdn import backends

    monkeypatch.setattr(backends, "interpreting", lambda: True)  # the decoder built on the CPU, never run
    cfg = config([GDN])
    cfg.linear_num_value_heads = 48
    m = build(cfg, dtype=bf16, seed=5)
    dec = StaticDecoder(m, 16, 4, kernel="triton")
    assert dec.tree_kernel == "fused" and [dec.tree_kernel_at(n) for n in (64, 65, 256, 257)] == [
        "fused", "split", "split", "fused"
    ]  # fmt: skip
    assert dec._tree_for(33) is dec._tree and dec._tree_for(100) is not dec._tree
    forced = StaticDecoder(m, 16, 4, kernel="triton", tree_kernel="fused")
    assert forced.tree_kernel_at(100) == "fused" and forced._tree_for(100) is forced._tree


def test_peel_root_moves_the_split_slots_of_2k_plus_1_nodes(monkeypatch):
    """PEEL_ROOT (the switch peel_root; off by default): where the split form is picked for a slot of 2^k + 1
    nodes, 16 <= 2^k <= 64, it is taken with node 0 peeled ("split_peel", a tree function of its own); other
    sizes (129: 64-row blocks, measured slower), the fused picks and a forced kernel stay as they are."""
    from repro.gdn import backends
    from repro.models import static

    assert not static.PEEL_ROOT
    assert [n for n in (1, 2, 3, 16, 17, 18, 32, 33, 64, 65, 129, 257) if static.peels_root(n)] == [
        17, 33, 65
    ]  # fmt: skip
    monkeypatch.setattr(backends, "interpreting", lambda: True)  # the decoder built on the CPU, never run
    cfg = config([GDN])
    cfg.linear_num_value_heads = 48
    m = build(cfg, dtype=torch.bfloat16, seed=5)
    dec = StaticDecoder(m, 16, 4, kernel="triton")
    sizes = (64, 65, 128, 129, 257)
    assert [dec.tree_kernel_at(n) for n in sizes] == ["fused", "split", "split", "split", "fused"]
    monkeypatch.setattr(static, "PEEL_ROOT", True)
    assert [dec.tree_kernel_at(n) for n in sizes] == ["fused", "split_peel", "split", "split", "fused"]
    assert dec._tree_for(65) is backends.tree_function("triton", dec.device, True, "split_peel")
    assert dec._tree_for(65) is not dec._tree_for(128)
    forced = StaticDecoder(m, 16, 4, kernel="triton", tree_kernel="split")
    assert forced.tree_kernel_at(65) == "split"


def test_slots_of_129_nodes_keep_an_aligned_mask_for_the_gdn_kernels(monkeypatch):
    """A slot over 65 nodes whose size is no multiple of 16 (the engine's 2^k + 1) keeps a copy of its
    ancestor mask in rows of a multiple of 16 bytes (triton_tree.mask_rows: the tree kernels' registers at
    129 nodes), refreshed by each verify before its layers and the one its GDN layers read; other sizes
    and the reference backend read the mask itself."""
    from repro.gdn import backends

    monkeypatch.setattr(backends, "interpreting", lambda: True)  # the decoder built on the CPU
    m = build(config([GDN]), dtype=torch.float32, seed=5)
    dec = StaticDecoder(m, 16, 129, kernel="triton")
    big, mid, small = TreeSlot(dec, 129), TreeSlot(dec, 65), TreeSlot(dec, 33)
    assert big.gdn_rows is not None and big.gdn_rows.stride() == (144, 1) and mid.gdn_rows is None
    assert small.gdn_rows is None and small.gdn_mask is small.ancestors
    assert TreeSlot(dec, 100).gdn_rows.stride() == (112, 1) and TreeSlot(dec, 112).gdn_rows is None
    assert TreeSlot(StaticDecoder(m, 16, 129), 129).gdn_rows is None  # the reference backend
    seen = []
    monkeypatch.setattr(dec, "_forward", lambda *a, **k: seen.append(big.gdn_rows.clone()) or torch.zeros(1))
    big.set_tree(Tree(torch.zeros(129, dtype=torch.long), torch.arange(129) - 1))  # a chain: every ancestor
    dec.verify(big)
    assert torch.equal(seen[0], big.ancestors) and big.ancestors.sum() == 129 * 130 // 2
    assert big.gdn_mask is big.gdn_rows


def test_small_trees_of_a_listed_shape_take_the_fused_kernel(monkeypatch):
    """FUSED_UP_TO: at the tiny family's GDN shape (4 value heads, d = 48) trees of up to 17 nodes verify on
    the fused kernel in bf16 (186 vs 204 us a verify step), larger ones on the split form; other shapes, no
    head dims or float32 as before. The static decoder passes its shape."""
    from repro.gdn.chain import FUSED_UP_TO

    bf16, tiny = torch.bfloat16, (48, 48)
    assert FUSED_UP_TO == {(4, 48, 48): 17}
    assert [select_tree_kernel(bf16, 4, n, tiny) for n in (5, 17, 18, 33, 65)] == [
        "fused", "fused", "split", "split", "split"
    ]  # fmt: skip
    assert select_tree_kernel(bf16, 4, 17) == "split"  # no head dims: the head-count rule
    assert select_tree_kernel(bf16, 8, 16, (256, 256)) == "split"  # SpecLA's shape: split wins at 16
    assert select_tree_kernel(bf16, 4, 17, (64, 64)) == "split"  # another head size: not listed
    assert select_tree_kernel(torch.float32, 4, 33, tiny) == "fused"
    from repro.gdn import backends

    monkeypatch.setattr(backends, "interpreting", lambda: True)  # the decoder built on the CPU, never run
    cfg = config([GDN])
    cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim = 4, 48, 48
    cfg.linear_num_key_heads = 2
    dec = StaticDecoder(build(cfg, dtype=bf16, seed=5), 16, 4, kernel="triton")
    assert dec.tree_kernel == "split" and [dec.tree_kernel_at(n) for n in (17, 33)] == ["fused", "split"]
    assert dec._tree_for(17) is not dec._tree and dec._tree_for(33) is dec._tree


def test_tree_kernel_option_needs_the_triton_backend(model):
    dec = StaticDecoder(model, max_len=8)
    assert dec.kernel == "reference" and dec.tree_kernel is None and dec._path_commit is None
    for bad in ("split", "fused", "blocked"):
        with pytest.raises(ConfigError, match="tree_kernel="):
            StaticDecoder(model, max_len=8, tree_kernel=bad)


def test_steps_are_capture_safe(model):
    """Each capturable step under a dispatch mode that sees every aten op: none reads a device value on
    the host, makes a data-dependent shape or copies host data in (what made the accept graph fail on
    the H200: ``choice[node]`` with a 0-dim node is a host read), and two runs on different data (a
    planted tree accepted 5 deep vs random tokens on the same shape accepted at the root) run the same
    ops on the same shapes."""
    state, _ = model.prefill(ids(8, 60))
    planted = planted_tree(model, state, 5, 0)
    randomised = Tree(ids(planted.size, 61), planted.parents)
    traces, paths = [], []
    for tree in (planted, randomised):
        dec = StaticDecoder(model, max_len=48, max_nodes=16)
        slot = TreeSlot(dec, tree.size, max_depth=int(tree.depth.max()), snapshots=True)
        slot.set_tree(tree)
        dec.set_token(int(tree.tokens[1]))
        run = {}
        for name, fn in step_calls(dec, slot).items():  # in order: verify before accept and commits
            dec.load(state)
            check = check_capture(fn)
            assert check.hazards == [], (name, check.hazards)
            run[name] = check.trace
            if name == "accept":
                paths.append(slot.accepted()[0])
        traces.append(run)
    assert len(paths[0]) == 5 and len(paths[1]) < 5  # the data differed where it matters
    for name in traces[0]:
        assert traces[0][name] == traces[1][name], name


def test_capture_check_flags_host_reads_and_dynamic_shapes():
    """Negative controls for the check above: each of these breaks a CUDA graph capture."""
    x, node = torch.arange(6.0), torch.tensor(2)
    bad = {
        "0-dim index": lambda: x[node],
        "bool()": lambda: bool(x.sum() > 0),
        ".item()": lambda: x.max().item(),
        "mask index": lambda: x[x > 2],
        "nonzero": lambda: torch.nonzero(x),
        "torch.tensor": lambda: torch.tensor([1, 2]),
        "repeat_interleave": lambda: x.repeat_interleave(torch.ones(6, dtype=torch.long)),
        "unique": lambda: torch.unique(x),
    }
    for name, fn in bad.items():
        assert check_capture(fn).hazards, name
    # what GraphedCall adds to a failed capture's error
    assert "aten::_local_scalar_dense (reads a device value on the host)" in diagnose(bad["0-dim index"])
    assert check_capture(lambda: x.index_select(0, node.view(1)) + torch.where(x > 2, x, 0.0)).hazards == []
    assert check_capture(lambda: x[node.view(1).expand(3)]).hazards == []  # an integer gather is fine


def test_decode_step_ops_per_layer():
    """Aten ops that launch work per layer of a decode step (views and allocations excluded; the GDN
    count includes the float64 reference recurrence, one fla kernel on CUDA). Stacked projections,
    precomputed gate constants and norm scales, one L2 norm for q and k, rotary tables and masks once
    per step and residual adds fused into the matmuls took these from 75 (GDN) and 80 (attention)."""

    def per_layer(kind: str) -> int:
        counts = []
        for n in (1, 2):
            model = build(config([kind] * n), seed=3)
            dec = StaticDecoder(model, max_len=16, max_nodes=4)
            dec.load(model.prefill(ids(5, 62))[0])
            counts.append(count_ops(dec.decode_step))
        return counts[1] - counts[0]

    assert per_layer(GDN) <= 56
    assert per_layer(ATTENTION) <= 59


# ------------------------------------------------------------------------------------- GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("strategy", ["replay", "closed_form", "snapshot"])
@pytest.mark.parametrize("forced", [False, True])
def test_gpu_graphs_match_eager_and_hybrid(dtype, tol, strategy, forced):
    """Eager and graphed steps vs HybridLM; the selected tree kernel (bf16 at 4 value heads: split;
    float32: fused) or, ``forced``, the other one."""
    from repro.models.graphs import GraphedCall

    selected = "split" if dtype == torch.bfloat16 else "fused"
    tree_kernel = {"split": "fused", "fused": "split"}[selected] if forced else None

    dev = torch.device("cuda")
    cfg = config()
    cfg.linear_key_head_dim = cfg.linear_value_head_dim = 32  # kernel tiles: head dims of 16+
    model = build(cfg, dtype=dtype, device="cuda", seed=11)
    state, _ = model.prefill(ids(40, 12), strategy=strategy)
    tree = random_token_tree(24, "mixed", 13)
    path = tree.path_to(int(tree.depth.argmax()))
    ref = model.verify(state, tree, strategy=strategy)
    ref_state = model.commit(state, ref, path)
    ref_decode = model.verify(ref_state, Tree.single(9)).logits

    errs = {}
    for graphed in (False, True):
        dec = StaticDecoder(model, max_len=96, max_nodes=32, tree_kernel=tree_kernel)
        assert dec.tree_kernel == (tree_kernel or selected)
        slot = TreeSlot(dec, 24, max_depth=int(tree.depth.max()), snapshots=strategy == "snapshot")
        slot.set_tree(tree)
        dec.load(state)
        verify, commit, decode = (
            (lambda d=dec, s=slot: d.verify(s)),
            (lambda d=dec, s=slot: d.commit(s, strategy)),
            dec.decode_step,
        )
        if graphed:  # commit's graph reads what verify's graph saved: capture (and run) verify first
            verify = GraphedCall(verify, dev)
            verify()
            commit, decode = GraphedCall(commit, dev), GraphedCall(decode, dev)
            dec.load(state)
        logits = verify()
        slot.set_accepted(path)
        commit()
        got_state = dec.export()
        dec.set_token(9)
        next_logits = decode()
        errs[graphed] = (
            rel(logits, ref.logits),
            state_err(got_state, ref_state),
            rel(next_logits, ref_decode),
        )
        if graphed:
            assert logits.data_ptr() == verify.output.data_ptr()
    print(f"{dtype} {strategy} {dec.tree_kernel}: eager {errs[False]}, graphed {errs[True]}")
    for e in errs.values():
        assert max(e) < tol, errs
    assert max(abs(a - b) for a, b in zip(errs[True], errs[False])) < tol / 10


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_gpu_accept_and_step_graphs(dtype, tol):
    """The device acceptance and the fused verify+accept+commit step as CUDA graphs (both failed to
    capture on the H200 before accept stopped indexing with a 0-dim tensor): the accepted path and bonus
    are TargetMatch's on the same logits, and the committed state is HybridLM's commit of that path."""
    from repro.models.graphs import GraphedCall

    dev = torch.device("cuda")
    cfg = config()
    cfg.linear_key_head_dim = cfg.linear_value_head_dim = 32
    model = build(cfg, dtype=dtype, device="cuda", seed=21)
    state, _ = model.prefill(ids(40, 22))
    tree = planted_tree(model, state, 5, 0)
    dec = StaticDecoder(model, max_len=96, max_nodes=32)
    slot = TreeSlot(dec, tree.size, max_depth=int(tree.depth.max()))
    slot.set_tree(tree)
    dec.load(state)
    verify = GraphedCall(lambda: dec.verify(slot), dev)
    accept = GraphedCall(lambda: dec.accept(slot), dev)
    verify()
    accept()
    want = TargetMatch(0.0, 0).accept(tree, slot.logits.cpu(), 0)
    assert slot.accepted() == (want.path, want.bonus)
    if dtype == torch.float32:  # float32 logits agree with HybridLM's: the planted path is taken
        assert len(want.path) > 1

    step = GraphedCall(lambda: dec.step(slot, "replay"), dev)  # its warm-up calls commit: load again
    dec.load(state)
    logits = step()
    path, bonus = slot.accepted()
    want = TargetMatch(0.0, 0).accept(tree, logits.cpu(), 0)
    assert (path, bonus) == (want.path, want.bonus)
    ref_state = model.commit(state, model.verify(state, tree), path)
    err = state_err(dec.export(), ref_state)
    print(f"{dtype}: step graph accepted {len(path)} nodes, state error {err:.1e}")
    assert err < tol


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("heads", [(8, 8, 256), (16, 48, 128)], ids=["gdn-1.3b", "qwen3.6-27b"])
def test_gpu_fused_decoder_at_paper_layer_shapes(heads):
    """The fused decoder's graphs (decode steps, verify + closed-form commit) at the GDN-1.3B and
    Qwen3.6-27B GDN head layouts (small hidden size), float32, against HybridLM and the unfused decoder;
    the same with gemv=True (its decode graphs on the GEMV kernels)."""
    from repro.models.graphs import GraphedCall

    dev = torch.device("cuda")
    cfg = config([GDN, ATTENTION, GDN])
    cfg.hidden_size, cfg.intermediate_size = 256, 512
    cfg.linear_num_key_heads, cfg.linear_num_value_heads, d = heads
    cfg.linear_key_head_dim = cfg.linear_value_head_dim = d
    model = build(cfg, dtype=torch.float32, device="cuda", seed=41)
    state, _ = model.prefill(ids(40, 42))
    tree = random_token_tree(24, "mixed", 43)
    path = tree.path_to(int(tree.depth.argmax()))
    ver = model.verify(state, tree)
    ref_state = model.commit(state, ver, path)
    results = {}
    for fused, gemv in ((True, False), (False, False), (True, True)):
        dec = StaticDecoder(model, max_len=96, max_nodes=32, fused=fused, gemv=gemv)
        slot = TreeSlot(dec, 24, max_depth=int(tree.depth.max()))
        slot.set_tree(tree)
        dec.load(state)
        verify = GraphedCall(lambda d=dec, s=slot: d.verify(s), dev)
        commit = GraphedCall(lambda d=dec, s=slot: d.commit(s, "closed_form"), dev)
        decode = GraphedCall(dec.decode_step, dev)
        dec.load(state)
        errs = {"verify": rel(verify(), ver.logits)}
        slot.set_accepted(path)
        commit()
        errs["commit"] = state_err(dec.export(), ref_state)
        ref = ref_state
        for tok in (3, 9, 27):
            dec.set_token(tok)
            step = model.verify(ref, Tree.single(tok))
            errs[f"decode_{tok}"] = rel(decode(), step.logits)
            ref = model.commit(ref, step, [0])
        errs["state"] = state_err(dec.export(), ref)
        results[("unfused", "fused", "gemv")[fused + gemv]] = errs
    print(heads, results)
    assert max(results["fused"].values()) < 1e-4, results
    assert max(results["gemv"].values()) < 1e-4, results


@pytest.mark.gpu
@needs_cuda
def test_gpu_gemv_decode_graph_at_the_1p3b_width():
    """Two GDN-1.3B layers at full width (hidden 2048, 8 x 256 heads, MLP 5632, vocab 32000) in bf16:
    decode graphs with gemv=True against the fused decoder's (cuBLAS matmuls) and HybridLM."""
    from repro.models.graphs import GraphedCall

    dev = torch.device("cuda")
    cfg = config([GDN, GDN])
    cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size = 32000, 2048, 5632
    cfg.linear_num_key_heads = cfg.linear_num_value_heads = 8
    cfg.linear_key_head_dim = cfg.linear_value_head_dim = 256
    model = build(cfg, dtype=torch.bfloat16, device="cuda", seed=45)
    state, _ = model.prefill(ids(40, 46))
    logits = {}
    for gemv in (False, True):
        dec = StaticDecoder(model, max_len=64, max_nodes=4, gemv=gemv)
        decode = GraphedCall(dec.decode_step, dev)
        dec.load(state)
        out = []
        for tok in (3, 9, 27):
            dec.set_token(tok)
            out.append(decode().clone())
        logits[gemv] = torch.cat(out)
    ref, hybrid = state, []
    for tok in (3, 9, 27):
        step = model.verify(ref, Tree.single(tok))
        hybrid.append(step.logits)
        ref = model.commit(ref, step, [0])
    errs = {
        "gemv_vs_fused": rel(logits[True], logits[False]),
        "gemv_vs_hybrid": rel(logits[True], torch.cat(hybrid)),
    }
    errs["fused_vs_hybrid"] = rel(logits[False], torch.cat(hybrid))
    print(errs)
    assert errs["gemv_vs_fused"] < 2e-2 and errs["gemv_vs_hybrid"] < 5e-2, errs


# --------------------------------------------- the Triton/fla kernel path through Triton's interpreter


def _interpreter_case(
    dtype: torch.dtype,
    strategies: tuple[str, ...],
    fused: bool,
    layers: list[str] | None = None,
    gemv: bool = False,
    tree_kernel: str | None = None,
    value_heads: int | None = None,
    nodes: int = 9,
) -> dict[str, float]:
    """StaticDecoder with kernel="triton" (a Triton tree kernel, ``tree_kernel`` or the one selected for the
    slot's size; fla recurrence or the fused decode kernels; ``gemv``: decode steps on the GEMV kernels) on
    CPU tensors vs HybridLM: verify of a ``nodes``-node tree, commit, then two decode steps (logits and
    state); ``value_heads``: the GDN layers' (a multiple of the key heads)."""
    cfg = config(layers)
    cfg.linear_key_head_dim = cfg.linear_value_head_dim = 16
    if value_heads is not None:
        cfg.linear_num_value_heads = value_heads
    model = build(cfg, dtype=dtype, seed=17)
    state, _ = model.prefill(ids(10, 18))
    tree = random_token_tree(nodes, "mixed", 19)
    path = tree.path_to(int(tree.depth.argmax()))
    ver = model.verify(state, tree)
    errs = {}
    for strategy in strategies:
        dec = StaticDecoder(
            model, max_len=96, max_nodes=max(16, nodes), kernel="triton", fused=fused, gemv=gemv,
            tree_kernel=tree_kernel,
        )  # fmt: skip
        if value_heads is not None:  # which kernel the slot's size selects
            errs["split_selected"] = float(dec.tree_kernel_at(nodes) == "split")
        dec.load(state)
        slot = TreeSlot(dec, nodes, max_depth=int(tree.depth.max()), snapshots=strategy == "snapshot")
        slot.set_tree(tree)
        errs["verify"] = rel(dec.verify(slot), ver.logits)
        slot.set_accepted(path)
        dec.commit(slot, strategy)
        ref = model.commit(state, ver, path)
        errs[f"commit_{strategy}"] = state_err(dec.export(), ref)
        for tok in (4, 11):
            dec.set_token(tok)
            step = model.verify(ref, Tree.single(tok))
            errs[f"decode_{tok}_after_{strategy}"] = rel(dec.decode_step(), step.logits)
            ref = model.commit(ref, step, [0])
            errs[f"decode_{tok}_state_after_{strategy}"] = state_err(dec.export(), ref)
    return errs


def _count_launches(counter: list[int]) -> None:
    """Count every launch of the fused decode and GEMV Triton kernels (module attributes replaced)."""
    from repro.gdn import triton_decode, triton_linear

    for module in (triton_decode, triton_linear):
        for name in dir(module):
            if name.endswith("_kernel"):
                setattr(module, name, CountedLaunches(getattr(module, name), counter))


def _selected_kernels_and_launches() -> dict[str, object]:
    """Which tree kernel the triton decoder picks (bf16 / float32 model, 4 value heads; forced), and the
    Triton launches of one verify + closed-form commit of a [GDN, ATTENTION] float32 model per kernel name
    (tree kernel forced to split; the commit's state and conv history in one path launch)."""
    from repro.gdn import backends, triton_commit, triton_tree

    picked = {}
    cases = {"bf16": (torch.bfloat16, None), "f32": (torch.float32, None),
             "f32_split": (torch.float32, "split"), "bf16_fused": (torch.bfloat16, "fused")}  # fmt: skip
    for name, (dtype, force) in cases.items():
        m = build(config([GDN]), dtype=dtype, seed=5)
        d = StaticDecoder(m, 16, 4, kernel="triton", tree_kernel=force)
        split = d._tree is backends._triton_split
        assert split == (d.tree_kernel == "split") and (split or d._tree is backends._triton), name
        picked[name] = d.tree_kernel
    model = build(config([GDN, ATTENTION]), dtype=torch.float32, seed=7)
    dec = StaticDecoder(model, max_len=16, max_nodes=8, kernel="triton", tree_kernel="split")
    dec.load(model.prefill(ids(5, 63))[0])
    slot = TreeSlot(dec, 5)
    slot.set_tree(Tree(ids(5, 64), torch.tensor([-1, 0, 0, 1, 3])))
    slot.set_accepted([0, 1, 3, 4])
    counters: dict[str, list[int]] = {}
    for module in (triton_tree, triton_commit):
        for name in dir(module):
            if name.endswith("_kernel"):
                counters[name] = [0]
                setattr(module, name, CountedLaunches(getattr(module, name), counters[name]))
    dec.verify(slot)
    dec.commit(slot, "closed_form")
    return {"picked": picked, "launches": {name: c[0] for name, c in counters.items() if c[0]}}


def _per_gdn_layer(counter: list[int], **options: bool) -> tuple[int, int]:
    """(aten ops, Triton launches) per GDN layer of a float32 decode step (1 vs 2 layers)."""
    ops, kernels = [], []
    for n in (1, 2):
        m = build(config([GDN] * n), dtype=torch.float32, seed=3)
        d = StaticDecoder(m, max_len=16, max_nodes=4, kernel="triton", **options)
        d.load(m.prefill(ids(5, 62))[0])
        counter[0] = 0
        ops.append(count_ops(d.decode_step))
        kernels.append(counter[0])
    return ops[1] - ops[0], kernels[1] - kernels[0]


def _fused_greedy_and_capture() -> dict[str, object]:
    """The fused decoder (float32, interpreter): greedy tokens through decode_step and through step() on
    planted trees vs the engine's AR route; the steps capture-safe; aten ops and Triton launches per
    GDN layer of a decode step."""

    model = build(config([GDN, ATTENTION]), dtype=torch.float32, seed=31)
    prompt = ids(8, 32).tolist()
    want = generate(model, prompt, Route("ar", None, SingleNode(), TargetMatch(0.0, 0)), 7).output_ids
    state, ver = model.prefill(prompt)
    dec = StaticDecoder(model, max_len=32, max_nodes=8, kernel="triton")
    assert dec.fused
    dec.load(state)
    ar = [int(ver.logits[-1].argmax())]
    while len(ar) < 7:
        dec.set_token(ar[-1])
        ar.append(int(dec.decode_step()[0].argmax()))
    dec.load(state)
    spec, ref_state, steps = ar[:1], state, 0
    slot = TreeSlot(dec, 7)
    while len(spec) < 7:
        tree = planted_tree(model, ref_state, spec[-1], steps)
        tree = Tree(tree.tokens[:7], tree.parents[:7])
        slot.set_tree(tree)
        dec.step(slot, "closed_form")
        path, bonus = slot.accepted()
        spec += tree.tokens[path[1:]].tolist() + [bonus]
        ref_state = model.commit(ref_state, model.verify(ref_state, tree), path)
        steps += 1

    launches = [0]
    _count_launches(launches)
    tree = Tree(ids(5, 33), torch.tensor([-1, 0, 0, 1, 2]))
    slot = TreeSlot(dec, 5, snapshots=True)
    slot.set_tree(tree)
    hazards = []
    for name, fn in step_calls(dec, slot).items():
        if name not in ("commit_replay", "step"):  # fla in the interpreter is slow; both run unfused too
            dec.load(state)
            hazards += [f"{name}: {h}" for h in check_capture(fn).hazards]
    ops, kernels = _per_gdn_layer(launches)
    return {
        "ar_equal": ar == want,
        "spec_equal": spec[:7] == want,
        "spec_steps": steps,
        "hazards": hazards,
        "gdn_ops_per_layer": ops,
        "gdn_triton_launches_per_layer": kernels,
    }


def _gemv_greedy_and_capture() -> dict[str, object]:
    """gemv=True (interpreter): greedy tokens through decode_step in float64 vs the engine's AR route
    (GDN and attention layers); decode_step capture-safe and the same ops on different tokens; aten ops
    and Triton launches per GDN layer of a decode step."""
    model = build(config([GDN, ATTENTION]), seed=35)
    prompt = ids(8, 36).tolist()
    want = generate(model, prompt, Route("ar", None, SingleNode(), TargetMatch(0.0, 0)), 7).output_ids
    state, ver = model.prefill(prompt)
    dec = StaticDecoder(model, max_len=32, max_nodes=8, kernel="triton", gemv=True)
    dec.load(state)
    ar = [int(ver.logits[-1].argmax())]
    while len(ar) < 7:
        dec.set_token(ar[-1])
        ar.append(int(dec.decode_step()[0].argmax()))
    launches = [0]
    _count_launches(launches)
    traces, hazards = [], []
    for tok in (5, 40):
        dec.load(state)
        dec.set_token(tok)
        check = check_capture(dec.decode_step)
        traces.append(check.trace)
        hazards += check.hazards
    ops, kernels = _per_gdn_layer(launches, gemv=True)
    return {
        "ar_equal": ar == want,
        "hazards": hazards,
        "same_trace": traces[0] == traces[1],
        "gdn_ops_per_layer": ops,
        "gdn_triton_launches_per_layer": kernels,
    }


def _interpreter_part(flag: str) -> dict[str, object]:
    """One interpreter test's results (``flag``: which one)."""
    if flag == "--interpret-gemv":
        return {
            "float32": _interpreter_case(torch.float32, ("closed_form",), True, [GDN, ATTENTION], gemv=True),
            "greedy": _gemv_greedy_and_capture(),
        }
    if flag == "--interpret-split":
        return {
            "float32": _interpreter_case(
                torch.float32, ("closed_form", "snapshot"), True, [GDN, ATTENTION], tree_kernel="split"
            ),
            "bfloat16": _interpreter_case(torch.bfloat16, ("closed_form",), True, [GDN, ATTENTION]),
            "bfloat16_many_heads_65_nodes": _many_heads_case(),
            "selection": _selected_kernels_and_launches(),
        }  # fmt: skip
    if flag == "--interpret-fused":
        return {
            "float32": _interpreter_case(torch.float32, ("closed_form",), True, [GDN, ATTENTION]),
            "greedy": _fused_greedy_and_capture(),
        }
    return {
        "float32": _interpreter_case(torch.float32, ("replay", "closed_form", "snapshot"), False),
        "bfloat16": _interpreter_case(torch.bfloat16, ("replay",), False),
    }


def _many_heads_case() -> dict[str, float]:
    """Many value heads: the split kernel only for the slot's size (65 nodes, three 32-row blocks). The
    "many" class starts above chain.FEW_HEADS (16); lowered to 3 here, 4 heads take the same selection at a
    fifth of 20 heads' interpreter time."""
    from repro.gdn import chain

    saved, chain.FEW_HEADS = chain.FEW_HEADS, 3
    try:
        return _interpreter_case(torch.bfloat16, ("closed_form",), True, [GDN], value_heads=4, nodes=65)
    finally:
        chain.FEW_HEADS = saved


INTERPRETER_PARTS = ("--interpret", "--interpret-fused", "--interpret-gemv", "--interpret-split")


def _interpreter_main(flags: tuple[str, ...]) -> None:
    """Subprocess entry (TRITON_INTERPRET=1): each flag's results (or its error) as JSON on the last line.
    One process for all of them (a process pays ~10 s importing fla); the kernels that a part replaces with
    launch counters are put back after it, so that every part runs as it would alone."""
    import repro.gdn.triton_common  # noqa: F401 - applies the interpreter's NumPy patch before fla loads
    from repro.gdn import triton_commit, triton_decode, triton_linear, triton_tree

    torch.set_num_threads(1)
    modules = (triton_commit, triton_decode, triton_linear, triton_tree)
    out: dict[str, object] = {}
    for flag in flags:
        kernels = [
            (m, name, getattr(m, name)) for m in modules for name in dir(m) if name.endswith("_kernel")
        ]
        try:
            out[flag] = _interpreter_part(flag)
        except Exception as exc:  # report, so that one broken part does not hide the others
            out[flag] = {"error": f"{type(exc).__name__}: {exc}"}
        for module, name, kernel in kernels:
            setattr(module, name, kernel)
    print(json.dumps(out))


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__, "--interpret-all", needs=("triton", "fla"))


def _run_interpreter(interpreted: dict, flag: str) -> dict:
    out = interpreted[flag]
    assert "error" not in out, out["error"]
    return out


def test_triton_kernel_path_through_the_interpreter(interpreted):
    """The unfused CUDA code path (fused Triton tree kernel, per-node states, fla's fused recurrence for
    decode and replay, bf16 kernel inputs with tf32 dots) run by Triton's CPU interpreter, vs HybridLM."""
    errs = _run_interpreter(interpreted, "--interpret")
    assert max(errs["float32"].values()) < 1e-5, errs
    assert max(errs["bfloat16"].values()) < 5e-2, errs  # bf16 q/k/v and model vs HybridLM's float32 GDN


def test_fused_decoder_through_the_interpreter(interpreted):
    """fused=True (the triton default): the Triton decode core, tree prologue, gated norm with the conv
    shift, RMSNorm and SiLU * up kernels, in the interpreter, vs HybridLM; greedy decoding equals AR
    (decode_step and speculative steps); every step capture-safe; a decode GDN layer is 4 aten ops
    (in_proj, out_proj + residual, gate|up, down + residual) and 5 Triton kernels (the bf16 kernels are
    pinned in tests/gdn/test_triton_decode.py, the replay commit and bf16 decoder on the GPU)."""
    out = _run_interpreter(interpreted, "--interpret-fused")
    assert max(out["float32"].values()) < 1e-5, out["float32"]
    greedy = out["greedy"]
    assert greedy["ar_equal"] and greedy["spec_equal"], greedy
    assert greedy["spec_steps"] < 6  # several tokens per step
    assert greedy["hazards"] == [], greedy
    assert (greedy["gdn_ops_per_layer"], greedy["gdn_triton_launches_per_layer"]) == (4, 5), greedy


def test_gemv_decoder_through_the_interpreter(interpreted):
    """gemv=True: decode steps on the GEMV kernels (norm + in_proj / q|k|v, residual into out_proj /
    o_proj and down, norm + gate|up + SiLU * up, final norm + LM head) in the interpreter: float32
    decode logits and states vs HybridLM after a fused verify + commit, greedy float64 decoding equals
    AR, decode_step capture-safe, and a decode GDN layer is 0 aten ops and 5 Triton kernels (gemv turns
    on fuse_decode: the core, gated norm and history shift in one kernel; 6 without it)."""
    out = _run_interpreter(interpreted, "--interpret-gemv")
    assert max(out["float32"].values()) < 1e-5, out["float32"]
    greedy = out["greedy"]
    assert greedy["ar_equal"] and greedy["hazards"] == [] and greedy["same_trace"], greedy
    assert (greedy["gdn_ops_per_layer"], greedy["gdn_triton_launches_per_layer"]) == (0, 5), greedy


def test_split_tree_kernel_and_path_commit_through_the_interpreter(interpreted):
    """The split tree kernel (forced on float32; selected for the bf16 model's 4 value heads, and at 20
    value heads for a 65-node slot) and the path commit (state and conv history in one launch) in the
    interpreter, vs HybridLM: verify, the closed-form and snapshot commits, then decode steps. The decoder
    picks split for bf16 and fused for float32 inputs at 4 value heads, a forced kernel wins, and a split
    verify + closed-form commit launches the split kernel's two phases, one path index per commit and one
    path commit per GDN layer, nothing else."""
    out = _run_interpreter(interpreted, "--interpret-split")
    assert max(out["float32"].values()) < 1e-5, out["float32"]
    assert max(out["bfloat16"].values()) < 5e-2, out["bfloat16"]  # as the unfused bf16 case
    many = out["bfloat16_many_heads_65_nodes"]  # the 27B engine's case: fused by head count, split by size
    assert many.pop("split_selected") == 1.0 and max(many.values()) < 5e-2, many
    sel = out["selection"]
    assert sel["picked"] == {"bf16": "split", "f32": "fused", "f32_split": "split", "bf16_fused": "fused"}, (
        sel
    )
    want = {
        "_tree_keys_kernel": 1,
        "_tree_values_kernel": 1,
        "_path_index_kernel": 1,
        "_indexed_commit_kernel": 1,
    }
    assert sel["launches"] == want, sel


if __name__ == "__main__" and sys.argv[-1] == "--interpret-all":
    _interpreter_main(INTERPRETER_PARTS)
elif __name__ == "__main__" and sys.argv[-1] in INTERPRETER_PARTS:  # one part alone
    _interpreter_main((sys.argv[-1],))


# ------------------------------------------------------------------ derived slot inputs (device trees)


def slot_inputs(slot: TreeSlot) -> dict[str, torch.Tensor]:
    names = ("tokens", "parents", "depth", "conv_index", "ancestors", "first")
    return {name: getattr(slot, name).clone() for name in names}


@pytest.mark.parametrize("kind", ["random", "forest", "chain", "fan", "mixed"])
def test_derived_slot_inputs_equal_the_host_upload(model, kind):
    """A deriving slot (tokens and parents uploaded, or copied from a DeviceTree; the rest derived by
    ``derive``) holds exactly set_tree's host tensors, padded or not, duplicate siblings included."""
    from repro.tree import DeviceTree

    dec = StaticDecoder(model, max_len=32, max_nodes=64)
    for n, size, seed in ((1, 1, 0), (5, 8, 1), (16, 16, 2), (23, 32, 3), (40, 64, 4)):
        tree = random_token_tree(n, kind, seed)
        tree = Tree(tree.tokens % 3, tree.parents)  # few tokens: many twin siblings (first flags)
        host = TreeSlot(dec, size)
        host.set_tree(tree, pad=True)
        want = slot_inputs(host)
        uploaded = TreeSlot(dec, size, derive=True)
        uploaded.set_tree(tree, pad=True)
        uploaded.derive()
        copied = TreeSlot(dec, size, derive=True)
        copied.set_device_tree(DeviceTree(tree.tokens.clone(), tree.parents.clone()))
        copied.derive()
        for got in (slot_inputs(uploaded), slot_inputs(copied)):
            for name, value in want.items():
                assert torch.equal(got[name], value), (kind, n, name)


def test_deriving_slots_check_depth_and_refuse_device_trees_elsewhere(model):
    from repro.tree import DeviceTree

    dec = StaticDecoder(model, max_len=32, max_nodes=16)
    with pytest.raises(ConfigError, match="max_depth 3"):
        TreeSlot(dec, 8, max_depth=3, derive=True).set_tree(Tree.chain(list(range(5))), pad=True)
    with pytest.raises(ConfigError, match="deriving slot"):
        TreeSlot(dec, 8).set_device_tree(DeviceTree(torch.arange(3), torch.arange(3) - 1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accepted_path_is_target_match_in_one_buffer(model, seed):
    """verify (deriving its inputs), accept and accepted_path on a padded planted tree: ``slot.result``
    holds TargetMatch's path, its tokens and the bonus; the steps stay capture-safe."""
    state, _ = model.prefill(ids(8, 30 + seed))
    tree = planted_tree(model, state, 5, seed)
    dec = StaticDecoder(model, max_len=32, max_nodes=16)
    dec.load(state)
    slot = TreeSlot(dec, 16, derive=True)
    slot.set_tree(tree, pad=True)
    for name, fn in (("verify", lambda: dec.verify(slot)), ("accept", lambda: dec.accept(slot))):
        assert check_capture(fn).hazards == [], name
    assert check_capture(lambda: dec.accepted_path(slot)).hazards == []
    ref = TargetMatch(0.0, 0).accept(tree, model.verify(state, tree).logits, 0)
    got = slot.result.tolist()
    n = got[0]
    assert got[2 : 2 + n] == ref.path and got[1] == ref.bonus
    assert got[2 + slot.max_depth : 2 + slot.max_depth + n] == tree.tokens[ref.path].tolist()


def layer_weights(model: HybridLM) -> list[GDNWeights | AttentionWeights]:
    """Every layer's constants as a fused decoder builds them (gate|up stacked too)."""
    return [
        GDNWeights.of(lay, F64, True) if lay.layer_type == GDN else AttentionWeights.of(lay, True)
        for lay in model.model.layers
    ]


def test_stacked_projections_are_the_models_weights():
    """A decoder's stacked matrices (input projections, gate|up) are the model's own weights, held once:
    the model's projections become views of them, it computes the same logits, and a second decoder
    from the same model copies nothing again."""
    model = build(config())
    x = ids(9, 3)
    _, before = model.prefill(x)
    first, second = layer_weights(model), layer_weights(model)
    assert StaticDecoder(model, 16, 4).weights[0].in_proj.data_ptr() == first[0].in_proj.data_ptr()
    for lay, a, b in zip(model.model.layers, first, second, strict=True):
        gdn = lay.layer_type == GDN
        lead = lay.linear_attn.in_proj_qkv if gdn else lay.self_attn.q_proj
        ends = [lay.linear_attn.in_proj_b] if gdn else [lay.self_attn.v_proj]
        for stacked, other, head, tail in (
            (a.in_proj if gdn else a.qkv, b.in_proj if gdn else b.qkv, lead, ends[0]),
            (a.gate_up, b.gate_up, lay.mlp.gate_proj, lay.mlp.up_proj),
        ):
            assert stacked.data_ptr() == head.weight.data_ptr() == other.data_ptr()
            assert torch.equal(stacked[-tail.out_features :], tail.weight)
    params = list(model.parameters())
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in params}
    assert sum(storages.values()) == sum(p.numel() * p.element_size() for p in params)
    _, after = model.prefill(x)
    assert torch.equal(before.logits, after.logits)
