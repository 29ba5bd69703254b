"""Issues 13's and 10's kernel targets judged from a bench-kernels table (repro.bench.kernel_targets): met,
missed by how much with the row's floor and its phases, ties of chains, commits and delayed-commit steps per
depth, and nothing judged without graph times."""

from __future__ import annotations

import math

import pandas as pd

from repro.bench import kernels_report as kr
from repro.bench.kernel_targets import TIE, target_lines


def row(shape: str, group: str, t: int, method: str, us_graph: float | None, **extra) -> dict:  # noqa: ANN003
    r = {c: None for c in kr.COLUMNS}
    r.update(shape=shape, group=group, kind=extra.pop("kind", "draft"), T=t, depth=extra.pop("depth", 7),
             method=method, dtype=extra.pop("dtype", "bf16"), status=extra.pop("status", "ok"), reason="",
             us=100.0, us_graph=us_graph, floor_us=extra.pop("floor_us", 2.0), **extra)  # fmt: skip
    return r


def verdicts(rows: list[dict]) -> dict[str, tuple[str, str]]:
    """target -> (measured, verdict) from the section's table."""
    lines = target_lines(pd.DataFrame(rows, columns=kr.COLUMNS + kr.PARTS))
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")][1:]
    return {c[0]: (c[1], c[2]) for c in cells}


def test_tree_targets_take_the_fastest_bf16_triton_kernel_and_say_how_far_and_the_floor():
    rows = [
        row("weaver", "verify", 128, "per_branch_recurrent", 110.0),
        row("weaver", "verify", 128, "tree_fused", 20.0),
        row("weaver", "verify", 128, "tree_split", 14.0),
        row("weaver", "verify", 128, "tree_torch", 1.0),  # not a Triton tree kernel
        row("weaver", "verify", 128, "tree_fused", 2.0, dtype="fp32"),  # not bf16
        row("weaver", "verify", 128, "tree_split_peel", 1.0, status="FAIL"),  # not timed
        row("weaver", "verify", 128, "tree_fused", 1.0, kind="chain", depth=128),  # a chain, not the tree
        row("specla", "verify", 128, "per_branch_recurrent", 50.0),
        row("specla", "verify", 128, "tree_split", 20.0, floor_us=1.25),
    ]
    v = verdicts(rows)
    assert v["tree verify, weaver, T = 128: <= 15 us"] == ("14.0 us (tree_split)", "met")
    assert v["tree verify, weaver, T = 128: >= 7.1x over per-branch"] == ("7.86x (14.0 vs 110.0 us)", "met")
    assert v["tree verify, weaver, T = 256: <= 30 us"] == ("not measured", "open")
    assert v["tree verify, specla, T = 128: <= 15 us"] == (
        "20.0 us (tree_split)",
        "missed by 1.33x; floor 1.25 us, 16x above it",
    )
    assert v["tree verify, specla, T = 128: >= 3x over per-branch"] == (
        "2.50x (20.0 vs 50.0 us)",
        "missed: 0.83 of it",
    )


def test_a_missed_time_on_a_two_launch_form_says_where_it_goes():
    rows = [
        row("specla", "verify", 128, "per_branch_recurrent", 50.0),
        row("specla", "verify", 128, "tree_split", 20.0, floor_us=1.25, phase1_us_graph=12.5),
        row("weaver", "verify", 128, "tree_fused", 30.0, floor_us=3.0, phase1_us_graph=None),  # one launch
    ]
    v = verdicts(rows)
    assert v["tree verify, specla, T = 128: <= 15 us"][1] == (
        "missed by 1.33x; floor 1.25 us, 16x above it; phase 1 (key work) 12.5 us, "
        "phase 2 and the launch between 7.5 us"
    )
    assert v["tree verify, weaver, T = 128: <= 15 us"][1] == "missed by 2.00x; floor 3.00 us, 10x above it"


