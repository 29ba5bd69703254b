"""`repro bench kernels`: trees, flattened paths, the cost model, the CPU run's files, FAIL rows.

The CPU tests run the plumbing with the pure-torch methods (the others are recorded as skipped);
one test runs the fla and Triton builders through Triton's CPU interpreter at a toy shape when
those packages are there; the ``gpu`` tests run a tiny grid of the real methods on CUDA.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import typer
from conftest import leaves, random_tree, run_cli, tree_depths
from typer.testing import CliRunner

from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench import kernels_report as kr
from repro.bench.cli import bench_app
from repro.bench.shapes import (
    SHAPES,
    LayerShape,
    chain_tree,
    deepest_path,
    depths,
    draft_tree,
    flatten_paths,
    make_tree,
)
from repro.bench.timing import TimerConfig
from repro.errors import ReproError

ROOT = Path(__file__).resolve().parents[2]
TINY = LayerShape("tiny", h=1, hv=1, dk=2, dv=2)
FAST = TimerConfig(warmup_ms=0.0, rep_ms=1.0)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# ------------------------------------------------------------------------------------- trees


def test_flatten_paths_by_hand():
    assert flatten_paths([-1, 0, 0, 1, 1, 2]) == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    assert flatten_paths(chain_tree(4)) == [[0, 1, 2, 3]]
    assert flatten_paths([-1, -1, 0]) == [[1], [0, 2]]  # two root-level nodes; leaves in node order


@pytest.mark.parametrize("kind", ["random", "mixed", "forest", "fan", "chain"])
def test_flatten_paths_are_root_to_leaf_and_cover_every_leaf(kind):
    gen = torch.Generator().manual_seed(7)
    parents_t = random_tree(60, kind, gen)
    parents = parents_t.tolist()
    paths = flatten_paths(parents)
    depth = tree_depths(parents_t)
    assert [p[-1] for p in paths] == leaves(parents_t)  # one path per leaf, in leaf order
    for path in paths:
        assert parents[path[0]] == -1  # starts at the root level
        assert all(parents[b] == a for a, b in zip(path, path[1:]))  # follows parent pointers
        assert len(path) == depth[path[-1]]
    assert set().union(*map(set, paths)) == set(range(60))  # every node lies on some path
    assert flatten_paths(parents) == paths  # deterministic


@pytest.mark.parametrize("n", [1, 2, 16, 64, 256])
def test_draft_trees_sizes_depth_and_determinism(n):
    parents = draft_tree(n, seed=3)
    assert len(parents) == n
    assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)  # one root, topological
    assert max(depths(parents)) <= 16
    children = pd.Series([p for p in parents if p >= 0]).value_counts()
    assert children.empty or children.max() <= 4  # branching bound
    assert draft_tree(n, seed=3) == parents
    if n >= 16:
        assert draft_tree(n, seed=4) != parents
        assert len(flatten_paths(parents)) > 1 and max(depths(parents)) > 2  # a real tree, not a chain/fan
    assert max(depths(draft_tree(n, seed=1, max_depth=5))) <= 5


def test_make_tree_kinds_and_deepest_path():
    assert make_tree("chain", 5, seed=0) == [-1, 0, 1, 2, 3]
    assert make_tree("draft", 20, seed=2) == draft_tree(20, 2)
    with pytest.raises(ValueError, match="unknown tree kind"):
        make_tree("bush", 5, seed=0)
    parents = [-1, 0, 0, 1, 3, 2]
    assert deepest_path(parents, 3) == [0, 1, 3]
    with pytest.raises(ValueError, match="deep"):
        deepest_path(parents, 5)


def test_default_recovery_tree_reaches_depth_16():
    """Every default depth, 1 (replay's single step, its cheapest) included, is cut from one tree's path."""
    cfg = bk.BenchConfig()
    assert cfg.depths == [1, 2, 4, 8, 16]
    cases = []
    for depth in cfg.depths:
        spec = bk.RowSpec("specla", "recovery", "draft", cfg.recovery_nodes, "commit_snapshot", "fp32", depth)
        case = bk.make_case(spec, cfg, torch.device("cpu"))
        assert len(case.accepted) == depth and case.accepted == case.tree.path_to(case.accepted[-1])
        cases.append(case)
    assert all(c.parents == cases[0].parents for c in cases)
    assert all(c.accepted == cases[-1].accepted[: len(c.accepted)] for c in cases)


# -------------------------------------------------------------------------------- cost model


def tiny_case(parents: list[int], accepted: list[int] | None = None) -> km.Case:
    return km.Case(TINY, "draft", parents, torch.device("cpu"), accepted)


def test_costs_by_hand():
    """H=HV=1, dk=dv=2: q/k/v/g/beta of one token = 2*2*2 + 2*2 + 2*4 = 20 bytes in bf16; S = 16 bytes."""
    case = tiny_case([-1, 0, 0], accepted=[0, 1])  # paths [0, 1] and [0, 2]: L = 4 tokens, N = 2
    wy3 = 3 * 9 * 2 + 2 * 9 * 2 + 27 / 3 + 4 * 3 * 2 * 2  # 147
    wy2 = 3 * 4 * 2 + 2 * 4 * 2 + 8 / 3 + 4 * 2 * 2 * 2
    assert km.wy_flops(3, 2, 2) == pytest.approx(wy3)
    # reads 3 tokens (60) + mask 9 + S0 16; writes o 3*2*2 = 12, delta 3*2*4 = 24, G 3*4 = 12
    assert km.cost("tree_fused", "bf16", case) == (60 + 9 + 16 + 12 + 24 + 12, pytest.approx(wy3), "bf16")
    # fp32 q/k/v: 2*2*4 + 2*4 + 8 = 32 bytes a token, o 8 bytes a token
    assert km.cost("tree_fused", "fp32", case)[0] == 3 * 32 + 9 + 16 + 3 * 8 + 24 + 12
    # 4 tokens (80) + two S0 copies (32) + cu_seqlens 3*8 + o 4*4; 7 dk dv flops a token
    assert km.cost("per_branch_recurrent", "bf16", case) == (80 + 32 + 24 + 16, 4 * 28, "fp32")
    assert km.cost("prefill_flattened", "bf16", case) == (152, pytest.approx(2 * wy2), "bf16")
    # k, v, g, beta of 3 nodes (3*16) + S0 + parents 3*8 + 3 states written
    assert km.cost("per_token_states", "bf16", case) == (48 + 16 + 24 + 48, 3 * 5 * 4, "fp32")
    # path rows of delta, k, G (2 * (2 + 2 + 1) * 4) + S0 read + S written; rank-2 update + scaling
    assert km.cost("commit_closed_form", "fp32", case) == (40 + 32, (2 * 2 + 2) * 4, "fp32")
    assert km.cost("commit_path_fused", "fp32", case) == km.cost("commit_closed_form_fused", "fp32", case)
    # conv history of W-1 = 3 rows of C = 2*1*2 + 1*2 = 6 bf16 channels, read and written
    assert km.cost("commit_path_fused_conv", "fp32", case)[0] == 40 + 32 + 2 * 3 * 6 * 2
    # a step: the tree's verification + the path's rows + the committed state written
    tree_bytes, tree_flops, _ = km.cost("tree_fused", "bf16", case)
    assert km.cost("step_delayed_fused", "bf16", case) == (tree_bytes + 40 + 16, tree_flops + 24, "bf16")
    assert km.cost("commit_replay_fla", "bf16", case) == (40 + 32 + 8, 2 * 28, "fp32")
    assert km.cost("commit_replay_fla_conv", "bf16", case) == (40 + 32 + 8 + 2 * 3 * 6 * 2, 2 * 28, "fp32")
    assert km.cost("commit_snapshot", "fp32", case) == (32, 0.0, "fp32")
    chain = tiny_case(chain_tree(3))
    assert km.cost("chain_recurrent", "bf16", chain) == (60 + 16 + 12, 3 * 28, "fp32")
    assert km.cost("chain_chunk", "bf16", chain)[1] == pytest.approx(wy3)
    assert km.cost("chain_verify", "bf16", chain) == km.cost("chain_chunk", "bf16", chain)
    assert km.cost("chain_torch", "fp32", chain) == (3 * 32 + 16 + 3 * 8, pytest.approx(wy3), "fp32")
    assert km.cost("commit_path_fused_old", "fp32", case) == km.cost("commit_path_fused", "fp32", case)


def test_chunk_flops_split_into_chunks_with_state_handoffs():
    dk, dv = 4, 8
    expected = 2 * km.wy_flops(64, dk, dv) + km.wy_flops(2, dk, dv) + 2 * (2 * 64 * dk * dv)
    assert km.chunk_flops(130, dk, dv) == pytest.approx(expected)
    assert km.chunk_flops(64, dk, dv) == pytest.approx(km.wy_flops(64, dk, dv))


def test_floor_is_the_larger_of_bytes_and_flops(monkeypatch):
    """A skipped row still carries its floor: 1 GB/s moves 1000 bytes a microsecond."""
    monkeypatch.setitem(SHAPES, "tiny", TINY)
    ceilings = {"copy_GBps": 1.0, "bf16_TFLOPs": 1.0, "fp32_TFLOPs": 1e-6}  # fp32: 1 flop a microsecond
    spec = bk.RowSpec("tiny", "verify", "chain", 2, "per_branch_recurrent", "bf16")
    row = bk.measure(spec, bk.BenchConfig(timer=FAST), torch.device("cpu"), ceilings)
    assert row["status"] == "skipped" and row["reason"] == "needs CUDA"
    assert row["bytes_min"] == 40 + 16 + 16 + 8 and row["flops"] == 56  # one path of 2 tokens
    assert row["floor_us"] == pytest.approx(56.0) and row["floor_bound"] == "flops"
    spec = bk.RowSpec("tiny", "recovery", "draft", 4, "commit_snapshot", "fp32", 1)
    row = bk.measure(spec, bk.BenchConfig(timer=FAST), torch.device("cpu"), ceilings)
    assert row["floor_us"] == pytest.approx(32 / 1e3) and row["floor_bound"] == "bytes"


def test_paper_numbers_come_from_the_baselines_files():
    paper = bk.paper_numbers()
    row = bk.lookup_paper(paper, ("weaver", "verify", "draft", "tree_fused", "bf16", 128))
    assert row["paper_us"] == 57.3 and row["paper_speedup"] == "7.1" and "Table 1" in row["paper_ref"]
    assert bk.lookup_paper(paper, ("weaver", "verify", "draft", "per_branch_recurrent", "bf16", 16)) == {
        "paper_us": 55.2,
        "paper_ref": row["paper_ref"],
        "prior_us": 140,
    }
    rec = bk.lookup_paper(paper, ("specla", "recovery", "draft", "commit_closed_form_fused", "fp32", 8))
    assert rec["paper_speedup"] == "2.74-4.28"
    assert bk.lookup_paper(paper, ("specla", "chain", "chain", "chain_chunk", "bf16", 128)) == {
        "prior_us": 501
    }
    assert bk.lookup_paper(paper, ("weaver", "chain", "chain", "per_branch_recurrent", "bf16", 16)) == {
        "prior_us": 109
    }
    assert bk.paper_numbers(ROOT / "no-such-folder") == {}


# ----------------------------------------------------------------------------------- the run


def cli_app() -> typer.Typer:
    """The main app's wiring: `repro bench kernels`."""
    app = typer.Typer()
    app.add_typer(bench_app, name="bench")
    return app


def read_rows(out: Path) -> list[dict]:
    return [json.loads(s) for s in (out / "records.jsonl").read_text().splitlines()]


def test_cpu_quick_run_writes_records_manifest_report_table_figures(tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "kernels", "--quick", "--out", str(out), "--shapes", "specla", "--sizes", "4",
            "--depths", "2", "--warmup-ms", "0", "--rep-ms", "1"]  # fmt: skip
    res = CliRunner().invoke(cli_app(), args)
    assert res.exit_code == 0, res.output
    rows = read_rows(out)
    expected = [(m, d, "draft") for m, d in bk.VERIFY_ROWS] + [(m, d, "chain") for m, d in bk.CHAIN_ROWS]
    expected += [(m, d, "draft") for m, d in bk.RECOVERY_ROWS]
    expected += [(m, d, "draft") for m, d in bk.STEP_ROWS]
    assert sorted((r["method"], r["dtype"], r["kind"]) for r in rows) == sorted(expected)
    assert all(set(r) == set(kr.COLUMNS + kr.COUNTS + kr.PARTS) for r in rows)
    for r in rows:
        torch_only = km.METHODS[r["method"]].needs == "torch"
        assert r["status"] == ("ok" if torch_only else "skipped"), r
        if torch_only:
            assert r["rel_err"] <= r["tol"] and r["us"] > 0 and r["us_graph"] is None
            assert r["n_timed"] >= 3 and r["graph_replays"] is None  # the CPU loop times >= 3 calls
            assert r["x_floor"] == pytest.approx(r["us"] / r["floor_us"]) and r["x_floor_graph"] is None
        else:
            assert r["reason"] == "needs CUDA" and r["us"] is None
        assert r["floor_us"] > 0 and r["bytes_min"] > 0 and r["timer"] == "perf_counter"
    rec = [r for r in rows if r["group"] == "recovery"]
    assert {r["depth"] for r in rec} == {2} and {r["T"] for r in rec} == {16}
    step = {r["method"]: r for r in rows if r["group"] == "step"}
    assert {(r["depth"], r["T"], r["baseline"]) for r in step.values()} == {(2, 16, "step_replay_fla")}
    assert step["step_torch"]["status"] == "ok"  # the reference step, checked against float64
    chain = {r["method"]: r for r in rows if r["group"] == "chain"}
    assert {(r["kind"], r["T"], r["depth"], r["baseline"]) for r in chain.values()} == {
        ("chain", 4, 4, "per_branch_recurrent")
    }
    assert chain["chain_torch"]["status"] == "ok" and chain["chain_verify"]["reason"] == "needs CUDA"
    assert chain["chain_verify"]["floor_us"] == pytest.approx(chain["chain_chunk"]["floor_us"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["quick"] is True and manifest["config"]["sizes"] == {"specla": [4]}
    assert {"copy_GBps", "bf16_TFLOPs", "fp32_TFLOPs"} <= set(manifest["ceilings"])
    assert manifest["bench_device"] == "cpu" and "git_sha" in manifest
    table = pd.read_csv(out / "table.csv")
    assert len(table) == len(rows) and list(table.columns) == kr.COLUMNS + kr.COUNTS + kr.PARTS
    report = (out / "report.md").read_text()
    assert "n: each us is the median of " in report and "timed calls." in report  # a line under each table
    assert "## specla (H=8, HV=8, dk=256, dv=256): Verification" in report and "| tree_torch" in report
    assert "skipped (needs CUDA)" in report and "](figures/recovery.png)" in report
    assert "x_floor_graph = us_graph / floor_us" in report and "us / floor_us (the do_bench time" in report
    assert "## specla (H=8, HV=8, dk=256, dv=256): Chain verification" in report and "| chain_torch" in report
    assert (out / "figures" / "kernel_tree_vs_branch.png").stat().st_size > 0
    assert (out / "figures" / "recovery.png").stat().st_size > 0
    assert (out / "figures" / "chain.png").stat().st_size > 0 and "](figures/chain.png)" in report
    again = CliRunner().invoke(cli_app(), args)  # never appends to an earlier run
    assert again.exit_code != 0 and isinstance(again.exception, ReproError)


def quick_cfg(**kw) -> bk.BenchConfig:
    base = dict(shapes=["specla"], sizes={"specla": [4]}, kinds=["draft"], depths=[], quick=True, timer=FAST)
    return bk.BenchConfig(**{**base, **kw})


@pytest.mark.parametrize("wrong", ["scaled", "nan"])
def test_a_wrong_output_is_marked_fail_and_not_timed(tmp_path, monkeypatch, wrong):
    real = km.METHODS["tree_torch"]

    def broken(case, x):
        fn = real.build(case, x)
        return (lambda: fn() * 1.01) if wrong == "scaled" else (lambda: fn() * math.nan)

    monkeypatch.setitem(km.METHODS, "tree_torch", km.Method(broken, "nodes", "torch"))
    table = bk.run_bench(quick_cfg(), tmp_path / "run")
    row = table[table["method"] == "tree_torch"].iloc[0]
    assert row["status"] == "FAIL" and pd.isna(row["us"]) and "not timed" in row["reason"]
    assert not row["rel_err"] <= row["tol"]
    assert "- FAIL: specla draft T=4 tree_torch (fp32)" in (tmp_path / "run" / "report.md").read_text()


def test_a_failed_row_makes_the_command_exit_3(tmp_path, monkeypatch, capsys):
    """The rows are written, and the command says the run did not measure what it was asked to."""
    from conftest import run_cli

    real = km.METHODS["tree_torch"]
    args = ("bench", "kernels", "--quick", "--shapes", "specla", "--sizes", "4", "--groups", "verify")
    code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "ok"))
    assert code == 0, err
    wrong = km.Method(lambda case, x: (lambda fn: lambda: fn() * 1.01)(real.build(case, x)), "nodes", "torch")
    monkeypatch.setitem(km.METHODS, "tree_torch", wrong)
    code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "bad"))
    assert code == 3 and "1 row(s) failed their check or raised: specla tree_torch T=4 FAIL" in err
    assert (tmp_path / "bad" / "records.jsonl").read_text().count('"FAIL"') == 1


