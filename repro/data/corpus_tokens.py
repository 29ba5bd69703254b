"""The training corpus as token ids: ChatML specials, documents, seeded prompt windows (used by the
drafter recipes and by the held-out evaluation of the family)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from repro.data.corpus import SEPARATOR, read_documents
from repro.errors import ConfigError
from repro.models.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer


def special_id(tok: Tokenizer, name: str) -> int:
    """Id of a ChatML special token (``<|endoftext|>``, ``<|mask|>``, ...) in either tokenizer."""
    if isinstance(tok, ByteTokenizer):
        return tok.special_ids[name]
    if isinstance(tok, HFTokenizer):
        tid = tok.tok.convert_tokens_to_ids(name)
        if isinstance(tid, int) and tid != tok.tok.unk_token_id:
            return tid
    raise ConfigError(f"tokenizer {tok.name} has no {name} token")


def encode_document(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of a corpus document; ChatML specials in the text become their special ids."""
    if not isinstance(tok, ByteTokenizer):
        return tok.encode(text)
    pattern = "(" + "|".join(re.escape(s) for s in tok.special_ids) + ")"
    ids: list[int] = []
    for part in re.split(pattern, text):
        ids += [tok.special_ids[part]] if part in tok.special_ids else tok.encode(part)
    return ids


def documents(path: Path) -> list[str]:
    """Non-blank documents of a corpus file (``train.txt`` / ``heldout.txt``)."""
    if not path.is_file():
        raise ConfigError(f"corpus file {path} does not exist: build it with `repro data corpus`")
    return [d for d in read_documents(path) if d.strip()]


def corpus_prompts(
    tok: Tokenizer, docs: list[str], count: int, length: int, gen: torch.Generator
) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens: windows at seeded random offsets of the documents."""
    sep = special_id(tok, SEPARATOR)
    stream = torch.tensor([t for d in docs for t in encode_document(tok, d) + [sep]], dtype=torch.long)
    if stream.numel() <= length:
        raise ConfigError(f"the corpus holds {stream.numel()} tokens: too few for prompts of {length}")
    starts = torch.randint(0, stream.numel() - length, (count,), generator=gen)
    return [stream[s : s + length].tolist() for s in starts.tolist()]
