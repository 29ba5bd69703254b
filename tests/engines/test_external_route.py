"""The ``external`` route kind: its registry entry matches the engine catalog, its specs are checked in
one line, its records (tokens, verdict, the loop's own accepted lengths, wall time) validate, and a
sampling loop's verdict is ``sampled: ...`` in records and in ``repro falsify external`` alike."""

from __future__ import annotations

import json
import math

import pytest

from repro.data.suites import Prompt
from repro.decoding.routes import EXTERNAL_ENGINES, build_route
from repro.engines import verdicts
from repro.engines.catalog import ENGINES
from repro.engines.external_route import build_external, resolve_external
from repro.engines.result import OK, SAMPLED, EngineResult, refused
from repro.errors import CheckpointError, ConfigError
from repro.harness.experiment import resolve
from repro.reporting.records import DecodeRecord
from repro.reporting.report import summarize

ZLAB = {"name": "zlab", "kind": "external", "engine": "dflash-generate"}
CFG = {"max_new_tokens": 5, "temperature": 0.0, "seed": 0, "dtype": "float64", "device": "cpu"}
PROMPT = Prompt("gsm8k", "1", ["q"])


def test_the_registry_names_every_external_loop_of_the_catalog():
    assert set(EXTERNAL_ENGINES) == set(ENGINES) - {"repro-dflash-chain"}  # the control is repro's own route


@pytest.mark.parametrize(
    "spec, target, needle",
    [
        ({**ZLAB, "engine": "zlab"}, "tiny-qwen35", "engine must be one of transformers-generate"),
        ({**ZLAB, "commit": "replay"}, "tiny-qwen35", "commit are the loop's own; remove them"),
        ({**ZLAB, "acceptance": "greedy"}, "tiny-qwen35", "acceptance are the loop's own"),
        (
            {**ZLAB, "engine": "transformers-generate", "drafter": "x"},
            "tiny-qwen35",
            "this loop takes no drafter",
        ),
        (ZLAB, "tiny-random", "missing parameter drafter (a dflash drafter checkpoint)"),
    ],
)
def test_bad_external_specs_give_one_line_errors(spec, target, needle):
    with pytest.raises(ConfigError) as err:
        resolve_external(spec, target)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_external_routes_are_built_by_the_harness_not_build_route():
    with pytest.raises(ConfigError, match="only `repro run` \\(an experiment's routes\\) runs it"):
        build_route(ZLAB, 260, "greedy", 0.0, 0)
    route = build_external(ZLAB, "default")
    assert route.params == {"kind": "external", "engine": "dflash-generate", "drafter": "tiny-qwen35-dflash"}
    assert route.target_dir.name == "tiny-qwen35" and route.drafter_dir.name == "tiny-qwen35-dflash"
    with pytest.raises(ConfigError, match="target tiny-random is built in code"):
        build_external({**ZLAB, "drafter": "tiny-qwen35-dflash"}, "tiny-random")
    with pytest.raises(CheckpointError, match="zlab.drafter /no/such does not exist"):
        build_external({**ZLAB, "drafter": "/no/such"}, "default")


def _record(result: EngineResult, temperature: float = 0.0, stop: tuple[int, ...] = ()) -> DecodeRecord:
    route = build_external(ZLAB, "default")
    rec = route.record(PROMPT, 0, [1, 2], result, [5, 6, 7, 8, 9], {**CFG, "temperature": temperature}, stop)
    rec.validate()
    return DecodeRecord.from_json(rec.to_json())


def test_records_of_an_external_loop():
    rec = _record(EngineResult([5, 6, 0, 8, 9], [2, 2], 0.5, OK, "float64", prefill_s=0.1))
    assert rec.vs_ar == "diverged at token 2" and rec.accepted_lengths == [2, 2] and rec.steps == 2
    assert rec.decode_s == pytest.approx(0.4) and rec.prefill_s == 0.1 and rec.finish_reason == "length"
    rec = _record(EngineResult([5, 6, 7], [3, 1], 0.5, OK, "float64"), stop=(7,))
    assert rec.steps == 0 and rec.accepted_lengths == []  # counts that do not add up are dropped
    assert rec.vs_ar == "diverged at token 3" and rec.finish_reason == "stop"
    rec = _record(refused("no\nway", "float64"))
    assert rec.vs_ar == "refused: no way" and rec.new_tokens == 0
    rec = _record(EngineResult([1, 2, 3, 4, 5], [1, 1, 1, 1], 0.5, OK, "float64"), temperature=0.7)
    assert rec.vs_ar == SAMPLED == "sampled: not compared token-wise"


def test_an_external_loop_is_seeded_per_prompt_like_repro_s_routes():
    """Each prompt's request carries its own seed (the run's seed and the prompt's ids, as
    generation_seed keys repro's own draws), not the run's seed for every prompt: prompts sampled at
    T > 0 draw independently; the same prompt, the same seed."""
    from dataclasses import replace

    from repro.decoding.sampling import generation_seed

    seen = []
    route = build_external(ZLAB, "default")
    route = replace(route, engine=replace(route.engine, fn=lambda request: seen.append(request.seed)))
    for ids, seed in (([1, 2], 0), ([1, 3], 0), ([1, 2], 0), ([1, 2], 7)):
        route.decode(ids, {**CFG, "seed": seed, "temperature": 1.0}, ())
    assert seen[0] == generation_seed(0, [1, 2]) % 2**31 and seen[0] == seen[2]
    assert len({seen[0], seen[1], seen[3]}) == 3 and all(0 <= s < 2**31 for s in seen)