def test_speedup_is_against_the_blocks_baseline(tmp_path, monkeypatch):
    """Stand in a torch per-branch baseline so that both rows of a block are timed on the CPU."""

    def per_branch(case, x):
        fn = km.build_tree_torch(case, x.to(torch.float32))
        return lambda: fn()[case.flat_index]

    monkeypatch.setitem(km.METHODS, "per_branch_recurrent", km.Method(per_branch, "flat", "torch"))
    table = bk.run_bench(quick_cfg(sizes={"specla": [4, 8]}), tmp_path / "run")
    for t in (4, 8):
        block = table[(table["T"] == t) & (table["status"] == "ok")].set_index("method")
        base = block.loc["per_branch_recurrent"]
        assert base["speedup"] == pytest.approx(1.0) and base["baseline"] == "per_branch_recurrent"
        assert block.loc["tree_torch", "speedup"] == pytest.approx(base["us"] / block.loc["tree_torch", "us"])


def test_a_recovery_row_that_commits_the_conv_history_is_compared_with_replay_plus_the_conv_commit():
    """A *_conv commit does the conv-history commit too: its speedup is against replay + that commit, the
    state-only rows' against replay alone (like against like)."""
    rows: list[dict] = []
    for method, us_graph in (("commit_replay_fla", 4.0), ("commit_replay_fla_conv", 6.0),
                             ("commit_path_indexed", 2.0), ("commit_path_indexed_conv", 3.0)):  # fmt: skip
        row = {c: None for c in kr.COLUMNS}
        row.update(shape="specla", group="recovery", kind="draft", T=16, depth=1, method=method, dtype="fp32",
                   status="ok", reason="", us=10.0, us_graph=us_graph, floor_us=1.0)  # fmt: skip
        rows.append(row)
        bk.derive(row, rows, {})
    assert [(r["baseline"], r["speedup_graph"]) for r in rows] == [
        ("commit_replay_fla", 1.0), ("commit_replay_fla_conv", 1.0),
        ("commit_replay_fla", 2.0), ("commit_replay_fla_conv", 2.0),
    ]  # fmt: skip


