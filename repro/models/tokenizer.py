"""Tokenizers behind one small interface: a byte-level one for the embedded default, and
transformers' tokenizers for real checkpoints (with their chat templates)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from repro.errors import CheckpointError
from repro.models.family import resolve_checkpoint

CHAT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    stop_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation, ending with the assistant's generation prompt."""
        ...


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus ChatML specials; the chat template is ChatML."""

    name = "byte-chatml"

    def __init__(self) -> None:
        self.special_ids = {tok: 256 + i for i, tok in enumerate(CHAT_SPECIALS)}
        self.vocab_size = 256 + len(CHAT_SPECIALS)
        self.stop_token_ids = (self.special_ids["<|im_end|>"], self.special_ids["<|endoftext|>"])
        self.mask_token_id = self.special_ids["<|mask|>"]

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        names = {v: k for k, v in self.special_ids.items()}
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            out.append(names.get(i, f"<|{i}|>"))
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        start, end = self.special_ids["<|im_start|>"], self.special_ids["<|im_end|>"]
        ids: list[int] = []
        for m in messages:
            ids += [start, *self.encode(f"{m['role']}\n{m['content']}"), end, *self.encode("\n")]
        return ids + [start, *self.encode("assistant\n")]


class HFTokenizer:
    """A transformers tokenizer loaded from a local checkpoint directory."""

    def __init__(self, path: str | Path) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise CheckpointError(
                "loading a checkpoint's tokenizer needs transformers: pip install transformers"
            ) from None
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # an fla config.json draws a "model of type" warning: noise here
        try:
            self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:
            raise CheckpointError(
                f"cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}"
            ) from None
        finally:
            hf_logging.set_verbosity(verbosity)
        self.name = Path(path).name
        self.vocab_size = len(self.tok)
        stops = {self.tok.eos_token_id} if self.tok.eos_token_id is not None else set()
        for t in ("<|im_end|>", "<|endoftext|>"):
            tid = self.tok.convert_tokens_to_ids(t)
            if isinstance(tid, int) and tid != self.tok.unk_token_id:
                stops.add(tid)
        self.stop_token_ids = tuple(sorted(stops))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``; an id the tokenizer lacks (a model vocabulary padded past the tokenizer)
        shows as ``<|id:N|>`` instead of vanishing or raising."""
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            if 0 <= i < self.vocab_size:
                run.append(i)
                continue
            out += [self.tok.decode(run), f"<|id:{i}|>"]
            run = []
        return "".join(out + [self.tok.decode(run)])

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        if getattr(self.tok, "chat_template", None):
            ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)  # a BatchEncoding is a Mapping
        text = "\n\n".join(m["content"] for m in messages)
        return self.encode(text)


BYTE_TOKENIZER_MARKER = "repro_tokenizer.json"


def load_tokenizer(path: str | Path | None, optional: bool = False) -> Tokenizer | None:
    """The checkpoint's own tokenizer, or the byte-level one (embedded default, or a checkpoint
    directory that carries a ``repro_tokenizer.json`` marker); ``None`` for a checkpoint without
    tokenizer files when ``optional``."""
    if path is None:
        return ByteTokenizer()
    path = resolve_checkpoint(path, "tokenizer checkpoint")
    if (path / "config.json").exists():  # transformers reads it too: report its errors as the checkpoint's
        from repro.models.loading import read_json_config

        read_json_config(path, "the")
    if any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return HFTokenizer(path)
    if (path / BYTE_TOKENIZER_MARKER).exists():
        return ByteTokenizer()
    if optional:
        return None
    raise CheckpointError(
        f"checkpoint {path} has no tokenizer (tokenizer.json / tokenizer_config.json); copy the model's "
        "tokenizer files into it"
    )


def write_byte_tokenizer_marker(path: str | Path) -> None:
    """Mark a checkpoint directory as using the byte-level ChatML tokenizer."""
    marker = {"type": "byte-chatml", "vocab_size": ByteTokenizer().vocab_size}
    (Path(path) / BYTE_TOKENIZER_MARKER).write_text(json.dumps(marker) + "\n")