def test_only_external_records_may_be_refused_or_lack_counts():
    rec = json.loads(_record(refused("no", "float64")).to_json())
    with pytest.raises(ValueError, match="vs_ar 'refused: no'"):
        DecodeRecord.from_dict({**rec, "route_params": {"kind": "ar"}})
    bare = json.loads(_record(EngineResult([5, 6, 7], None, 0.5, OK, "float64")).to_json())
    with pytest.raises(ValueError, match="sum\\(accepted_lengths\\)=0 but new_tokens - 1 = 2"):
        DecodeRecord.from_dict({**bare, "route_params": {"kind": "ar"}})


def test_report_keeps_refusals_and_sampling_and_times_no_stages_of_other_loops():
    ar = _record(EngineResult([5, 6, 7, 8, 9], [1, 1, 1, 1], 0.5, OK, "float64"))
    ar.route, ar.route_params, ar.vs_ar, ar.tree_sizes = "ar", {"kind": "ar"}, "reference", [1] * 4
    refusal = _record(refused("no", "float64"))
    refusal.route = "hf"
    sampled = _record(EngineResult([1, 2, 3, 4, 5], [2, 2], 0.5, OK, "float64"), temperature=0.7)
    sampled.route = "zlab-sampled"
    table = summarize([ar, refusal, sampled]).set_index(["suite", "route"])
    assert table.loc[("all", "hf"), "lossless"] == "refused: no"
    assert table.loc[("all", "zlab-sampled"), "lossless"] == SAMPLED
    assert table.loc[("all", "zlab-sampled"), "MAL"] == 2.0
    assert (
        math.isnan(table.loc[("all", "zlab-sampled"), "verify_ms"])
        and table.loc[("all", "ar"), "verify_ms"] == 0
    )


def test_protocols_and_sweeps_run_an_external_route_once():
    raw = {"name": "x", "target": "tiny-qwen35", "device": "cpu", "routes": [{"kind": "dflash_chain"}, ZLAB]}
    cfg = resolve({**raw, "temperature": 0.7, "protocols": "auto"}, {})
    assert [r["name"] for r in cfg["routes"]].count("zlab") == 1 and "acceptance" not in cfg["routes"][-1]
    cfg = resolve({**raw, "sweep": {"param": "block_size", "values": [4, 8]}}, {})
    assert [r["name"] for r in cfg["routes"]] == [
        "ar",
        "dflash_chain@block_size=4",
        "dflash_chain@block_size=8",
        "zlab",
    ]


def test_sampling_verdict_in_the_falsify_check(tmp_path):
    pytest.importorskip("transformers")
    assert verdicts.verdict(refused("no", "float64"), [1], 0.7) == "refused: no"
    recs = verdicts.run_external_check(
        tmp_path / "x", ["tiny-qwen35"], ["gsm8k"], 1, 4, ["transformers-generate"], temperature=0.7
    )
    assert [r.vs_ar for r in recs] == [SAMPLED] and recs[0].vs_transformers_ar == SAMPLED
    assert len(recs[0].output_ids) == 4 and recs[0].first_divergence is None
    report = (tmp_path / "x" / "report.md").read_text()
    assert "Sampling at temperature 0.7 (verdict `sampled: not compared token-wise`)" in report
    assert f"| transformers-generate | tiny-qwen35 | float64 | 1 | {SAMPLED} |" in report


def test_the_transformers_target_is_loaded_once_per_run():
    pytest.importorskip("transformers")
    from repro.engines.hf_target import held_hf_target
    from repro.models.family import resolve_checkpoint

    first, _ = held_hf_target(resolve_checkpoint("tiny-qwen35"), "float64", "cpu")
    assert held_hf_target(resolve_checkpoint("tiny-qwen35"), "float64", "cpu")[0] is first
    assert held_hf_target(resolve_checkpoint("tiny-qwen35"), "float64", "cpu", "assistant")[0] is not first


@pytest.mark.parametrize("wrapped_in_module", [False, True], ids=["function", "kernels-func-module"])
@pytest.mark.parametrize("bound", [False, True])
def test_the_fla_binding_flag_is_found_through_transformers_wrappers(wrapped_in_module: bool, bound: bool):
    """transformers' hub wrapper closes over ``is_new_implementation`` (5.17-5.24: the module attribute is
    that function; 5.25 on: a torch module whose forward closes over it); absent: not bound."""
    import types

    import torch

    from repro.engines.hf_target import _binds_fla

    def hub_wrapper(is_new_implementation: bool):
        def wrapped(*args):
            return is_new_implementation

        return wrapped

    fn = hub_wrapper(bound)
    if wrapped_in_module:

        def func_module(func):
            class Func(torch.nn.Module):
                def forward(self, *args):
                    return func(*args)

            return Func()

        fn = func_module(fn)
    assert _binds_fla(types.SimpleNamespace(torch_chunk_gated_delta_rule=fn)) is bound
    assert _binds_fla(types.SimpleNamespace()) is False


def test_a_perturbed_assistant_is_the_same_weights_times_seeded_noise():
    import torch

    from repro.engines.hf_target import perturb

    def model() -> torch.nn.Module:
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).double()

    a, b, base = model(), model(), model()
    perturb(a, 0.1)
    perturb(b, 0.1)
    for pa, pb, p0 in zip(a.parameters(), b.parameters(), base.parameters()):
        assert torch.equal(pa, pb)  # seeded: the same perturbed weights
        rel = (pa / p0 - 1).std().item()
        assert 0.05 < rel < 0.2  # each weight times 1 + 0.1 N(0, 1)
    perturb(b, 0.1, seed=1)
    assert not torch.equal(next(a.parameters()), next(b.parameters()))