def test_depth_1_recovery_and_step_rows_run(tmp_path):
    """Accepted depth 1 (in the default depths): one node committed, by the torch rows on the CPU."""
    cfg = quick_cfg(depths=[1], recovery_nodes=16, groups=["recovery", "step"])
    table = bk.run_bench(cfg, tmp_path / "run")
    assert set(table["group"]) == {"recovery", "step"} and set(table["depth"]) == {1}
    torch_rows = table[table["method"].map(lambda m: km.METHODS[m].needs == "torch")]
    assert {"commit_closed_form", "commit_snapshot", "step_torch"} <= set(torch_rows["method"])
    assert set(torch_rows["status"]) == {"ok"}, torch_rows[["method", "reason"]].to_string()
    assert (torch_rows["rel_err"] <= torch_rows["tol"]).all() and (table["floor_us"] > 0).all()


def test_the_report_shows_the_graph_floor_ratio_and_a_dash_without_a_graph(tmp_path):
    """x_floor_graph (us_graph / floor_us: the graph time the notes quote) beside x_floor (us / floor_us,
    do_bench per call); a row without a graph time shows "-"."""
    rows: list[dict] = []
    for method, us_graph in (("commit_replay_fla", 8.0), ("commit_closed_form", None)):
        row = {c: None for c in kr.COLUMNS}
        row.update(shape="specla", group="recovery", kind="draft", T=16, depth=1, method=method, dtype="fp32",
                   status="ok", reason="", us=100.0, us_graph=us_graph, floor_us=2.0)  # fmt: skip
        rows.append(row)
        bk.derive(row, rows, {})
    assert rows[0]["x_floor"] == 50.0 and rows[0]["x_floor_graph"] == 4.0 and rows[1]["x_floor_graph"] is None
    text = kr.report_markdown(pd.DataFrame(rows, columns=kr.COLUMNS), {}, tmp_path, {})
    section = text[text.index("## specla") :]  # the group's table (after the targets section)
    table = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header.index("x_floor_graph") == header.index("floor_us") + 1
    assert header.index("x_floor") == header.index("x_floor_graph") + 1
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table[1:]]
    at = header.index("x_floor_graph")
    assert [(r[at], r[at + 1]) for r in cells] == [("4.0", "50.0"), ("-", "50.0")]


