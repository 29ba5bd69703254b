"""Bad input at the command line: one clear line on stderr and exit 2, before anything is written."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from repro.errors import ConfigError
from repro.harness.experiment import read_experiment, resolve


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "scale"],  # default shape qwen3.6-27b
        ["bench", "scale", "--shape", "tiny,gdn-1.3b"],
        ["bench", "model"],  # default shapes gdn-1.3b, qwen3.6-27b
        ["bench", "model", "--shapes", "qwen3.6-27b"],
    ],
)
def test_real_bench_shapes_are_refused_off_cuda(args, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, *args, "--device", "cpu", "--out", str(out))
    assert code == 2 and "need a CUDA GPU" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "model", "--context", "40000"], "--context + the largest tree is 40,256 tokens"),
        (["bench", "model", "--context", "32600", "--sizes", "200"], "is 32,800 tokens; the tiny"),
        (["bench", "model", "--sizes", "4,5000"], "trees of <= 1024 nodes, got 5000"),
        (["bench", "model", "--step-nodes", "2000"], "trees of <= 1024 nodes, got 2000"),
        (["bench", "scale", "--prompt-len", "40000"], "--prompt-len + new tokens is 40,096 tokens"),
        (["bench", "scale", "--max-new-tokens", "99999999"], "the tiny shape holds 32,768"),
        (["bench", "scale", "--warmup-tokens", "32600"], "--prompt-len + new tokens is 32,856 tokens"),
    ],
)
def test_bench_sequences_past_the_shape_context_are_refused(args, message, tmp_path, monkeypatch, capsys):
    """Huge contexts, prompts or trees ran until memory or the time limit gave out; now one line."""
    out = tmp_path / "run"
    shape = "--shapes" if args[1] == "model" else "--shape"
    code, _, err = run_cli(monkeypatch, capsys, *args, shape, "tiny", "--device", "cpu", "--out", str(out))
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_the_context_capacity_is_the_stated_one_else_the_default():
    from repro.models.config import DEFAULT_CONTEXT
    from repro.models.default import tiny_config

    cfg = tiny_config()
    cfg.max_position_embeddings = None
    assert cfg.context_capacity == DEFAULT_CONTEXT == cfg.to_qwen35_dict()["max_position_embeddings"]
    cfg.max_position_embeddings = 4096
    assert cfg.context_capacity == 4096 == cfg.to_qwen35_dict()["max_position_embeddings"]


def test_a_one_value_sweep_runs_each_route_once():
    cfg = resolve(read_experiment("sweep"), {"sweep": {"param": "budget", "values": [16]}, "device": "cpu"})
    assert [r["name"] for r in cfg["routes"]][1:] == [
        "ddtree@budget=16",
        "dflash_tfm@budget=16",
        "specla@budget=16",
    ]
    raw = read_experiment("sweep")
    raw["routes"] = [{"name": "ar", "kind": "ar"}]
    with pytest.raises(ConfigError, match="no route takes 'budget'"):
        resolve(raw, {"sweep": {"param": "budget", "values": [16]}, "device": "cpu"})


@pytest.mark.parametrize(
    "field, value",
    [("num_attention_heads", "four"), ("hidden_size", -5), ("num_hidden_layers", 8.5), ("eos_token_id", "x")],
)
def test_checkpoint_config_values_of_the_wrong_type_or_range_are_one_line(
    field, value, tmp_path, monkeypatch, capsys
):
    from repro.models.default import tiny_config

    raw = tiny_config().to_qwen35_dict()
    raw.pop("layer_types")
    raw[field] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))
    code, _, err = run_cli(monkeypatch, capsys, "run", "smoke", "--target", str(tmp_path), "--check")
    assert code == 2 and f"field {field!r} must be" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("device", ["tpu", "cuda:abc", "cuda:"])
def test_unknown_devices_are_refused_by_check_and_run(device, tmp_path, monkeypatch, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"target: tiny-random\ndevice: '{device}'\nroutes: [{{name: ar, kind: ar}}]\n")
    for args in (
        ["run", str(exp), "--check"],
        ["run", "smoke", "--device", device, "--out", str(tmp_path / "o")],
    ):
        code, _, err = run_cli(monkeypatch, capsys, *args)
        assert code == 2 and f"unknown device {device!r}" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("backend, says", [("triton", "needs a CUDA device"), ("nope", "nope")])
def test_tree_exactness_refuses_a_backend_before_writing(backend, says, tmp_path, monkeypatch, capsys):
    out = tmp_path / "d"
    args = ["falsify", "tree-exactness", "--backend", backend, "--device", "cpu", "--out", str(out)]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_claims_check_refuses_a_file_that_is_not_a_ledger(tmp_path, monkeypatch, capsys):
    other = tmp_path / "notes.md"
    other.write_text("# notes\n\nno claims here\n")
    code, _, err = run_cli(
        monkeypatch, capsys, "claims", "--check", "--out", str(other), "--results", str(tmp_path)
    )
    assert code == 2 and "is not a claims ledger" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "args, says",
    [
        (["--time-budget", "-1"], "time budget must be"),
        (["--time-budget", "nan"], "time budget must be"),
        (["--warmup", "-1"], "warmup must be >= 0"),
        (["--max-train-tokens", "0"], "max_train_tokens must exceed"),
        (["--max-train-tokens", "-5"], "max_train_tokens must exceed"),
        (["--eval-sequences", "0"], "eval_sequences must be >= 1"),
        (["--eval-sequences", "-1"], "eval_sequences must be >= 1"),
        (["--out", "FILE"], "is a file"),
    ],
)
def test_train_target_refuses_bad_settings_up_front(args, says, tmp_path, monkeypatch, capsys):
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / "FILE") if a == "FILE" else a for a in args]
    out = ["--out", str(tmp_path / "out")] if "--out" not in args else []
    code, _, err = run_cli(
        monkeypatch, capsys, "train", "target", "--corpus", str(tmp_path), "--device", "cpu", *out, *args
    )
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--target-layers", "abc"], "--target-layers takes"),
        (["--target-layers", ","], "--target-layers needs"),
        (["--target-layers", "-1"], "--target-layers needs"),
        (["--prompts", "0"], "prompts must be >= 1"),
        (["--anchors", "0"], "anchors must be >= 1"),
        (["--layers", "0"], "draft_layers must be >= 1"),
        (["--eval-prompts", "0"], "eval_prompts must be >= 1"),
        (["--max-new-tokens", "0"], "eval_new_tokens must be >= 1"),
    ],
)
def test_train_dflash_refuses_bad_settings_up_front(args, says, tmp_path, monkeypatch, capsys):
    cmd = ["train", "dflash", "--target", "default", "--corpus", str(tmp_path), "--out", str(tmp_path / "o")]
    code, _, err = run_cli(monkeypatch, capsys, *cmd, *args)
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("manifest", ["{}", "garbage", "[1]", '{"files": {"train.txt": 1}}'])
def test_data_tokenizer_refuses_a_broken_corpus_manifest(manifest, tmp_path, monkeypatch, capsys):
    pytest.importorskip("tokenizers")
    (tmp_path / "manifest.json").write_text(manifest)
    (tmp_path / "train.txt").write_text("text")
    out = tmp_path / "tok"
    code, _, err = run_cli(
        monkeypatch, capsys, "data", "tokenizer", "--corpus", str(tmp_path), "--out", str(out)
    )
    assert code == 2 and "manifest.json" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_falsify_checks_run_dirs_before_running_anything(tmp_path, monkeypatch, capsys):
    import repro.cli as cli

    ran = []
    monkeypatch.setattr(cli, "falsify_pool_mass", lambda **kw: ran.append("pool-mass"))
    code, _, err = run_cli(
        monkeypatch, capsys, "falsify", "--pool-mass", "--what-was-timed", str(tmp_path / "nonexistent")
    )
    assert code == 2 and "nonexistent" in err and len(err.splitlines()) == 1, err
    assert ran == []


def test_check_refuses_an_unknown_experiment_kind(tmp_path, monkeypatch, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text("target: tiny-random\nkind: weird\nroutes: [{name: ar, kind: ar}]\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(exp), "--check")
    assert code == 2 and "unknown experiment kind 'weird'" in err and len(err.splitlines()) == 1, err


def test_weight_seeds_are_bounded_in_one_line(tmp_path, monkeypatch, capsys):
    big = str(10**23)
    code, _, err = run_cli(monkeypatch, capsys, "export-default", str(tmp_path / "ckpt"), "--seed", big)
    assert code == 2 and "--seed must be in [0, 2**64)" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(ConfigError, match="target_seed must be in"):
        resolve({**read_experiment("smoke"), "target_seed": 2**64}, {"device": "cpu"})


@pytest.mark.parametrize("args", [["--suites", ","], ["--k", ","]])
def test_pool_mass_refuses_empty_lists_up_front(args, tmp_path, monkeypatch, capsys):
    out = tmp_path / "o"
    code, _, err = run_cli(monkeypatch, capsys, "falsify", "pool-mass", *args, "--out", str(out))
    assert code == 2 and "at least one value" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_bench_scale_refuses_an_infinite_logit_scale(tmp_path, monkeypatch, capsys):
    args = [
        "bench",
        "scale",
        "--shape",
        "tiny",
        "--logit-scale",
        "inf",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "o"),
    ]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and "--logit-scale must be a finite number" in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["claims", "--results", "{file}"],
        ["report", "--index", "{file}"],
        ["family", "install", "{file}", "tiny-qwen35"],
        ["suites", "freeze", "--wheels", "{file}", "--out", "{tmp}/suites"],
    ],
)
def test_a_file_where_a_folder_is_expected_is_named_as_such(args, tmp_path, monkeypatch, capsys):
    """A path that exists as a file is "a file, not a folder", not "does not exist"."""
    file = tmp_path / "afile"
    file.write_text("hi")
    argv = [a.format(file=file, tmp=tmp_path) for a in args]
    code, _, err = run_cli(monkeypatch, capsys, *argv)
    assert code == 2 and f"{file} is a file, not a folder" in err and len(err.splitlines()) == 1, err


def test_a_broken_manifest_suggests_another_out_only_to_a_command_that_writes(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{not json")
    (run / "records.jsonl").write_text("")
    for args, writes in ((["report", str(run)], False), (["run", "smoke", "--out", str(run)], True)):
        code, _, err = run_cli(monkeypatch, capsys, *args)
        assert code == 2 and len(err.splitlines()) == 1 and "manifest.json" in err, err
        assert ("--out" in err) == writes, (args, err)


def test_a_blank_route_name_is_refused():
    from repro.decoding.routes import COMMON_PARAMS

    name = next(p for p in COMMON_PARAMS if p.name == "name")
    assert name.check("ddtree-b32") == "ddtree-b32"
    for blank in ("", "  ", "\t"):
        with pytest.raises(ValueError, match="not blank"):
            name.check(blank)


@pytest.mark.parametrize(
    "args",
    [
        ["report", "{tmp}/run"],
        ["family", "report", "--out", "{tmp}/fam"],
        ["bench", "kernels", "--quick", "--out", "{tmp}/bk"],
        ["bench", "model", "--shapes", "tiny", "--out", "{tmp}/bm"],
    ],
)
def test_a_figure_folder_that_is_a_file_is_refused_before_any_work(args, tmp_path, monkeypatch, capsys):
    file = tmp_path / "afile"
    file.write_text("hi")
    argv = [a.format(tmp=tmp_path) for a in args] + ["--figures", str(file)]
    code, _, err = run_cli(monkeypatch, capsys, *argv)
    assert code == 2 and f"figure folder {file} is a file, not a folder" in err and len(err.splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]  # nothing written


def test_a_sweep_takes_the_commit_every_route_takes():
    """``repro routes`` lists ``commit`` for every route: a sweep of it runs each swept route per value
    (an external loop's commit is its own: it runs once)."""
    cfg = resolve(
        read_experiment("sweep"),
        {"sweep": {"param": "commit", "values": ["closed_form", "replay"]}, "device": "cpu"},
    )
    names = [r["name"] for r in cfg["routes"]]
    assert "ddtree@commit=replay" in names and "specla@commit=closed_form" in names
    with pytest.raises(ConfigError, match="no parameter 'name' to sweep"):
        resolve(read_experiment("sweep"), {"sweep": {"param": "name", "values": ["a"]}, "device": "cpu"})


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "kernels", "--quick", "--out", "{tmp}/bk"],
        ["falsify", "tree-exactness", "--out", "{tmp}/fx"],
        ["generate", "--prompt-ids", "1,2,3"],
    ],
)
def test_a_malformed_device_is_one_line_in_every_command(args, tmp_path, monkeypatch, capsys):
    argv = [a.format(tmp=tmp_path) for a in args] + ["--device", "cuda:abc"]
    code, _, err = run_cli(monkeypatch, capsys, *argv)
    assert code == 2 and len(err.splitlines()) == 1 and "cuda:abc" in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_training_seed_beyond_64_bits_is_one_line(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "train",
        "target",
        "--seed",
        str(2**64),
        "--out",
        str(tmp_path / "t"),
        "--steps",
        "1",
    )
    assert code == 2 and len(err.splitlines()) == 1 and "--seed" in err and "2**64" in err, err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    "text, says",
    [
        ("{not json", "is not valid JSON"),
        ("[1]", "a JSON list, not an object"),
        ('{"superseded": 5}', "superseded must be an object"),
        ('{"superseded": {"run": {"why": "no by"}}}', "superseded['run'] must be an object"),
        ('{"not_run_dirs": [1]}', "not_run_dirs must be an object"),
    ],
)
def test_a_broken_supersedes_file_is_one_line(text, says, tmp_path, monkeypatch, capsys):
    (tmp_path / "supersedes.json").write_text(text)
    for args in (["report", "--index", str(tmp_path)], ["claims", "--results", str(tmp_path)]):
        code, _, err = run_cli(monkeypatch, capsys, *args)
        assert code == 2 and "supersedes.json" in err and says in err and len(err.splitlines()) == 1, err
    assert [p.name for p in tmp_path.iterdir()] == ["supersedes.json"]  # no INDEX.md, no CLAIMS.md


