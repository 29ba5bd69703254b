"""`repro falsify tree-exactness`: passes on the reference, catches a broken verifier, and checks every
Triton tree kernel on the same trees."""

from __future__ import annotations

import json

import pytest
import torch

from repro.gdn import reference
from repro.gdn.backends import TREE_KERNELS, tree_function
from repro.harness.falsify import exactness as falsify


def test_reference_passes_with_live_controls(tmp_path):
    rows = falsify.tree_exactness("cpu", "reference", seed=3)
    assert {r.level for r in rows} == {"layer", "model"} and {r.kernel for r in rows} == {"reference"}
    assert all(r.verdict == "pass" for r in rows), [r.verdict for r in rows]
    assert max(r.err_outputs for r in rows) < 1e-12
    branching = [r for r in rows if r.level == "layer" and r.tree != "chain"]
    assert branching
    assert all(r.control_causal_mask > 1e-2 and r.control_positional_gate > 1e-2 for r in branching)
    with falsify.open_exactness_run(tmp_path, {"check": "tree-exactness"}) as run:
        text = falsify.write_exactness(rows, run)
    assert "pass" in text and len((tmp_path / "records.jsonl").read_text().splitlines()) == len(rows)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["config"]["check"] == "tree-exactness"
    assert manifest["kind"] == "falsify-tree-exactness" and "report.md" in manifest["outputs"]


def test_a_finished_check_is_not_overwritten(tmp_path):
    config = {"check": "tree-exactness", "device": "cpu", "backend": "reference", "seed": 0}
    row = falsify.ExactnessRow("layer", "small", "fan", 3, 1, "reference", "reference", "float64", 0.0, 0.0,
                               1.0, 1.0, 1e-10, "pass")  # fmt: skip
    with falsify.open_exactness_run(tmp_path, config) as run:
        falsify.write_exactness([row], run)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(falsify.ReproError, match="already holds a finished or interrupted"):
        falsify.open_exactness_run(tmp_path, config)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_verifier_with_a_positional_gate_fails(monkeypatch):
    """Swap the verifier for one that charges nodes for their siblings' decays: must be caught."""

    def broken(q, k, v, g, beta, state, parents, ancestors, scale, keep):
        return reference.tree_gdn(q, k, v, falsify.positional_gate(g, parents), beta, state, ancestors, scale)

    monkeypatch.setattr(falsify, "tree_function", lambda name, device: broken)
    rows = [r for r in falsify.tree_exactness("cpu", "reference", seed=3) if r.level == "layer"]
    chains = [r for r in rows if r.tree == "chain"]
    others = [r for r in rows if r.tree != "chain"]
    assert chains and others  # the control has branching trees to catch it on
    assert all(r.verdict == "pass" for r in chains)  # on a chain the positional gate is right
    assert all(r.verdict.startswith("FAIL") for r in others)


def test_positional_gate_matches_cumsum_on_ancestors():
    g = -torch.rand(6, 2, dtype=torch.float64)
    parents = torch.tensor([-1, 0, 0, 2, 1, -1])
    wrong = falsify.positional_gate(g, parents)
    anc = reference.ancestor_gates(wrong, torch.ones(6, 6, dtype=torch.bool).tril() & _anc(parents))[0]
    assert torch.allclose(anc, g.cumsum(0))


def _anc(parents: torch.Tensor) -> torch.Tensor:
    from repro.tree import Tree

    return Tree(torch.zeros(parents.numel(), dtype=torch.long), parents).ancestor_mask


def test_cuda_request_without_gpu_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(falsify.ReproError, match="no CUDA GPU"):
        falsify.tree_exactness("cuda", "triton")


def test_the_triton_backend_checks_every_tree_kernel_on_the_same_trees(monkeypatch):
    """Each of the tree kernels (fused, split, blocked) verifies every case (here each stood in by the
    reference, on CPU); the rows name the kernel, and a kernel that differs fails its rows."""
    asked: list[str] = []

    def stand_in(name: str, device: torch.device, interpreter: bool = False, kernel: str = "fused"):
        asked.append(kernel)
        exact = tree_function("reference", device)
        if kernel != "blocked":
            return exact
        return lambda q, k, v, *rest: (lambda o, f: (o * 1.01, f))(*exact(q, k, v, *rest))  # off by 1%

    monkeypatch.setattr(falsify, "tree_function", stand_in)
    rows = [r for r in falsify.tree_exactness("cpu", "triton") if r.level == "layer"]
    assert list(dict.fromkeys(asked)) == list(TREE_KERNELS)
    by_kernel = {k: [r for r in rows if r.kernel == k] for k in TREE_KERNELS}
    assert all(len(v) == len(falsify.CASES) for v in by_kernel.values())
    assert [r.tree for r in by_kernel["fused"]] == [r.tree for r in by_kernel["split"]]
    assert all(r.verdict == "pass" for k in ("fused", "split") for r in by_kernel[k])
    assert all(r.verdict.startswith("FAIL") for r in by_kernel["blocked"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_every_tree_kernel_equals_the_float64_recurrence():
    rows = falsify.tree_exactness("cuda", "triton")
    assert {r.kernel for r in rows if r.level == "layer"} == set(TREE_KERNELS)
    assert all(r.verdict == "pass" for r in rows), [r for r in rows if r.verdict != "pass"]
