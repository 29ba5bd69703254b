"""Today's findings, pinned on CPU (float64 weights, greedy), per transformers version
(:mod:`external_findings`): with transformers 5.17-5.24 the ``dflash`` package's reference loop diverges
from AR on tiny-qwen35 while repro's ``dflash_chain`` with the same drafter does not, and transformers
refuses assisted generation on the stateful Qwen3.5 model; the cause: the linear-attention cache's
``crop`` rolls back the conv states but not the GDN recurrent state. transformers 5.25 keeps the recurrent
states for ``crop`` when asked (``recurrent_states_to_keep``): crop is exact, assisted generation is
identical to AR, and the dflash package's loop (which does not ask) fails inside transformers.

A failure here that says "verdict changed" is news: re-run ``repro falsify external`` and update the pins
in tests/external_findings.py.
"""

from __future__ import annotations

import pytest
import torch

from repro.data.suites import load_suite
from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.engines.dflash_loop import dflash_generate
from repro.engines.hf_generate import hf_assisted, hf_assisted_perturbed, hf_generate
from repro.engines.hf_target import load_hf_target
from repro.engines.repro_route import repro_dflash_chain
from repro.engines.result import EngineRequest
from repro.engines.verdicts import verdict
from repro.models.family import resolve_checkpoint
from repro.models.target import open_target

pytest.importorskip("transformers", reason="the finding is about transformers' cache")
pytest.importorskip("dflash.model", reason="the finding is about the dflash package's loop")

from external_findings import (  # noqa: E402 - after the skips: it imports transformers
    CHANGED,
    DFLASH_DIVERGES,
    RECORDS_RECURRENT_STATES,
    assisted_verdict,
    dflash_loop_verdict,
)

NEW = 32


@pytest.fixture(scope="module")
def case():
    """Target and drafter dirs, and per pinned prompt its ids and repro's AR tokens."""
    torch.set_num_threads(1)
    model, tok = open_target("tiny-qwen35", "float64")
    ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, 0)
    prompts = load_suite("gsm8k", 1, 42) + load_suite("mt_bench", 1, 42)
    cases = {}
    for p in prompts:
        ids = tok.chat_prompt([{"role": "user", "content": p.turns[0]}])
        cases[f"{p.suite}/{p.id}"] = (ids, generate(model, ids, ar, NEW).output_ids)
    assert set(cases) == set(DFLASH_DIVERGES), "the suite sample changed: re-pick the pinned prompts"
    return resolve_checkpoint("tiny-qwen35"), resolve_checkpoint("tiny-qwen35-dflash"), cases


def test_dflash_package_loop_against_ar(case):
    """Diverges at the pinned tokens (5.17-5.24), fails inside transformers (5.25 on)."""
    target, drafter, cases = case
    for key, (ids, ref) in cases.items():
        res = dflash_generate(EngineRequest(target, drafter, ids, NEW))
        if res.ok:
            assert res.dtype == "float64" and len(res.output_ids) == NEW
            assert sum(res.accepted_lengths) == NEW - 1  # produced per step; the first token is prefill's
        hf_ar = hf_generate(EngineRequest(target, None, ids, NEW))
        # transformers' own AR on the same loaded model agrees with repro's AR: not a rounding effect
        assert verdict(hf_ar, ref) == "identical", CHANGED.format(
            was="identical", now=verdict(hf_ar, ref), what=f"transformers AR on {key}"
        )
        now, was = verdict(res, ref), dflash_loop_verdict(key)
        assert now == was, CHANGED.format(was=was, now=now, what=f"dflash_generate on {key}")


def test_repro_dflash_chain_with_the_same_drafter_is_identical(case):
    target, drafter, cases = case
    for key, (ids, ref) in cases.items():
        res = repro_dflash_chain(EngineRequest(target, drafter, ids, NEW))
        assert verdict(res, ref) == "identical", f"repro's dflash_chain diverged from AR on {key}"
        assert max(res.accepted_lengths) > 1  # the drafter's tokens were accepted: a real speculative run