def test_an_exception_in_one_method_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    def boom(case, x):
        raise RuntimeError("kernel exploded\nsecond line")

    monkeypatch.setitem(km.METHODS, "tree_torch", km.Method(boom, "nodes", "torch"))
    table = bk.run_bench(quick_cfg(depths=[2], recovery_nodes=16), tmp_path / "run")
    row = table[table["method"] == "tree_torch"].iloc[0]
    assert row["status"] == "error" and row["reason"] == "RuntimeError: kernel exploded"
    assert set(table[table["method"] == "commit_closed_form"]["status"]) == {"ok"}


def test_groups_and_methods_select_rows_and_keep_each_blocks_baseline(tmp_path):
    """--groups / --methods: only the chosen rows, each block with its baseline; unknown names: exit 2."""
    full = bk.plan(quick_cfg(depths=[2], kinds=["draft", "chain"]))
    chosen = bk.plan(quick_cfg(depths=[2], kinds=["draft", "chain"], groups=["verify", "recovery"],
                               methods=["tree_split", "commit_path_fused"]))  # fmt: skip
    assert {r.group for r in full} == {"verify", "recovery", "step", "chain"}
    assert {(r.group, r.method) for r in chosen} == {
        ("verify", "per_branch_recurrent"), ("verify", "tree_split"),
        ("recovery", "commit_replay_fla"), ("recovery", "commit_path_fused"),
    }  # fmt: skip
    assert [r for r in full if r in chosen] == chosen  # the plan's order kept
    conv = bk.plan(quick_cfg(depths=[2], groups=["recovery"], methods=["commit_path_indexed_conv"]))
    assert [r.method for r in conv] == [
        "commit_replay_fla",
        "commit_replay_fla_conv",
        "commit_path_indexed_conv",
    ]
    out = tmp_path / "sel"
    args = ["bench", "kernels", "--quick", "--out", str(out), "--shapes", "specla", "--sizes", "4",
            "--depths", "2", "--groups", "verify", "--methods", "tree_torch", "--rep-ms", "1"]  # fmt: skip
    res = CliRunner().invoke(cli_app(), args)
    assert res.exit_code == 0, res.output
    assert sorted({r["method"] for r in read_rows(out)}) == ["per_branch_recurrent", "tree_torch"]
    bad_cases = ((["--groups", "verfy"], "unknown row group"), (["--methods", "magic"], "unknown method"))
    for bad, needle in bad_cases:
        res = CliRunner().invoke(cli_app(), [*args[:2], "--quick", "--out", str(tmp_path / "x"), *bad])
        assert res.exit_code != 0 and needle in str(res.exception), res.output


