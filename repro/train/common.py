"""What every training recipe shares: seeding, the optimiser and schedule, the loop, logs, figures.

The loop is AdamW with linear warmup then cosine decay to ``min_lr_ratio * lr``, global-norm
gradient clipping, and (CUDA only) bf16 autocast; every ``log_every`` steps one JSON line
(step, loss, lr, grad norm, tokens, tokens/s) goes to ``train_log.jsonl``. The same seed gives
the same batches and, on CPU, the same loss curve bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn

from repro.errors import CheckFailed, ConfigError, RunDirError
from repro.harness.experiment import check_weight_seed
from repro.progress import Progress
from repro.reporting.records import build_manifest, write_json
from repro.reporting.rundir import lock_dir, not_empty, os_error

PRECISIONS = ("fp32", "bf16")
LOG_FILE = "train_log.jsonl"
LOSS_FIGURE = "loss.png"


@dataclass
class OptimConfig:
    """Optimiser, schedule and loop settings of one run."""

    steps: int
    lr: float
    warmup: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: str = "fp32"
    log_every: int = 1
    time_budget_s: float | None = None  # stop early (logged) once the loop has run this long

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr}")
        at_least(self, 0, "warmup")
        at_least(self, 1, "log_every")
        if self.time_budget_s is not None and not (
            math.isfinite(self.time_budget_s) and self.time_budget_s >= 0
        ):
            raise ConfigError(
                f"time budget must be a finite number of seconds >= 0, got {self.time_budget_s}"
            )
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def at_least(obj: Any, minimum: int, *names: str) -> None:
    """A one-line ConfigError for the first of ``obj``'s fields ``names`` below ``minimum`` (None passes)."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < minimum:
            raise ConfigError(f"{name} must be >= {minimum}, got {value}")


