"""The slot bookkeeping kernels (repro.models.slot_kernels) equal what they replace.

Interpreter (one TRITON_INTERPRET=1 subprocess):
- ``derive_slot`` against the host's ancestor matrix, conv gather index and first-sibling flags (NumPy:
  what ``TreeSlot.set_tree`` uploads) on random, chain, fan, mixed and forest trees of 1-100 nodes, with
  few distinct tokens (so that twins occur);
- ``copy_tree`` against the stream copies it replaces (padding, parents kept, a strided source);
- ``tagged_to_host`` read back through ``untagged`` (every element landed, another tag, one missing);
- ``commit_rows`` + ``advance_length`` against the torch commit's row writes and length update written
  out (the path's rows after the length, nothing for node -1, every other row untouched; the cap at
  ``max_len``), with planted errors (a path one row late, the cap left out) that the comparisons flag;
- ``greedy_node`` + ``path_result`` against TargetMatch's host walk at temperature 0, the choices made
  to match deep paths, and against the torch ops on the same slot;
- a StaticDecoder (kernel="triton", three GDN layers and one attention layer) with the kernels against the
  same decoder with the torch bookkeeping (``fuse_bookkeeping`` False): verify, accept, accepted path and
  commit by every strategy give the same node, result and state; the torch ops of a greedy accept + path +
  commit drop to the argmax and the path's two selects of the replay commit.
GPU: the same decoders on CUDA graphs (GraphedTarget's greedy steps), float32: the same states and tokens.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TREE_KINDS, CountedLaunches, random_tree, run_in_interpreter

from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights
from repro.models.graphs import count_ops
from repro.models.hybrid import HybridLM
from repro.models.static import StaticDecoder, TreeSlot
from repro.tree import Tree, ancestor_matrix, conv_gather_index_np, first_occurrences

LAYERS = [GDN, GDN, ATTENTION, GDN]
STRATEGIES = ("closed_form", "replay", "snapshot", "delayed")


def _model(device: str = "cpu") -> HybridLM:
    cfg = HybridConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, layer_types=LAYERS, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), 41).to(device=device, dtype=torch.float32).eval()


def _trees(device: str) -> list[tuple[str, int, torch.Tensor, torch.Tensor]]:
    """(kind, n, tokens, parents) of random trees, tokens from 3 values (many twins)."""
    gen = torch.Generator().manual_seed(5)
    out = []
    for kind in TREE_KINDS:
        for n in (1, 2, 9, 33, 100):
            parents = random_tree(n, kind, gen)
            tokens = torch.randint(0, 3, (n,), generator=gen)
            out.append((kind, n, tokens.to(device), parents.to(device)))
    return out


def derive_mismatches(device: str) -> list[str]:
    """Trees where derive_slot differs from the host's NumPy tensors (every tree kind, 1-100 nodes, the
    default rows a program and 4 and 64; on the CPU the default's 100-node trees only as a chain: one row a
    program walking to the root is the interpreter's slowest case, and the chain's walks are the longest)."""
    from repro.models.slot_kernels import derive_slot

    bad = []
    for (kind, n, tokens, parents), rows in itertools.product(_trees(device), (None, 4, 64)):
        if device == "cpu" and n == 100 and rows is None and kind != "chain":
            continue
        width = 4
        depth = torch.full((n,), -7, dtype=torch.long, device=device)
        anc = torch.ones(n, n, dtype=torch.bool, device=device)
        conv = torch.full((n, width), -99, dtype=torch.long, device=device)
        first = torch.zeros(n, dtype=torch.bool, device=device)
        derive_slot(tokens, parents, depth, anc, conv, first, block_rows=rows)
        p, t = parents.cpu().numpy(), tokens.cpu().numpy()
        want_anc, want_depth = ancestor_matrix(p)
        got = (anc.cpu().numpy(), depth.cpu().numpy(), conv.cpu().numpy(), first.cpu().numpy())
        want = (want_anc, want_depth, conv_gather_index_np(p, width), first_occurrences(p, t))
        for name, g, w in zip(("ancestors", "depth", "conv_index", "first"), got, want):
            if not np.array_equal(g, w):
                bad.append(f"{kind} n={n} block_rows={rows}: {name}")
    return bad


def copy_mismatches(device: str) -> list[str]:
    """Trees where copy_tree's slot tokens / parents differ from the stream copies' (padding included)."""
    from repro.models.slot_kernels import copy_tree

    bad = []
    gen = torch.Generator().manual_seed(9)
    for n, size, parents_too, step in (
        (33, 33, True, 1),
        (5, 17, True, 1),
        (5, 17, False, 1),
        (9, 16, True, 3),
    ):
        src_t = torch.randint(1, 50, (n * step,), generator=gen).to(device)[::step]  # strided when step > 1
        src_p = (torch.arange(n) - 1).to(device).repeat_interleave(step)[::step]
        tokens = torch.full((size,), -7, dtype=torch.long, device=device)
        parents = torch.full((size,), -9, dtype=torch.long, device=device)
        copy_tree(tokens, parents, src_t, src_p, copy_parents=parents_too)
        want_t = torch.cat([src_t.cpu(), torch.zeros(size - n, dtype=torch.long)])
        want_p = (
            torch.cat([src_p.cpu(), torch.full((size - n,), -1)]) if parents_too else torch.full((size,), -9)
        )
        if not (torch.equal(tokens.cpu(), want_t) and torch.equal(parents.cpu(), want_p)):
            bad.append(f"n={n} size={size} parents={parents_too} stride={step}")
    try:
        copy_tree(tokens[:3], parents[:3], src_t, src_p)
        bad.append("a tree larger than the slot was taken")
    except ValueError:
        pass
    return bad


def tagged_mismatches(device: str) -> list[str]:
    """Results where tagged_to_host's stores (into pinned host memory on CUDA) do not read back as the
    values through ``untagged`` in row ``tag % TAG_ROWS``, the tag the one after the counter's (written
    back); another row touched; a half-written row, another tag or a zeroed row that reads as done;
    consecutive stores that do not take the rows in turn, across the counter's wrap too; a wrong-shaped host
    buffer taken."""
    from repro.models.slot_kernels import TAG_BITS, TAG_PERIOD, TAG_ROWS, next_tag, tagged_to_host, untagged

    bad = []
    gen = torch.Generator().manual_seed(12)
    for n, start in ((1, 0), (18, 6), (40, TAG_PERIOD - 1), (70, TAG_PERIOD), (3, 299)):
        src = torch.randint(-(2**40), 2**40, (n,), generator=gen)
        src[0] = 2 ** (63 - TAG_BITS) - 1  # the largest value a tagged element holds
        dst = torch.zeros(TAG_ROWS, n, dtype=torch.long, pin_memory=device == "cuda")
        counter = torch.tensor([start], device=device)
        tag = next_tag(start)
        if untagged(dst[tag % TAG_ROWS].numpy(), tag) is not None:
            bad.append(f"n={n}: a zeroed row read as tag {tag}")
        tagged_to_host(src.to(device), dst, counter)
        if device == "cuda":
            torch.cuda.synchronize()
        if int(counter) != tag:
            bad.append(f"n={n}: counter {start} -> {int(counter)}, not {tag}")
        words = dst[tag % TAG_ROWS].numpy().copy()
        if untagged(words, tag) != src.tolist():
            bad.append(f"n={n} tag={tag}: read back {untagged(words, tag)}")
        if dst.count_nonzero() != dst[tag % TAG_ROWS].count_nonzero():
            bad.append(f"n={n} tag={tag}: another row written")
        if untagged(words, next_tag(tag)) is not None:
            bad.append(f"n={n}: read under another tag")
        if n > 1:
            words[n // 2] = 0  # one element not landed yet
            if untagged(words, tag) is not None:
                bad.append(f"n={n}: a buffer with a missing element read as done")
        rows = [tag % TAG_ROWS]
        after = tag
        for _ in range(TAG_ROWS):  # the next stores: the other rows in turn, then the first again
            tagged_to_host(src.to(device), dst, counter)
            if device == "cuda":
                torch.cuda.synchronize()
            after = next_tag(after)
            rows.append(after % TAG_ROWS)
            if untagged(dst[after % TAG_ROWS].numpy(), after) != src.tolist():
                bad.append(f"n={n}: the store of tag {after} did not read back")
        if sorted(rows[:TAG_ROWS]) != list(range(TAG_ROWS)) or rows[TAG_ROWS] != rows[0]:
            bad.append(f"n={n}: the stores after tag {tag} took rows {rows}, not each in turn")
    try:
        tagged_to_host(
            torch.zeros(2, dtype=torch.long, device=device),
            torch.zeros(2, dtype=torch.long),
            torch.zeros(1, dtype=torch.long, device=device),
        )
        bad.append("a host buffer of one row taken")
    except ValueError:
        pass
    return bad


def commit_rows_errors(device: str) -> dict:
    """commit_rows and advance_length against the torch commit they replace, written out: the path's
    keys and values, root first, into rows ``length``, ``length + 1``, ... (nothing for node -1), every other
    row untouched; the length plus the path's length (none for node -1), capped at ``max_len``. Head dims
    12 and 48 (masked to 16 and 64; 48 at n = 100: two node blocks), sources strided (rows wider than the
    head dim). ``caught``: planted errors (the path one row late, the cap ignored) the same comparisons
    flag, of ``planted``."""
    from repro.models.slot_kernels import advance_length, commit_rows

    gen = torch.Generator().manual_seed(13)
    heads = 3
    out: dict = {"bad": [], "cases": 0, "caught": 0, "planted": 0}
    for (kind, n, _, parents), hd in zip(_trees("cpu"), itertools.cycle((12, 48))):
        tree = Tree(torch.zeros(n, dtype=torch.long), parents.cpu())
        depth, anc = tree.depth.to(device), tree.ancestor_mask.to(device)
        k_src, v_src = (torch.randn(n, heads, hd + 5, generator=gen)[..., 2 : 2 + hd] for _ in "kv")
        deepest = max(range(n), key=lambda i: int(tree.depth[i]))
        for end, start in ((deepest, n), (n - 1, 0), (-1, 3)):
            keys, values = (torch.randn(heads, 2 * n + 8, hd, generator=gen) for _ in "kv")
            want_k, want_v = keys.clone(), values.clone()
            for i, j in enumerate(tree.path_to(end) if end >= 0 else []):
                want_k[:, start + i], want_v[:, start + i] = k_src[j], v_src[j]
            for late in (0, 1):  # 1: a planted error, the path written one row late
                got_k, got_v = keys.clone().to(device), values.clone().to(device)
                length = torch.tensor([start + late], device=device)
                node = torch.tensor([end], device=device)
                commit_rows(got_k, got_v, k_src.to(device), v_src.to(device), anc, depth, node, length)
                same = torch.equal(got_k.cpu(), want_k) and torch.equal(got_v.cpu(), want_v)
                if late:
                    out["planted"] += end >= 0
                    out["caught"] += end >= 0 and not same
                elif not same:
                    out["bad"].append(f"commit_rows {kind} n={n} hd={hd} node={end} length={start}")
            out["cases"] += 1
        cap = 60 + int(tree.depth[deepest]) - 1  # one row short of the path: the cap binds
        for end, start, max_len, binds in (
            (0, 5, 64, False),
            (-1, 5, 64, False),  # nothing committed: the length stays, as commit_rows writes no row
            (deepest, 5, 200, False),
            (deepest, 60, cap, True),
        ):
            want = min(start + (int(tree.depth[end]) if end >= 0 else 0), max_len)
            for planted in (False, True) if binds else (False,):  # True: the cap left out
                length = torch.tensor([start], device=device)
                node = torch.tensor([end], device=device)
                advance_length(length, depth, node, 10**6 if planted else max_len)
                if planted:
                    out["planted"] += 1
                    out["caught"] += int(length) != want
                elif int(length) != want:
                    out["bad"].append(f"advance_length {kind} n={n} node={end}: {int(length)} != {want}")
            out["cases"] += 1
    return out


def accept_mismatches(device: str) -> tuple[list[str], int]:
    """Trees where greedy_node + path_result differ from TargetMatch's walk or the torch ops; the deepest
    accepted path seen (the choices follow random children, so paths go deep)."""
    from repro.decoding.acceptance import TargetMatch
    from repro.models.slot_kernels import greedy_node, path_result

    model = _model(device)
    decs = {fuse: StaticDecoder(model, 64, 128, kernel="triton", fused=False) for fuse in (True, False)}
    decs[False].fuse_bookkeeping = False
    gen = torch.Generator().manual_seed(6)
    bad, deepest = [], 0
    for kind, n, tokens, parents in _trees("cpu"):
        tree = Tree(tokens, parents)
        choice = torch.randint(0, 3, (n,), generator=gen)
        for i in range(n):  # most nodes pick a child's token
            kids = tree.children_of(i)
            if kids and float(torch.rand((), generator=gen)) < 0.8:
                choice[i] = tokens[kids[int(torch.randint(len(kids), (), generator=gen))]]
        logits = torch.nn.functional.one_hot(choice, 61).float()
        want = TargetMatch(0.0, 0).accept(tree, logits, 0)
        results = []
        for fuse, dec in decs.items():
            slot = TreeSlot(dec, n)
            slot.set_tree(tree)
            slot.logits = logits.to(device)
            dec.accept(slot)
            dec.accepted_path(slot)
            results.append(slot.result.cpu())
            path, bonus = slot.accepted()
            if (path, bonus) != (list(want.path), want.bonus):
                bad.append(f"{kind} n={n} fused={fuse}: {path, bonus} != {want.path, want.bonus}")
        if not torch.equal(*results):
            bad.append(f"{kind} n={n}: result {results[0].tolist()} != {results[1].tolist()}")
        deepest = max(deepest, len(want.path))
        # the kernels alone, on fresh buffers (no decoder)
        for rows in (None, 8):  # greedy_node's default row steps, and steps of 8 rows (several steps)
            node, bonus = torch.full((1,), -5, device=device), torch.full((1,), -5, device=device)
            derived = slot.depth, slot.ancestors
            args = (choice.to(device), slot.tokens, slot.parents, slot.first, *derived, node, bonus)
            greedy_node(*args, block_rows=rows)
            result = torch.full_like(slot.result, -5)
            path_result(node, bonus, slot.tokens, *derived, result)
            if not torch.equal(result.cpu(), results[1]):
                bad.append(f"{kind} n={n} block_rows={rows}: kernels alone {result.tolist()}")
    return bad, deepest


def decoder_diffs(device: str) -> dict:
    """Largest differences between the decoders with and without the kernels over steps of every strategy;
    the torch ops of one greedy accept + path + commit on each."""
    model = _model(device)
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 61, (7,), generator=gen).to(device)
    state, _ = model.prefill(prompt)
    decs = [StaticDecoder(model, 64, 32, kernel="triton", fused=False) for _ in "ab"]
    decs[1].fuse_bookkeeping = False
    out: dict = {"state": 0.0, "results_equal": True, "ops": {}}
    for strategy in STRATEGIES:
        for dec in decs:
            dec.load(state)
        for step in range(3):
            parents = random_tree(12, "mixed", gen)
            tree = Tree(torch.randint(0, 61, (12,), generator=gen), parents)
            results = []
            for dec in decs:
                parity = step % 2 if strategy == "delayed" else None
                slot = TreeSlot(dec, 12, snapshots=strategy == "snapshot", derive=True, parity=parity)
                slot.set_tree(tree)
                dec.verify(slot)
                slot.logits[:, int(tree.tokens[1])] += 50.0  # the root picks node 1's token: a deeper path
                dec.accept(slot)
                dec.accepted_path(slot)
                dec.commit(slot, strategy)
                results.append(slot.result.cpu())
            out["results_equal"] &= torch.equal(*results)
        exported = [dec.export() for dec in decs]  # flushes a delayed commit
        assert exported[0].position == exported[1].position
        for x, y in zip(exported[0].layers, exported[1].layers):
            for u, v in zip(vars(x).values(), vars(y).values()):
                out["state"] = max(out["state"], float((u.double() - v.double()).abs().max()))
    launches = counted_launches()
    for key, dec in zip(("fused", "torch"), decs):
        dec.load(state)
        slot = TreeSlot(dec, 12, derive=True)
        slot.set_tree(tree)
        dec.verify(slot)

        def step(dec: StaticDecoder = dec, slot: TreeSlot = slot) -> None:
            dec.accept(slot)
            dec.accepted_path(slot)
            dec.commit(slot, "closed_form")

        for name, fn in (("step", step), ("verify", lambda dec=dec, slot=slot: dec.verify(slot))):
            for counter in launches.values():
                counter[0] = 0
            out["ops"][f"{key}_{name}"] = {
                "aten": count_ops(fn),
                **{k: c[0] for k, c in launches.items() if c[0]},
            }
    return out


def counted_launches() -> dict[str, list[int]]:
    """Every Triton kernel of the slot kernels', the commits' and the tree kernels' modules, counted (and
    kept out of the aten count: the interpreter runs them on torch ops): {module: launches}."""
    from triton.runtime import KernelInterface

    from repro.gdn import triton_commit, triton_tree
    from repro.models import slot_kernels

    counters = {}
    for module in (slot_kernels, triton_commit, triton_tree):
        name = module.__name__.rsplit(".", 1)[1]
        counters[name] = [0]
        for attr, obj in list(vars(module).items()):
            if isinstance(obj, KernelInterface) and attr.endswith(
                "_kernel"
            ):  # launched, not device functions
                setattr(module, attr, CountedLaunches(obj, counters[name]))
    return counters


def compare(device: str) -> dict:
    bad, deepest = accept_mismatches(device)
    return {
        "derive": derive_mismatches(device), "copy": copy_mismatches(device), "accept": bad,
        "tagged": tagged_mismatches(device), "commit_rows": commit_rows_errors(device),
        "deepest": deepest, **decoder_diffs(device),
    }  # fmt: skip


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


def test_derive_slot_equals_the_host_tensors(interp: dict) -> None:
    assert interp["derive"] == [], interp["derive"]


def test_copy_tree_equals_the_stream_copies(interp: dict) -> None:
    assert interp["copy"] == [], interp["copy"]


def test_tagged_results_read_back_when_every_element_has_landed(interp: dict) -> None:
    assert interp["tagged"] == [], interp["tagged"]


def test_commit_rows_and_advance_length_equal_the_torch_commit(interp: dict) -> None:
    got = interp["commit_rows"]
    assert got["bad"] == [], got["bad"]
    assert got["cases"] == 7 * len(TREE_KINDS) * 5, got  # 25 trees: 3 commits and 4 advances each
    # not vacuous: every planted error (a path one row late, an advance past its cap) is flagged
    assert got["planted"] == 3 * len(TREE_KINDS) * 5 and got["caught"] == got["planted"], got


def test_greedy_node_and_path_result_equal_target_match(interp: dict) -> None:
    assert interp["accept"] == [], interp["accept"]
    assert interp["deepest"] >= 6, interp["deepest"]  # deep paths were accepted, not just the root


def test_decoder_with_kernels_equals_the_torch_bookkeeping(interp: dict) -> None:
    assert interp["results_equal"], interp
    assert interp["state"] == 0.0, interp  # the kernels copy and index; nothing is rounded differently


def test_kernels_take_the_torch_ops_of_a_greedy_step(interp: dict) -> None:
    ops = interp["ops"]
    # accept + path + commit: the argmax stays torch; greedy node, path result, attention rows, advance
    assert ops["fused_step"] == {"aten": 1, "slot_kernels": 4, "triton_commit": 4}, ops
    assert ops["torch_step"]["aten"] >= 30 and "slot_kernels" not in ops["torch_step"], ops
    # verify: the derived inputs in one launch instead of dozens of torch ops
    assert ops["fused_verify"]["slot_kernels"] == 1, ops
    assert ops["torch_verify"]["aten"] - ops["fused_verify"]["aten"] >= 40, ops


def specialization_keys(kernel: Any, calls: list[tuple]) -> set[tuple]:
    """The argument part of Triton's binary key (what it specialises on: an int equal to 1 or divisible by
    16, a pointer aligned to 16 bytes) for each of ``calls`` (the kernel's arguments before its constexprs),
    as an sm_90 launch would compute it; one key = one binary."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    params = [p for p in kernel.params if not p.is_constexpr]
    return {
        tuple(
            native_specialize_impl(
                CUDABackend, arg, False, not p.do_not_specialize, not p.do_not_specialize_on_alignment
            )
            for p, arg in zip(params, args, strict=True)
        )
        for args in calls
    }


def test_tagged_stores_take_one_binary_for_every_length_of_a_block() -> None:
    """tagged_to_host runs outside the graphs on every read when graphs are off: were a length of one or
    divisible by 16 a binary of its own, one would compile mid-run (as a Python-launched store's tag did on
    an H200: greedy AR 0.116 -> 0.314 ms a token over 288 tokens, results/2026-12-05-h200-host-writes). The
    same calls through a kernel that specialises as Triton does by default take several binaries."""
    import triton

    from repro.models.slot_kernels import TAG_ROWS, _tagged_kernel

    src = torch.arange(1, 17)
    counter = torch.zeros(1, dtype=torch.long)
    calls = [(src[:n], torch.zeros(TAG_ROWS, n, dtype=torch.long), n, counter) for n in (1, 5, 8, 13, 16)]
    assert len(specialization_keys(_tagged_kernel, calls)) == 1
    default = triton.jit(_tagged_kernel.fn)  # the same body, specialised by default
    assert len(specialization_keys(default, calls)) >= 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_tagged_stores_compile_once_for_every_length_of_a_block() -> None:
    """tagged_to_host outside the graphs (graphs off): a length of one or divisible by 16 must not compile
    (or load) another binary mid-run; each store lands in the row of its tag."""
    from repro.models.slot_kernels import TAG_ROWS, _tagged_kernel, tagged_to_host, untagged

    src = torch.arange(1, 17, device="cuda")
    counter = torch.zeros(1, dtype=torch.long, device="cuda")
    tagged_to_host(src[:8], torch.zeros(TAG_ROWS, 8, dtype=torch.long, pin_memory=True), counter)
    torch.cuda.synchronize()
    device = torch.cuda.current_device()
    before = len(_tagged_kernel.device_caches[device][0])
    for tag, n in enumerate((1, 5, 8, 16, 3, 13), start=2):
        host = torch.zeros(TAG_ROWS, n, dtype=torch.long, pin_memory=True)
        tagged_to_host(src[:n], host, counter)
        torch.cuda.synchronize()
        assert untagged(host[tag % TAG_ROWS].numpy(), tag) == list(range(1, n + 1)), (n, tag)
    assert len(_tagged_kernel.device_caches[device][0]) == before == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_slot_kernels() -> None:
    """The same checks on CUDA, then GraphedTarget greedy steps (the kernels captured) with and without
    them: the same tokens and states."""
    from repro.models.graphed import GraphedTarget

    got = compare("cuda")
    assert got["derive"] == [] and got["copy"] == [] and got["accept"] == [] and got["results_equal"], got
    assert got["tagged"] == [], got  # the kernel's stores into pinned host memory
    rows = got["commit_rows"]
    assert rows["bad"] == [] and rows["planted"] > 0 and rows["caught"] == rows["planted"], rows
    assert got["state"] < 1e-6, got
    model = _model("cuda")
    model.set_gdn_backend("triton")
    gen = torch.Generator().manual_seed(8)
    prompt = torch.randint(0, 61, (7,), generator=gen).tolist()
    trees = [
        Tree(torch.randint(0, 61, (10,), generator=gen), random_tree(10, "mixed", gen)) for _ in range(4)
    ]
    runs = []
    for fuse in (True, False):
        target = GraphedTarget(model, max_len=64, max_nodes=16)
        target.decoder.fuse_bookkeeping = fuse  # before any graph is captured
        state, _ = target.prefill(prompt)
        tokens = []
        for tree in trees:
            ver = target.verify(state, tree, strategy="closed_form")
            state, _, toks, bonus = target.commit_greedy(state, ver)
            tokens.append((toks, bonus))
        runs.append((tokens, target.decoder.export()))
    assert runs[0][0] == runs[1][0]
    for x, y in zip(runs[0][1].layers, runs[1][1].layers):
        for u, v in zip(vars(x).values(), vars(y).values()):
            assert torch.equal(u, v)


if __name__ == "__main__" and "--interpret" in sys.argv:
    torch.set_num_threads(1)
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    print(json.dumps(compare("cpu")))
