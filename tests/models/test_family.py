"""The shipped family: every member loads and fits its target, family.json matches the files on disk
within the size budget, and each drafter's routes reproduce AR exactly in float64."""

from __future__ import annotations

import re

import pytest
import torch

from repro.data.suites import load_suite
from repro.drafters.dflash import check_fits, load_dflash
from repro.drafters.eagle import load_eagle
from repro.drafters.weaver import load_weaver
from repro.harness.evaluation import route_acceptance
from repro.harness.family_report import route_specs
from repro.models.family import (
    DRAFTER_KINDS,
    FAMILY_DIR,
    SIZE_BUDGET_BYTES,
    TARGETS,
    drafter_name,
    index,
    members,
)
from repro.models.hybrid import HybridLM
from repro.models.loading import load_target
from repro.models.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def targets() -> dict[str, HybridLM]:
    return {t: load_target(t, dtype=torch.float64) for t in TARGETS}


def test_family_json_lists_exactly_the_shipped_dirs() -> None:
    dirs = sorted(p.name for p in FAMILY_DIR.iterdir() if p.is_dir())
    expected = sorted([*TARGETS, *(drafter_name(t, k) for t in TARGETS for k in DRAFTER_KINDS)])
    assert dirs == members() == sorted(index()["members"]) == expected


def test_bytes_match_the_disk_and_fit_the_budget() -> None:
    info = index()
    on_disk = {m: sum(f.stat().st_size for f in (FAMILY_DIR / m).iterdir() if f.is_file()) for m in members()}
    assert {m: e["bytes"] for m, e in info["members"].items()} == on_disk
    assert info["total_bytes"] == sum(on_disk.values()) <= SIZE_BUDGET_BYTES
    assert info["budget_bytes"] == SIZE_BUDGET_BYTES


def test_index_records_each_members_provenance() -> None:
    info = index()
    for name, entry in info["members"].items():
        assert re.fullmatch(r"[0-9a-f]{40}", entry["git_sha"]), name
        assert entry["seed"] == 0 and entry["recipe"]["recipe"] in {"target", "dflash", "eagle", "weaver"}
        assert entry["metrics"] and "H200" in entry["device"], name
    assert re.fullmatch(r"[0-9a-f]{64}", info["corpus_manifest_sha256"])


@pytest.mark.parametrize("target", TARGETS)
def test_every_drafter_loads_and_fits_its_target(targets: dict[str, HybridLM], target: str) -> None:
    model = targets[target]
    assert load_tokenizer(FAMILY_DIR / target).vocab_size <= model.config.vocab_size
    dflash = load_dflash(drafter_name(target, "dflash"))
    check_fits(dflash.config, model)
    assert dflash.config.block_size == 16
    eagle = load_eagle(drafter_name(target, "eagle"), target=model)
    weaver = load_weaver(drafter_name(target, "weaver"), dflash, model)
    for drafter in (dflash, eagle, weaver):
        assert all(torch.isfinite(p).all() for p in drafter.parameters())


@pytest.mark.parametrize("target", TARGETS)
def test_shipped_drafters_reproduce_ar_in_float64(targets: dict[str, HybridLM], target: str) -> None:
    tok = load_tokenizer(FAMILY_DIR / target)
    prompt = tok.chat_prompt([{"role": "user", "content": load_suite("gsm8k", limit=1)[0].turns[0]}])
    specs = route_specs(target, budget=8)
    results = route_acceptance(targets[target], specs, [prompt], 16, 0, 15)
    assert set(results) == set(specs)
    for name, r in results.items():
        assert r["lossless"] and r["diverged"] == 0, name
        assert r["steps"] >= 1 and r["mal"] == pytest.approx(15 / r["steps"]), name  # 16 tokens, 1 by prefill
    assert results["ar"]["mal"] == 1.0 and results["ar"]["steps"] == 15
    assert max(r["mal"] for r in results.values()) > 1.0  # trained drafters get drafts accepted