def test_transformers_assisted_generation_on_the_stateful_model(case):
    """Refused (5.17-5.24), identical to AR (5.25 on; the target as its own assistant)."""
    target, _, cases = case
    ids, ref = next(iter(cases.values()))
    res = hf_assisted(EngineRequest(target, None, ids, NEW))
    now, was = verdict(res, ref), assisted_verdict()
    assert now == was, CHANGED.format(was=was, now=now, what="transformers assisted")


def test_transformers_assisted_generation_with_a_perturbed_assistant(case):
    """The same verdict when the assistant is a perturbed copy of the target whose own greedy tokens leave
    the target's (so drafts are rejected and the loop rolls its GDN states back): refused (5.17-5.24),
    identical to AR (5.25 on)."""
    target, _, cases = case
    ids, ref = next(iter(cases.values()))
    res = hf_assisted_perturbed(EngineRequest(target, None, ids, NEW))
    now, was = verdict(res, ref), assisted_verdict()
    assert now == was, CHANGED.format(was=was, now=now, what="transformers assisted, perturbed assistant")
    if res.ok:
        assert "the assistant's own greedy tokens leave the target's at token" in res.notes, res.notes


def test_transformers_crop_and_the_recurrent_state(case):
    """The cause, at the cache: forward 4 tokens, crop 3 of them, compare with forwarding 1 token. The conv
    window is rolled back; the recurrent state is not (5.17-5.24), or exactly when the cache keeps the
    last states (5.25 on: ``recurrent_states_to_keep``)."""
    from transformers import DynamicCache

    target, _, cases = case
    hf, _ = load_hf_target(target, "float64", "cpu")
    ids = torch.tensor([next(iter(cases.values()))[0][:20]])

    def cache_after(n: int, drop: int) -> DynamicCache:
        cache = DynamicCache(config=hf.config)
        keep = {"recurrent_states_to_keep": 4} if RECORDS_RECURRENT_STATES else {}
        cache.activate_past_recording(**keep)
        with torch.no_grad():
            hf(ids[:, :16], past_key_values=cache, use_cache=True)
            cache.crop(0)  # as dflash_generate does after prefill
            hf(ids[:, 16 : 16 + n], past_key_values=cache, use_cache=True)
        cache.crop(-drop)
        return cache

    cropped, exact = cache_after(4, 3), cache_after(1, 0)
    gdn = [i for i, t in enumerate(hf.config.layer_types) if t == "linear_attention"]
    assert cropped.get_seq_length() == exact.get_seq_length() == 17
    for i in gdn:  # the conv window is rolled back (to transformers' float32-internal rounding) ...
        conv, ref = cropped.layers[i].conv_states[0], exact.layers[i].conv_states[0]
        assert torch.allclose(conv, ref, atol=1e-5, rtol=0), f"layer {i}: conv state not rolled back"
    state = [(cropped.layers[i].recurrent_states[0], exact.layers[i].recurrent_states[0]) for i in gdn]
    diff = max((a - b).abs().max().item() for a, b in state)
    was = "recurrent state rolled back" if RECORDS_RECURRENT_STATES else "recurrent state not rolled back"
    now = f"max |diff| {diff:.2e}"
    if RECORDS_RECURRENT_STATES:  # ... the recurrent state too: the state kept after the first token
        assert diff == 0.0, CHANGED.format(was=was, now=now, what="transformers' cache crop")
    else:  # ... the recurrent state is not
        assert diff > 1e-3, CHANGED.format(was=was, now=now, what="transformers' cache crop")


def test_transformers_cannot_load_the_fla_format_target():
    res = hf_generate(EngineRequest(resolve_checkpoint("tiny-gdn"), None, [1, 2, 3], 4))
    assert res.status.startswith("refused: transformers cannot load tiny-gdn"), res.status
    assert "gated_deltanet" in res.status
