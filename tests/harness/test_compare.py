"""``repro compare``: two committed result folders, and planted copies with known regressions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli as cli

from repro.harness.compare import Noise, claim_verdicts, compare, speed_change
from repro.reporting.records import sha256_ids
from repro.reporting.rundir import restore_records
from repro.reporting.stats import paired_ratio

RESULTS = Path(__file__).resolve().parents[2] / "results"
ROUTES = RESULTS / "2026-11-30-h200-routes" / "float32"  # a decode run on the H200, 4 prompts x 3 suites


def _night(tmp_path: Path, name: str, edit=None) -> Path:
    """A results folder with a copy of the routes run as ``routes``, its records passed through ``edit``."""
    root = tmp_path / name
    shutil.copytree(ROUTES, root / "routes", ignore=shutil.ignore_patterns("*.png", "*.log"))
    restore_records(root / "routes")  # the committed run is archived (repro archive): its records.jsonl back
    if edit:
        path = root / "routes" / "records.jsonl"
        rows = [edit(json.loads(line)) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_the_same_results_compare_clean(monkeypatch, capsys, tmp_path):
    old, new = _night(tmp_path, "old"), _night(tmp_path, "new")
    code, out, err = cli(monkeypatch, capsys, "compare", str(old), str(new))
    assert code == 0, err
    assert "1 run(s) matched; 0 regression(s); 0 other change(s)" in out


def test_a_slower_route_and_a_new_divergence_are_regressions(monkeypatch, capsys, tmp_path):
    def plant(r: dict) -> dict:
        if r["route"] == "ddtree-b32":
            r["decode_s"] *= 1.25  # 20% fewer tokens/s on every prompt
        if r["route"] == "eagle-chain-k6" and r["prompt_id"] == "130" and r["turn"] == 0:
            r["vs_ar"] = "diverged at token 3"
        return r

    old, new = _night(tmp_path, "old"), _night(tmp_path, "new", plant)
    code, out, err = cli(monkeypatch, capsys, "compare", str(old), str(new), "--out", str(tmp_path / "c.md"))
    assert code == 3
    assert "2 regression(s)" in err and len(err.strip().splitlines()) == 1
    row = next(line for line in out.splitlines() if "| ddtree-b32 | tokens/s" in line)
    assert "x0.800 [0.800, 0.800]" in row and "**yes**" in row
    assert "| eagle-chain-k6 mt_bench/130 turn 0 | vs AR | identical | diverged at token 3 |" in out
    assert (tmp_path / "c.md").read_text() == out.rstrip("\n") + "\n"


def test_a_faster_route_is_a_change_but_not_a_regression(tmp_path):
    def faster(r: dict) -> dict:
        r["decode_s"] *= 0.8 if r["route"] == "ar" else 1.0
        return r

    result = compare(_night(tmp_path, "old"), _night(tmp_path, "new", faster))
    assert [(c.item, c.regression) for c in result.changes] == [("ar", False)]


def test_a_prompt_with_two_turns_is_one_unit(tmp_path):
    """MT-Bench's two turns pool into one unit per prompt (tokens and seconds summed on each side): the
    routes run has 5 prompts but 7 turns per route, and the change is reported over 5 prompts."""
    from repro.harness.compare import Noise, prompt_sums, speed_change
    from repro.harness.run_kinds import load_run

    def slower(r: dict) -> dict:
        if r["route"] == "ddtree-b32":  # every turn 10% slower, MT-Bench's second turns 50% slower
            r["decode_s"] *= 1.5 if r["turn"] == 1 else 1 / 0.9
        return r

    old, new = (load_run(_night(tmp_path, n, e) / "routes") for n, e in (("o", None), ("n", slower)))
    olds = {r.key: r for r in old.records}
    pairs = [(olds[r.key], r) for r in new.records if r.route == "ddtree-b32"]
    sums = prompt_sums(pairs)
    assert len(pairs) == 7 and all(len(column) == 5 for column in sums)
    for unit, (suite, pid) in enumerate(dict.fromkeys((b.suite, b.prompt_id) for _, b in pairs)):
        turns = [(a, b) for a, b in pairs if (b.suite, b.prompt_id) == (suite, pid)]
        want = (
            sum(b.new_tokens for _, b in turns),
            sum(b.decode_s for _, b in turns),
            sum(a.new_tokens for a, _ in turns),
            sum(a.decode_s for a, _ in turns),
        )
        assert tuple(column[unit] for column in sums) == want and (len(turns) == 2) == (suite == "mt_bench")
    change = speed_change(paired_ratio(sums), Noise())
    assert change is not None and change[2] == -1 and "over 5 prompts" in change[1]


def test_the_change_is_the_pooled_tokens_per_second_not_a_mean_of_prompt_ratios():
    """Four long prompts 1.5x faster and 36 short ones 0.9x as fast: the pooled tokens/s rose by a third,
    so the change is faster (a geometric mean of the per-prompt ratios, x0.947, would call it a
    regression): the ratio is the report's token-weighted one, with its interval."""
    from repro.harness.compare import Noise, speed_change

    long_, short = (1000.0, 10.0), (10.0, 0.1)  # (tokens, seconds) on the old night: 100 tok/s each
    units = [(*long_, 1.5) for _ in range(4)] + [(*short, 0.9) for _ in range(36)]
    new_tokens = [t for t, _, _ in units]
    new_s = [s / f for _, s, f in units]
    sums = (new_tokens, new_s, [t for t, _, _ in units], [s for _, s, _ in units])
    got = paired_ratio(sums)
    pooled = (sum(new_tokens) / sum(new_s)) / (sum(sums[2]) / sum(sums[3]))
    assert got.value == pytest.approx(pooled) and pooled > 1.3 and got.n == 40
    change = speed_change(got, Noise())
    assert change is not None and change[2] == 1 and got.low > 1


