"""The one-program Triton best-first kernel (repro.decoding.best_first_kernel, ``best_first_triton``)
against ``best_first_device`` and the host heap (``BestFirst.build``): the same tree node for node
(tokens, parents, order).

- interpreter (CPU, TRITON_INTERPRET=1, one subprocess: Triton reads the flag when a kernel is decorated,
  at import): float64 marginals at budgets 1..256, depths 1..15, vocabularies 2..4096, and tie-heavy
  rows (dyadic probabilities, whose log sums tie across depths and parents; zeros; probability one;
  vocab < budget; bf16 marginals), for both selections (the tuple reduction on fewer, larger-budget trees: the
  interpreter runs its combine element by element).
- CPU: the tie cases do tell tie orders apart (a heap with another tie order builds other trees).
- GPU (``gpu``): the same at DDTree's shapes (15 depths x 4096, float32 and bf16 marginals, budgets
  8..256), eagerly and inside a CUDA graph (``GraphedBestFirst``), and ``BestFirst.build_device``.
"""

from __future__ import annotations

import heapq
import importlib.util
import json
import os
import sys
from functools import partial

import pytest
import torch
from conftest import run_in_interpreter, seed_of

from repro.decoding.tree_builders import (
    ALIASED_GRAPHS,
    BestFirst,
    GraphedBestFirst,
    best_first_device,
    best_first_size,
    best_first_triton,
    device_builder,
    top_log_probs,
)
from repro.drafters.base import Proposal
from repro.tree import DeviceTree

F64 = torch.float64
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton needed")
Case = tuple[str, torch.Tensor, int]  # name, marginals [depth, vocab], budget


def dyadic(depth: int, vocab: int, gen: torch.Generator, zeros: float = 0.2) -> torch.Tensor:
    """Rows of powers of two (2^-1 .. 2^-5) and some zeros: float64 log sums tie across depths and
    parents (log 2^-a + log 2^-b == log 2^-(a+b) when the sums are exact) and ranks tie within a row."""
    probs = 0.5 ** torch.randint(1, 6, (depth, vocab), generator=gen).to(F64)
    return torch.where(torch.rand(depth, vocab, generator=gen, dtype=F64) < zeros, 0.0, probs)