@dataclass(kw_only=True)
class TrainRecipe:
    """What every training recipe shares: where the run goes, its optimiser and loop settings, and how
    the checkpoint is written. Recipes subclass it (recorded whole in manifest.json) and may change
    the defaults."""

    out: str
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    log_every: int = 1
    save_dtype: str = "fp32"  # bf16: weights rounded before the held-out eval and written in bf16
    time_budget_s: float | None = None

    def __post_init__(self) -> None:
        """Every setting checked before anything runs (subclasses add their own, then call this)."""
        at_least(self, 1, "batch_size")
        check_weight_seed(self.seed, "--seed")  # it seeds torch's generators: 64-bit words
        self.optim()  # steps, lr, warmup, precision, log interval, time budget
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise ConfigError(f"--out {self.out} is a file; give a directory to write the checkpoint into")
        refuse_used_out(Path(self.out))

    def claim_out(self) -> IO[str]:
        """Make ``out`` and lock it against a second writer for this run (the lock is released when the
        returned file is closed or the process ends); refuses a folder that holds files by then."""
        out = Path(self.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise os_error(out, e) from None
        lock = lock_dir(out)
        try:
            refuse_used_out(out)  # again under the lock: a writer may have begun since the recipe was checked
        except RunDirError:
            lock.close()
            raise
        return lock

    def optim(self) -> OptimConfig:
        return OptimConfig(
            steps=self.steps, lr=self.lr, warmup=min(self.warmup, self.steps - 1),
            weight_decay=self.weight_decay, grad_clip=self.grad_clip, precision=self.precision,
            log_every=self.log_every, time_budget_s=self.time_budget_s,
        )  # fmt: skip


def refuse_used_out(out: Path) -> None:
    """RunDirError when the folder ``out`` holds files: a checkpoint is written only into a new or empty
    folder, never over one it did not write (another checkpoint, a run, an earlier training)."""
    if why := not_empty(out):
        raise RunDirError(f"--out {out} {why}; choose another --out or delete it (nothing was written)")


def lr_at(step: int, cfg: OptimConfig, elapsed_s: float = 0.0) -> float:
    """Learning rate of 0-based ``step``: linear warmup over ``warmup`` steps, then cosine decay.

    With a time budget the decay follows whichever is further along, steps or wall time, so a run
    cut by its budget still ends annealed at ``min_lr_ratio * lr``.
    """
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    if cfg.time_budget_s:
        progress = max(progress, min(1.0, elapsed_s / cfg.time_budget_s))
    floor = cfg.min_lr_ratio * cfg.lr
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch (all devices); returns a CPU generator for data sampling."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA when asked for; a no-op everywhere else (CPU runs stay exact)."""
    if precision == "bf16" and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(params: Iterable[nn.Parameter], cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (norm weights, gates and biases are not decayed)."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


StepFn = Callable[[int], tuple[torch.Tensor, int]]  # step -> (loss to minimise, tokens in the batch)


def train_loop(
    model: nn.Module, step_fn: StepFn, cfg: OptimConfig, out_dir: Path, device: torch.device
) -> list[dict[str, Any]]:
    """Run ``cfg.steps`` optimiser steps of ``step_fn``'s loss on ``model``'s trainable parameters.

    Writes ``out_dir/train_log.jsonl`` (one line per logged step) and returns those lines. With
    ``cfg.time_budget_s`` the loop ends after the first step past the budget; that step is logged
    with ``"stopped_early": true``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, cfg)
    log: list[dict[str, Any]] = []
    tokens = 0
    start = time.perf_counter()
    with (
        open(out_dir / LOG_FILE, "w", encoding="utf-8") as f,
        Progress(f"train {out_dir.name}", cfg.steps) as bar,
    ):
        for step in range(cfg.steps):
            lr = lr_at(step, cfg, time.perf_counter() - start)
            for group in opt.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            with autocast(device, cfg.precision):
                loss, n = step_fn(step)
            if not torch.isfinite(loss):
                raise CheckFailed(f"loss is {loss.item()} at step {step}: lower --lr or check the data")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            value = float(loss.detach())
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            tokens += n
            over = cfg.time_budget_s is not None and time.perf_counter() - start > cfg.time_budget_s
            if step % cfg.log_every == 0 or step == cfg.steps - 1 or over:
                row = {
                    "step": step,
                    "loss": value,
                    "lr": lr,
                    "grad_norm": float(norm),
                    "tokens": tokens,
                    "tokens_per_s": n / dt if dt > 0 else 0.0,
                    "elapsed_s": time.perf_counter() - start,
                }
                if over and step < cfg.steps - 1:
                    row["stopped_early"] = True
                log.append(row)
                f.write(json.dumps(row) + "\n")
                f.flush()
            bar.advance(item=f"loss {value:.4f}")
            if over:
                break
    return log


def plot_loss(log: list[dict[str, Any]], path: Path, title: str) -> Path:
    """The loss curve (and a moving average) as a PNG (:func:`repro.reporting.figures.save_png`)."""
    from matplotlib.figure import Figure

    from repro.reporting.figures import save_png

    steps = [r["step"] for r in log]
    losses = [r["loss"] for r in log]
    window = max(1, len(losses) // 20)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="loss")
    if window > 1:
        ax.plot(steps[window - 1 :], smooth, lw=1.5, label=f"mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    return save_png(fig, path)


def write_manifest(out_dir: Path, recipe: dict[str, Any], seed: int) -> Path:
    """``manifest.json``: environment, seed and the full recipe (repro.reporting.records.build_manifest)."""
    return write_json(out_dir / "manifest.json", build_manifest(recipe, seed=seed))


SAVE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def save_dtype(name: str) -> torch.dtype:
    if name not in SAVE_DTYPES:
        raise ConfigError(f"unknown save dtype {name!r}: choose one of {', '.join(SAVE_DTYPES)}")
    return SAVE_DTYPES[name]


def round_weights(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Round ``model``'s parameters to ``dtype`` in place (kept in their own dtype), so that what is
    evaluated after training is exactly what a checkpoint written in ``dtype`` holds."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype))
    return model


def fast_gdn_backend(model: nn.Module) -> nn.Module:
    """Training and distillation on CUDA run the Triton GDN kernels (fla's chunk kernel for no-grad
    chains, the project's tree kernels for verification; gradients always flow through the torch
    chunked form, see ``repro.gdn.backends.chain_function``); CPU keeps the reference."""
    if model.device.type == "cuda":
        model.set_gdn_backend("triton")
    return model


def resolve_train_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for CUDA without one is a ConfigError."""
    from repro.models.target import resolve_device

    return torch.device(resolve_device(name))
