"""A small byte-level BPE tokenizer trained on the corpus's train split with the ``tokenizers`` library.

- Special tokens at fixed ids, whatever the vocabulary size: ``<|endoftext|>`` 0 (document
  separator), ``<|im_start|>`` 1, ``<|im_end|>`` 2 (end of a chat turn, the eos), ``<|mask|>`` 3
  (DFlash's mask token), ``<|pad|>`` 4; then the 256 byte symbols, then merges.
- Pre-tokenization: Qwen2's split regex (single digits, letter runs, punctuation runs, newlines,
  space runs) and GPT-2's byte-to-unicode mapping; no normalizer. Every string encodes and decodes
  back to itself (every byte is in the vocabulary).
- ``tokenizer_config.json`` carries a ChatML chat template identical to the byte-level default's
  (``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per turn, ``<|im_start|>assistant\\n`` to
  generate), so ``AutoTokenizer.from_pretrained(dir)`` and ``repro.models.tokenizer.HFTokenizer(dir)``
  load it.

Determinism: the BPE trainer of ``tokenizers`` has no randomness; its known source of
run-to-run differences (hash-map order deciding the ids of continuing-subword tokens, which then
break ties between merges: huggingface/tokenizers#1794) needs ``continuing_subword_prefix`` or
``end_of_word_suffix``, which this tokenizer does not use; the byte alphabet is given explicitly
and merge ties are broken by pair ids. Training the same corpus twice, in separate processes and
with 1 or many threads, gave byte-identical ``tokenizer.json`` files (tokenizers 0.23.3).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from repro.data.corpus import SPECIAL_TOKENS, CorpusError, load_manifest, read_documents

# Qwen2's pre-tokenizer split (digits one by one).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
STATS_NAME = "tokenizer_stats.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pieces(docs: list[str]) -> Iterator[str]:
    """Document text between special tokens (the trainer never sees a special token's characters)."""
    for doc in docs:
        parts = [doc]
        for special in SPECIAL_TOKENS:
            parts = [q for p in parts for q in p.split(special)]
        yield from (p for p in parts if p)


def new_tokenizer() -> Any:
    """An untrained byte-level BPE tokenizer with this module's pre-tokenizer and decoder."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def tokenizer_config() -> dict[str, Any]:
    """The ``tokenizer_config.json`` that makes transformers load ``tokenizer.json`` with ChatML."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|pad|>",
        "mask_token": "<|mask|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
        "chat_template": CHAT_TEMPLATE,
    }


def compression_stats(tok: Any, corpus_dir: Path, split: str = "heldout") -> dict[str, Any]:
    """UTF-8 bytes per token of a split, overall and per document kind, and whether it round-trips."""
    docs = read_documents(corpus_dir / f"{split}.txt")
    kinds: list[str] = []
    tsv = corpus_dir / "documents.tsv"
    if tsv.is_file():
        rows = [ln.split("\t") for ln in tsv.read_text(encoding="utf-8").splitlines()[1:] if ln]
        kinds = [r[2] for r in rows if r[0] == split]
    if len(kinds) != len(docs):
        kinds = ["all"] * len(docs)
    encs = tok.encode_batch(docs)
    per: dict[str, list[int]] = {}
    lossless = True
    for doc, enc, kind in zip(docs, encs, kinds):
        acc = per.setdefault(kind, [0, 0, 0])
        acc[0] += 1
        acc[1] += len(doc.encode("utf-8"))
        acc[2] += len(enc.ids)
        lossless = lossless and tok.decode(enc.ids, skip_special_tokens=False) == doc
    total_bytes = sum(v[1] for v in per.values())
    total_tokens = sum(v[2] for v in per.values())
    return {
        "split": split,
        "documents": len(docs),
        "bytes": total_bytes,
        "tokens": total_tokens,
        "bytes_per_token": round(total_bytes / max(total_tokens, 1), 4),
        "by_kind": {
            k: {"documents": d, "bytes": b, "tokens": t, "bytes_per_token": round(b / max(t, 1), 4)}
            for k, (d, b, t) in sorted(per.items())
        },
        "lossless": lossless,
    }


def suite_stats(tok: Any) -> dict[str, dict[str, Any]]:
    """Bytes per token on each benchmark suite's formatted prompts (measured, never trained on)."""
    from repro.data.suites import SUITES, load_suite

    out = {}
    for name in SUITES:
        turns = [t for p in load_suite(name) for t in p.turns]
        n_bytes = sum(len(t.encode("utf-8")) for t in turns)
        n_tokens = sum(len(e.ids) for e in tok.encode_batch(turns))
        out[name] = {"turns": len(turns), "bytes": n_bytes, "tokens": n_tokens,
                     "bytes_per_token": round(n_bytes / max(n_tokens, 1), 4)}  # fmt: skip
    return out


def train_tokenizer(
    corpus_dir: str | Path, out_dir: str | Path, vocab_size: int = 4096, min_frequency: int = 2
) -> Path:
    """Train the tokenizer on ``corpus_dir/train.txt`` and write ``tokenizer.json``,
    ``tokenizer_config.json`` and ``tokenizer_stats.json`` (bytes per token on the heldout split and on
    the suites' prompts) to ``out_dir``."""
    try:
        from tokenizers import pre_tokenizers, trainers
    except ImportError:
        raise CorpusError(
            "training a tokenizer needs the tokenizers package: pip install tokenizers"
        ) from None
    corpus = Path(corpus_dir)
    manifest = load_manifest(corpus)
    base = len(SPECIAL_TOKENS) + 256
    if vocab_size <= base:
        raise CorpusError(f"vocab_size must exceed {base} (specials and the 256 bytes), got {vocab_size}")
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_pieces(read_documents(corpus / "train.txt")), trainer=trainer)
    for i, special in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(special) != i:
            raise CorpusError(f"{special} got id {tok.token_to_id(special)}, expected {i}")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=True)
    config = json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    (out / "tokenizer_config.json").write_text(config, encoding="utf-8")
    stats = {
        "vocab_size": tok.get_vocab_size(),
        "requested_vocab_size": vocab_size,
        "min_frequency": min_frequency,
        "special_tokens": {s: i for i, s in enumerate(SPECIAL_TOKENS)},
        "corpus_train_sha256": manifest["files"]["train.txt"]["sha256"],
        "tokenizer_json_sha256": _sha256((out / "tokenizer.json").read_bytes()),
        "heldout": compression_stats(tok, corpus, "heldout"),
        "suite_prompts": suite_stats(tok),
    }
    (out / STATS_NAME).write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return out
