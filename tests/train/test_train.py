"""Training recipes: the differentiable forward, a tiny target run, a tiny DFlash run (CPU, fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from repro.data.corpus_tokens import documents
from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.drafters.dflash import load_dflash
from repro.models.default import init_random_weights, tiny_config
from repro.models.hybrid import HybridLM
from repro.models.loading import load_target
from repro.models.tokenizer import ByteTokenizer, load_tokenizer
from repro.train.cli import train_app
from repro.train.common import OptimConfig, lr_at
from repro.train.dflash import DFlashRecipe, train_dflash
from repro.train.distill import greedy_continuations
from repro.train.target import TargetRecipe, evaluate, pack, target_config, train_target
from repro.tree import Tree


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls run faster (and steadier on a busy machine) on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def recipe(corpus: Path, out: Path, **kw) -> TargetRecipe:
    base = dict(steps=20, batch_size=4, seq_len=32, lr=3e-3, warmup=3, device="cpu", eval_sequences=4)
    return TargetRecipe(corpus=str(corpus), out=str(out), **{**base, **kw})


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("arch", ["qwen35", "fla_gdn"])
def test_forward_train_equals_verify(arch: str) -> None:
    cfg = target_config(arch, 260, 4, 32, [])
    model = init_random_weights(HybridLM(cfg), 3).to(torch.float64)
    ids = torch.randint(0, 260, (3, 11), generator=torch.Generator().manual_seed(0))
    logits, hidden = model.forward_train_hidden(ids, capture=(1, 3))
    assert logits.requires_grad and logits.shape == (3, 11, 260)
    for b in range(3):
        ver = model.verify(model.empty_state(), Tree.chain(ids[b]), capture=(1, 3))
        assert (logits[b] - ver.logits).abs().max() <= 1e-12
        for i in (1, 3):
            assert (hidden[i][b] - ver.hidden[i]).abs().max() <= 1e-12
    assert torch.equal(model.forward_train(ids), logits)


@pytest.mark.parametrize("arch", ["qwen35", "fla_gdn"])
def test_forward_chain_continues_a_committed_state(arch: str) -> None:
    """forward_chain after a prefilled state equals verify + commit: logits, GDN states, conv
    windows and attention keys/values (the batched prefill path)."""
    cfg = target_config(arch, 260, 4, 32, [])
    model = init_random_weights(HybridLM(cfg), 5).to(torch.float64)
    gen = torch.Generator().manual_seed(2)
    prompt, more = torch.randint(0, 260, (7,), generator=gen), torch.randint(0, 260, (2, 9), generator=gen)
    state, _ = model.prefill(prompt)
    logits, _, finals = model.forward_chain(more, state=state)
    for b in range(2):
        ver = model.verify(state, Tree.chain(more[b]))
        assert (logits[b] - ver.logits).abs().max() <= 1e-12
        after = model.commit(state, ver, list(range(9)))
        for final, ref in zip(finals, after.layers):
            pairs = (
                [(final.recurrent[b], ref.recurrent), (final.conv[b], ref.conv)]
                if hasattr(ref, "recurrent")
                else [(final.keys[b], ref.keys), (final.values[b], ref.values)]
            )
            for got, want in pairs:
                assert got.shape == want.shape and (got - want).abs().max() <= 1e-12


def test_batched_greedy_continuations_are_ar_outputs() -> None:
    model = init_random_weights(HybridLM(tiny_config()), 4).to(torch.float64)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 260, (70,), generator=gen).tolist() for _ in range(3)]
    seqs = greedy_continuations(model, prompts, 12, batch=2)
    ar = build_route({"kind": "ar"}, 260, "greedy", 0.0, 0)
    for p, row in zip(prompts, seqs.tolist()):
        assert row == p + generate(model, p, ar, 12).output_ids


def test_forward_train_gradients_reach_every_parameter() -> None:
    model = init_random_weights(HybridLM(tiny_config()), 1).to(torch.float64)
    ids = torch.randint(0, 260, (2, 16), generator=torch.Generator().manual_seed(1))
    logits = model.forward_train(ids[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_tied_bf16_target_and_time_budget(corpus: Path, tmp_path: Path) -> None:
    """A zero time budget stops after one logged step; a tied bf16 checkpoint holds exactly the
    rounded weights that were evaluated."""
    out = tmp_path / "tied"
    metrics = train_target(
        recipe(corpus, out, steps=5, tie_embeddings=True, save_dtype="bf16", time_budget_s=0.0)
    )
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert metrics["steps_run"] == 1 and len(log) == 1 and log[0]["stopped_early"] is True
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert {f.get_tensor(k).dtype for k in names} == {torch.bfloat16}
        assert "lm_head.weight" not in names
    model = load_target(out, dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    heldout = pack(load_tokenizer(out), documents(corpus / "heldout.txt"), 32)[:4]
    assert evaluate(model, heldout, 4) == pytest.approx(metrics["heldout_loss"], rel=1e-6)


def test_a_diverging_loss_is_a_failed_check_not_a_traceback(corpus: Path, tmp_path: Path) -> None:
    """A non-finite loss stops training with one line (exit 3 from the CLI) naming the step and the remedy."""
    from repro.errors import CheckFailed

    with pytest.raises(CheckFailed, match=r"loss is (nan|inf) at step \d+: lower --lr"):
        train_target(recipe(corpus, tmp_path / "diverged", steps=20, lr=1e30, warmup=0))


def test_schedule_follows_the_time_budget() -> None:
    cfg = OptimConfig(steps=100, lr=1.0, warmup=10, min_lr_ratio=0.1, time_budget_s=60.0)
    assert lr_at(20, cfg, elapsed_s=0.0) == pytest.approx(lr_at(20, OptimConfig(100, 1.0, 10, 0.1)))
    assert lr_at(20, cfg, elapsed_s=30.0) == pytest.approx(0.55)  # halfway in time: cosine midpoint
    assert lr_at(20, cfg, elapsed_s=90.0) == pytest.approx(0.1)
    assert lr_at(5, cfg, elapsed_s=90.0) == pytest.approx(0.6)  # warmup is step-based


def test_schedule_warms_up_then_decays() -> None:
    cfg = OptimConfig(steps=100, lr=1.0, warmup=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] >= 0.1


def test_target_training_lowers_loss_and_reloads(trained: tuple[Path, dict], corpus: Path) -> None:
    out, metrics = trained
    curve = losses(out)
    assert len(curve) == 20
    assert sum(curve[-5:]) / 5 < sum(curve[:5]) / 5 - 1.5, curve
    for name in ("config.json", "model.safetensors", "loss.png", "metrics.json", "manifest.json"):
        assert (out / name).is_file(), name
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_5_text"
    assert json.loads((out / "manifest.json").read_text())["config"]["steps"] == 20
    assert metrics["heldout_ppl"] < 260 / 4
    model = load_target(out)
    tok = load_tokenizer(out)
    assert isinstance(tok, ByteTokenizer)
    heldout = pack(tok, documents(corpus / "heldout.txt"), 32)[:4]
    assert evaluate(model, heldout, 4) == pytest.approx(metrics["heldout_loss"], abs=1e-6)


def test_fla_gdn_target_trains_and_reloads(corpus: Path, tmp_path: Path) -> None:
    metrics = train_target(recipe(corpus, tmp_path, arch="fla_gdn", layers=2, steps=10))
    curve = losses(tmp_path)
    assert sum(curve[-3:]) / 3 < sum(curve[:3]) / 3 - 0.5, curve
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gated_deltanet"
    model = load_target(tmp_path)
    assert model.config.num_attention_layers == 0
    heldout = pack(load_tokenizer(tmp_path), documents(corpus / "heldout.txt"), 32)[:4]
    assert evaluate(model, heldout, 4) == pytest.approx(metrics["heldout_loss"], abs=1e-6)


def test_same_seed_same_curve(corpus: Path, tmp_path: Path) -> None:
    args = ["target", "--corpus", str(corpus), "--steps", "4", "--batch-size", "2", "--seq-len", "16"]
    args += ["--device", "cpu", "--layers", "2", "--eval-sequences", "2"]
    result = CliRunner().invoke(train_app, [*args, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    kw = dict(steps=4, batch_size=2, seq_len=16, layers=2, eval_sequences=2, warmup=20, lr=3e-3)
    train_target(recipe(corpus, tmp_path / "b", **kw))
    train_target(recipe(corpus, tmp_path / "c", seed=1, **kw))
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    assert losses(tmp_path / "a") != losses(tmp_path / "c")


def test_dflash_training_is_lossless_and_reloads(
    trained: tuple[Path, dict], corpus: Path, tmp_path: Path
) -> None:
    target_dir, _ = trained
    metrics = train_dflash(
        DFlashRecipe(
            target=str(target_dir),
            corpus=str(corpus),
            out=str(tmp_path),
            block_size=4,
            prompts=6,
            prompt_len=12,
            gen_len=12,
            anchors=4,
            steps=12,
            batch_size=4,
            lr=3e-3,
            warmup=2,
            device="cpu",
            eval_prompts=2,
            eval_new_tokens=12,
        )  # fmt: skip
    )
    curve = losses(tmp_path)
    assert sum(curve[-3:]) / 3 < sum(curve[:3]) / 3 - 1.0, curve
    assert metrics["lossless"]  # and training gets more drafts accepted than a random drafter (block 4)
    assert 1.0 <= metrics["heldout_chain_mal_untrained"] < metrics["heldout_chain_mal"] <= 4, metrics
    drafter = load_dflash(tmp_path)
    assert drafter.config.block_size == 4 and drafter.config.mask_token_id == ByteTokenizer().mask_token_id
    target = load_target(target_dir, dtype=torch.float64)
    vocab = target.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 0)
    chain = build_route(
        {"kind": "dflash_chain", "drafter": str(tmp_path)}, vocab, "greedy", 0.0, 0, target=target
    )
    for prompt in ([116, 104, 101, 32], list(b"the dog ran to ")):
        ref = generate(target, prompt, ar, 20)
        got = generate(target, prompt, chain, 20)
        assert got.output_ids == ref.output_ids


def tiny_target_args(corpus: Path, out: Path) -> list[str]:
    """``repro train target`` with the smallest settings (a second or so on CPU)."""
    sizes = ["--steps", "2", "--batch-size", "2", "--seq-len", "16", "--layers", "1", "--hidden-size", "16"]
    return ["train", "target", "--corpus", str(corpus), "--out", str(out), *sizes, "--eval-sequences", "2",
            "--device", "cpu"]  # fmt: skip


def test_training_never_writes_into_a_folder_holding_files(monkeypatch, capsys, corpus: Path, tmp_path: Path):
    """A checkpoint is written only into a new or empty folder: one holding files (another checkpoint, a
    run's records, notes) is refused in one line, untouched."""
    from conftest import run_cli

    (tmp_path / "config.json").write_text('{"mine": 1}')
    code, _, err = run_cli(monkeypatch, capsys, *tiny_target_args(corpus, tmp_path))
    assert code == 2 and len(err.splitlines()) == 1 and str(tmp_path) in err and "config.json" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    assert (tmp_path / "config.json").read_text() == '{"mine": 1}'
    out = tmp_path / "new"
    assert run_cli(monkeypatch, capsys, *tiny_target_args(corpus, out))[0] == 0
    code, _, err = run_cli(monkeypatch, capsys, *tiny_target_args(corpus, out))  # its own, finished: kept too
    assert code == 2 and "model.safetensors" in err


def test_a_second_training_writer_is_refused(monkeypatch, capsys, corpus: Path, tmp_path: Path):
    """Two trainings into one folder: the second is refused while the first holds its lock."""
    import fcntl

    from conftest import run_cli

    with open(tmp_path / ".lock", "a+") as held:  # what a first writer holds (repro.reporting.rundir)
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = run_cli(monkeypatch, capsys, *tiny_target_args(corpus, tmp_path))
    assert code == 2 and "another repro process is writing" in err and len(err.splitlines()) == 1, err
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]
    assert run_cli(monkeypatch, capsys, *tiny_target_args(corpus, tmp_path))[0] == 0  # released: it writes