@pytest.mark.parametrize(
    "args, says",
    [
        (["family", "report", "--suites", ",", "--corpus", "{tmp}/none"], "nothing to evaluate"),
        (["falsify", "pool-mass", "--suites", "nosuch"], "unknown suite 'nosuch'"),
        (["falsify", "external", "--targets", "nosuch"], "target nosuch does not exist"),
        (["falsify", "external", "--targets", ","], "--targets must name at least one value"),
        (["falsify", "external", "--suites", ","], "--suites must name at least one value"),
        (["falsify", "external", "--engines", ","], "name at least one engine"),
        (["falsify", "external", "--dtype", "float16"], "unknown dtype 'float16'"),
        (["falsify", "external", "--temperature", "inf"], "--temperature must be a finite number"),
        (["bench", "kernels", "--quick", "--groups", ","], "--groups must name at least one value"),
        (["bench", "kernels", "--quick", "--methods", ","], "--methods must name at least one value"),
    ],
)
def test_empty_or_unknown_selections_are_refused_before_a_run_directory(
    args, says, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "o"
    argv = [a.format(tmp=tmp_path) for a in args] + ["--out", str(out)]
    code, _, err = run_cli(monkeypatch, capsys, *argv)
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    "args, says",
    [
        (["dflash", "--loss-gamma", "nan"], "loss_gamma must be a number"),
        (["eagle", "--k", "0"], "k must be an integer >= 1"),
        (["eagle", "--w-cls", "nan"], "w_cls must be a finite number >= 0"),
        (["eagle", "--w-reg", "-1"], "w_reg must be a finite number >= 0"),
        (["eagle", "--w-reg", "0", "--w-cls", "0"], "both 0"),
        (["eagle", "--feature-noise", "nan"], "feature_noise must be a finite number >= 0"),
        (["weaver", "--dflash", "tiny-qwen35-dflash", "--budget", "0"], "budget must be an integer in"),
        (["weaver", "--dflash", "tiny-qwen35-dflash", "--budget", "5000"], "budget must be an integer in"),
        (["weaver", "--dflash", "tiny-qwen35-dflash", "--width", "0"], "width must be an integer >= 1"),
        (["weaver", "--dflash", "tiny-qwen35-dflash", "--target-temperature", "nan"], "target_temperature"),
    ],
)
def test_drafter_training_refuses_bad_settings_before_training(args, says, tmp_path, monkeypatch, capsys):
    """Settings of the loss and of the held-out evaluation's route are checked before anything is trained
    (not after the checkpoint is written, nor as a NaN loss)."""
    kind, *rest = args
    cmd = ["train", kind, "--target", "default", "--corpus", str(tmp_path), "--out", str(tmp_path / "o")]
    code, _, err = run_cli(monkeypatch, capsys, *cmd, *rest)
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "args, option",
    [
        (["run", "smoke", "--weaver", "", "--check"], "--weaver"),
        (["sweep", "--budget", "16", "--weaver", "", "--device", "cpu", "--out", "{tmp}/o"], "--weaver"),
        (["sweep", "--budget", "16", "--drafter", "", "--device", "cpu", "--out", "{tmp}/o"], "--drafter"),
        (["claims", "--results", ""], "--results"),  # wrote CLAIMS.md into the current folder
        (["run", "smoke", "--device", "cpu", "--out="], "--out"),
        (["report", ""], "argument 2"),
    ],
)
def test_an_empty_value_is_refused_not_read_as_the_current_folder_or_nothing(
    args, option, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    argv = [a.format(tmp=tmp_path) for a in args]
    code, _, err = run_cli(monkeypatch, capsys, *argv)
    assert code == 2 and f"{option} is empty" in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_option_left_empty_in_an_edit_is_refused(tmp_path):
    """The edits behind --weaver / --drafter refuse an empty path themselves (callers other than the CLI)."""
    from repro.harness.overrides import apply_edits

    with pytest.raises(ConfigError, match="--weaver needs a checkpoint path"):
        apply_edits({"routes": [{"name": "w", "kind": "weaver"}]}, weaver="")


def test_a_download_cache_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    args = ["data", "corpus", "--out", str(tmp_path / "corpus"), "--cache", str(cache)]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and "cannot make the download cache" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "corpus").exists()


@pytest.mark.parametrize("make, says", [("file", "is a file, not a folder"), ("nothing", "does not exist")])
def test_merge_of_something_not_a_run_directory_says_what_it_is(make, says, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    if make == "file":
        out.write_text("not a run")
    code, _, err = run_cli(monkeypatch, capsys, "merge", str(out))
    assert code == 2 and f"the run directory {out} {says}" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("option", ["--min-effect", "--threshold"])
def test_compare_refuses_a_noise_floor_no_change_could_pass(option, tmp_path, monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "compare", str(tmp_path), str(tmp_path), option, "inf")
    assert code == 2 and f"{option} must be a finite number >= 0, got inf" in err, err
    assert len(err.splitlines()) == 1, err


def test_a_held_out_corpus_too_small_for_the_prompts_is_refused_before_a_run_directory(
    tmp_path, monkeypatch, capsys
):
    corpus, out = tmp_path / "corpus", tmp_path / "o"
    corpus.mkdir()
    (corpus / "heldout.txt").write_text("Too short.\n")
    args = ["family", "report", "--suites", ",", "--corpus", str(corpus), "--out", str(out)]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and "too few for prompts" in err and len(err.splitlines()) == 1, err
    assert not out.exists()  # before, the manifest was written first
