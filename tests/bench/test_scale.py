"""`repro bench scale`: acceptance sources, drafter shapes, a tiny-shape run's files, bad input."""

from __future__ import annotations

import json
import math
import shutil
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from conftest import run_cli

from repro.bench import scale as bs
from repro.bench.model import MODEL_SHAPES
from repro.decoding.replayed import ReplayedAcceptance
from repro.decoding.routes import build_route
from repro.drafters import shapes
from repro.drafters.dflash import random_dflash_for
from repro.drafters.dflash_model import DFlashDraftModel
from repro.errors import ConfigError, ReproError
from repro.harness.run_kinds import rebuild_report
from repro.models.default import init_random_weights, tiny_config
from repro.models.graphed import GraphedTarget
from repro.models.hybrid import HybridLM
from repro.reporting.report import accept_histogram
from repro.reporting.rundir import load_run, restore_records
from repro.reporting.scale_figure import FIGURE, plot_scale
from repro.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")
ROOT = Path(__file__).resolve().parents[2]
GRAPHED_RUN = ROOT / "results/2026-12-01-h200-graphed-routes/graphed"


def tiny_target() -> HybridLM:
    return init_random_weights(HybridLM(tiny_config()), 0).eval().requires_grad_(False)


def test_paper_mals_follow_from_the_baselines():
    mals = bs.paper_mals()
    chain = (6.55 + 6.55 + 4.25) / 3  # related.yaml: DFlash tau on gsm8k, humaneval, mt_bench
    assert mals["dflash_chain"][0] == pytest.approx(chain)
    assert mals["dflash_tfm"][0] == pytest.approx(chain * 1.77)  # weaver.yaml: +77% over chain DFlash
    assert mals["ddtree"][0] == pytest.approx(chain * 1.77 / 1.32)  # +32% over DDTree
    assert mals["specla"][0] == pytest.approx((2.89 + 3.36 + 2.72) / 3)  # EAGLE-3 tau
    assert bs.paper_mals("gsm8k")["dflash_chain"][0] == pytest.approx(6.55)
    assert "weaver.yaml" in mals["dflash_tfm"][1]
    assert bs.paper_speedups()[("qwen3.6-27b", "dflash_tfm")][0] == pytest.approx(4.37)


def test_acceptance_per_route_from_a_mal_and_from_the_papers():
    model = tiny_target()
    route = build_route(
        {"kind": "ddtree", "drafter": "random", "budget": 8}, 260, "greedy", 0.0, 0, target=model
    )
    assert bs.route_depth(route) == 15
    process = bs.acceptance_for(bs.parse_acceptance("mal:4.5"), route)
    assert process.mal == pytest.approx(4.5) and process.depth == 15
    paper = bs.acceptance_for(bs.parse_acceptance("paper-mal"), route)
    assert paper.mal == pytest.approx(bs.paper_mals()["ddtree"][0])
    assert "paper-mal" in paper.source and "weaver.yaml" in paper.source
    ar = build_route({"kind": "ar"}, 260, "greedy", 0.0, 0)
    assert bs.acceptance_for(bs.parse_acceptance("mal:4.5"), ar) is None


@pytest.mark.skipif(not GRAPHED_RUN.exists(), reason="the committed graphed-routes run is absent")
def test_records_source_gives_the_measured_conditional_acceptance():
    probs, how = bs.records_probs(str(GRAPHED_RUN), "ddtree", 15)
    run = load_run(GRAPHED_RUN)
    hist = accept_histogram([r for r in run.records if r.route == "ddtree-b32"])
    for d, p in zip(hist["length"], hist["cond_accept_rate"]):
        if d <= 15 and p == p:
            assert probs[d - 1] == pytest.approx(p)
    assert "ddtree-b32" in how and len(probs) == 15
    tfm, _ = bs.records_probs(str(GRAPHED_RUN), "dflash_tfm", 15)  # the `weaver` kind is DFlash-TfM
    assert tfm[0] > 0.5
    with pytest.raises(ConfigError, match="no route of kind"):
        bs.records_probs(str(GRAPHED_RUN), "specla_missing", 6)
    # FLA-SD drafts the EAGLE chain: that run has none, so its eagle_chain route's acceptance stands in
    fla, how = bs.records_probs(str(GRAPHED_RUN), "fla_sd", 6)
    assert "eagle-chain-k6" in how and fla == bs.records_probs(str(GRAPHED_RUN), "eagle_chain", 6)[0]


