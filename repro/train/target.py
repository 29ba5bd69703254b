"""`repro train target`: a tiny GDN target trained from scratch on the corpus.

Documents (``train.txt`` / ``heldout.txt``, separated by ``<|endoftext|>``) are tokenized, each
followed by the separator token, concatenated and cut into windows of ``seq_len + 1`` tokens
(stride ``seq_len``); each window is one sequence evaluated from an empty state, and the loss is
next-token cross-entropy over its ``seq_len`` predictions. The model runs through
``HybridLM.forward_train``, i.e. the very layer code that verifies draft trees at decode time.

Architectures: ``qwen35`` (Qwen3.5 layout: 3 GDN layers per gated-attention layer, written in the
transformers format) and ``fla_gdn`` (pure GDN, written in flash-linear-attention's format).
The output directory is a checkpoint that ``repro run --target DIR`` loads, with the tokenizer
files beside the weights, plus ``train_log.jsonl``, ``loss.png``, ``metrics.json`` and
``manifest.json``.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from repro.data.corpus import SEPARATOR
from repro.data.corpus_tokens import documents, encode_document, special_id
from repro.errors import ConfigError
from repro.models.config import GDN, HybridConfig
from repro.models.default import init_random_weights, tiny_config
from repro.models.hybrid import HybridLM
from repro.models.loading import save_target
from repro.models.tokenizer import (
    Tokenizer,
    load_tokenizer,
    write_byte_tokenizer_marker,
)
from repro.reporting.records import write_json
from repro.train.common import (
    LOSS_FIGURE,
    TrainRecipe,
    at_least,
    fast_gdn_backend,
    plot_loss,
    resolve_train_device,
    round_weights,
    save_dtype,
    seed_everything,
    train_loop,
    write_manifest,
)

ARCHS = ("qwen35", "fla_gdn")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


@dataclass(kw_only=True)
class TargetRecipe(TrainRecipe):
    """Everything that decides a target training run (recorded whole in manifest.json)."""

    corpus: str
    tokenizer: str | None = None  # a trained tokenizer dir; None = the byte-level ChatML tokenizer
    arch: str = "qwen35"
    layers: int = 4
    hidden_size: int = 64
    seq_len: int = 128
    eval_sequences: int = 64
    max_train_tokens: int | None = None
    tie_embeddings: bool = False
    steps: int = 200
    batch_size: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        at_least(self, 1, "layers", "hidden_size", "seq_len", "eval_sequences")
        if self.max_train_tokens is not None and self.max_train_tokens <= self.seq_len:
            raise ConfigError(
                f"max_train_tokens must exceed seq_len {self.seq_len} (one training window), got"
                f" {self.max_train_tokens}"
            )
        super().__post_init__()


# ----- data -----


def pack(tok: Tokenizer, docs: list[str], seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """Windows [N, seq_len + 1] (stride seq_len) of the documents, each followed by the separator."""
    sep = special_id(tok, SEPARATOR)
    stream: list[int] = []
    for doc in docs:
        stream += encode_document(tok, doc) + [sep]
        if max_tokens is not None and len(stream) >= max_tokens:
            break
    ids = torch.tensor(stream[: max_tokens or None], dtype=torch.long)
    n = (ids.numel() - 1) // seq_len
    if n < 1:
        raise ConfigError(f"the corpus holds {ids.numel()} tokens: too few for one sequence of {seq_len}")
    return ids[: n * seq_len + 1].unfold(0, seq_len + 1, seq_len)


# ----- model -----


def target_config(
    arch: str, vocab_size: int, layers: int, hidden: int, eos: list[int], tie: bool = False
) -> HybridConfig:
    """``tiny_config`` scaled to width ``hidden`` (head dims hidden / 4); ``fla_gdn``: pure GDN;
    ``tie``: the LM head shares the embedding matrix."""
    if arch not in ARCHS:
        raise ConfigError(f"unknown arch {arch!r}: choose one of {', '.join(ARCHS)}")
    if hidden % 8:
        raise ConfigError(f"hidden size {hidden} must be a multiple of 8")
    head = hidden // 4
    cfg = dataclasses.replace(
        tiny_config(vocab_size, layers),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        linear_key_head_dim=head,
        linear_value_head_dim=head,
        head_dim=head,
        eos_token_id=list(eos),
        tie_word_embeddings=tie,
    )
    if arch == "fla_gdn":
        cfg = dataclasses.replace(
            cfg, layer_types=[GDN] * layers, zero_centered_norm=False, source_format="fla_gdn"
        )
    return cfg


def sequence_loss(model: HybridLM, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of windows [B, L + 1]."""
    logits = model.forward_train(batch[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


@torch.no_grad()
def evaluate(model: HybridLM, windows: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats) over ``windows``."""
    total, count = 0.0, 0
    for start in range(0, windows.shape[0], batch_size):
        batch = windows[start : start + batch_size].to(model.device)
        total += float(sequence_loss(model, batch)) * batch.shape[0]
        count += batch.shape[0]
    return total / count


def copy_tokenizer(tokenizer_dir: str | None, out: Path) -> None:
    """Put the tokenizer beside the weights so that ``load_tokenizer(out)`` finds it."""
    if tokenizer_dir is None:
        write_byte_tokenizer_marker(out)
        return
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            shutil.copyfile(src, out / name)


def train_target(recipe: TargetRecipe) -> dict[str, Any]:
    """Train, evaluate and write the checkpoint; returns the metrics written to metrics.json."""
    with recipe.claim_out():  # the out folder locked until the checkpoint is written, or training fails
        return _train_target(recipe, time.perf_counter())


def _train_target(recipe: TargetRecipe, t_start: float) -> dict[str, Any]:
    out = Path(recipe.out)
    device = resolve_train_device(recipe.device)
    gen = seed_everything(recipe.seed)
    tok = load_tokenizer(recipe.tokenizer)
    corpus = Path(recipe.corpus)
    train = pack(tok, documents(corpus / "train.txt"), recipe.seq_len, recipe.max_train_tokens)
    heldout = pack(tok, documents(corpus / "heldout.txt"), recipe.seq_len)[: recipe.eval_sequences]
    cfg = target_config(
        recipe.arch, tok.vocab_size, recipe.layers, recipe.hidden_size, list(tok.stop_token_ids),
        recipe.tie_embeddings,
    )  # fmt: skip
    dtype = save_dtype(recipe.save_dtype)
    model = init_random_weights(HybridLM(cfg), recipe.seed)
    if recipe.tie_embeddings:  # the shared matrix is also the LM head: logits start at unit scale
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(recipe.hidden_size**-0.5)
    model = fast_gdn_backend(model.to(device).train())

    def step_fn(step: int) -> tuple[torch.Tensor, int]:
        idx = torch.randint(0, train.shape[0], (recipe.batch_size,), generator=gen)
        batch = train[idx].to(device)
        return sequence_loss(model, batch), batch.shape[0] * recipe.seq_len

    log = train_loop(model, step_fn, recipe.optim(), out, device)
    model.eval()
    heldout_loss = evaluate(round_weights(model, dtype), heldout, recipe.batch_size)
    save_target(model, out, dtype=dtype)
    copy_tokenizer(recipe.tokenizer, out)
    plot_loss(log, out / LOSS_FIGURE, f"target {recipe.arch} ({recipe.layers}x{recipe.hidden_size})")
    metrics = {
        "heldout_loss": heldout_loss,
        "heldout_ppl": float(torch.tensor(heldout_loss).exp()),
        "heldout_sequences": int(heldout.shape[0]),
        "train_sequences": int(train.shape[0]),
        "first_loss": log[0]["loss"],
        "final_loss": log[-1]["loss"],
        "tokens_seen": log[-1]["tokens"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps_run": log[-1]["step"] + 1,
        "wall_s": time.perf_counter() - t_start,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
    }
    write_json(out / "metrics.json", metrics)
    write_manifest(out, {"recipe": "target", **dataclasses.asdict(recipe)}, recipe.seed)
    return metrics