def test_the_delayed_commit_step_must_beat_the_separate_commit_and_replay_at_every_depth():
    def step(depth: int, method: str, us: float) -> dict:
        return row("specla", "step", 64, method, us, depth=depth)

    rows = [
        step(2, "step_replay_fla", 18.6),
        step(2, "step_closed_form_fused", 24.6),
        step(2, "step_path_fused", 21.9),
        step(2, "step_delayed_fused", 16.0),
        step(2, "step_delayed_split_indexed", 15.1),
        step(4, "step_replay_fla", 20.6),
        step(4, "step_path_fused", 22.2),
        step(4, "step_delayed_split_indexed", 15.4),
        step(8, "step_torch", 1.0),  # the reference: neither side
    ]
    key = (
        "delayed commit (issue 10), specla, T = 64: the step faster than a separate closed-form commit and "
        "than token replay, at every accepted depth"
    )
    measured, verdict = verdicts(rows)[key]
    assert measured == (
        "depth 2: 15.1 vs 21.9 / 18.6 us, 4: 15.4 vs 22.2 / 20.6 us (delayed vs separate / replay)"
    )
    assert verdict == "met"
    rows.append(step(8, "step_replay_fla", 9.0))
    rows.append(step(8, "step_path_fused", 12.0))
    rows.append(step(8, "step_delayed_fused", 10.0))  # beats the separate commit, not replay
    assert verdicts(rows)[key][1] == "missed at depth 8"
    alone = [step(2, "step_replay_fla", 18.6), step(2, "step_path_fused", 21.9)]  # no delayed step timed
    alone.append(row("weaver", "verify", 128, "tree_split", 14.0))  # a judged target: the section prints
    assert verdicts(alone)[key] == ("not measured", "open")


def test_chains_count_a_tie_within_TIE_and_name_the_lengths_where_they_lose():
    def chain(t: int, method: str, us: float) -> dict:
        return row("weaver", "chain", t, method, us)

    rows = [
        chain(16, "per_branch_recurrent", 22.9),
        chain(16, "chain_verify", 8.1),
        chain(16, "chain_chunk", 25.0),
    ]
    rows += [chain(128, "chain_verify", 40.5 * (1 + TIE / 2)), chain(128, "chain_chunk", 40.5)]
    v = verdicts(rows)
    key = "chains, weaver: chain_verify <= fla's chunk kernel at every length"
    assert v[key][1] == "met" and v[key][0].startswith("16: 8.1 / 25.0, 128: ")
    assert v["chains, weaver: chain_verify <= per-branch recurrent at length 16"] == ("8.1 vs 22.9 us", "met")
    assert v["chains, specla: chain_verify <= per-branch recurrent at length 16"] == ("not measured", "open")
    rows.append(chain(64, "chain_verify", 30.0))
    rows.append(chain(64, "chain_chunk", 25.0))
    assert verdicts(rows)[key][1] == "missed at T = 64 (1.20x)"


def test_commit_is_judged_at_every_depth_on_the_best_closed_form_against_its_own_replay():
    def commit(depth: int, method: str, speedup: float, baseline: str) -> dict:
        return row(
            "specla", "recovery", 128, method, 5.0, depth=depth, speedup_graph=speedup, baseline=baseline
        )

    rows = [
        commit(1, "commit_replay_fla_conv", 1.0, "commit_replay_fla_conv"),
        commit(1, "commit_path_indexed_conv", 0.9, "commit_replay_fla_conv"),
        commit(1, "commit_closed_form_fused", 0.5, "commit_replay_fla"),
        commit(4, "commit_path_indexed_conv", 2.5, "commit_replay_fla_conv"),
    ]
    v = verdicts(rows)
    measured, verdict = v[
        "closed-form commit faster than token replay at every accepted depth, specla, T = 128"
    ]
    assert measured == "0.90 / 2.50x at depth 1 / 4 (commit_path_indexed_conv vs commit_replay_fla_conv)"
    assert verdict == "missed at depth 1"
    rows[1]["speedup_graph"] = 1.6
    assert (
        verdicts(rows)[
            "closed-form commit faster than token replay at every accepted depth, specla, T = 128"
        ][1]
        == "met"
    )
    assert v["closed-form commit faster than token replay at every accepted depth, weaver"] == (
        "not measured",
        "open",
    )


def test_a_run_without_graph_times_or_target_rows_judges_nothing_and_a_report_says_how_many_are_met(tmp_path):
    cpu = [
        row("weaver", "verify", 128, "tree_split", None),
        row("weaver", "verify", 128, "tree_fused", math.nan),
    ]
    assert target_lines(pd.DataFrame(cpu, columns=kr.COLUMNS)) == []
    other = [row("weaver", "step", 64, "step_replay_fla", 9.0)]  # graph times, but no target's rows
    assert target_lines(pd.DataFrame(other, columns=kr.COLUMNS)) == []
    assert "kernel targets" not in kr.report_markdown(pd.DataFrame(cpu, columns=kr.COLUMNS), {}, tmp_path, {})
    gpu = [
        row("weaver", "verify", 128, "per_branch_recurrent", 110.0),
        row("weaver", "verify", 128, "tree_split", 14.0),
    ]
    text = kr.report_markdown(pd.DataFrame(gpu, columns=kr.COLUMNS), {}, tmp_path, {})
    assert "## Kernel targets of issues 13 and 10 (CUDA-graph times)" in text
    assert "2 met, 0 missed, 9 not measured in this run." in text
    assert text.index("Kernel targets") < text.index("## weaver")