def test_a_spent_time_budget_skips_the_remaining_rows_but_still_reports(tmp_path):
    table = bk.run_bench(quick_cfg(budget_s=0.0), tmp_path / "run")
    assert set(table["status"]) == {"skipped"}
    assert set(table["reason"]) == {
        f"time budget of 0 s spent (the {s} {g} rows' share)" for s, g in zip(table["shape"], table["group"])
    }
    assert (tmp_path / "run" / "report.md").exists() and (tmp_path / "run" / "table.csv").exists()


INTERPRETER_CHECK = """
import torch, warnings
warnings.filterwarnings("ignore")
import repro.triton_interpreter  # noqa: F401 - repro's patches to the interpreter (TRITON_INTERPRET=1)
from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.shapes import LayerShape, draft_tree
sh = LayerShape("toy", 2, 4, 16, 16)
cpu = torch.device("cpu")
tree = km.Case(sh, "draft", draft_tree(12, 5), cpu, accepted=[0, 1, 2])
chain = km.Case(sh, "chain", list(range(-1, 7)), cpu)
rows = [(tree, "per_branch_recurrent", "bf16"), (tree, "tree_fused", "bf16"), (tree, "tree_fused", "fp32"),
        (tree, "per_token_states", "bf16"), (tree, "commit_replay_fla", "bf16"),
        (tree, "commit_closed_form_fused", "fp32"), (tree, "commit_path_fused", "fp32"),
        (tree, "commit_closed_form_fused_conv", "fp32"), (tree, "commit_path_fused_conv", "fp32"),
        (tree, "step_replay_fla", "bf16"), (tree, "step_closed_form_fused", "bf16"),
        (tree, "step_path_fused", "bf16"), (tree, "step_delayed_fused", "bf16"), (tree, "step_torch", "fp32"),
        (tree, "tree_split", "bf16"), (tree, "tree_split", "fp32"), (tree, "step_delayed_split", "bf16"),
        (tree, "tree_split_peel", "bf16"), (tree, "tree_split_peel", "fp32"),
        (chain, "tree_split_peel", "fp32"),
        (tree, "commit_path_fused_old", "fp32"), (tree, "commit_path_indexed", "fp32"),
        (tree, "commit_path_indexed_conv", "fp32"), (tree, "commit_path_indexed_rank1_conv", "fp32"),
        (tree, "step_delayed_fused_indexed", "bf16"), (tree, "step_delayed_split_indexed", "bf16"),
        (chain, "chain_recurrent", "bf16"),
        (chain, "tree_split", "bf16"), (chain, "chain_verify", "bf16"), (chain, "chain_torch", "fp32"),
        (tree, "tree_blocked", "bf16"), (tree, "tree_blocked", "fp32"), (chain, "tree_blocked", "bf16")]
for case, name, dtype in rows:
    x64 = km.make_inputs(sh, case.n, 1, cpu)
    m = km.METHODS[name]
    err = km.rel_err(m.build(case, x64.to(dtype))(), km.reference(m.output, case, x64))
    assert err <= km.TOLERANCE[dtype], (name, dtype, err)
    print(name, dtype, err)
"""


