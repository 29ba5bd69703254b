"""The import rules of docs/architecture.md: each package imports only the packages below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package (a folder or a top-level module of repro/) -> the packages it may import; the table in
# docs/architecture.md says the same in words. The package face ``repro`` (its version, its folder)
# may be imported by any of them.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "options": {"errors"},
    "progress": {"errors"},
    "tree": {"errors"},
    "grid": set(),
    "triton_interpreter": set(),
    "gdn": {"errors", "grid"},
    "models": {"errors", "tree", "gdn"},
    "drafters": {"errors", "tree", "models", "grid"},
    "decoding": {"errors", "tree", "models", "drafters"},
    "data": {"errors", "models"},
    "reporting": {"errors"},
    "bench": {"errors", "tree", "gdn", "models", "decoding", "reporting", "progress", "options"},
    "engines": {"errors", "tree", "models", "drafters", "decoding", "data", "reporting"},
    "paper": {"errors", "reporting", "bench"},
    "harness": {
        "paper",
        "errors",
        "tree",
        "gdn",
        "models",
        "drafters",
        "decoding",
        "data",
        "reporting",
        "bench",
        "engines",
        "progress",
    },
    "train": {
        "paper",
        "errors",
        "tree",
        "gdn",
        "models",
        "drafters",
        "decoding",
        "data",
        "reporting",
        "harness",
        "progress",
        "options",
    },
    "cli": {
        "errors",
        "models",
        "decoding",
        "data",
        "reporting",
        "harness",
        "bench",
        "engines",
        "train",
        "options",
        "progress",
    },
    "__main__": {"cli"},
}


def package_of(module: str) -> str:
    """``repro.harness.runner`` -> ``harness``; ``repro`` itself -> ``repro``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "repro"


def imports(path: Path) -> set[str]:
    """The repro packages that one source file imports (at any depth of the file)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "repro":
            if node.module == "repro":
                found |= {"repro" if a.name == "__version__" else a.name for a in node.names}
            else:
                found.add(package_of(node.module))
        elif isinstance(node, ast.Import):
            found |= {package_of(a.name) for a in node.names if a.name.split(".")[0] == "repro"}
    return found


def sources() -> list[tuple[str, Path]]:
    out = []
    for path in sorted((ROOT / "repro").rglob("*.py")):
        rel = path.relative_to(ROOT / "repro")
        package = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if package != "__init__":
            out.append((package, path))
    return out


def test_every_package_has_a_rule():
    unknown = sorted({package for package, _ in sources()} - set(ALLOWED))
    assert not unknown, f"packages without an import rule (add them to docs/architecture.md): {unknown}"


@pytest.mark.parametrize("package,path", sources(), ids=lambda v: str(v).split("repro/")[-1])
def test_imports_follow_the_layers(package, path):
    bad = imports(path) - ALLOWED[package] - {package, "repro"}
    assert not bad, f"{path.relative_to(ROOT)} ({package}) imports {sorted(bad)}"


def test_the_rule_check_catches_an_upward_import(tmp_path):
    """Negative control: a models file importing the harness is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from repro.harness.runner import ExperimentRunner\nimport repro.train.common\n")
    assert imports(bad) - ALLOWED["models"] == {"harness", "train"}


def test_nothing_outside_train_imports_train():
    users = {package for package, rules in ALLOWED.items() if "train" in rules}
    assert users == {"cli"}


def test_every_package_has_a_row_in_the_doc():
    """docs/architecture.md's table names every package of ALLOWED (``name.py`` or ``name/``)."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`") for line in doc.splitlines() if line.startswith("| `")}
    named = {row.removesuffix(".py").removesuffix("/") for row in rows}
    missing = sorted(set(ALLOWED) - named - {"__main__"})
    assert not missing, f"packages without a row in docs/architecture.md: {missing}"
