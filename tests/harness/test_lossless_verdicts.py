"""Lossless verdicts against a route whose output really differs from AR's: the runner's ``vs_ar`` (and the
run report and exit code 3 of ``repro run``), ``repro generate``'s ``identical_to_ar``, and the family
report's ``diverged`` count (:func:`repro.harness.evaluation.route_acceptance`). The lossy route is a real
route whose decode has one token of its output changed (:func:`lossy_generate`); every other route, and
the comparison itself, is the real one."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from repro.cli import main
from repro.decoding.engine import DecodeResult, Route


def lossy_generate(real: Callable[..., DecodeResult], route_name: str, k: int) -> Callable[..., DecodeResult]:
    """``real`` (the engine's generate) with token ``k`` of ``route_name``'s output replaced by another
    token, so that route's output differs from AR's first at index k (or is unchanged when shorter)."""

    def generate(target, prompt_ids, route: Route, *args, **kwargs) -> DecodeResult:
        result = real(target, prompt_ids, route, *args, **kwargs)
        if route.name != route_name or len(result.output_ids) <= k:
            return result
        ids = list(result.output_ids)
        ids[k] = (ids[k] + 1) % target.config.vocab_size
        return dataclasses.replace(result, output_ids=ids)

    return generate


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# ------------------------------------------------------------------------------------ repro run

K = 2


@pytest.fixture
def diverging_run(tmp_path: Path, monkeypatch, capsys) -> tuple[int, str, Path]:
    """``repro run`` (float64, greedy: must be lossless) of AR, a chain and a tree route, whose chain's
    output differs from AR's at token K on every prompt: (exit code, stderr, run directory)."""
    import repro.harness.runner as runner

    cfg = {
        "target": "default", "dtype": "float64", "suites": ["gsm8k", "humaneval"], "limit": 1,
        "max_new_tokens": 6, "ignore_eos": True, "warmup": 0,
        "routes": [
            {"name": "ar", "kind": "ar"},
            {"name": "chain", "kind": "synthetic_chain", "k": 3, "p": 0.7},
            {"name": "tree", "kind": "synthetic_tree", "k": 3, "p": 0.5, "width": 3},
        ],
    }  # fmt: skip
    exp = tmp_path / "tiny.yaml"
    exp.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(runner, "generate", lossy_generate(runner.generate, "chain", K))
    out = tmp_path / "run"
    code, _, err = run_main(monkeypatch, capsys, "run", str(exp), "--out", str(out), "--device", "cpu")
    return code, err, out


def test_a_route_that_diverges_is_recorded_at_its_token_reported_and_exits_3(diverging_run):
    code, err, out = diverging_run
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    verdicts = {(r["route"], r["suite"]): r["vs_ar"] for r in records}
    assert verdicts == {
        ("ar", "gsm8k"): "reference", ("ar", "humaneval"): "reference",
        ("chain", "gsm8k"): f"diverged at token {K}", ("chain", "humaneval"): f"diverged at token {K}",
        ("tree", "gsm8k"): "identical", ("tree", "humaneval"): "identical",
    }  # fmt: skip
    ar = {r["suite"]: r["output_ids"] for r in records if r["route"] == "ar"}
    for r in records:
        if r["route"] == "chain":  # the record holds the diverging output: equal up to K, not at K
            assert r["output_ids"][:K] == ar[r["suite"]][:K] and r["output_ids"][K] != ar[r["suite"]][K]

    assert code == 3, err
    assert "not lossless: route(s) chain diverged from AR in float64" in err  # the tree is not named

    report = (out / "report.md").read_text()
    assert "## Divergences from AR" in report
    divergences = [line for line in report.splitlines() if line.startswith("- ") and "diverged at" in line]
    assert sorted(divergences) == [
        f"- chain / {suite} / {pid} turn 0 (T=0): diverged at token {K}"
        for suite, pid in sorted((r["suite"], r["prompt_id"]) for r in records if r["route"] == "chain")
    ]
    assert "0/2 identical, 2 diverged" in report and "2/2 identical" in report  # chain, tree


# -------------------------------------------------------------------------------- repro generate


def test_generate_says_a_diverging_route_is_not_identical_to_ar(monkeypatch, capsys):
    import repro.harness.generate as gen

    args = ["generate", "--prompt-ids", "1,2,3,4", "--max-new-tokens", "6", "--dtype", "float64"]
    args += [
        "--device",
        "cpu",
        "--ignore-eos",
        "--route",
        "synthetic_chain",
        "--param",
        "k=3",
        "--param",
        "p=0.7",
    ]
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    assert json.loads(out)["identical_to_ar"] is True  # the route as it is: lossless

    monkeypatch.setattr(gen, "generate", lossy_generate(gen.generate, "synthetic_chain", K))
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    assert json.loads(out)["identical_to_ar"] is False


# ------------------------------------------------------------------------------ family report

TARGET = "tiny-gdn"


def test_family_report_counts_the_prompts_a_route_diverged_on(
    corpus: Path, tmp_path: Path, monkeypatch, capsys
):
    """route_acceptance counts a prompt as diverged when the route's output differs from AR's; the report
    flags it and ``repro family report`` exits 3. The lossy route diverges on every other prompt it
    decodes (the first, third, ... of each prompt set), so the count is not all or nothing."""
    import repro.harness.evaluation as evaluation

    real = evaluation.generate
    lossy = lossy_generate(real, "ddtree", K)
    decodes: list[list[int]] = []

    def every_other(target, prompt_ids, route, *args, **kwargs):
        if route.name == "ddtree":
            decodes.append(prompt_ids)
            if len(decodes) % 2 == 1:
                return lossy(target, prompt_ids, route, *args, **kwargs)
        return real(target, prompt_ids, route, *args, **kwargs)

    monkeypatch.setattr(evaluation, "generate", every_other)
    out = tmp_path / "run"
    args = [
        "family",
        "report",
        "--out",
        str(out),
        "--figures",
        str(tmp_path / "fig"),
        "--corpus",
        str(corpus),
    ]
    args += ["--targets", TARGET, "--prompts", "3", "--suites", "gsm8k", "--limit", "1"]
    args += ["--max-new-tokens", "6", "--budget", "6"]
    code, _, err = run_main(monkeypatch, capsys, *args)
    assert code == 3 and "not lossless: 1 route(s) diverged from AR" in err, err

    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    diverged = {(r["prompt_set"], r["route"]): (r["diverged"], r["prompts"], r["lossless"]) for r in records}
    assert diverged[("heldout", "ddtree")] == (2, 3, False)  # prompts 1 and 3 of 3
    assert diverged[("gsm8k", "ddtree")] == (0, 1, True)  # its one prompt is the 4th ddtree decode
    assert all(v[0] == 0 and v[2] for (_, route), v in diverged.items() if route != "ddtree")
    report = (out / "report.md").read_text()
    assert f"diverged from AR's greedy output: {TARGET}/heldout/ddtree (2 of 3 prompts)" in report
    assert "**NO: 2/4 prompts diverged**" in report  # the table pools the sets: 2 of 3 + 0 of 1
