"""SpecLA's check 2 (``repro falsify tree-exactness``): every Triton tree kernel on the same trees."""

from __future__ import annotations

import pytest
import torch

import repro.harness.falsify.exactness as exactness
from repro.gdn.backends import TREE_KERNELS, tree_function


def test_the_reference_rows_pass_with_their_controls_detected():
    rows = exactness.tree_exactness("cpu", "reference")
    layer = [r for r in rows if r.level == "layer"]
    assert {r.kernel for r in rows} == {"reference"} and len(layer) == len(exactness.CASES)
    assert all(r.verdict == "pass" for r in rows), [r for r in rows if r.verdict != "pass"]
    assert any(
        r.control_causal_mask is not None and r.control_causal_mask > exactness.CONTROL_MIN for r in layer
    )


def test_the_triton_backend_checks_every_tree_kernel_on_the_same_trees(monkeypatch):
    """Each of the tree kernels (fused, split, blocked) verifies every case (here each stood in by the
    reference, on CPU); the rows name the kernel, and a kernel that differs fails its rows."""
    asked: list[str] = []

    def stand_in(name: str, device: torch.device, interpreter: bool = False, kernel: str = "fused"):
        asked.append(kernel)
        reference = tree_function("reference", device)
        if kernel != "blocked":
            return reference
        return lambda q, k, v, *rest: (lambda o, f: (o * 1.01, f))(*reference(q, k, v, *rest))  # off by 1%

    monkeypatch.setattr(exactness, "tree_function", stand_in)
    rows = [r for r in exactness.tree_exactness("cpu", "triton") if r.level == "layer"]
    assert list(dict.fromkeys(asked)) == list(TREE_KERNELS)
    by_kernel = {k: [r for r in rows if r.kernel == k] for k in TREE_KERNELS}
    assert all(len(v) == len(exactness.CASES) for v in by_kernel.values())
    assert [r.tree for r in by_kernel["fused"]] == [r.tree for r in by_kernel["split"]]
    assert all(r.verdict == "pass" for k in ("fused", "split") for r in by_kernel[k])
    assert all(r.verdict.startswith("FAIL") for r in by_kernel["blocked"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_every_tree_kernel_equals_the_float64_recurrence():
    rows = exactness.tree_exactness("cuda", "triton")
    assert {r.kernel for r in rows if r.level == "layer"} == set(TREE_KERNELS)
    assert all(r.verdict == "pass" for r in rows), [r for r in rows if r.verdict != "pass"]