def tie_rows() -> list[torch.Tensor]:
    """The hand-made tie cases of tests/decoding/test_tree_builders_device.py."""
    rows = torch.tensor(
        [[0.5, 0.25, 0.25, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
         [0.25] * 4 + [0.0, 0.0]], dtype=F64,
    )  # fmt: skip
    return [rows, torch.full((5, 3), 1 / 3, dtype=F64), torch.tensor([[0.5, 0.5]], dtype=F64)]


RANDOM_SHAPES = [(15, 4096), (2, 7), (15, 64), (5, 300), (3, 40), (1, 50), (8, 3)]  # (2, 7): 56 paths
CPU_BUDGETS = (1, 3, 8, 16, 32, 64, 128, 256)


def cpu_cases() -> list[Case]:
    """Random and tie-heavy float64 marginals over budgets 1..256, depths 1..15, vocab 2..4096: every
    shape up to budget 32, fewer above (the interpreter's time grows with the nodes)."""
    out: list[Case] = []
    for budget in CPU_BUDGETS:
        gen = torch.Generator().manual_seed(seed_of("bf-kernel", budget))
        few = {64: 3, 128: 2, 256: 1}.get(budget)
        for i, (depth, vocab) in enumerate(RANDOM_SHAPES[:few]):
            temp = (0.5, 2.0, 6.0)[(i + budget) % 3]
            probs = torch.softmax(temp * torch.randn(depth, vocab, generator=gen, dtype=F64), -1)
            out.append((f"random-b{budget}-{depth}x{vocab}", probs, budget))
        if budget <= 64:  # bf16 marginals (DDTree's on the GPU): many exact ties within and across rows
            rows = torch.softmax(3 * torch.randn(15, 4096, generator=gen, dtype=F64), -1)
            out.append((f"bf16-b{budget}", rows.to(torch.bfloat16), budget))
        for depth, vocab in ((15, 40), (6, 9), (4, 200))[: 1 if few else 3]:
            out.append((f"dyadic-b{budget}-{depth}x{vocab}", dyadic(depth, vocab, gen), budget))
        for j, rows in enumerate(tie_rows()[: {128: 2, 256: 1}.get(budget)]):
            out.append((f"ties{j}-b{budget}", rows, budget))
    return out


FUSED_BUDGETS = (1, 3, 8, 16, 32)  # the tuple reduction in the interpreter: ~n * slots combines


def compare(cases: list[Case], device: str, **kw: object) -> dict:
    """Run ``best_first_triton`` (``kw``: fused, num_warps) on every case; the names of those whose tree
    differs from ``best_first_device``'s or the host heap's, and how many trees were compared."""
    bad, nodes = [], 0
    for i, (name, probs, budget) in enumerate(cases):
        probs = probs.to(device)
        root = 7 + budget
        device_root = torch.full((1,), root, device=device)  # the graphs' static root, every other case
        got = best_first_triton(device_root if i % 2 else root, probs, budget, **kw)
        ref = best_first_device(root, probs, budget)
        host = BestFirst(budget).build(root, Proposal(probs=probs, top_ids=probs.topk(1, -1).indices))
        size = best_first_size(probs.shape[0], probs.shape[1], budget)
        same = (
            isinstance(got, DeviceTree)
            and got.tokens.device == probs.device
            and got.size == ref.size == host.size == size
            and got.tokens.tolist() == ref.tokens.tolist() == host.tokens.tolist()
            and got.parents.tolist() == ref.parents.tolist() == host.parents.tolist()
        )
        nodes += got.size
        if not same:
            bad.append(name)
    return {"trees": len(cases), "nodes": nodes, "mismatches": bad}


def _interpreter_main() -> None:
    """Subprocess entry (TRITON_INTERPRET=1): both selections' results as JSON on the last line."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    cases = cpu_cases()
    res = {}
    for fused, chosen in ((False, cases), (True, [c for c in cases if c[2] in FUSED_BUDGETS])):
        try:
            res[f"fused={fused}"] = compare(chosen, "cpu", fused=fused)
        except Exception as exc:  # report, so that the other selection still runs
            res[f"fused={fused}"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(res))


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


@needs_triton
@pytest.mark.parametrize("fused", [False, True])
def test_interpreter_kernel_equals_reference(interp: dict, fused: bool) -> None:
    res = interp[f"fused={fused}"]
    assert "error" not in res, res.get("error")
    budgets = {c[2] for c in cpu_cases()} if not fused else set(FUSED_BUDGETS)
    assert res["trees"] == sum(c[2] in budgets for c in cpu_cases())
    assert res["mismatches"] == [], res


def _heap_order_tree(probs: torch.Tensor, budget: int, order: str) -> list[tuple[int, int]]:
    """(token, parent) of a heap best-first tree whose exact ties pop by ``order``: "depth" (the
    builders': depth, then parent node), or a wrong order to show that the tie cases tell orders apart:
    "parent" (parent node, then depth), "late" (depth, then the later parent node first)."""
    logp_t, ids_t = top_log_probs(probs, budget)
    logp, ids = logp_t.tolist(), ids_t.tolist()
    depth, k = logp_t.shape
    n = best_first_size(depth, probs.shape[1], budget) - 1
    heap = [(-logp[0][0], 0, 0, 0, 0.0)]  # -score, tie key a, tie key b, rank, parent score

    def entry(score: float, d: int, parent: int, r: int, base: float) -> tuple:
        a, b = {"depth": (d, parent), "parent": (parent, d), "late": (d, -parent)}[order]
        return (-score, a, b, r, base)

    out: list[tuple[int, int]] = []
    for _ in range(n):
        neg, a, b, r, base = heapq.heappop(heap)
        d, parent = {"depth": (a, b), "parent": (b, a), "late": (a, -b)}[order]
        out.append((ids[d][r], parent))
        node = len(out)
        if r + 1 < k:
            heapq.heappush(heap, entry(base + logp[d][r + 1], d, parent, r + 1, base))
        if d + 1 < depth:
            heapq.heappush(heap, entry(-neg + logp[d + 1][0], d + 1, node, 0, -neg))
    return out


def test_tie_cases_tell_tie_orders_apart() -> None:
    """Negative control: on the tie-heavy cases heaps that break exact ties in another order build other
    trees, so the kernel's tie order is pinned, not just its scores; the test heap with the builders'
    order is the host builder's tree."""
    differ = {"parent": 0, "late": 0}
    for name, probs, budget in cpu_cases():
        if not name.startswith(("dyadic", "ties")) or budget < 8:
            continue
        host = BestFirst(budget).build(0, Proposal(probs=probs, top_ids=probs.topk(1, -1).indices))
        assert _heap_order_tree(probs, budget, "depth") == list(
            zip(host.tokens[1:].tolist(), host.parents[1:].tolist())
        ), name
        right = _heap_order_tree(probs, budget, "depth")
        for order in differ:
            differ[order] += _heap_order_tree(probs, budget, order) != right
    assert differ["parent"] >= 2 and differ["late"] >= 5, differ


def test_device_builder_selection() -> None:
    """CPU marginals keep the torch builder; CUDA takes the Triton kernel where Triton is installed."""
    assert device_builder(torch.device("cpu")) is best_first_device
    expect = best_first_triton if HAS_TRITON else best_first_device
    assert device_builder(torch.device("cuda")) is expect


def _host(budget: int, root: int, probs: torch.Tensor) -> list[list[int]]:
    tree = BestFirst(budget).build(root, Proposal(probs=probs, top_ids=probs.topk(1, -1).indices))
    return [tree.tokens.tolist(), tree.parents.tolist()]


def _lists(tree: DeviceTree) -> list[list[int]]:
    return [tree.tokens.tolist(), tree.parents.tolist()]


def test_graph_for_reads_static_buffers_in_place_and_copies_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BestFirst.graph_for`` with stand-in graphs (the callable run on CPU at each call): each of the
    first ALIASED_GRAPHS buffers gets a graph that reads it where it lies (refreshed in place: no copy),
    later buffers share one copying graph, and ``device_build`` is the builder the graphs run."""
    import repro.decoding.tree_builders as tb
    import repro.models.graphs as graphs

    monkeypatch.setattr(graphs, "GraphedCall", lambda fn, device: fn)
    monkeypatch.setattr(tb, "ALIASED_GRAPHS", 2)
    calls: list[int] = []

    def spy(root: int | torch.Tensor, probs: torch.Tensor, budget: int) -> DeviceTree:
        calls.append(budget)
        return best_first_device(root, probs, budget)

    gen = torch.Generator().manual_seed(3)
    rows = [torch.softmax(2 * torch.randn(4, 30, generator=gen, dtype=F64), -1) for _ in range(6)]
    builder = BestFirst(9)
    builder.device_build = spy
    first, second = rows[0].clone(), rows[1].clone()  # two static drafter buffers
    aliased = [builder.graph_for(first), builder.graph_for(second)]
    assert all(g.alias for g in aliased) and aliased[0].probs is first and aliased[1].probs is second
    assert _lists(aliased[0](3, first)) == _host(9, 3, rows[0])
    first.copy_(rows[2])  # the drafter refreshes its buffer in place
    assert builder.graph_for(first) is aliased[0] and builder.graph_for(second) is aliased[1]
    assert _lists(aliased[0](4, first)) == _host(9, 4, rows[2])
    assert _lists(aliased[1](5, second)) == _host(9, 5, rows[1])
    copying = builder.graph_for(rows[3])
    assert not copying.alias and builder.graph_for(rows[4]) is copying
    assert _lists(copying(6, rows[3])) == _host(9, 6, rows[3])
    assert _lists(copying(7, rows[4])) == _host(9, 7, rows[4])
    assert builder.graph_for(first) is aliased[0]
    assert not aliased[0].reads(first[:, :20]) and not aliased[0].reads(first.to(torch.float32))
    with pytest.raises(ValueError, match="aliasing"):
        aliased[0](3, rows[5])
    assert calls and set(calls) == {9} and len(builder._graphs) == 3


def _sm90_resources(n: int, fused: bool, num_warps: int) -> str | None:
    """The kernel compiled ahead of time for sm_90 (the H200; no GPU needed): cuobjdump's resource line
    of the cubin ("" when it has none), or None without cuobjdump."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from repro.decoding.best_first_kernel import best_first_kernel

    sig = {"logp": "*fp64", "ids": "*i64", "root": "*i64", "tokens": "*i64", "parents": "*i64"}
    sig.update(depth="i32", k="i32", N="constexpr", C="constexpr", FUSED="constexpr")
    consts = {"N": n, "C": triton.next_power_of_2(n), "FUSED": fused}
    src = ASTSource(fn=best_first_kernel, signature=sig, constexprs=consts)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    tool = str(tool) if tool.exists() else shutil.which("cuobjdump")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        out = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True)
    return next((line.strip() for line in out.stdout.splitlines() if "REG:" in line), "")


def _can_compile_for_cuda() -> bool:
    if not HAS_TRITON or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    from pathlib import Path

    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.skipif(not _can_compile_for_cuda(), reason="needs triton's NVIDIA backend (ptxas)")
@pytest.mark.parametrize(
    ("n", "fused", "num_warps"), [(32, True, 1), (256, True, 1), (256, False, 1), (1000, True, 4)]
)
def test_kernel_compiles_for_sm90_without_spills(n: int, fused: bool, num_warps: int) -> None:
    """What the H200 runs compiles here (Triton -> PTX -> ptxas cubin for sm_90) and keeps its slots in
    registers: no local memory (spills) at budgets up to 1000."""
    usage = _sm90_resources(n, fused, num_warps)
    if usage is None:
        pytest.skip("cuobjdump not found")
    assert "LOCAL:0 " in usage and "STACK:0 " in usage, usage


# ---------------------------------------------------------------------------------------------
# GPU: DDTree's shapes, eagerly and in a CUDA graph


def _gpu_ok() -> bool:
    if not (HAS_TRITON and torch.cuda.is_available()):
        return False
    import triton

    return not triton.knobs.runtime.interpret


GPU_BUDGETS = (8, 16, 32, 64, 128, 256)


def gpu_cases(dtype: torch.dtype, per_budget: int = 6) -> list[Case]:
    """DDTree's marginals: 15 depths x 4096 (softmax at several temperatures, in ``dtype``), dyadic
    rows and the hand-made tie rows."""
    gen = torch.Generator().manual_seed(seed_of("bf-gpu", str(dtype)))
    out: list[Case] = []
    for budget in GPU_BUDGETS:
        for i in range(per_budget):
            temp = (0.5, 2.0, 6.0)[i % 3]
            probs = torch.softmax(temp * torch.randn(15, 4096, generator=gen), -1).to(dtype)
            out.append((f"random-b{budget}-{i}", probs, budget))
        out.append((f"dyadic-b{budget}", dyadic(15, 4096, gen).to(dtype), budget))
        out.append((f"dyadic-narrow-b{budget}", dyadic(15, 40, gen).to(dtype), budget))
        out += [(f"ties{j}-b{budget}", rows.to(dtype), budget) for j, rows in enumerate(tie_rows())]
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
@pytest.mark.parametrize("fused", [True, False])
def test_gpu_kernel_equals_reference(dtype: torch.dtype, fused: bool) -> None:
    res = compare(gpu_cases(dtype), "cuda", fused=fused)
    assert res["mismatches"] == [], res


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
@pytest.mark.parametrize("budget", GPU_BUDGETS)
def test_gpu_kernel_in_a_cuda_graph(budget: int) -> None:
    """One graph per (shape, builder): replays on fresh marginals give the eager reference's trees, for
    both selections; ``BestFirst.build_device`` on CUDA takes the Triton graphs (one reading a static
    buffer refreshed in place, one copying fresh tensors in) and gives the host tree."""
    cases = [c for c in gpu_cases(torch.float32, per_budget=3) if c[2] == budget and c[1].shape[1] == 4096]
    first = cases[0][1].cuda()
    graphs = [GraphedBestFirst(first, budget, partial(best_first_triton, fused=f)) for f in (True, False)]
    builder = BestFirst(budget)
    static = torch.empty_like(first)  # a static drafter's output buffer
    for i, (name, probs, _) in enumerate(cases * 2):
        probs = probs.cuda()
        root = 100 + i
        ref = best_first_device(root, probs, budget).to_tree()
        for graphed in graphs:
            got = graphed(root, probs).to_tree()
            assert got.tokens.tolist() == ref.tokens.tolist(), name
            assert got.parents.tolist() == ref.parents.tolist(), name
        static.copy_(probs)
        for marg in (static, probs):  # the aliasing graph, then the copying one
            prop = Proposal(probs=marg, top_ids=marg.topk(1, -1).indices)
            dev = builder.build_device(root, prop)
            assert isinstance(dev, DeviceTree)
            host = builder.build(root, prop)
            assert dev.tokens.tolist() == host.tokens.tolist(), name
            assert dev.parents.tolist() == host.parents.tolist(), name
    made = list(builder._graphs.values())  # static, then each fresh tensor until the cap, then one copying
    assert made[0].alias and made[0].probs.data_ptr() == static.data_ptr()  # the buffer itself, not a copy
    assert len(made) == min(2 * len(cases) + 1, ALIASED_GRAPHS + 1)
    assert device_builder(first.device) is best_first_triton


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
