"""``repro family install``: every name and run folder checked before anything is written, each member
copied aside and renamed into place, an existing member replaced only with --force."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli as cli

from repro.models import family


def _trained(runs: Path, name: str, weights: bytes = b"weights") -> Path:
    """A training run's output folder ``runs/name`` as scripts/gpu_train.sh leaves it."""
    src = runs / name
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps({"name": name}))
    (src / "model.safetensors").write_bytes(weights)
    (src / "metrics.json").write_text(json.dumps({"heldout_ppl": 9.5}))
    manifest = {"config": {"recipe": "target"}, "seed": 0, "git_sha": "a" * 40, "device": "cpu"}
    (src / "manifest.json").write_text(json.dumps(manifest))
    (src / "train.log").write_text("not shipped\n")
    return src


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def dest(tmp_path, monkeypatch) -> Path:
    """An installed family of one member, made the family folder the CLI installs into."""
    folder = tmp_path / "family"
    monkeypatch.setattr(family, "FAMILY_DIR", folder)
    _trained(tmp_path / "first", "tiny-a")
    family.install(tmp_path / "first", ["tiny-a"], dest=folder)
    return folder


def test_a_bad_name_in_the_middle_installs_nothing(monkeypatch, capsys, tmp_path, dest):
    runs = tmp_path / "runs"
    _trained(runs, "tiny-b")
    _trained(runs, "tiny-c")
    (runs / "tiny-half").mkdir()  # a run that stopped before writing its checkpoint
    (runs / "tiny-half" / "config.json").write_text("{}")
    _trained(tmp_path, "outside")
    before = _tree(dest)
    cases = {
        "tiny-missing does not exist": ["tiny-b", "tiny-missing", "tiny-c"],
        "tiny-half is not a trained checkpoint (no model.safetensors)": ["tiny-b", "tiny-half", "tiny-c"],
        "'../outside' is not a member name": ["tiny-b", "../outside", "tiny-c"],
        "tiny-b is named twice": ["tiny-b", "tiny-c", "tiny-b"],
    }
    for why, names in cases.items():
        code, out, err = cli(monkeypatch, capsys, "family", "install", str(runs), *names)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, (names, err)
        assert why in err and "nothing was installed" in err, err
        assert _tree(dest) == before, names
    assert not (tmp_path / "outside" / "tiny-b").exists()


def test_an_installed_member_is_replaced_only_with_force(monkeypatch, capsys, tmp_path, dest):
    runs = tmp_path / "runs"
    _trained(runs, "tiny-a", b"retrained weights")
    _trained(runs, "tiny-b")
    before = _tree(dest)
    code, out, err = cli(monkeypatch, capsys, "family", "install", str(runs), "tiny-b", "tiny-a")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "tiny-a is already installed" in err and "--force" in err
    assert _tree(dest) == before  # neither tiny-a overwritten nor tiny-b installed
    code, out, err = cli(monkeypatch, capsys, "family", "install", str(runs), "tiny-b", "tiny-a", "--force")
    assert code == 0, err
    assert (dest / "tiny-a" / "model.safetensors").read_bytes() == b"retrained weights"
    assert sorted(p.name for p in dest.iterdir()) == ["family.json", "tiny-a", "tiny-b"]  # nothing left aside
    assert sorted(p.name for p in (dest / "tiny-b").iterdir()) == sorted(
        ["config.json", "model.safetensors", "metrics.json", "manifest.json"]
    )
    index = json.loads((dest / "family.json").read_text())
    assert index["members"]["tiny-a"]["bytes"] == sum(f.stat().st_size for f in (dest / "tiny-a").iterdir())
    assert "family: tiny-a, tiny-b" in out


def test_force_does_not_replace_what_is_not_a_member(monkeypatch, capsys, tmp_path, dest):
    (dest / "tiny-b").mkdir()
    (dest / "tiny-b" / "notes.txt").write_text("mine\n")
    before = _tree(dest)
    code, _, err = cli(monkeypatch, capsys, "family", "install", str(tmp_path / "runs"), "tiny-b", "--force")
    assert code == 2 and "does not exist" in err  # no run folder yet
    _trained(tmp_path / "runs", "tiny-b")
    code, _, err = cli(monkeypatch, capsys, "family", "install", str(tmp_path / "runs"), "tiny-b", "--force")
    assert code == 2 and "is not a family member" in err and _tree(dest) == before


def test_a_failed_copy_installs_nothing_and_leaves_no_temporary_folder(monkeypatch, capsys, tmp_path, dest):
    runs = tmp_path / "runs"
    _trained(runs, "tiny-b")
    _trained(runs, "tiny-c")
    before = _tree(dest)
    copy = shutil.copyfile

    def full_disk(src, dst, *args, **kwargs):
        if Path(src).parent.name == "tiny-c" and Path(src).name == "model.safetensors":
            raise OSError(28, "No space left on device", str(dst))
        return copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    code, _, err = cli(monkeypatch, capsys, "family", "install", str(runs), "tiny-b", "tiny-c")
    assert code == 2 and "No space left on device" in err and "nothing was installed" in err
    assert _tree(dest) == before and sorted(p.name for p in dest.iterdir()) == ["family.json", "tiny-a"]


def test_the_budget_is_checked_before_copying(monkeypatch, capsys, tmp_path, dest):
    runs = tmp_path / "runs"
    _trained(runs, "tiny-b", b"x" * 200)
    before = _tree(dest)
    monkeypatch.setattr(family, "SIZE_BUDGET_BYTES", 150)
    code, _, err = cli(monkeypatch, capsys, "family", "install", str(runs), "tiny-b")
    assert code == 2 and "over its 150-byte budget" in err and _tree(dest) == before