def test_the_27b_dflash_drafter_has_its_public_shape():
    cfg = shapes.qwen27b_dflash_config(MODEL_SHAPES["qwen3.6-27b"]())
    assert cfg.target_layer_ids == [1, 16, 31, 46, 61] and cfg.block_size == 16
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (5120, 5, 17408)
    with torch.device("meta"):
        model = DFlashDraftModel(cfg)
    assert 1.6e9 < sum(p.numel() for p in model.parameters()) < 1.9e9


def test_the_13b_eagle_drafter_is_one_layer_at_the_target_width():
    cfg = shapes.gdn13b_eagle_config(MODEL_SHAPES["gdn-1.3b"]())
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim) == (
        2048,
        1,
        16,
        128,
    )
    assert cfg.target_layer_ids == [23] and cfg.intermediate_size == 5632 and cfg.vocab_size == 32000


def test_device_init_follows_the_draft_weight_law():
    cfg = random_dflash_for(tiny_target()).config
    model = shapes.device_model(DFlashDraftModel, cfg, torch.device("cpu"), torch.float32, 0)
    w = model.layers[0].mlp.down_proj.weight
    assert abs(float(w.mean())) < 0.02 and float(w.std() * w.shape[1] ** 0.5) == pytest.approx(1.0, rel=0.1)
    norm = model.norm.weight
    assert float((norm - 1).abs().max()) < 1.0 and float((norm - 1).std()) == pytest.approx(0.1, rel=0.5)


def test_build_route_uses_the_random_drafter_constructors():
    model = tiny_target()
    calls = []

    def make(target, seed=0, block_size=16):
        calls.append(block_size)
        return random_dflash_for(target, seed=seed, block_size=block_size, num_layers=2)

    route = build_route({"kind": "dflash_chain", "drafter": "random", "block_size": 8}, 260, "greedy", 0.0, 0,
                        target=model, random_drafters={"dflash": make})  # fmt: skip
    assert calls == [8] and route.drafter.model.config.num_hidden_layers == 2


