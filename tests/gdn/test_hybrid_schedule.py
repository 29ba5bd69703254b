"""SpecLA's hybrid schedule (repro.gdn.hybrid_schedule) vs the tree reference and the recurrence.

- the plan: the main chain is the longest path, the remainder a forest hanging off the right chain
  positions (a hand-checked tree, tie-breaking, every random tree's partition);
- the torch path in float64 vs :func:`repro.gdn.reference.tree_gdn` (o and every factor) on random trees
  (chain, fan = star, random = bushy, mixed = deep, forest; T = 1..128; grouped value heads), vs the
  token-by-token recurrence along each root-to-node path (o, and the committed state from the hybrid's
  factors), float32 vs float64; a negative control (branch states ignored) that must fail;
- the Triton paths (tree_fused / tree_split for both pieces) under the interpreter, in a subprocess
  (see test_triton_tree.py), float32 "ieee" and bf16 inputs;
- the same on a GPU at the SpecLA and Weaver shapes (``gpu`` marker).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import leaves, random_tree, run_in_interpreter, seed_of

from repro.gdn import hybrid_schedule as hs
from repro.gdn import reference as gdn
from repro.tree import Tree

F64 = torch.float64
HEADS = [(2, 4, 8, 6), (2, 2, 6, 10), (1, 3, 4, 4)]  # (H, HV, d_k, d_v): grouped heads, d_k != d_v
KINDS = ("chain", "fan", "random", "mixed", "forest")  # chain, star, bushy, deep (+ siblings), forest
SIZES = (1, 2, 3, 17, 64, 128)
HAS_TRITON = importlib.util.find_spec("triton") is not None


def inputs(n: int, h: int, hv: int, dk: int, dv: int, seed: int, dtype: torch.dtype = F64):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(n, h, dk, generator=gen, dtype=F64), dim=-1)
    k = F.normalize(torch.randn(n, h, dk, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(n, hv, dv, generator=gen, dtype=F64)
    g = -torch.rand(n, hv, generator=gen, dtype=F64) * (
        0.05 + 0.8 * torch.rand(1, hv, generator=gen, dtype=F64)
    )
    beta = torch.rand(n, hv, generator=gen, dtype=F64).clamp(0.02, 0.98)
    s0 = torch.randn(hv, dv, dk, generator=gen, dtype=F64)
    return [x.to(dtype) for x in (q, k, v, g, beta)], s0.to(dtype), gen


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    return Tree(torch.zeros_like(parents), parents).ancestor_mask


# --------------------------------------------------------------------------------------------- plan


def test_plan_of_a_hand_checked_tree() -> None:
    #     0 - 1 - 3
    #      \- 2 - 4 - 5      longest path 0, 2, 4, 5; remainder 1, 3 hanging off chain position 0
    plan = hs.plan_hybrid([-1, 0, 0, 1, 2, 4])
    assert plan.chain.tolist() == [0, 2, 4, 5] and plan.rest.tolist() == [1, 3]
    assert plan.branch.tolist() == [0, 0]
    assert plan.rest_ancestors.tolist() == [[True, False], [True, True]]
    assert plan.cross.tolist() == [[True, False, False, False]] * 2


def test_plan_ties_and_forests() -> None:
    assert hs.main_chain([-1, 0, 0]) == [0, 1]  # two longest paths: the lower leaf index
    plan = hs.plan_hybrid([-1, -1, 1, 0])  # two roots, chain 1, 2 (leaves 2, 3 at depth 2: the lower)
    assert plan.chain.tolist() == [1, 2] and plan.rest.tolist() == [0, 3]
    assert plan.branch.tolist() == [-1, -1] and not plan.cross.any()
    with pytest.raises(ValueError):
        hs.plan_hybrid([])
    with pytest.raises(ValueError):
        hs.plan_hybrid([-1, 1])


@pytest.mark.parametrize("kind", KINDS)
def test_plan_partitions_every_tree(kind: str) -> None:
    gen = torch.Generator().manual_seed(seed_of("plan", kind))
    for n in (1, 5, 40, 128):
        parents = random_tree(n, kind, gen)
        plan = hs.plan_hybrid(parents)
        chain, rest = plan.chain.tolist(), plan.rest.tolist()
        assert sorted(chain + rest) == list(range(n))
        depth = Tree(torch.zeros_like(parents), parents).depth
        assert (
            len(chain) == int(depth.max())
            and Tree(torch.zeros_like(parents), parents).path_to(chain[-1]) == chain
        )
        anc = ancestors(parents)
        assert torch.equal(plan.rest_ancestors, anc[plan.rest][:, plan.rest])
        for i, node in enumerate(rest):  # the deepest chain node on the path, or -1
            on_chain = [j for j, c in enumerate(chain) if anc[node, c]]
            assert plan.branch[i] == (on_chain[-1] if on_chain else -1)


# ---------------------------------------------------------------------------------- torch, float64


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("kind", KINDS)
def test_torch_path_equals_the_tree_reference(kind: str, heads: tuple[int, int, int, int]) -> None:
    for n in SIZES:
        (q, k, v, g, beta), s0, gen = inputs(n, *heads, seed=seed_of("ref", kind, heads, n))
        parents = random_tree(n, kind, gen)
        o_ref, f_ref = gdn.tree_gdn(q, k, v, g, beta, s0, ancestors(parents), 0.7)
        o, f = hs.hybrid_gdn(q, k, v, g, beta, s0, hs.plan_hybrid(parents), 0.7)
        assert o.dtype == F64 and o.shape == o_ref.shape and f.snapshots is None
        assert rel(o, o_ref) < 1e-12, (n, rel(o, o_ref))
        for name in ("delta", "gate_cum", "k"):
            assert rel(getattr(f, name), getattr(f_ref, name)) < 1e-12, (n, name)
        assert f.v is v and f.g is g and f.beta is beta


def path_oracle(q, k, v, g, beta, s0, parents: torch.Tensor, scale: float):
    """Per-node outputs and states by recurrent_gdn along each root-to-node path."""
    tree = Tree(torch.zeros_like(parents), parents)
    outs, states = [], []
    for i in range(parents.numel()):
        p = tree.path_to(i)
        o, s = gdn.recurrent_gdn(q[p], k[p], v[p], g[p], beta[p], s0, scale)
        outs.append(o[-1])
        states.append(s)
    return torch.stack(outs), torch.stack(states)


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("kind", KINDS)
def test_torch_path_equals_the_recurrence(kind: str) -> None:
    for n, heads in ((7, HEADS[0]), (40, HEADS[1]), (64, HEADS[2])):
        (q, k, v, g, beta), s0, gen = inputs(n, *heads, seed=seed_of("rec", kind, n))
        parents = random_tree(n, kind, gen)
        o_rec, s_rec = path_oracle(q, k, v, g, beta, s0, parents, 0.5)
        o, f = hs.hybrid_gdn(q, k, v, g, beta, s0, hs.plan_hybrid(parents), 0.5)
        assert rel(o, o_rec) < 1e-11
        tree = Tree(torch.zeros_like(parents), parents)
        for leaf in leaves(parents):  # the commit reads the hybrid's factors
            assert rel(gdn.commit_closed_form(s0, f, tree.path_to(leaf)), s_rec[leaf]) < 1e-11


def test_float32_matches_float64() -> None:
    (q, k, v, g, beta), s0, gen = inputs(96, *HEADS[0], seed=seed_of("f32"))
    parents = random_tree(96, "mixed", gen)
    plan = hs.plan_hybrid(parents)
    o64 = hs.hybrid_gdn(q, k, v, g, beta, s0, plan, 0.5)[0]
    o32, f32 = hs.hybrid_gdn(*(x.float() for x in (q, k, v, g, beta)), s0.float(), plan, 0.5)
    assert o32.dtype == torch.float32 and f32.delta.dtype == torch.float32
    assert rel(o32, o64) < 1e-5


def test_ignoring_the_branch_states_fails() -> None:
    """Negative control: a remainder verified from S0 (no chain -> remainder term) is wrong."""
    (q, k, v, g, beta), s0, gen = inputs(30, *HEADS[0], seed=seed_of("neg"))
    parents = random_tree(30, "random", gen)
    plan = hs.plan_hybrid(parents)
    assert bool((plan.branch > 0).any())
    o_ref = gdn.tree_gdn(q, k, v, g, beta, s0, ancestors(parents), 0.5)[0]
    broken = replace(plan, cross=torch.zeros_like(plan.cross), branch=torch.full_like(plan.branch, -1))
    assert rel(hs.hybrid_gdn(q, k, v, g, beta, s0, broken, 0.5)[0], o_ref) > 1e-3


def test_rejects_bad_calls() -> None:
    (q, k, v, g, beta), s0, _ = inputs(4, *HEADS[0], seed=0)
    with pytest.raises(ValueError, match="plan is for 3"):
        hs.hybrid_gdn(q, k, v, g, beta, s0, hs.plan_hybrid([-1, 0, 1]), 0.5)
    with pytest.raises(ValueError, match="unknown kernel"):
        hs.hybrid_gdn(q, k, v, g, beta, s0, hs.plan_hybrid([-1, 0, 1, 0]), 0.5, kernel="chunk")
    assert hs.default_kernel(8, torch.device("cpu"), torch.bfloat16) == "reference"
    assert hs.default_kernel(8, torch.device("cuda"), torch.bfloat16) == "tree_split"
    assert hs.default_kernel(48, torch.device("cuda"), torch.bfloat16) == "tree_fused"
    assert hs.default_kernel(8, torch.device("cuda"), torch.float32) == "tree_fused"


def test_bench_rows_run_the_torch_path_on_cpu() -> None:
    """`repro bench kernels`' hybrid_torch on a SpecLA-shape draft tree with a remainder, vs float64."""
    from repro.bench import kernel_methods as km
    from repro.bench import kernels as bk

    spec = bk.RowSpec("specla", "verify", "draft", 24, "hybrid_torch", "fp32")
    case = bk.make_case(spec, bk.BenchConfig(), torch.device("cpu"))
    assert hs.plan_hybrid(case.parents).rest.numel() > 0
    x = km.make_inputs(case.shape, case.n, 0, case.device)
    out = km.METHODS["hybrid_torch"].build(case, x.to("fp32"))()
    assert km.rel_err(out, km.reference("nodes", case, x)) < 1e-5
    assert km.cost("hybrid", "bf16", case) == km.cost("tree_fused", "bf16", case)  # the tree's floor


