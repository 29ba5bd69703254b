"""GPU: the batched chain path (training, prefill) with fla's chunk kernel vs the torch reference.

Skipped without CUDA. The reference side (``chunk_gdn``) is pinned to the float64 recurrence in
tests/test_gdn_reference.py; here the fla-backed model must give the same logits, final states
and parameter gradients in float32.
"""

from __future__ import annotations

import copy

import pytest
import torch

from repro.models.default import init_random_weights
from repro.models.hybrid import HybridLM
from repro.train.target import target_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("arch", ["qwen35", "fla_gdn"])
def test_fla_chain_matches_reference(arch: str) -> None:
    cfg = target_config(arch, 512, 4, 64, [])
    ref = init_random_weights(HybridLM(cfg), 0).cuda()
    fast = copy.deepcopy(ref).set_gdn_backend("triton")
    ids = torch.randint(0, 512, (3, 150), generator=torch.Generator().manual_seed(0)).cuda()
    outs = []
    for model in (ref, fast):
        logits, _, finals = model.forward_chain(ids)
        logits.float().logsumexp(-1).mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        outs.append((logits.detach(), finals, grads))
    (l_ref, s_ref, g_ref), (l_fast, s_fast, g_fast) = outs
    assert rel(l_fast, l_ref) <= 1e-4
    for a, b in zip(s_fast, s_ref):
        first = a.recurrent if hasattr(a, "recurrent") else a.keys
        second = b.recurrent if hasattr(b, "recurrent") else b.keys
        assert rel(first.detach(), second.detach()) <= 1e-4
    for name, g in g_ref.items():
        assert rel(g_fast[name], g) <= 1e-3, name
