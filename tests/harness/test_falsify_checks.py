"""The falsifiers of issue 11: pool mass (+ the oracle bound), what was timed, uniform protocol; their
verdict logic on planted cases and the CLI end to end on the tiny family with small sizes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import run_cli as cli

from repro.drafters.dflash import random_dflash_for
from repro.drafters.pool import PoolMass, outside_mass, pool_mass, top_k_pool
from repro.harness.falsify import pool_mass as pm
from repro.harness.falsify import protocol, timed
from repro.harness.falsify.oracle import context_curves

# ------------------------------------------------------------------------------- pool mass


def test_outside_mass_is_the_mass_outside_the_drafts_top_k(model64):
    dflash = random_dflash_for(model64, seed=1, block_size=4)
    seq = torch.randint(0, model64.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    vocab = model64.config.vocab_size
    got = outside_mass(model64, dflash, seq, [3, 50, vocab], first_anchor=5)
    # brute force at anchor a = 5, depth 1: the target's distribution at position a + 1 - 1 vs row 1's top-3
    layers = tuple(dflash.config.target_layer_ids)
    with torch.no_grad():
        logits, hidden = model64.forward_train_hidden(seq, layers)
        feats = torch.cat([hidden[i] for i in layers], dim=-1)
        block, _ = dflash.anchored_blocks(seq, feats, torch.tensor([[5]]), model64.model.embed_tokens.weight)
        _, ids = top_k_pool(dflash.compute_logits(block[:, 1:], model64.lm_head)[0, 0], 3)
    p = torch.softmax(logits[0, 5].double(), -1)
    assert float(got[3][0][0]) == pytest.approx(1 - float(p[ids].sum()), abs=1e-9)
    assert all(float(v.abs().max()) < 1e-9 for v in got[vocab])  # the whole vocabulary keeps everything
    assert all(bool((a >= b - 1e-12).all()) for a, b in zip(got[3], got[50]))  # a larger pool keeps more
    single = pool_mass(model64, dflash, seq, 50, first_anchor=5)  # the one-K face is the same numbers
    assert single.mean_outside == PoolMass.of(50, got[50]).mean_outside


def test_pool_statistics_on_a_planted_pool():
    values = [torch.tensor([0.0, 0.05, 0.2, 0.5]), torch.tensor([])]
    mass = PoolMass.of(512, values, threshold=0.9)
    assert mass.mean_outside[0] == pytest.approx(0.1875) and mass.positions == [4, 0]
    assert mass.share_below[0] == pytest.approx(0.5)  # 0.2 and 0.5 outside: kept < 90%
    assert mass.median_outside[0] == pytest.approx(0.125) and math.isnan(mass.mean_outside[1])
    assert mass.p90_outside[0] == pytest.approx(float(torch.quantile(values[0].double(), 0.9)))
    # the progress line stops at the deepest depth reached (depth 2 has no positions: no "nan")
    assert pm.mass_line(mass) == "K=512: mean outside mass 0.188 (depth 1) .. 0.188 (depth 1)"
    assert pm.mass_line(PoolMass.of(64, [torch.tensor([])])) == "K=64: no positions"


def test_rerun_verdict_on_planted_changes():
    assert pm.rerun_verdict((4.0, 4.1), (100.0, 104.0)) == "immaterial"  # 2.5% and 4%
    assert pm.rerun_verdict((4.0, 4.4), (100.0, 100.0)) == "material"  # MAL +10%
    assert pm.rerun_verdict((4.0, 4.0), (100.0, 94.0)) == "material"  # tokens/s -6%
    assert pm.rerun_verdict((4.0, math.nan), (100.0, 100.0)) == "material"  # unknown is not immaterial


def test_falsifier_verdict_on_planted_cases():
    outside, bound = [0.2, 0.2, 0.2, 0.2], [0.5, 0.3, 0.1, 0.0]
    assert pm.falsifier_verdict(outside, bound, [0.4, 0.3, 0.05, 0.0]) == ("refuted", [1, 2, 3])
    assert pm.falsifier_verdict(outside, bound, [0.6, 0.5, 0.3, 0.0]) == ("not refuted", [1, 2, 3])
    assert pm.falsifier_verdict([0.01] * 4, bound, [0.4, 0.3, 0.05, 0.0]) == ("not refuted", [])  # pool safe
    assert pm.falsifier_verdict(outside, [0.0] * 4, [0.0] * 4) == ("not refuted", [])  # nothing informative


def test_oracle_curves_on_planted_marginals():
    same = torch.tensor([[1, 2, 3]] * 4)
    argmax, sampled = context_curves(same, same, vocab=8)
    assert argmax == [1.0, 1.0, 1.0] and sampled == pytest.approx([1.0, 1.0, 1.0])
    fit = torch.tensor([[1, 5], [1, 5], [2, 5], [2, 6]])  # p_1 = {1: .5, 2: .5}, p_2 = {5: .75, 6: .25}
    score = torch.tensor([[1, 5], [2, 6]])
    argmax, sampled = context_curves(fit, score, vocab=8)
    assert argmax == [0.5, 0.5]  # the argmax chain (1, 5) matches the first scoring sample only
    assert sampled == pytest.approx([0.5, (0.5 * 0.75 + 0.5 * 0.25) / 2])


def test_pool_mass_cli_end_to_end_on_the_tiny_family(monkeypatch, capsys, tmp_path):
    out = tmp_path / "pm"
    code, text, err = cli(
        monkeypatch, capsys, "falsify", "pool-mass", "--k", "64,512", "--rerun-k", "64", "--suites", "gsm8k",
        "--limit", "1", "--max-new-tokens", "6", "--budget", "8", "--oracle-samples", "4",
        "--contexts-per-prompt", "1", "--corpus", str(tmp_path / "none"), "--out", str(out),
    )  # fmt: skip
    assert code in (0, 3), err
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    table = pd.read_csv(out / "table.csv")
    pools = [r for r in records if r["record"] == "pool"]
    assert len(table) == len(pools) == 2 * 7 and set(table["k"]) == {
        64,
        512,
    }  # anchors from the last prompt token
    for row, rec in zip(table.itertuples(), pools):
        assert row.mean_outside == pytest.approx(rec["mean_outside"]) and row.k == rec["k"]
    routes = {r["route"]: r for r in records if r["record"] == "route" and r["temperature"] == 0}
    rerun = pm.rerun_table(records, 64)
    assert list(rerun["mal"]) == [routes["weaver-K64"]["mal"], routes["weaver-K128"]["mal"]]
    config = json.loads((out / "manifest.json").read_text())["config"]
    found = pm.verdicts(records, config)
    assert found["diverged"] == []  # greedy in float64: every route identical to AR
    assert f"**Falsifier: {found['falsifier']}.**" in text and (code == 3) == (
        found["falsifier"] == "refuted"
    )
    tampered = [{**r, "lossless": False} if r.get("route") == "ddtree" else r for r in records]
    assert pm.verdicts(tampered, config)["diverged"] == ["ddtree"]  # and the command exits 3 on it
    assert pm.verdicts(tampered, {**config, "dtype": "float32"})["diverged"] == []  # not required there
    assert (out / "figures" / "pool_mass.png").exists() and (out / "figures" / "oracle_bound.svg").exists()
    oracle = pd.read_csv(out / "oracle.csv")
    assert list(oracle["bound"]) == pytest.approx(
        next(r for r in records if r["record"] == "oracle")["bound"]
    )
    before = (out / "report.md").read_text()
    (out / "report.md").unlink()
    assert cli(monkeypatch, capsys, "report", str(out))[0] == 0 and (out / "report.md").read_text() == before


def test_the_options_dispatch_to_the_same_functions(monkeypatch, capsys, tmp_path):
    import repro.harness.falsify.pool_mass as module

    seen = []

    def fake(cfg, progress=None):
        seen.append(cfg)
        return "report", {"falsifier": "refuted", "depths": [1], "rerun": "material", "diverged": []}

    monkeypatch.setattr(module, "run_pool_check", fake)
    code, _, err = cli(monkeypatch, capsys, "falsify", "--pool-mass", "--k", "64,128", "--out", str(tmp_path))
    assert code == 3 and "pool-mass claim refuted at depth(s) 1" in err
    assert seen[0].ks == [64, 128] and seen[0].out == str(tmp_path)
    diverged = {"falsifier": "not refuted", "depths": [], "rerun": "immaterial", "diverged": ["ddtree"]}
    monkeypatch.setattr(module, "run_pool_check", lambda cfg, progress=None: ("report", diverged))
    code, _, err = cli(monkeypatch, capsys, "falsify", "pool-mass", "--out", str(tmp_path / "b"))
    assert code == 3 and "not lossless: greedy route(s) ddtree diverged from AR in float64" in err
    code, _, err = cli(monkeypatch, capsys, "falsify", "--pool-mass", "--k", "6x")
    assert code == 2 and "--k takes comma-separated integers" in err
    code, _, _ = cli(monkeypatch, capsys, "falsify")
    assert code == 2  # nothing asked for: the help


# ---------------------------------------------------------------------- decode runs to read


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory) -> Path:
    """A tiny-random decode run at temperature 1 with two methods under two acceptance rules."""
    from repro.harness.experiment import resolve
    from repro.harness.runner import ExperimentRunner
    from repro.reporting.records import build_manifest
    from repro.reporting.report import DECODE_KIND
    from repro.reporting.rundir import RunDir

    routes = [{"name": "ar", "kind": "ar"}]
    for rule in ("sample_match", "traversal"):
        routes.append(
            {"name": f"chain-{rule}", "kind": "synthetic_chain", "k": 3, "p": 0.9, "acceptance": rule}
        )
        routes.append({"name": f"tree-{rule}", "kind": "synthetic_tree", "k": 2, "width": 2, "p": 0.5,
                       "acceptance": rule})  # fmt: skip
    raw = {"name": "t", "target": "tiny-random", "dtype": "float64", "suites": ["gsm8k"], "limit": 1,
           "max_new_tokens": 8, "warmup": 0, "ignore_eos": True, "temperature": 1.0,
           "routes": routes}  # fmt: skip
    cfg = resolve(raw, {})
    path = tmp_path_factory.mktemp("decode") / "run"
    with RunDir(path, build_manifest(cfg), DECODE_KIND) as run:
        ExperimentRunner(cfg).run(run)
        run.write_report()
    return path


def test_what_was_timed_counts_every_layer(monkeypatch, capsys, tmp_path, decode_run):
    out = tmp_path / "timed"
    code, text, err = cli(
        monkeypatch, capsys, "falsify", "--what-was-timed", str(decode_run), "--out", str(out)
    )
    assert code == 0, err
    rows = pd.read_csv(out / "table.csv")
    from repro.models.default import build_default_target

    layers = len(build_default_target().model.layers)  # configured; the run's counts must reach it
    assert set(rows["model_layers"]) == {layers} and set(rows["layers_min"]) == {layers}
    assert (rows["verify_calls"] > 0).all() and set(rows["verdict"]) == {timed.MODEL}
    from repro.reporting.report import summarize
    from repro.reporting.rundir import load_run

    pooled = summarize(load_run(decode_run).records).query("suite == 'all'").set_index("route")
    for r in rows.itertuples():
        assert (
            r.verify_ms == pytest.approx(pooled.loc[r.route, "verify_ms"])
            and pytest.approx(pooled.loc[r.route, "MAL"]) == r.MAL
        )


def test_what_was_timed_refuses_a_run_whose_checkpoint_changed_since(monkeypatch, capsys, tmp_path):
    """The re-run counts layers on today's weights: a checkpoint edited since the decode run is refused in
    one line (exit 2), the unedited one is counted."""
    target = tmp_path / "target"
    assert cli(monkeypatch, capsys, "export-default", str(target))[0] == 0
    run = tmp_path / "run"
    routes = "routes=[{name: ar, kind: ar}, {name: c, kind: synthetic_chain, k: 2, p: 0.9}]"
    args = ("run", "smoke", "--target", str(target), "--suites", "gsm8k", "--limit", "1",
            "--max-new-tokens", "3", "--set", routes)  # fmt: skip
    assert cli(monkeypatch, capsys, *args, "--out", str(run))[0] == 0
    timed_into = ("falsify", "what-was-timed", str(run), "--out")
    code, _, err = cli(monkeypatch, capsys, *timed_into, str(tmp_path / "a"))
    assert code == 0, err
    (target / "config.json").write_text((target / "config.json").read_text() + "\n")
    code, _, err = cli(monkeypatch, capsys, *timed_into, str(tmp_path / "b"))
    assert code == 2 and len(err.splitlines()) == 1 and "config.json changed" in err, err
    assert not (tmp_path / "b").exists()


def test_what_was_timed_counts_the_graphed_engine_s_own_layers(monkeypatch):
    """A run on the graphed engine is counted on its static decoder (the HybridLM hooks never fire
    there): every decode step executes every layer; a decoder that skips one is caught."""
    from repro.harness.experiment import resolve
    from repro.models.static import StaticDecoder

    routes = [{"name": "ar", "kind": "ar"}, {"name": "chain", "kind": "synthetic_chain", "k": 3, "p": 0.9}]
    raw = {"name": "t", "target": "tiny-random", "dtype": "float32", "suites": ["gsm8k"], "limit": 1,
           "max_new_tokens": 6, "warmup": 0, "ignore_eos": True, "engine": "graphed",
           "routes": routes}  # fmt: skip
    cfg = resolve(raw, {})
    counts = timed.count_layers(cfg, ["ar", "chain"], 6)
    layers = counts["ar"]["model_layers"]
    assert {c["layers_min"] for c in counts.values()} == {layers} and counts["chain"]["verify_calls"] >= 2
    real = StaticDecoder._forward

    def one_layer_short(
        self: StaticDecoder, *args: object, **kw: object
    ) -> torch.Tensor:  # 1st layer skipped
        full = self.layers, self.weights, self.buffers
        self.layers, self.weights, self.buffers = full[0][1:], full[1][1:], full[2][1:]
        try:
            return real(self, *args, **kw)
        finally:
            self.layers, self.weights, self.buffers = full

    monkeypatch.setattr(StaticDecoder, "_forward", one_layer_short)
    short = timed.count_layers(cfg, ["ar"], 6)["ar"]  # decode steps only (a verify's commit needs them all)
    assert (
        short["layers_min"] == layers - 1
        and timed.timing_verdict(short["layers_min"], layers) == timed.SINGLE
    )


def test_a_single_layer_timing_is_refused(monkeypatch, capsys, tmp_path, decode_run):
    assert timed.timing_verdict(1, 8) == timed.SINGLE and timed.timing_verdict(8, 8) == timed.MODEL

    def one_layer(cfg, routes, new_tokens, checkpoints=None):
        return {r: {"prompt": "p", "verify_calls": 3, "layers_per_verify": 1.0, "layers_min": 1,
                    "model_layers": 8} for r in routes}  # fmt: skip

    monkeypatch.setattr(timed, "count_layers", one_layer)
    code, _, err = cli(
        monkeypatch, capsys, "falsify", "what-was-timed", str(decode_run), "--out", str(tmp_path / "t")
    )
    assert code == 3 and "single-layer timing, not a model timing" in err


def test_layer_counter_sees_a_skipped_layer(model64):
    """Negative control of the counter: a target whose verify skips a layer is counted one short."""
    from repro.tree import Tree

    counter = timed.LayerCounter(model64)
    try:
        state, _ = model64.prefill([1, 2, 3])
        model64.verify(state, Tree.chain(torch.tensor([4, 5])))
        skipped = model64.model.layers[3].input_layernorm
        handle = skipped.register_forward_pre_hook(lambda *a: None)
        counter.hooks[3].remove()  # the layer runs but is no longer seen: as if it were not executed
        model64.verify(state, Tree.chain(torch.tensor([4, 5])))
        handle.remove()
    finally:
        counter.close()
    assert counter.per_verify == [len(model64.model.layers), len(model64.model.layers) - 1]
    assert "verify" not in vars(model64)  # the instance is restored


def test_uniform_protocol_on_planted_rows():
    rows = pd.DataFrame([
        {"method": "A", "rule": "r1", "route": "a1", "speedup": 2.0, "MAL": 3.0},
        {"method": "A", "rule": "r2", "route": "a2", "speedup": 1.0, "MAL": 2.0},
        {"method": "B", "rule": "r1", "route": "b1", "speedup": 1.5, "MAL": 2.5},
        {"method": "B", "rule": "r2", "route": "b2", "speedup": 3.0, "MAL": 4.0},
    ])  # fmt: skip
    uniform, best = protocol.protocol_tables(rows)
    assert set(uniform) == {"r1", "r2"} and list(best["route"]) == ["b2", "a1"]
    assert protocol.ranking_changes(rows) == {"r1": True, "r2": False}
    same = rows.assign(speedup=[2.0, 1.0, 1.5, 0.5])
    assert protocol.ranking_changes(same) == {"r1": False, "r2": False}


def test_uniform_protocol_rows_state_n_and_the_paired_interval(tmp_path):
    """Each method row's speedup states n (the prompts paired with AR) and its paired bootstrap interval
    (stats.compare, the decode report's), recorded from the source run and printed in every table; rows
    recorded before they kept n print as they did, with a line saying so."""
    from conftest import make_record

    from repro.reporting.records import build_manifest
    from repro.reporting.rundir import RunDir
    from repro.reporting.stats import MIN_UNITS, SPEEDUP, compare

    records = []
    for i in range(6):
        records.append(make_record("ar", prompt_id=f"p{i}", decode_s=1.0))
        for name, kind, rule, s in (("c-sm", "synthetic_chain", "sample_match", 0.5),
                                    ("c-tr", "synthetic_chain", "traversal", 0.6),
                                    ("t-sm", "synthetic_tree", "sample_match", 0.7),
                                    ("t-tr", "synthetic_tree", "traversal", 0.4)):  # fmt: skip
            rec = make_record(name, prompt_id=f"p{i}", decode_s=s + 0.05 * i, kind=kind)
            rec.route_params = {"kind": kind, "acceptance": rule}
            records.append(rec)
    rows = protocol.method_rows(records)
    for r in rows.itertuples():
        want = compare(records, r.route, "ar", ["gsm8k"], SPEEDUP)
        assert (r.n, r.speedup, r.ci_low, r.ci_high) == (
            want.n,
            pytest.approx(want.value),
            want.low,
            want.high,
        )
        assert r.n == 6 >= MIN_UNITS and r.ci_low < r.speedup < r.ci_high
    with RunDir(tmp_path / "new", build_manifest({"check": "uniform-protocol", "source": "src"}),
                protocol.KIND) as run:  # fmt: skip
        for row in rows.to_dict("records"):
            run.append(row)
        text = run.write_report()
    assert "| n | speedup | ci_low | ci_high |" in text.replace("  ", " ").replace("  ", " ")
    assert text.count("| 6 |") == 2 * 3  # 2 methods in the best-of table and in both uniform tables
    assert f"below {MIN_UNITS} prompts" in text and "not recorded" not in text
    old = [
        {k: v for k, v in row.items() if k not in ("n", "ci_low", "ci_high")}
        for row in rows.to_dict("records")
    ]
    with RunDir(tmp_path / "old", build_manifest({"check": "uniform-protocol", "source": "src"}),
                protocol.KIND) as run:  # fmt: skip
        for row in old:
            run.append(row)
        text = run.write_report()
    assert "| n |" not in text and "n and intervals not recorded" in text


def planted_protocol_run(a_sample_match: list[float]) -> list:
    """Decode records of methods A (synthetic_chain) and B (synthetic_tree) under sample_match and traversal
    on 6 prompts: best-of ranks B (traversal, 0.4 s) over A (sample_match, ``a_sample_match`` s a prompt);
    under sample_match B takes 0.7 s, so A passes B there by as much as ``a_sample_match`` says."""
    from conftest import make_record

    records = []
    for i in range(6):
        records.append(make_record("ar", prompt_id=f"p{i}", decode_s=1.0))
        for name, kind, rule, s in (("a-sm", "synthetic_chain", "sample_match", a_sample_match[i]),
                                    ("a-tr", "synthetic_chain", "traversal", 0.9),
                                    ("b-sm", "synthetic_tree", "sample_match", 0.7),
                                    ("b-tr", "synthetic_tree", "traversal", 0.4)):  # fmt: skip
            rec = make_record(name, prompt_id=f"p{i}", decode_s=s, kind=kind)
            rec.route_params = {"kind": kind, "acceptance": rule}
            records.append(rec)
    return records


@pytest.mark.parametrize(
    "a_sample_match, beyond",
    [([0.5, 0.52, 0.48, 0.5, 0.51, 0.49], True),  # A 1.4x faster than B on every prompt: a real swap
     ([0.3, 1.1, 0.35, 1.05, 0.32, 1.0], False)],  # A ahead on the pooled estimate, 3 of 6 prompts each way
)  # fmt: skip
def test_a_ranking_changes_only_where_a_swap_is_beyond_noise(tmp_path, a_sample_match, beyond):
    """Under sample_match A passes B (best-of ranks B first): the swap's paired ratio and interval are
    recorded, and only an interval above 1 changes the ranking (exit 3); a swap within noise is reported as
    such. Runs recorded before the swaps were are judged on point estimates, saying so."""
    from repro.reporting.records import build_manifest
    from repro.reporting.report import DECODE_KIND
    from repro.reporting.rundir import RunDir, load_run

    records = planted_protocol_run(a_sample_match)
    rows = protocol.method_rows(records)
    swapped = protocol.swaps(rows, records)
    assert [(s["rule"], s["ahead"], s["behind"], s["n"]) for s in swapped] == [
        ("sample_match", "synthetic_chain", "synthetic_tree", 6)
    ]
    assert swapped[0]["ratio"] > 1 and swapped[0]["beyond_noise"] == beyond == (swapped[0]["low"] > 1)
    assert protocol.ranking_changes(rows, swapped) == {"sample_match": beyond, "traversal": False}
    assert protocol.ranking_changes(rows) == {"sample_match": True, "traversal": False}  # point estimates
    src = tmp_path / "src"
    with RunDir(src, build_manifest({"t": 1}), DECODE_KIND) as run:
        for rec in records:
            run.append(rec)
    _, changes = protocol.uniform_protocol(load_run(src), tmp_path / "check")
    text = (tmp_path / "check" / "report.md").read_text()
    assert changes["sample_match"] == beyond and "## Swaps" in text
    assert ("beyond noise (Swaps below)" in text) == beyond and ("up to noise" in text) == (not beyond)
    assert "Judged on point estimates" not in text


def test_uniform_protocol_end_to_end(monkeypatch, capsys, tmp_path, decode_run):
    out = tmp_path / "proto"
    code, text, err = cli(
        monkeypatch, capsys, "falsify", "uniform-protocol", str(decode_run), "--out", str(out)
    )
    assert code in (0, 3), err
    table = pd.read_csv(out / "table.csv")
    assert set(table["rule"]) == {"sample_match", "traversal"} and table["method"].nunique() == 2
    from repro.reporting.report import summarize
    from repro.reporting.rundir import load_run

    pooled = summarize(load_run(decode_run).records).query("suite == 'all'").set_index("route")
    for r in table.itertuples():
        assert r.speedup == pytest.approx(pooled.loc[r.route, "speedup"])
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    changed = any(protocol.ranking_changes(table, [r for r in records if r.get("swap")]).values())
    assert (code == 3) == changed and "## Best-of-protocol" in text
    # a run with one rule is bad input
    code, _, err = cli(
        monkeypatch, capsys, "falsify", "--uniform-protocol", str(out), "--out", str(tmp_path / "x")
    )
    assert code == 2 and "needs a decode run directory" in err


def test_pool_mass_decodes_on_the_graphed_engine_like_the_eager_one(monkeypatch, capsys, tmp_path):
    """``--engine graphed`` (the GPU engine; on CPU without graphs, float64) measures the same acceptance."""
    routes = {}
    for engine in ("eager", "graphed"):
        out = tmp_path / engine
        code, _, err = cli(
            monkeypatch, capsys, "falsify", "pool-mass", "--k", "64", "--rerun-k", "64", "--suites", "gsm8k",
            "--limit", "1", "--max-new-tokens", "6", "--budget", "8", "--oracle-samples", "2",
            "--contexts-per-prompt", "1", "--corpus", str(tmp_path / "none"), "--engine", engine,
            "--out", str(out),
        )  # fmt: skip
        assert code in (0, 3), err
        assert json.loads((out / "manifest.json").read_text())["engine"] == engine
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        routes[engine] = {
            (r["route"], r["temperature"]): (r["mal"], r["depth_acceptance"], r["diverged"])
            for r in records
            if r["record"] == "route"
        }
    assert routes["graphed"] == routes["eager"] and len(routes["eager"]) == 5
    assert all(diverged == 0 for _, _, diverged in routes["eager"].values())
