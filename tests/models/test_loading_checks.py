"""Checkpoint checks: weight names against config.json, config errors named as such, tokenizers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repro.errors import CheckpointError
from repro.models.default import build_default_target
from repro.models.family import FAMILY_DIR
from repro.models.loading import load_target, save_target
from repro.models.target import open_target
from repro.models.tokenizer import HFTokenizer, load_tokenizer, write_byte_tokenizer_marker


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    save_target(build_default_target(seed=0), path)
    write_byte_tokenizer_marker(path)
    return path


def edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_fewer_layers_in_config_than_in_the_weights_is_refused(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    edit_config(ckpt, num_hidden_layers=n - 1, layer_types=cfg["layer_types"][: n - 1])
    with pytest.raises(CheckpointError, match=r"\(its config.json\) lacks: model.layers") as err:
        load_target(ckpt)
    assert f"model.layers.{n - 1}." in str(err.value) and "more)" in str(err.value)


def test_a_missing_weight_is_refused_by_name(ckpt):
    weights = load_file(str(ckpt / "model.safetensors"))
    weights.pop("model.norm.weight")
    save_file(weights, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match="is incomplete: missing model.norm.weight"):
        load_target(ckpt)


def test_a_stray_weight_is_refused(ckpt):
    weights = load_file(str(ckpt / "model.safetensors"))
    weights["model.extra.weight"] = torch.zeros(2)
    save_file(weights, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lacks: model.extra.weight"):
        load_target(ckpt)


def test_config_errors_are_checkpoint_config_errors_not_tokenizer_errors(tmp_path):
    ckpt = tmp_path / "hf"
    ckpt.mkdir()
    for f in (FAMILY_DIR / "tiny-qwen35").iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    (ckpt / "config.json").write_text("{bad")
    with pytest.raises(CheckpointError) as err:
        load_tokenizer(ckpt)
    assert "config.json is not valid JSON" in str(err.value) and "tokenizer" not in str(err.value)


def test_loading_in_bfloat16_gives_bfloat16_weights(ckpt):
    model = load_target(ckpt, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ref = load_target(ckpt, dtype=torch.float32)
    assert torch.equal(model.model.norm.weight, ref.model.norm.weight.to(torch.bfloat16))


def test_prompt_ids_need_no_tokenizer(ckpt):
    (ckpt / "repro_tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="has no tokenizer"):
        open_target(str(ckpt))
    model, tok = open_target(str(ckpt), need_tokenizer=False)
    want = load_target(ckpt)  # the same weights as with a tokenizer
    assert tok is None and torch.equal(model.model.embed_tokens.weight, want.model.embed_tokens.weight)


def test_ids_beyond_a_smaller_tokenizer_decode_as_visible_placeholders():
    tok = HFTokenizer(FAMILY_DIR / "tiny-qwen35")
    ids = tok.encode("hello world")
    text = tok.decode([*ids, tok.vocab_size + 3, *ids])
    assert text == f"hello world<|id:{tok.vocab_size + 3}|>hello world"


def test_weights_stacked_by_a_decoder_are_written_each_on_its_own(tmp_path):
    """A static decoder makes the model's projections views of one stacked matrix; safetensors refuses
    tensors that share memory, so write_weights copies those, and they read back equal."""
    from repro.models.loading import write_weights
    from repro.models.static_layers import stacked_mlp

    model = build_default_target()
    for layer in model.model.layers:
        stacked_mlp(layer, True)  # as a fused decoder does: gate_proj and up_proj views of gate|up
    gate = model.model.layers[0].mlp.gate_proj.weight
    assert gate.untyped_storage().nbytes() > gate.numel() * gate.element_size()
    state = model.state_dict()
    back = load_file(str(write_weights(state, tmp_path / "w.safetensors")))
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], v) for k, v in state.items())