# ------------------------------------------------------------------------- Triton (interpreter, GPU)

# (kind, n, H, HV, d_k, d_v, dtype, kernel)
INTERP_CASES = {
    "fused-random-33": ("random", 33, 2, 4, 16, 16, "float32", "tree_fused"),
    "split-mixed-40": ("mixed", 40, 2, 4, 16, 32, "float32", "tree_split"),
    "fused-fan-17": ("fan", 17, 1, 2, 32, 16, "float32", "tree_fused"),
    "split-forest-24-bf16": ("forest", 24, 2, 4, 16, 16, "bfloat16", "tree_split"),
    "fused-chain-5": ("chain", 5, 2, 2, 16, 16, "float32", "tree_fused"),
}
O_TOL = {"float32": 1e-5, "bfloat16": 5e-3}  # bf16: o rounded twice (module docstring)


def run_case(name: str, spec: tuple, device: str, seed: int, precision: str | None = None) -> dict:
    """Errors of the hybrid's Triton path vs the float64 reference on the same (rounded) inputs."""
    kind, n, h, hv, dk, dv, dtype, kernel = spec
    (q, k, v, g, beta), s0, gen = inputs(n, h, hv, dk, dv, seed)
    parents = random_tree(n, kind, gen)
    low = getattr(torch, dtype)
    x = [t.to(low) for t in (q, k, v)] + [g.float(), beta.float()]
    x = [t.to(device) for t in x]
    o_ref, f_ref = gdn.tree_gdn(*(t.cpu().double() for t in x), s0, ancestors(parents), 0.5)
    plan = hs.plan_hybrid(parents, device)
    o, f = hs.hybrid_gdn(*x, s0.float().to(device), plan, 0.5, kernel=kernel, precision=precision)
    return {
        "o": rel(o.cpu(), o_ref),
        "delta": rel(f.delta.cpu(), f_ref.delta),
        "gate_cum": rel(f.gate_cum.cpu(), f_ref.gate_cum),
        "k": rel(f.k.cpu(), f_ref.k),
        "o_dtype": str(o.dtype),
    }