@pytest.mark.slow
def test_fla_and_triton_builders_in_the_triton_interpreter():
    """The real call signatures (fla's fused_recurrent, repro's Triton tree kernels) on a toy shape.

    fla's chunk kernels need a GPU driver even here (autotuning), so prefill/chain_chunk are GPU-only.
    """
    for module in ("triton", "fla.ops.gated_delta_rule", "repro.gdn.triton_tree"):
        pytest.importorskip(module)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", INTERPRETER_CHECK], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]


# ---------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@cuda
def test_gpu_tiny_grid_of_the_real_methods(tmp_path, monkeypatch):
    """The verify and recovery rows at one shape and size: fla's recurrent kernel, the Triton tree
    kernels, the torch paths. fla's chunk kernels (prefill_flattened, the chain rows) autotune dozens of
    configs per kernel on a fresh machine (minutes; tests/models/test_chain_gpu.py covers the chunk forward),
    so they and the second shape run with REPRO_GPU_FULL=1 only (and in `repro bench kernels`)."""
    full = os.environ.get("REPRO_GPU_FULL") == "1"
    if not full:
        monkeypatch.setattr(bk, "VERIFY_ROWS", [r for r in bk.VERIFY_ROWS if r[0] != "prefill_flattened"])
    cfg = bk.BenchConfig(
        shapes=["specla", "weaver"] if full else ["weaver"],
        sizes={"specla": [16], "weaver": [16]},
        chain_sizes={"specla": [16], "weaver": [16]},
        kinds=["draft", "chain"] if full else ["draft"],
        depths=[2],
        recovery_nodes=16,
        step_nodes=16,
        step_depths=[2],
        timer=TimerConfig(warmup_ms=1.0, rep_ms=5.0),
    )
    table = bk.run_bench(cfg, tmp_path / "run")
    bad = table[table["status"].isin(["FAIL", "error"])]
    assert bad.empty, bad[["shape", "kind", "method", "dtype", "status", "reason"]].to_string()
    fla = table[table["method"].map(lambda m: km.METHODS[m].needs == "fla")]
    assert set(fla["status"]) == {"ok"}, fla[["method", "reason"]].to_string()
    ok = table[table["status"] == "ok"]
    assert (ok["us"] > 0).all() and (ok["rel_err"] <= ok["tol"]).all()
    graphed = ok[ok["method"].map(lambda m: km.METHODS[m].graphable)]
    assert graphed["us_graph"].notna().all(), graphed[["method", "reason"]].to_string()
    phased = ok["method"].map(lambda m: km.METHODS[m].phase1 is not None)
    assert set(ok.loc[phased, "method"]) == {"tree_split", "tree_split_peel"}
    first = ok.loc[phased, ["phase1_us_graph", "us_graph"]].astype(float)
    assert ((first["phase1_us_graph"] > 0) & (first["phase1_us_graph"] < first["us_graph"])).all(), first
    assert ok.loc[~phased, "phase1_us_graph"].isna().all()  # one-launch forms have no phase
    assert table[table["method"] == "tree_torch"]["status"].eq("ok").all()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (
        manifest["bench_device"] == torch.cuda.get_device_name() and manifest["ceilings"]["copy_GBps"] > 100
    )