def test_a_newly_refused_record_is_a_regression_and_lost_records_are_listed(tmp_path):
    """A route that starts being refused on a prompt is a regression (its tokens/s pairs would otherwise
    just drop out); records the new run lacks are listed, not silently left out of the comparison."""

    def external(r: dict) -> dict:  # the eagle chain's records as an external loop's (they may be refused)
        if r["route"] == "eagle-chain-k6":
            r["route_params"] = {"kind": "external", "engine": "dflash-generate"}
        return r

    def refuse(r: dict) -> dict:
        if external(r)["route"] == "eagle-chain-k6" and r["prompt_id"] == "588":
            r.update(vs_ar="refused: engine failed", output_ids=[], accepted_lengths=[], new_tokens=0,
                     decode_s=0.0, steps=0, tree_sizes=[], output_sha256=sha256_ids([]))  # fmt: skip
        return r

    old, new = _night(tmp_path, "old", external), _night(tmp_path, "new", refuse)
    path = new / "routes" / "records.jsonl"
    rows = path.read_text().splitlines()
    path.write_text("".join(r + "\n" for r in rows if json.loads(r)["route"] != "ddtree-b32"))
    changes = compare(old, new).changes
    refused = [c for c in changes if c.note == "newly refused"]
    assert [(c.item, c.regression) for c in refused] == [("eagle-chain-k6 gsm8k/588 turn 0", True)]
    lost = [c for c in changes if "not in the new run" in c.note]
    assert [(c.item, c.what, c.old, c.new, c.regression) for c in lost] == [
        ("ddtree-b32", "route", "7", "0", False)
    ]


def _ratios(ratios: list[float]):
    """Units of 100 tokens whose new tokens/s are ``ratios`` times the old 100 tok/s."""
    return paired_ratio(
        ([100.0] * len(ratios), [1 / r for r in ratios], [100.0] * len(ratios), [1.0] * len(ratios))
    )


def test_noise_is_a_ci_including_one_or_a_small_effect():
    jitter = [0.97, 1.04, 0.99, 1.02, 0.98, 1.01, 0.96, 1.03]
    assert speed_change(_ratios(jitter), Noise()) is None  # the interval includes 1
    assert speed_change(_ratios([0.99] * 8), Noise()) is None  # certain but below min_effect (3%)
    slower = speed_change(_ratios([0.9, 0.92, 0.88, 0.91, 0.9, 0.89]), Noise())
    assert slower is not None and slower[2] == -1 and "over 6 prompts" in slower[1]
    assert speed_change(_ratios([0.85, 0.8]), Noise()) is not None  # too few pairs: the 10% threshold
    assert speed_change(_ratios([0.95, 0.93]), Noise()) is None


def test_committed_model_benches_compare_row_by_row(monkeypatch, capsys):
    """model-4 (graphed decode) is the later, faster run: read backwards, its speed-up is a regression."""
    old, new = RESULTS / "2026-11-30-h200-model-2", RESULTS / "2026-11-30-h200-model-4"
    forward = compare(old, new)
    assert forward.matched == [("2026-11-30-h200-model-4", "bench-model")]
    decode = next(c for c in forward.changes if "group=decode method=static_graph T=1 " in c.item + " ")
    assert "shape=gdn-1.3b" in decode.item or "shape=qwen3.6-27b" in decode.item
    assert not decode.regression and float(decode.new) < float(decode.old)
    code, _, err = cli(monkeypatch, capsys, "compare", str(new), str(old))
    assert code == 3 and "regression(s)" in err


