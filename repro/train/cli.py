"""`repro train ...`: train the tiny target and its drafters (wired in as the ``train`` group)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from repro.options import comma_ints, device_option, dtype_option, short_dtype

train_app = typer.Typer(help="Training: a tiny target from the corpus, drafters by self-distillation.")


CorpusOpt = Annotated[Path, typer.Option(help="Corpus dir with train.txt / heldout.txt.")]
TargetOpt = Annotated[Path, typer.Option(help="Target checkpoint dir or family name (with its tokenizer).")]
StepsOpt = Annotated[int, typer.Option(help="Optimiser steps.")]
BatchOpt = Annotated[int, typer.Option(help="Sequences per step.")]
LrOpt = Annotated[float, typer.Option(help="Peak learning rate (warmup then cosine).")]
WarmupOpt = Annotated[int, typer.Option(help="Warmup steps.")]
SeedOpt = Annotated[int, typer.Option(help="Init, data, anchor and noise seed.")]
DeviceOpt = Annotated[str, device_option()]
DtypeOpt = Annotated[str, dtype_option("compute: float32, or bfloat16 autocast (CUDA only).")]
SaveDtypeOpt = Annotated[
    str, dtype_option("float32 or bfloat16 (weights rounded, then evaluated).", name="--save-dtype")
]
BudgetOpt = Annotated[float | None, typer.Option(help="Stop training after this many seconds.")]
PromptsOpt = Annotated[int, typer.Option(help="Self-distillation sequences.")]
PromptLenOpt = Annotated[int, typer.Option(help="Corpus prefix tokens per sequence.")]
DistillTokensOpt = Annotated[int, typer.Option(help="Greedy target tokens generated per training sequence.")]
EvalPromptsOpt = Annotated[int, typer.Option(help="Held-out prompts for the acceptance report.")]
MaxNewTokensOpt = Annotated[int, typer.Option(help="New tokens per held-out prompt (acceptance report).")]
LayerIdsOpt = Annotated[str | None, typer.Option(help="Comma-separated target layer ids for features.")]
DEFAULT_CORPUS = Path("data/corpus")


def precisions(dtype: str, save_dtype: str) -> dict[str, str]:
    """The recipes' ``precision`` and ``save_dtype`` (short spellings, as recorded in manifests) of the
    full dtype names the options take."""
    return {
        "precision": short_dtype(dtype, ("fp32", "bf16")),
        "save_dtype": short_dtype(save_dtype, ("fp32", "bf16"), "--save-dtype"),
    }


def distill_args(
    target: Path, corpus: Path, out: Path, prompts: int, prompt_len: int, distill_new_tokens: int, steps: int,
    batch_size: int, lr: float, warmup: int, seed: int, device: str, dtype: str, eval_prompts: int,
    max_new_tokens: int, save_dtype: str, time_budget: float | None,
) -> dict:  # fmt: skip
    """The DistillRecipe fields every drafter command takes, from its options."""
    return dict(
        target=str(target), corpus=str(corpus), out=str(out), prompts=prompts, prompt_len=prompt_len,
        gen_len=distill_new_tokens, steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
        device=device, eval_prompts=eval_prompts, eval_new_tokens=max_new_tokens, time_budget_s=time_budget,
        **precisions(dtype, save_dtype),
    )  # fmt: skip


def layer_ids(text: str | None) -> list[int] | None:
    """``--target-layers``: comma-separated layer ids >= 0 (None: the recipe's default spread)."""
    return None if text is None else comma_ints(text, "--target-layers", minimum=0)


@train_app.command("target")
def target(
    corpus: CorpusOpt = DEFAULT_CORPUS,
    out: Annotated[Path, typer.Option(help="Checkpoint dir to write (weights, tokenizer, logs).")] = Path(
        "runs/train/target"
    ),
    tokenizer: Annotated[
        Path | None, typer.Option(help="A trained tokenizer dir (repro data tokenizer); default: bytes.")
    ] = None,
    arch: Annotated[
        str, typer.Option(help="qwen35 (3 GDN : 1 gated attention) or fla_gdn (pure GDN).")
    ] = "qwen35",
    layers: Annotated[int, typer.Option(help="Decoder layers.")] = 4,
    hidden_size: Annotated[int, typer.Option(help="Model width (head dims are width / 4).")] = 64,
    steps: StepsOpt = 200,
    batch_size: BatchOpt = 8,
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = 128,
    lr: LrOpt = 3e-3,
    warmup: WarmupOpt = 20,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    max_train_tokens: Annotated[int | None, typer.Option(help="Cap on tokenized training data.")] = None,
    eval_sequences: Annotated[int, typer.Option(help="Held-out sequences for perplexity.")] = 64,
    tie_embeddings: Annotated[bool, typer.Option(help="LM head shares the embedding.")] = False,
    save_dtype: SaveDtypeOpt = "float32",
    time_budget: BudgetOpt = None,
) -> None:
    """Train a tiny target; writes a loadable checkpoint, train_log.jsonl, loss.png, metrics.json."""
    from repro.train.target import TargetRecipe, train_target

    recipe = TargetRecipe(
        corpus=str(corpus), out=str(out), tokenizer=None if tokenizer is None else str(tokenizer), arch=arch,
        layers=layers, hidden_size=hidden_size, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
        warmup=warmup, seed=seed, device=device, max_train_tokens=max_train_tokens,
        eval_sequences=eval_sequences, tie_embeddings=tie_embeddings, time_budget_s=time_budget,
        **precisions(dtype, save_dtype),
    )  # fmt: skip
    typer.echo(json.dumps(train_target(recipe), indent=2))


@train_app.command("dflash")
def dflash(
    target: TargetOpt,
    corpus: CorpusOpt = DEFAULT_CORPUS,
    out: Annotated[Path, typer.Option(help="Drafter dir to write (z-lab DFlash format).")] = Path(
        "runs/train/dflash"
    ),
    block_size: Annotated[int, typer.Option(help="Block size (root + block_size - 1 drafts).")] = 8,
    layers: Annotated[int, typer.Option(help="Draft transformer layers.")] = 1,
    target_layers: LayerIdsOpt = None,
    anchors: Annotated[int, typer.Option(help="Blocks per sequence per step.")] = 8,
    loss_gamma: Annotated[
        float, typer.Option(help="Position weights exp(-(k-1)/gamma); <= 0 uniform.")
    ] = 4.0,
    prompts: PromptsOpt = 64,
    prompt_len: PromptLenOpt = 32,
    distill_new_tokens: DistillTokensOpt = 64,
    steps: StepsOpt = 300,
    batch_size: BatchOpt = 16,
    lr: LrOpt = 1e-3,
    warmup: WarmupOpt = 20,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    eval_prompts: EvalPromptsOpt = 4,
    max_new_tokens: MaxNewTokensOpt = 64,
    save_dtype: SaveDtypeOpt = "float32",
    time_budget: BudgetOpt = None,
) -> None:
    """Train a DFlash drafter on the target's own greedy continuations; reports held-out MAL."""
    from repro.train.dflash import DFlashRecipe, train_dflash

    recipe = DFlashRecipe(
        block_size=block_size, draft_layers=layers, target_layer_ids=layer_ids(target_layers),
        anchors=anchors, loss_gamma=loss_gamma, **distill_args(
            target, corpus, out, prompts, prompt_len, distill_new_tokens, steps, batch_size, lr, warmup, seed,
            device, dtype, eval_prompts, max_new_tokens, save_dtype, time_budget,
        ),
    )  # fmt: skip
    typer.echo(json.dumps(train_dflash(recipe), indent=2))


@train_app.command("eagle")
def eagle(
    target: TargetOpt,
    corpus: CorpusOpt = DEFAULT_CORPUS,
    out: Annotated[Path, typer.Option(help="Drafter dir to write (EAGLE format).")] = Path(
        "runs/train/eagle"
    ),
    layers: Annotated[int, typer.Option(help="Draft decoder layers.")] = 1,
    target_layers: LayerIdsOpt = None,
    w_reg: Annotated[float, typer.Option(help="Weight of the smooth-L1 feature regression.")] = 1.0,
    w_cls: Annotated[float, typer.Option(help="Weight of the token cross-entropy.")] = 0.1,
    feature_noise: Annotated[
        float, typer.Option(help="Half-width of uniform noise on input features (EAGLE: 0.1).")
    ] = 0.0,
    k: Annotated[int, typer.Option(help="Drafts per step in the held-out eagle_chain evaluation.")] = 4,
    prompts: PromptsOpt = 64,
    prompt_len: PromptLenOpt = 32,
    distill_new_tokens: DistillTokensOpt = 64,
    steps: StepsOpt = 300,
    batch_size: BatchOpt = 16,
    lr: LrOpt = 1e-3,
    warmup: WarmupOpt = 20,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    eval_prompts: EvalPromptsOpt = 4,
    max_new_tokens: MaxNewTokensOpt = 64,
    save_dtype: SaveDtypeOpt = "float32",
    time_budget: BudgetOpt = None,
) -> None:
    """Train an EAGLE drafter on the target's own greedy continuations; reports held-out MAL."""
    from repro.train.eagle import EagleRecipe, train_eagle

    recipe = EagleRecipe(
        draft_layers=layers, target_layer_ids=layer_ids(target_layers), w_reg=w_reg, w_cls=w_cls,
        feature_noise=feature_noise, k=k, **distill_args(
            target, corpus, out, prompts, prompt_len, distill_new_tokens, steps, batch_size, lr, warmup, seed,
            device, dtype, eval_prompts, max_new_tokens, save_dtype, time_budget,
        ),
    )  # fmt: skip
    typer.echo(json.dumps(train_eagle(recipe), indent=2))


@train_app.command("weaver")
def weaver(
    target: TargetOpt,
    dflash: Annotated[Path, typer.Option(help="DFlash drafter dir or family name (frozen).")],
    corpus: CorpusOpt = DEFAULT_CORPUS,
    out: Annotated[Path, typer.Option(help="Adapter dir to write (config.json + model.safetensors).")] = Path(
        "runs/train/weaver"
    ),
    d_model: Annotated[int, typer.Option(help="Adapter width.")] = 64,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    pool: Annotated[int, typer.Option(help="Pool size K: DFlash's top-K tokens per depth.")] = 512,
    tv_weight: Annotated[float, typer.Option(help="Loss = (1 - w) KL + w TV.")] = 0.5,
    target_temperature: Annotated[
        float, typer.Option(help="Distil softmax(target logits / T); small T: the greedy token.")
    ] = 1.0,
    anchors: Annotated[int, typer.Option(help="Blocks per sequence per step.")] = 8,
    budget: Annotated[
        int, typer.Option(help="Tree budget of the held-out weaver vs ddtree comparison.")
    ] = 16,
    width: Annotated[int, typer.Option(help="Frontier nodes per Weaver step.")] = 4,
    prompts: PromptsOpt = 64,
    prompt_len: PromptLenOpt = 32,
    distill_new_tokens: DistillTokensOpt = 64,
    steps: StepsOpt = 300,
    batch_size: BatchOpt = 16,
    lr: LrOpt = 1e-3,
    warmup: WarmupOpt = 20,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    eval_prompts: EvalPromptsOpt = 4,
    max_new_tokens: MaxNewTokensOpt = 64,
    save_dtype: SaveDtypeOpt = "float32",
    time_budget: BudgetOpt = None,
) -> None:
    """Train a Weaver adapter over a frozen DFlash drafter; reports held-out MAL vs DDTree."""
    from repro.train.weaver import WeaverRecipe, train_weaver

    recipe = WeaverRecipe(
        dflash=str(dflash), d_model=d_model, heads=heads, pool_size=pool, tv_weight=tv_weight,
        target_temperature=target_temperature, anchors=anchors, budget=budget, width=width, **distill_args(
            target, corpus, out, prompts, prompt_len, distill_new_tokens, steps, batch_size, lr, warmup, seed,
            device, dtype, eval_prompts, max_new_tokens, save_dtype, time_budget,
        ),
    )  # fmt: skip
    typer.echo(json.dumps(train_weaver(recipe), indent=2))


if __name__ == "__main__":
    train_app()
