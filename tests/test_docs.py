"""The user's path through the docs: every `repro ...` command line they show names commands and options
that exist, every relative link resolves and every dated results folder they cite is committed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from repro.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
        "runbooks/nightly-h100.md"]  # fmt: skip
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
START = re.compile(r"(?:^|(?<=[\s/]))repro (?=[a-z\"-])")


def command_lines(text: str) -> list[str]:
    """`repro ...` command lines: in fenced code blocks (continuation lines joined, comments dropped)
    and in inline code spans that start with `repro `."""
    found: list[str] = []
    fenced = after_command = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, after_command = not fenced, False
            continue
        if not fenced:
            found += re.findall(r"`(repro [^`]+)`", line)
            continue
        code = line.split(" #")[0].rstrip().removesuffix("\\")
        if after_command and code[:1] == " " and code.lstrip()[:1] in ("[", "-", "|"):
            found[-1] += " " + code.strip()  # an indented continuation of the command above
            continue
        match = START.search(code)
        after_command = match is not None
        if match:
            found.append(code[match.start() :])
    return found


def unknown_options(line: str) -> list[str]:
    """What in one command line names no command or option of the CLI (empty when all exist)."""
    root = typer.main.get_command(app)
    problems = []
    group, cmd = root, root
    for k, segment in enumerate(line.split(" | ")):
        tokens = segment.split()[1:] if k == 0 else segment.split()
        if k > 0 and tokens and hasattr(group, "commands") and tokens[0] in group.commands:
            cmd = group  # `repro family list | install | report`: the next alternative of the group
        i = 0
        while hasattr(cmd, "commands") and i < len(tokens) and not tokens[i].startswith("-"):
            name = tokens[i].split("|")[0]
            if name not in cmd.commands:
                if re.fullmatch(r"[a-z][a-z0-9-]*", name):
                    problems.append(f"no command {name!r}")
                break
            group, cmd, i = cmd, cmd.commands[name], i + 1
        known = {opt for param in cmd.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
        problems += [
            f"{cmd.name} has no {opt}" for opt in OPTION.findall(" ".join(tokens[i:])) if opt not in known
        ]
    return problems


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_line_names_existing_commands_and_options(doc):
    lines = command_lines((ROOT / doc).read_text(encoding="utf-8"))
    assert lines or doc in ("docs/metrics.md", "docs/architecture.md")
    bad = {line: problems for line in lines if (problems := unknown_options(line))}
    assert not bad, f"{doc}: {bad}"


def test_the_check_finds_a_renamed_option_and_an_unknown_command():
    """Negative control: a renamed option, a removed subcommand and a wrong alternative are reported."""
    lines = command_lines(
        "```bash\nrepro bench model --shape tiny   # comment --ignored\n  [--no-such]\n```\n"
        "`repro falsify pool-masses` and `repro family list | report --nope`\n"
    )
    assert [unknown_options(line) for line in lines] == [
        ["model has no --shape", "model has no --no-such"],
        ["no command 'pool-masses'"],
        ["report has no --nope"],
    ]


@pytest.mark.parametrize("doc", DOCS)
def test_links_resolve_and_cited_results_folders_exist(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    base = (ROOT / doc).parent
    links = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if not t.startswith("http")]
    cited = {p.rstrip(".,") for p in re.findall(r"results/20\d\d-\d\d-\d\d-[\w.-]+(?:/[\w.-]+)*", text)}
    missing = [t for t in links if not (base / t).exists()] + [p for p in cited if not (ROOT / p).exists()]
    assert not missing, f"{doc} points at what does not exist: {missing}"