@pytest.mark.gpu
@cuda
def test_gpu_graph_timing_and_ceilings():
    from repro.bench.timing import graph_us, measure_ceilings, median_us

    dev = torch.device("cuda")
    x = torch.randn(1 << 20, device=dev)
    cfg = TimerConfig(warmup_ms=1.0, rep_ms=5.0)
    us = median_us(lambda: x.mul(2.0), dev, cfg)
    assert 0 < us < 1e4
    assert 0 < graph_us([lambda: x.mul(2.0), lambda: x.add(1.0)], dev, cfg, us) < 1e4
    ceil = measure_ceilings(dev, cfg, quick=True)
    assert ceil["copy_GBps"] > 0 and ceil["bf16_TFLOPs"] > 0 and ceil["fp32_TFLOPs"] > 0


@pytest.mark.parametrize("method", ["commit_path_fused", "commit_closed_form_fused", "commit_path_indexed"])
def test_commit_rows_hand_their_kernel_contiguous_factors(monkeypatch, method):
    """The reference returns delta as a view; a commit handed it copies it inside every timed call (the
    recovery and step rows timed that copy until 2026-12-02). Spies stand in for the Triton commits."""
    tc = pytest.importorskip("repro.gdn.triton_commit")
    seen: list[bool] = []

    def spy(state, delta, k, gate_cum, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(all(t.is_contiguous() for t in (delta, k, gate_cum)))

    for name in ("commit_path_fused", "commit_closed_form_fused", "commit_path_indexed"):
        monkeypatch.setattr(tc, name, spy)
    monkeypatch.setattr(tc, "write_path_index", lambda *a: None)
    dev = torch.device("cpu")
    spec = bk.RowSpec("specla", "recovery", "draft", 16, method, "fp32", 4)
    case = bk.make_case(spec, quick_cfg(depths=[4], recovery_nodes=16), dev)
    x = km.make_inputs(case.shape, case.n, 0, dev).to("fp32")
    km.METHODS[method].build(case, x)()
    assert seen == [True]


def test_the_time_budget_is_shared_by_the_group_and_shape_blocks_in_plan_order():
    """Each (group, shape) block's rows start until its share of the budget (and what earlier blocks left)
    is spent: a slow first group or shape cannot take the whole budget from the later ones (2026-12-04's
    side-by-side run spent the verify group's share on the Weaver shape, leaving SpecLA's unmeasured)."""
    blocks = [("verify", "weaver"), ("verify", "specla"), ("chain", "weaver"), ("chain", "specla")]
    assert [bk.block_deadline(400.0, blocks, b) for b in blocks] == [100.0, 200.0, 300.0, 400.0]
    assert bk.block_deadline(300.0, [("chain", "weaver")], ("chain", "weaver")) == 300.0
    two = dict(shapes=["weaver", "specla"], sizes={"weaver": [4], "specla": [4]}, kinds=["draft", "chain"])
    specs = bk.plan(quick_cfg(**two, groups=["verify", "chain"]))
    assert list(dict.fromkeys((s.group, s.shape) for s in specs)) == blocks


def test_a_foreign_figures_folder_is_refused_before_anything_is_measured(monkeypatch, capsys, tmp_path):
    """--figures naming a folder of files the run did not write is bad input: refused in one line with
    nothing written to --out (not after measuring, leaving a run that cannot be rerun)."""
    figures, out = tmp_path / "figs", tmp_path / "bench"
    figures.mkdir()
    (figures / "mine.png").write_bytes(b"x")
    args = ["bench", "kernels", "--quick", "--out", str(out), "--figures", str(figures), "--shapes", "specla",
            "--sizes", "4", "--groups", "verify", "--warmup-ms", "0", "--rep-ms", "1"]  # fmt: skip
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and len(err.splitlines()) == 1 and "holds files this run did not write" in err, err
    assert not out.exists() and [p.name for p in figures.iterdir()] == ["mine.png"]


def test_counts_line_says_what_each_median_is_a_median_of():
    """The line under a bench table: the span of timed calls behind us, the replays and calls behind
    us_graph; rows of older runs (no counts, or NaN in a table) give no line."""
    from repro.bench.timing import counts_line

    rows = [
        {"n_timed": 120, "graph_replays": 5, "graph_calls": 12},
        {"n_timed": 4000, "graph_replays": 5, "graph_calls": 2000},
        {"n_timed": None, "graph_replays": float("nan"), "graph_calls": None},  # a row not timed
    ]
    assert counts_line(rows) == (
        "n: each us is the median of 120-4000 timed calls; "
        "each us_graph of 5 graph replays of 12-2000 calls each."
    )
    assert counts_line([{"n_timed": 7}]) == "n: each us is the median of 7 timed calls."
    assert counts_line([{"us": 1.0}]) is None and counts_line([{"n_timed": float("nan")}]) is None