@pytest.mark.parametrize("where", ["data", "training"])
def test_a_failed_distillation_releases_its_out_folder(
    monkeypatch, trained: tuple[Path, dict], corpus: Path, tmp_path: Path, where: str
) -> None:
    """A drafter training that fails while making its data or while training releases the out-folder lock
    at once (not when the process ends): another writer may take the folder."""
    import fcntl

    import repro.train.dflash as dflash
    import repro.train.distill as distill

    def fail(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("planted")

    if where == "data":  # inside Distillation.start, after the folder was claimed
        monkeypatch.setattr(distill, "greedy_continuations", fail)
    else:  # inside train_dflash's with block
        monkeypatch.setattr(dflash, "target_features", fail)
    target_dir, _ = trained
    recipe = DFlashRecipe(
        target=str(target_dir), corpus=str(corpus), out=str(tmp_path), block_size=4, prompts=2, prompt_len=12,
        gen_len=12, anchors=2, steps=2, batch_size=2, device="cpu", eval_prompts=1, eval_new_tokens=4,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="planted") as failure:
        train_dflash(recipe)
    # the traceback is still held (as a caller handling the error holds it): its frames keep their locals
    with open(tmp_path / ".lock", "a+") as other:  # what a second writer takes (repro.reporting.rundir)
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while still held
    assert failure.traceback