def tiny_scale_run(
    tmp_path: Path, monkeypatch, capsys, routes: str, prompts: int, new_tokens: int
) -> tuple[Path, str, list[dict]]:
    """``repro bench scale`` on the tiny shape on CPU (mal:3): (its folder, stdout, its records)."""
    out = tmp_path / "scale"
    code, stdout, err = run_cli(
        monkeypatch, capsys, "bench", "scale", "--shape", "tiny", "--routes", routes,
        "--acceptance", "mal:3", "--prompts", str(prompts), "--prompt-len", "12", "--max-new-tokens",
        str(new_tokens), "--warmup-tokens", "2", "--device", "cpu", "--dtype", "float32", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    return out, stdout, [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_tiny_run_writes_records_table_and_report(tmp_path, monkeypatch, capsys):
    targets: list[weakref.ref] = []

    def spying(model: HybridLM) -> GraphedTarget:
        target = GraphedTarget(model)
        targets.append(weakref.ref(target))
        return target

    monkeypatch.setattr(bs, "GraphedTarget", spying)
    out, stdout, records = tiny_scale_run(tmp_path, monkeypatch, capsys, "dflash_chain", 1, 12)
    # the shape's target went with it: collected by the run, not left to a later collection (its objects
    # hold one another in cycles; the 27B shape's held 56 GiB while the next shape ran, 2026-12-06)
    assert len(targets) == 1 and targets[0]() is None
    assert [r["route"] for r in records] == ["ar", "dflash_chain"]
    chain = records[1]
    assert chain["acceptance"]["source"] == "mal:3" and chain["acceptance"]["mal"] == pytest.approx(3.0)
    assert len(chain["acceptance"]["probs"]) == 15 and chain["drafter"]["dflash"]["block_size"] == 16
    assert chain["route_params"]["acceptance"] == "replayed" and chain["truncated_steps"] == 0
    assert sum(chain["accepted_lengths"]) == chain["new_tokens"] - 1 == 11
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "bench-scale" and manifest["config"]["acceptance"] == "mal:3"
    assert "peak_gpu_gib" not in manifest["models"]["tiny"] and "gpu_memory_gib" not in manifest  # CPU
    table = pd.read_csv(out / "table.csv")
    assert list(table["route"]) == ["ar", "dflash_chain"] and table["speedup"].iloc[0] == pytest.approx(1.0)
    assert table["MAL"].iloc[1] > 1 and "acceptance replayed" in stdout and "mal:3" in stdout
    before = {name: (out / name).read_bytes() for name in ("report.md", "table.csv", FIGURE)}
    assert before[FIGURE].startswith(b"\x89PNG") and f"]({FIGURE})" in before["report.md"].decode()
    for name in before:
        (out / name).unlink()
    # `repro report DIR` rebuilds them from the records: report and table byte for byte, and the figure
    # (same matplotlib in one process: the same bytes)
    assert rebuild_report(out) == before["report.md"].decode()
    assert {name: (out / name).read_bytes() for name in before} == before


def test_a_run_stopped_inside_a_shape_still_reports_its_prompts_and_says_so(tmp_path, monkeypatch):
    """Interrupted (a timeout's SIGINT) after the first prompt: the records stay, the report is written with
    them and names the shape cut short; the interrupt is not swallowed. A finished run has no such line."""
    real, calls = bs.decode_record, []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # the second prompt's AR
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bs, "decode_record", stopping)
    cfg = bs.ScaleConfig(
        shapes=["tiny"], routes={"tiny": ["ar", "dflash_chain"]}, acceptance="mal:3", prompts=3,
        prompt_len=12, max_new_tokens=6, warmup_tokens=2, dtype="fp32",
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        bs.run_scale(cfg, torch.device("cpu"), tmp_path / "cut")
    report = (tmp_path / "cut" / "report.md").read_text()
    assert len((tmp_path / "cut" / "records.jsonl").read_text().splitlines()) == 2
    assert "**Cut short:** tiny stopped after 1 of 3 prompts; its rows hold those." in report
    assert rebuild_report(tmp_path / "cut") == report  # `repro report DIR` says the same
    monkeypatch.setattr(bs, "decode_record", real)
    bs.run_scale(replace(cfg, prompts=1), torch.device("cpu"), tmp_path / "whole")
    assert "Cut short" not in (tmp_path / "whole" / "report.md").read_text()


def test_each_prompt_replays_its_own_acceptance_draws_shared_by_the_routes(tmp_path, monkeypatch, capsys):
    """Prompts are independent samples of the acceptance process (one draw stream per prompt), and every
    route of a prompt replays that prompt's stream (paired): before, every prompt replayed the same
    depths, so a row's MAL was one sample however many prompts ran."""
    out, _, records = tiny_scale_run(tmp_path, monkeypatch, capsys, "dflash_chain,ddtree", 3, 24)
    chain = {r["prompt"]: r for r in records if r["route"] == "dflash_chain"}
    tree = {r["prompt"]: r for r in records if r["route"] == "ddtree"}
    assert [chain[i]["acceptance_seed"] for i in range(3)] == [bs.acceptance_seed(0, i) for i in range(3)]
    assert all(tree[i]["acceptance_seed"] == chain[i]["acceptance_seed"] for i in range(3))
    lengths = [tuple(chain[i]["accepted_lengths"]) for i in range(3)]
    assert len(set(lengths)) == 3, lengths  # the chain holds every drawn depth: the draws differ
    manifest = json.loads((out / "manifest.json").read_text())
    assert "per prompt" in manifest["config"]["acceptance_draws"]
    # the pipelined loop's step launched past a generation's end is counted (its time is in decode_s); none
    # is launched once the unread one must reach the limit
    past = {(r["route"], r["prompt"]): r["launched_steps"] - r["steps"] for r in records}
    assert set(past.values()) <= {0, 1} and past[("ar", 0)] == past[("ar", 1)] == past[("ar", 2)] == 0
    assert any(past[("dflash_chain", i)] or past[("ddtree", i)] for i in range(3)), past
    table = pd.read_csv(out / "table.csv").set_index("route")
    tree_past = sum(past[("ddtree", i)] for i in range(3))
    assert table.loc["ddtree", "launched"] == table.loc["ddtree", "steps"] + tree_past
    assert "ran past a generation's end" not in (out / "report.md").read_text()  # no paper row for tiny
    assert "| steps | launched |" in (out / "report.md").read_text()


def test_replayed_rule_is_the_routes_rule():
    model = tiny_target()
    cfg = bs.ScaleConfig(shapes=["tiny"], routes={"tiny": ["ar", "ddtree"]}, acceptance="mal:2", dtype="fp32")
    ar, ddtree = bs.build_routes("tiny", cfg, model, bs.parse_acceptance("mal:2"))
    assert not isinstance(ar.rule, ReplayedAcceptance) and isinstance(ddtree.rule, ReplayedAcceptance)
    assert ddtree.rule.process.mal == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shape", "llama-70b"], "unknown shape"),
        (["--shapes", "llama-70b"], "unknown shape"),  # the other benches' spelling (docs/usage.md)
        (["--shape", "tiny", "--routes", "medusa"], "unknown route"),
        (["--shape", "tiny", "--acceptance", "oracle"], "unknown acceptance"),
        (["--shape", "tiny", "--acceptance", "mal:0.5"], "MAL"),
        (["--shape", "tiny", "--acceptance", "mal:many"], "needs a number"),
        (["--shape", "tiny", "--acceptance", "records:/nonexistent/run"], "records:/nonexistent/run"),
        (["--shape", "tiny", "--acceptance", "paper-mal:arxiv"], "paper-mal suite"),
        (["--shape", "tiny", "--routes", "dflash_chain", "--acceptance", "mal:20"], "not reachable"),
        (["--shape", "tiny", "--switch", "fuse_acept=false"], "unknown engine switch(es): fuse_acept"),
        (["--shape", "tiny", "--switch", "ar_group"], "--switch takes NAME=VALUE"),
        (["--shape", "tiny", "--switch", "pipeline=2"], "switch pipeline must be true or false"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    code, _, err = run_cli(monkeypatch, capsys, "bench", "scale", *args, "--device", "cpu", "--out",
                           str(tmp_path / "x"))  # fmt: skip
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_shape_on_cuda_graphs(tmp_path):
    cfg = bs.ScaleConfig(
        shapes=["tiny"], routes={"tiny": bs.DEFAULT_ROUTES["tiny"].split(",")}, acceptance="mal:3",
        prompts=1, prompt_len=32, max_new_tokens=32, warmup_tokens=4, dtype="bf16",
    )  # fmt: skip
    table = bs.run_scale(cfg, torch.device("cuda"), tmp_path / "scale")
    assert len(table) == len(cfg.routes["tiny"]) == 7
    # a random drafter's spine may now and then be shorter than the drawn depth (counted, not an error:
    # one DDTree step of ~10 on an H100, 2026-12-05); trees that rarely hold MAL 3 fail
    assert (table["truncated"] * 4 <= table["steps"]).all()
    assert table["MAL"].iloc[1:].between(1.5, 5).all()
    manifest = json.loads((tmp_path / "scale" / "manifest.json").read_text())
    assert manifest["models"]["tiny"]["graphs_captured"] > 0
    tiny = manifest["models"]["tiny"]
    assert 0 <= tiny["held_gpu_gib"] < tiny["peak_gpu_gib"] < manifest["gpu_memory_gib"]
    assert tiny["left_gpu_gib"] < 0.01  # the shape's target, drafters, buffers and graphs went with it


@pytest.mark.parametrize("name", ["dflash_chain", "ddtree", "dflash_tfm", "fla_sd", "eagle_chain", "specla"])
def test_replayed_steps_run_on_the_device_path_as_on_the_host(name, monkeypatch):
    """The scale rows' replayed acceptance runs on the graphed engine's device path, pipelined (no host
    tree, one read a step: :func:`repro.decoding.device_acceptance.replayed_accept`; FLA-SD on chain slots,
    committed by replay) and gives the host walk's tokens, accepted lengths and truncation count (float32,
    the eager graphed target on the CPU)."""
    from repro.decoding import engine
    from repro.models.graphed import GraphedTarget

    cfg = bs.ScaleConfig(shapes=["tiny"], routes={"tiny": [name]}, acceptance="mal:4", dtype="fp32",
                         prompt_len=12, max_new_tokens=40)  # fmt: skip
    model = bs.build_target("tiny", cfg, torch.device("cpu"))
    target = GraphedTarget(model, graphs=False)
    (route,) = bs.build_routes("tiny", cfg, target, bs.parse_acceptance(cfg.acceptance))
    ids = bs.prompt_ids(model.config.vocab_size, cfg.prompt_len, 0, cfg.seed)
    assert engine.device_sampling(target, route) and engine.pipelined(target, route)  # one step ahead
    runs = []
    for on_device in (True, False):
        if not on_device:
            monkeypatch.setattr(engine, "device_sampling", lambda *a: False)
        route.rule.reset()
        res = engine.generate(target, ids, route, cfg.max_new_tokens)
        runs.append((res.output_ids, res.accepted_lengths, route.rule.steps, route.rule.truncated))
    assert runs[0] == runs[1]
    assert max(runs[0][1]) > 2 and runs[0][2] == len(runs[0][1])  # drafts accepted; every step counted


def test_replayed_accept_walks_the_first_children_to_the_drawn_depth():
    """On a padded slot view: the spine of lowest-index children, cut at the drawn depth or its end; the
    bonus is the argmax at the end node (against the host rule on the same tree and logits)."""
    from repro.decoding.device_acceptance import HostView, replayed_accept
    from repro.decoding.replayed import AcceptanceProcess

    tokens = [0, 5, 6, 7, 8, 9, 4]
    parents = [-1, 0, 0, 1, 1, 3, 2]  # spine 0 -> 1 -> 3 -> 5; 2 and 4 are later siblings
    view = HostView.of(tokens, parents, size=9)  # two padding nodes
    logits = torch.randn(9, 11, generator=torch.Generator().manual_seed(0))
    tree = Tree(tokens, parents)
    for want, node in [(0, 0), (1, 1), (2, 3), (3, 5), (7, 5)]:
        got, bonus = replayed_accept(view, logits, torch.tensor([want]))
        assert int(got) == node and int(bonus) == int(logits[node].argmax()), want
        rule = ReplayedAcceptance(process=AcceptanceProcess("fixed", (1.0,) * want + (0.0,), "test"))
        acc = rule.accept(tree, logits[:7], 0)
        assert acc.path[-1] == node and acc.bonus == int(bonus)


def test_the_breakdown_gives_the_stage_split_only_when_the_events_account_for_the_step():
    def table(commit_ms: float) -> pd.DataFrame:
        rows = [
            {"shape": "s", "kind": "ar", "route": "ar", "MAL": 1.0, "step_ms": 10.0, "paper_speedup": None,
             "speedup": 1.0, "draft_ms": 0.0, "tree_ms": 0.0, "verify_ms": 10.0, "commit_ms": 0.0},
            {"shape": "s", "kind": "dflash_tfm", "route": "dflash_tfm", "MAL": 8.0, "step_ms": 20.0,
             "paper_speedup": 4.0, "speedup": 4.0, "draft_ms": 5.0, "tree_ms": 0.5, "verify_ms": 12.0,
             "commit_ms": commit_ms},
        ]  # fmt: skip
        return pd.DataFrame(rows)

    (whole,) = bs.breakdown_lines(table(2.5))  # stages sum to the 20 ms step
    assert "needs a step of 20.0 ms" in whole and "takes 20.0 ms = draft 5.0 + tree 0.5" in whole
    (short,) = bs.breakdown_lines(table(0.1))  # 17.6 of 20 ms: beyond the 10% tolerance
    assert "device times sum to 17.6 ms" in short and "is not the step's split" in short
    assert "= draft" not in short
    assert "launched" not in whole  # records without launched steps: nothing said
    counted = table(2.5).assign(steps=[40, 14], launched=[40, 16])
    (ahead,) = bs.breakdown_lines(counted)  # 2 of 16 launched steps past the end: 20 x 14 / 16 = 17.5 ms
    assert "Of its 16 launched steps 2 ran past a generation's end" in ahead and "takes 17.5 ms." in ahead


def scale_record(route: str, **fields: Any) -> dict[str, Any]:
    """A bench-scale record of shape "s": 4 steps of 1 token in 20 ms (stages 2 + 0 + 4 + 2 ms)."""
    stages = {"draft": 0.002, "tree": 0.0, "verify": 0.004, "commit": 0.002}
    return {
        "shape": "s", "route": route, "kind": route, "status": "ok", "steps": 4, "decode_s": 0.02,
        "new_tokens": 5, "accepted_lengths": [1] * 4, "tree_sizes": [1] * 4, "truncated_steps": 0,
        "acceptance": None, "stage_s": stages, "device_stage_s": stages, "drafter": {}, **fields,
    }  # fmt: skip


def test_the_table_gives_graph_busy_ms_and_wall_over_busy_only_when_records_have_them():
    """And the host's read waits a step beside them (the graphed engine's records since 2026-12-05)."""
    record = scale_record("ar")
    old = bs.summary_table([record])
    assert not {"busy_ms", "wall_over_busy"} & set(old.columns)
    assert "graphs busy" not in bs.report_markdown(old, {})
    busy = {"draft": 0.001, "tree": 0.0, "verify": 0.003, "commit": 0.001}
    new = bs.summary_table([{**record, "busy_stage_s": busy}])
    got = new.iloc[0]
    assert got["busy_ms"] == pytest.approx(1.25) and got["wall_over_busy"] == pytest.approx(4.0)
    assert got["step_ms"] == pytest.approx(5.0) and got["verify_ms"] == pytest.approx(1.0)
    text = bs.report_markdown(new, {})
    (row,) = [line for line in text.splitlines() if line.startswith("| s | ar |")]
    assert "| commit | graphs busy | wall/busy | nodes |" in text and "| 0.50 | 1.25 | 4.00 | 1.0 |" in row
    waited = bs.summary_table([{**record, "busy_stage_s": busy, "host_wait_s": 0.006}])  # 1.5 ms a step
    assert waited.iloc[0]["wait_ms"] == pytest.approx(1.5)
    text = bs.report_markdown(waited, {})
    (row,) = [line for line in text.splitlines() if line.startswith("| s | ar |")]
    assert "| graphs busy | wall/busy | host wait | nodes |" in text and "| 4.00 | 1.500 | 1.0 |" in row
    assert "host wait: the host's ms per step waiting" in text
    assert "wait_ms" not in new and "host wait" not in bs.report_markdown(new, {})  # records without it
    no_busy = bs.summary_table([{**record, "host_wait_s": 0.0}])  # a CPU run: no graphs, no wait column
    assert "host wait" not in bs.report_markdown(no_busy, {})


def test_a_routes_speedup_has_its_paired_interval_over_the_prompts():
    """Six prompts, each its own speed for AR and the route (1.5x to 2.5x over AR): the interval is the
    paired percentile bootstrap of the pooled ratio (stats.paired_ratio), around the speedup; AR has none,
    and three prompts give none (below five)."""
    from repro.reporting.stats import paired_ratio

    ratios = [1.5, 2.5, 1.8, 2.2, 2.0, 1.6]
    ar_s = [0.02, 0.05, 0.03, 0.04, 0.02, 0.06]
    records = [scale_record("ar", prompt=i, decode_s=s) for i, s in enumerate(ar_s)]
    records += [
        scale_record("ddtree", prompt=i, decode_s=s / f) for i, (s, f) in enumerate(zip(ar_s, ratios))
    ]
    table = bs.summary_table(records).set_index("route")
    want = paired_ratio(([5] * 6, [s / f for s, f in zip(ar_s, ratios)], [5] * 6, ar_s))
    got = table.loc["ddtree"]
    assert got["speedup"] == pytest.approx(want.value) and (got["ci_low"], got["ci_high"]) == (
        want.low,
        want.high,
    )
    assert 1.5 < got["ci_low"] < got["speedup"] < got["ci_high"] < 2.5 and math.isnan(
        table.loc["ar", "ci_low"]
    )
    few = bs.summary_table([r for r in records if r["prompt"] < 3]).set_index("route")
    assert math.isnan(few.loc["ddtree", "ci_low"])
    assert "95% CI low" in bs.report_markdown(bs.summary_table(records), {})


def test_a_speedup_is_paired_when_a_route_lacks_some_of_ars_prompts():
    """A route missing a prompt AR decoded (failed or not yet run): its speedup is over the prompts both
    decoded (one implementation, stats.paired_ratio, point estimate and interval alike), not its pooled
    tok/s over AR's pooled over prompts it never ran; the report says how many prompts the speedup pairs."""
    from repro.reporting.stats import paired_ratio

    ar_s = [0.02, 0.05, 0.03, 0.04, 0.02, 0.2]  # prompt 5: a slow prompt only AR holds
    route_s = [0.01, 0.02, 0.015, 0.02, 0.01]
    records = [scale_record("ar", prompt=i, decode_s=s) for i, s in enumerate(ar_s)]
    records += [scale_record("ddtree", prompt=i, decode_s=s) for i, s in enumerate(route_s)]
    records.append(scale_record("ddtree", prompt=5, status="failed"))
    table = bs.summary_table(records).set_index("route")
    want = paired_ratio(([5] * 5, route_s, [5] * 5, ar_s[:5]))
    got = table.loc["ddtree"]
    assert got["speedup"] == pytest.approx(want.value) and (got["ci_low"], got["ci_high"]) == (
        want.low,
        want.high,
    )
    assert want.low <= got["speedup"] <= want.high
    text = bs.report_markdown(bs.summary_table(records), {})
    assert "- s ddtree: speedup over the 5 prompts both it and AR decoded (AR: 6, ddtree: 5;" in text
    full = [r for r in records if r["prompt"] < 5]  # every prompt paired: nothing to say
    assert "prompts both it and AR decoded" not in bs.report_markdown(bs.summary_table(full), {})


def test_the_report_states_the_minimum_n_of_an_interval_from_stats(monkeypatch):
    """The "no interval below N prompts" of the report is stats.MIN_UNITS (what paired_ratio applies)."""
    from repro.reporting import stats

    table = bs.summary_table([scale_record("ar", prompt=0), scale_record("ddtree", prompt=0)])
    assert f"no interval below {stats.MIN_UNITS} prompts" in bs.report_markdown(table, {})
    monkeypatch.setattr(stats, "MIN_UNITS", 7)
    assert "no interval below 7 prompts" in bs.report_markdown(table, {})


def test_the_report_gives_each_shapes_peak_gpu_memory_only_when_the_run_recorded_it():
    """A CUDA run records the GPU memory each shape peaked at (and the card's); its report says both. Runs
    that did not record it (CPU runs, runs from before) have no such line."""
    table = bs.summary_table([scale_record("ar", prompt=0), scale_record("ddtree", prompt=0)])
    models = {"qwen3.6-27b": {"peak_gpu_gib": 61.234, "held_gpu_gib": 0.0}, "gdn-1.3b": {"peak_gpu_gib": 5.0}}
    text = bs.report_markdown(table, {"models": models, "gpu_memory_gib": 79.18})
    want = "graphs): qwen3.6-27b 61.2 GiB, gdn-1.3b 5.0 GiB of the card's 79.2 GiB."
    assert f"Peak GPU memory allocated (target, drafters, buffers, {want}" in text
    models["gdn-1.3b"]["held_gpu_gib"] = 52.04
    text = bs.report_markdown(table, {"models": models, "gpu_memory_gib": 79.18})
    assert "61.2 GiB, gdn-1.3b 5.0 GiB (52.0 of it left allocated by the shapes before) of the" in text
    models["qwen3.6-27b"]["left_gpu_gib"] = 52.04  # what a shape left once its objects were gone
    text = bs.report_markdown(table, {"models": models, "gpu_memory_gib": 79.18})
    assert "qwen3.6-27b 61.2 GiB, 52.0 GiB left allocated after it, gdn-1.3b 5.0 GiB (52.0 of it" in text
    assert "Peak GPU memory" not in bs.report_markdown(table, {"models": {"s": {"setup_s": 1.0}}})


def test_the_report_lists_graph_captures_inside_the_timed_decode_only_when_there_were_any():
    record = scale_record("ddtree")
    clean = [{**record, "prompt": i, "graph_captures": 0} for i in range(3)]
    assert bs.capture_lines(clean) == [] and bs.capture_lines([record]) == []  # none, or old records
    hit = [*clean[:2], {**clean[2], "graph_captures": 5}]
    lines = bs.capture_lines(hit)
    assert "- s ddtree: 5 capture(s) in 1 of 3 prompt(s)" in lines
    text = bs.report_markdown(bs.summary_table(hit), {}, lines)
    assert "## Graphs captured inside the timed decode" in text
    assert "Graphs captured" not in bs.report_markdown(bs.summary_table(clean), {}, bs.capture_lines(clean))


def test_the_run_draws_its_figure_beside_the_report_and_links_it(tmp_path, monkeypatch, capsys):
    """records, manifest, report, table and figure: one PNG beside report.md, linked from it and listed in
    the manifest's outputs; a rebuild from the records draws the same bytes."""
    out, _, _ = tiny_scale_run(tmp_path, monkeypatch, capsys, "dflash_chain,ddtree", 2, 12)
    data = (out / FIGURE).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 150_000
    report = (out / "report.md").read_text()
    assert f"]({FIGURE})" in report and report.index("| shape |") < report.index(FIGURE)
    assert FIGURE in json.loads((out / "manifest.json").read_text())["outputs"]
    table = (out / "table.csv").read_bytes()
    (out / FIGURE).unlink()
    assert rebuild_report(out) == report
    assert (out / FIGURE).read_bytes() == data and (out / "table.csv").read_bytes() == table


def test_the_figure_marks_the_paper_speedup_and_survives_a_shape_without_ar(tmp_path):
    """Two shapes: one with a paper row (its needed step drawn), one without AR (no speedups: no bars, no
    reference line, still a figure); an empty table is refused in one line."""
    records = [
        {**scale_record("ar"), "prompt": 0},
        {**scale_record("dflash_tfm"), "prompt": 0, "accepted_lengths": [3] * 4, "new_tokens": 13},
        {**scale_record("ddtree"), "shape": "t", "prompt": 0},
    ]
    table = bs.summary_table(records)
    table.loc[table["route"] == "dflash_tfm", "paper_speedup"] = 2.0
    path = plot_scale(table, tmp_path / "fig.png", "title")
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size < 150_000
    text = bs.report_markdown(table, {}, figure="fig.png")
    assert "![speedup over AR and ms per step by stage](fig.png)" in text
    assert "](fig.png)" not in bs.report_markdown(table, {})
    with pytest.raises(ReproError, match="no scale rows"):
        plot_scale(table.iloc[0:0], tmp_path / "empty.png")


@pytest.mark.skipif(not GRAPHED_RUN.exists(), reason="the committed graphed-routes run is absent")
def test_a_records_run_without_a_replayed_kind_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(GRAPHED_RUN, run)
    restore_records(run)  # the committed run is archived (repro archive): its records.jsonl back
    lines = (run / "records.jsonl").read_text().splitlines()
    (run / "records.jsonl").write_text("".join(f"{x}\n" for x in lines if '"weaver-b32"' not in x))
    out = tmp_path / "x"
    args = ["--shape", "tiny", "--routes", "dflash_chain,dflash_tfm", "--acceptance", f"records:{run}"]
    code, _, err = run_cli(monkeypatch, capsys, "bench", "scale", *args, "--device", "cpu", "--out", str(out))
    assert code == 2 and "has no route of kind dflash_tfm" in err, err
    assert not (out / "records.jsonl").exists()  # refused before the first route ran


def test_a_run_measures_under_its_engine_switches_and_names_them(tmp_path, monkeypatch, capsys):
    """``--switch NAME=VALUE``: the shapes are measured with the switch set, restored after; the config
    keeps it and the report names it (a run without switches has none in its config)."""
    from repro.decoding import switches
    from repro.models import graphed

    seen = []
    measure = bs.measure_shape

    def spying(*args, **kwargs):
        seen.append(graphed.AR_GROUP)
        return measure(*args, **kwargs)

    monkeypatch.setattr(bs, "measure_shape", spying)
    before = switches.current()
    out = tmp_path / "scale"
    code, stdout, err = run_cli(
        monkeypatch, capsys, "bench", "scale", "--shape", "tiny", "--routes", "dflash_chain", "--acceptance",
        "mal:3", "--prompts", "1", "--prompt-len", "8", "--max-new-tokens", "4", "--warmup-tokens", "2",
        "--device", "cpu", "--dtype", "float32", "--switch", "ar_group=3", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    assert seen == [3] and switches.current() == before
    assert json.loads((out / "manifest.json").read_text())["config"]["switches"] == {"ar_group": 3}
    assert "engine switches set: ar_group=3." in (out / "report.md").read_text()