def test_claim_verdict_changes_are_flagged(tmp_path):
    table = "| claim | source | verdict |\n|---|---|---|\n| {a} | A | {v} |\n| speedup 1.70x | B | missed |\n"
    old, new = _night(tmp_path, "old"), _night(tmp_path, "new")
    (old / "CLAIMS.md").write_text("# Claims\n\n" + table.format(a="tree exact", v="reproduced"))
    (new / "CLAIMS.md").write_text("# Claims\n\n" + table.format(a="tree exact", v="refuted"))
    assert claim_verdicts(new / "CLAIMS.md") == {"tree exact": "refuted", "speedup 1.70x": "missed"}
    result = compare(old, new)
    assert [(c.item, c.old, c.new) for c in result.regressions] == [("tree exact", "reproduced", "refuted")]


def test_unmatched_and_mismatched_runs_are_listed(tmp_path):
    old, new = _night(tmp_path, "old"), _night(tmp_path, "new")
    shutil.copytree(RESULTS / "2026-11-30-h200-model-4", new / "model", ignore=shutil.ignore_patterns("gpu*"))
    result = compare(old, new)
    assert "model: only in" in " ".join(result.skipped)


def test_out_is_never_written_over_a_file_compare_did_not_write(monkeypatch, capsys, tmp_path):
    """--out naming another file (here the run's own records) is refused in one line, before comparing,
    and left as it was; an earlier comparison is rewritten."""
    old, new = _night(tmp_path, "old"), _night(tmp_path, "new")
    records = new / "routes" / "records.jsonl"
    before = records.read_bytes()
    code, out, err = cli(monkeypatch, capsys, "compare", str(old), str(new), "--out", str(records))
    assert code == 2 and len(err.splitlines()) == 1 and str(records) in err and not out, err
    assert records.read_bytes() == before
    earlier = tmp_path / "c.md"
    earlier.write_text("# Comparison: a -> b\n")
    code, out, _ = cli(monkeypatch, capsys, "compare", str(old), str(new), "--out", str(earlier))
    assert code == 0 and earlier.read_text() == out.rstrip("\n") + "\n"


def test_repeats_raise_a_routes_floor_to_what_it_moved_between_them(monkeypatch, capsys, tmp_path):
    """--repeats: a route that moved 6% between two repeats of one code is not flagged for a 5% slowdown
    (another route is, and the same slowdown without --repeats is); its floor is the larger move either
    way (repeat_floors); repeats of other code or other settings, or fewer than two, are refused in one
    line (exit 2)."""
    from repro.harness.compare import repeat_floors

    def scaled(route: str, factor: float):
        def edit(r: dict) -> dict:
            if r["route"] == route:
                r["decode_s"] *= factor
            return r

        return edit

    repeats = tmp_path / "repeats"
    _night(repeats, "a")
    _night(repeats, "b", scaled("ddtree-b32", 1.06))  # ddtree 6% slower in a repeat
    floors = repeat_floors(repeats)
    assert floors["ddtree-b32"] == pytest.approx(0.06) and floors["ar"] == pytest.approx(0.0)
    assert repeat_floors(repeats) == floors  # b -> a or a -> b: the same floor
    old = _night(tmp_path, "old")
    new = _night(tmp_path, "new", lambda r: scaled("ar", 1.05)(scaled("ddtree-b32", 1.05)(r)))
    code, out, _ = cli(monkeypatch, capsys, "compare", str(old), str(new))
    assert code == 3 and "| ddtree-b32 | tokens/s" in out and "| ar | tokens/s" in out
    code, out, _ = cli(monkeypatch, capsys, "compare", str(old), str(new), "--repeats", str(repeats))
    assert code == 3 and "| ddtree-b32 | tokens/s" not in out and "| ar | tokens/s" in out
    planted = tmp_path / "other"
    _night(planted, "a")
    _night(planted, "b", lambda r: r)
    manifest = planted / "b" / "routes" / "manifest.json"
    meta = json.loads(manifest.read_text())
    meta["git_sha"] = "0000000"
    manifest.write_text(json.dumps(meta))
    for bad, why in ((planted, "ran other code"), (planted / "a", "needs two or more decode runs")):
        code, _, err = cli(monkeypatch, capsys, "compare", str(old), str(new), "--repeats", str(bad))
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err
