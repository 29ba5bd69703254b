"""The verdict logic on planted engines (identical, diverged at k, refused, package missing), the files
of an external check, and the one-line message for a missing package."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import torch

from repro.engines import tables, verdicts
from repro.engines.catalog import Engine, pick
from repro.engines.dflash_loop import dflash_generate
from repro.engines.hf_generate import hf_generate
from repro.engines.result import OK, EngineRequest, EngineResult, MissingPackageError, refused, require
from repro.errors import ConfigError

REF = [5, 6, 7, 8, 9]


def ok(ids: list[int]) -> EngineResult:
    return EngineResult(ids, None, 0.1, OK, "float64")


@pytest.mark.parametrize(
    "result,expected",
    [
        (ok(REF), "identical"),
        (ok([5, 6, 7, 0, 9]), "diverged at token 3"),
        (ok([1, 6, 7, 8, 9]), "diverged at token 0"),
        (ok(REF[:3]), "diverged at token 3"),
        (refused("no  such\nthing", "float64"), "refused: no such thing"),
    ],
    ids=["identical", "diverged-3", "diverged-0", "short", "refused"],
)
def test_verdict_of_planted_results(result, expected):
    assert verdicts.verdict(result, REF) == expected


def test_summary_of_a_cell():
    assert tables.summarize(["identical"] * 3) == "lossless (3/3 identical)"
    cell = tables.summarize(["identical", "diverged at token 4", "diverged at token 2"])
    assert cell == "diverged at token 4, 2 (2/3 prompts)"
    assert tables.summarize(["refused: x", "refused: x"]) == "refused: x"
    assert tables.summarize(["refused: x", "identical"]).startswith("mixed: ")


def _planted(request: EngineRequest) -> list[int]:
    """AR's own tokens (repro's model), so that the planted engines know the reference."""
    from repro.decoding.engine import generate
    from repro.decoding.routes import build_route
    from repro.models.target import open_target

    model, _ = open_target(str(request.target_dir), request.dtype, request.device)
    ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, request.seed)
    return generate(model, request.prompt_ids, ar, request.max_new_tokens).output_ids


def _same(request):
    return ok(_planted(request))


def _flip3(request):
    ids = _planted(request)
    ids[3] = (ids[3] + 1) % 100
    return ok(ids)


def _refuse(request):
    return refused("planted refusal", "float64")


def _missing(request):
    require("repro_no_such_package_xyz")


def test_external_check_writes_the_planted_verdicts(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    fakes = [
        Engine("same", _same, None, "planted: AR's tokens"),
        Engine("flip3", _flip3, "dflash", "planted: token 3 changed"),
        Engine("refuse", _refuse, None, "planted refusal"),
        Engine("missing", _missing, None, "planted missing package"),
    ]
    monkeypatch.setattr(verdicts, "pick", lambda names: fakes)
    records = verdicts.run_external_check(tmp_path, ["tiny-qwen35"], ["gsm8k"], 1, 6)
    got = {r.engine: r.vs_ar for r in records}
    assert got == {
        "same": "identical",
        "flip3": "diverged at token 3",
        "refuse": "refused: planted refusal",
        "missing": "not run: package repro_no_such_package_xyz is not installed:"
        " pip install repro_no_such_package_xyz",
    }
    assert {r.engine: r.first_divergence for r in records}["flip3"] == 3
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["vs_ar"] for line in lines] == list(got.values())
    with open(tmp_path / "table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cells = {r["engine"]: r["verdict_vs_repro_ar"] for r in rows}
    assert cells["same"] == "lossless (1/1 identical)"
    assert cells["flip3"] == "diverged at token 3 (1/1 prompts)"
    report = (tmp_path / "report.md").read_text()
    assert "| refuse | tiny-qwen35 | float64 | 1 | refused: planted refusal |" in report
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["config"]["max_new_tokens"] == 6 and manifest["config"]["dtype"] == "float64"
    assert "dflash" in manifest["external_versions"]


def test_unknown_engine_is_one_line():
    with pytest.raises(ConfigError, match="unknown engine.*nope.*dflash-generate"):
        pick(["nope"])


@pytest.mark.parametrize(
    "hidden,fn,package",
    [
        (("dflash", "dflash.model"), dflash_generate, "dflash"),
        (("transformers",), hf_generate, "transformers"),
    ],
    ids=["dflash", "transformers"],
)
def test_missing_package_is_one_clear_line(monkeypatch, hidden, fn, package):
    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    with pytest.raises(MissingPackageError) as info:
        fn(EngineRequest("unused-target", "unused-drafter", [1, 2], 4))
    assert str(info.value) == f"package {package} is not installed: pip install {package}"
