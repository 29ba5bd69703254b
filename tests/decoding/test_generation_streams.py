"""Each generation draws its own random numbers: keyed by the run's seed and the prompt's token ids.

Every route on one prompt draws AR's numbers (so sample_match speculation reproduces AR's tokens), while
two prompts, or a second turn after its first, draw independent ones: a fair coin picked at 2000
positions after two prompts agrees about half the time, not always (the draws of a run-wide key did).
"""

from __future__ import annotations

import torch
from conftest import SMALL_VOCAB, small_hybrid, small_ids
from scipy.stats import binomtest

from repro.decoding.acceptance import make_rule
from repro.decoding.device_acceptance import device_rule
from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.decoding.sampling import generation_seed, step_rng

COIN = torch.zeros(2)  # a fair coin's logits
POSITIONS = 2000


def _coin_flips(rule) -> list[int]:
    return [rule.pick(COIN, t) for t in range(POSITIONS)]


def test_two_prompts_draw_independent_numbers_and_one_prompt_the_same():
    rule = make_rule("sample_match", 1.0, 42)
    first, second, again = [1, 2, 3], [1, 2, 4], [1, 2, 3]
    flips = []
    for prompt in (first, second, again):
        rule.begin(prompt)
        flips.append(_coin_flips(rule))
    assert flips[0] == flips[2]  # the same prompt: the same draws (AR and every route on it)
    agree = sum(a == b for a, b in zip(flips[0], flips[1]))
    assert binomtest(agree, POSITIONS, 0.5).pvalue > 1e-3, agree  # independent: agree half the time
    # the control: keyed by the run's seed alone (no begin), two prompts' draws are the same numbers
    run_wide = make_rule("sample_match", 1.0, 42)
    wide = [_coin_flips(run_wide), _coin_flips(run_wide)]
    assert wide[0] == wide[1] and len(set(wide[0])) == 2  # both faces drawn, the same at every position
    agree = sum(a == b for a, b in zip(*wide))
    assert binomtest(agree, POSITIONS, 0.5).pvalue < 1e-3  # which the check above rejects
    assert generation_seed(42, first) != generation_seed(43, first)


def test_a_step_stream_and_the_device_twin_follow_the_generation():
    """The step streams of the sampling rules and the device twins' keys follow the prompt too."""
    rule = make_rule("spec_sampling", 0.8, 7)
    rule.begin([5, 6])
    a = step_rng(rule.stream, 3).random(4)
    twin = device_rule(rule, torch.device("cpu"), 4, 64)
    twin.begin(2, 16)
    assert int(twin.seed) == rule.stream % 2**63
    rule.begin([5, 7])
    twin.begin(2, 16)
    assert int(twin.seed) == rule.stream % 2**63 and not (step_rng(rule.stream, 3).random(4) == a).any()


def test_generate_keys_its_draws_by_the_prompt():
    """``generate`` begins the route's rule on the prompt it decodes: its draws are that prompt's, and a
    second generation of the prompt samples the same tokens."""
    model = small_hybrid(11).double()
    route = build_route({"kind": "ar"}, SMALL_VOCAB, "sample_match", 1.0, 3)
    prompt = small_ids(6, 2)
    got = generate(model, prompt, route, 12)
    assert route.rule.stream == generation_seed(3, prompt)
    assert generate(model, prompt, route, 12).output_ids == got.output_ids  # reproducible


def test_a_position_draw_depends_on_every_bit_of_its_seed():
    """Seeds 2**32 apart draw differently (torch's CPU generator keeps a seed's low 32 bits: they drew
    alike), and the draws of many seeds and positions are uniform (KS test) without repeats (a seed
    sequence of integers of varying width met: (2**40 + 1, 0) drew as (1, 256))."""
    from scipy.stats import kstest

    from repro.decoding.sampling import position_uniform

    assert len({position_uniform(5 + k * 2**32, 3) for k in range(4)}) == 4
    draws = [position_uniform(seed, t) for seed in (1, 2**40 + 1, 2**62 + 7) for t in range(1000)]
    assert kstest(draws, "uniform").pvalue > 1e-3 and len(set(draws)) == len(draws)
    # (seed, position) pairs whose integers a seed sequence would cut into the same words: apart
    assert position_uniform(2**40 + 1, 0) != position_uniform(1, 256)
    assert step_rng(2**40 + 1, 0).random() != step_rng(1, 256).random()