def _interpreter_main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    results = {}
    for name, spec in INTERP_CASES.items():
        try:
            results[name] = run_case(name, spec, "cpu", seed_of("interp", name))
        except Exception as exc:  # report, so that one broken case does not hide the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interp_results() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("name", list(INTERP_CASES))
def test_interpreter_case(interp_results: dict, name: str) -> None:
    res = interp_results[name]
    assert "error" not in res, res["error"]
    dtype = INTERP_CASES[name][6]
    assert res["o_dtype"] == f"torch.{dtype}"
    assert res["o"] <= O_TOL[dtype], res
    for key in ("delta", "gate_cum", "k"):
        assert res[key] <= 1e-5, (key, res)


def _gpu_ok() -> bool:
    if not (HAS_TRITON and torch.cuda.is_available()):
        return False
    import triton

    return not triton.knobs.runtime.interpret


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU, triton, and TRITON_INTERPRET unset")
@pytest.mark.parametrize(
    ("kind", "n", "h", "hv", "d", "dtype", "kernel", "precision", "o_tol", "d_tol"),
    [("mixed", 64, 8, 8, 256, "bfloat16", "tree_split", "tf32", 5e-3, 2e-3),
     ("random", 128, 8, 8, 256, "float32", "tree_fused", "ieee", 1e-5, 1e-5),
     ("mixed", 128, 16, 48, 128, "bfloat16", "tree_fused", "tf32", 5e-3, 2e-3)],
)  # fmt: skip
def test_gpu_hybrid(kind, n, h, hv, d, dtype, kernel, precision, o_tol, d_tol) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    spec = (kind, n, h, hv, d, d, dtype, kernel)
    res = run_case("gpu", spec, "cuda", seed, precision)
    assert res["o"] <= o_tol and res["delta"] <= d_tol and res["gate_cum"] <= 1e-5, (seed, res)


if __name__ == "__main__":
    if "--interpret" in sys.argv:
        _interpreter_main()
