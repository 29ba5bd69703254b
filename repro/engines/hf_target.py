"""Load a target checkpoint the way a transformers user would (``AutoModelForCausalLM``).

On CPU, transformers' Qwen3.5 module must bind its pure-torch GDN functions: where fla is installed
it binds fla's Triton kernels at import time instead, and those need a GPU. ``TargetRefused``
carries transformers' own reason when it cannot load or run a checkpoint. ``held_hf_target`` keeps
the last model loaded (per slot) across prompts: one load per run, not per prompt, on a real checkpoint.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import torch

from repro.engines.result import require
from repro.engines.serving import cached_engine
from repro.errors import describe

QWEN35_MODULE = "transformers.models.qwen3_5.modeling_qwen3_5"
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


class TargetRefused(Exception):
    """transformers cannot load (or run here) this checkpoint; ``str()`` is the reason."""


def torch_dtype(name: str) -> torch.dtype:
    from repro.errors import ConfigError

    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r} for an external engine: choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _first_sentence(text: str) -> str:
    head, sep, _ = text.partition(". ")
    return head + "." if sep else text


def _binds_fla(module: Any) -> bool:
    """Whether transformers' Qwen3.5 module bound fla's kernels (not its torch reference): the flag its hub
    wrapper closes over (``is_new_implementation``), a function's closure (transformers 5.17-5.24) or one
    wrapped in a ``kernels`` Func module (5.25 on)."""
    fn = getattr(module, "torch_chunk_gated_delta_rule", None)
    return bool(_closure_value(fn, "is_new_implementation"))


def _closure_value(obj: Any, name: str, depth: int = 4) -> Any:
    """``name``'s value in the closure of function ``obj``, else of the functions it closes over or of a
    torch module's ``forward``, searched ``depth`` levels deep; None where it is not found."""
    if depth < 0 or obj is None:
        return None
    if isinstance(obj, torch.nn.Module):
        return _closure_value(type(obj).forward, name, depth - 1)
    if not inspect.isfunction(obj):
        return None
    nonlocals = inspect.getclosurevars(obj).nonlocals
    if name in nonlocals:
        return nonlocals[name]
    inner = (_closure_value(v, name, depth - 1) for v in nonlocals.values() if callable(v))
    return next((v for v in inner if v is not None), None)


def import_qwen35_torch_path() -> Any:
    """transformers' Qwen3.5 modeling module, bound to its pure-torch GDN path when imported here."""
    require("transformers")
    if QWEN35_MODULE not in sys.modules:
        hidden = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "fla" or k.startswith("fla.")}
        sys.modules["fla"] = None  # type: ignore[assignment]  # `import fla` raises while the module binds
        try:
            __import__(QWEN35_MODULE)
        finally:
            del sys.modules["fla"]
            sys.modules.update(hidden)
    return sys.modules[QWEN35_MODULE]


def load_hf_target(target_dir: str | Path, dtype: str, device: str) -> tuple[Any, str]:
    """(model in eval mode, a note on how it was loaded); raises TargetRefused with the reason."""
    transformers = require("transformers")
    qwen35 = import_qwen35_torch_path()
    if device == "cpu" and _binds_fla(qwen35):
        raise TargetRefused(
            "transformers' Qwen3.5 module was bound to fla's Triton kernels before this check ran"
            " (they need a GPU); run in a fresh process"
        )
    load = transformers.AutoModelForCausalLM.from_pretrained
    try:
        model = load(str(target_dir), dtype=torch_dtype(dtype))
    except (ValueError, KeyError, OSError) as exc:
        reason = f"transformers cannot load {Path(target_dir).name}: {_first_sentence(describe(exc, 300))}"
        if device == "cpu" or importlib.util.find_spec("fla") is None:
            reason += " (fla registers fla formats, but its Triton kernels need a GPU)"
            raise TargetRefused(reason) from None
        importlib.import_module("fla")  # registers fla's architectures with the Auto classes
        try:
            model = load(str(target_dir), dtype=torch_dtype(dtype))
        except (ValueError, KeyError, OSError) as exc2:
            raise TargetRefused(f"{reason}; with fla: {_first_sentence(describe(exc2, 300))}") from None
    if device == "cpu" and type(model).__module__.startswith("fla."):
        model_type = getattr(model.config, "model_type", "?")
        raise TargetRefused(
            f"transformers cannot load {Path(target_dir).name} natively: model type `{model_type}` is"
            " registered by fla (imported in this process), whose model runs Triton kernels that need a GPU"
        )
    note = f"{type(model).__name__} via transformers {transformers.__version__}, {dtype} weights"
    if type(model).__module__ == QWEN35_MODULE:
        note += "; GDN core, gates and norms computed in float32 inside transformers' torch path"
    return model.to(device).eval(), note


def held_hf_target(
    target_dir: str | Path, dtype: str, device: str, slot: str = "target", noise: float = 0.0
) -> tuple[Any, str]:
    """``load_hf_target``, kept across calls while (directory, dtype, device, noise) stay the same;
    ``slot`` separates models held at once (a target and its assistant). The loops only read the weights.
    ``noise`` > 0: every floating weight times 1 + noise N(0, 1) (seed 0; :func:`perturb`)."""
    key = (str(Path(target_dir).resolve()), dtype, device, noise)

    def start() -> tuple[Any, str]:
        model, note = load_hf_target(target_dir, dtype, device)
        if noise > 0:
            perturb(model, noise)
            note += f"; {perturbed(noise)}"
        return model, note

    return cached_engine(f"transformers-{slot}", key, start, lambda _: None)


def perturbed(noise: float) -> str:
    """How :func:`perturb` changed a model's weights, for the notes."""
    return f"weights perturbed by {noise:g} N(0, 1) relative noise (seed 0)"


def perturb(model: torch.nn.Module, noise: float, seed: int = 0) -> None:
    """Every floating parameter of ``model`` times 1 + ``noise`` N(0, 1), in place, from a CPU generator
    seeded with ``seed`` in parameter order (the same model and seed: the same weights)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                z = torch.randn(p.shape, generator=gen, dtype=torch.float64)
                p.mul_((1 + noise * z).to(p.device, p.dtype))
