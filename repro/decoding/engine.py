"""The generic decode loop: draft -> tree -> verify -> accept -> commit, with stage timers.

It knows nothing about any particular route: a route supplies a drafter (or none), a tree
builder and an acceptance rule.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from repro.decoding.acceptance import SamplingRule, TargetMatch
from repro.decoding.sampling import step_rng
from repro.decoding.tree_builders import TreeBuilder
from repro.drafters.base import DraftContext, Drafter
from repro.models.hybrid import PREFILL_CHUNK, HybridLM, Verification
from repro.models.state import ModelState

STAGES = ("draft", "tree", "verify", "commit")


@dataclass
class DecodeResult:
    """One generation: tokens, per-step accepted lengths (bonus included) and timings."""

    output_ids: list[int]
    accepted_lengths: list[int]
    tree_sizes: list[int]
    prefill_s: float
    decode_s: float
    stage_s: dict[str, float]
    finish_reason: str
    accepted_paths: list[list[int]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.accepted_lengths)


@dataclass
class Route:
    """A named composition of drafter, tree builder, acceptance rule and commit strategy.

    Everything a route decodes with travels with it: ``generate`` passes ``commit`` to the model
    on every call and writes nothing on the (shared) model. ``params`` are the resolved route
    parameters (defaults filled in) that records carry.
    """

    name: str
    drafter: Drafter | None
    builder: TreeBuilder
    rule: TargetMatch
    params: dict = field(default_factory=dict)
    commit: str = "closed_form"
    verifier: str = "tree"  # or "chain": the stock chunk-form chain verify (HybridLM.verify)

    @property
    def random(self) -> bool:
        """Whether a step draws randomness (a sampling rule or a sampling tree builder)."""
        return isinstance(self.rule, SamplingRule) or bool(getattr(self.builder, "sample", False))


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _cut(tokens: list[int], stop_ids: set[int], room: int) -> tuple[list[int], str | None]:
    """Tokens up to and including the first stop token, and at most ``room`` of them."""
    for i, t in enumerate(tokens[:room]):
        if t in stop_ids:
            return tokens[: i + 1], "stop"
    if len(tokens) >= room:
        return tokens[:room], "length"
    return tokens, None


def _prefill(
    model: HybridLM, prompt_ids: list[int], capture: tuple[int, ...], drafter: Drafter | None, strategy: str
) -> tuple[ModelState, Verification]:
    """``model.prefill``; a drafter with ``observe_prefill`` sees every chunk's verification.

    The chunks are the model's own (PREFILL_CHUNK tokens), so the result is identical; drafters
    that read target hidden states (DFlash) need them for the whole prompt, not just the last chunk.
    """
    observe = getattr(drafter, "observe_prefill", None)
    if observe is None or not prompt_ids:
        return model.prefill(prompt_ids, capture=capture, strategy=strategy)
    state: ModelState | None = None
    for start in range(0, len(prompt_ids), PREFILL_CHUNK):
        state, ver = model.prefill(prompt_ids[start : start + PREFILL_CHUNK], state, capture, strategy)
        observe(ver)
    assert state is not None  # the prompt is not empty: at least one chunk ran
    return state, ver


def generate(
    model: HybridLM,
    prompt_ids: list[int],
    route: Route,
    max_new_tokens: int,
    stop_ids: Iterable[int] = (),
    reference_ids: list[int] | None = None,
) -> DecodeResult:
    """Decode up to ``max_new_tokens`` after ``prompt_ids`` with ``route`` (and its commit strategy)."""
    stops = set(stop_ids)
    dev = model.device
    drafter = route.drafter
    capture = drafter.capture_layers if drafter else ()
    if drafter:
        drafter.begin(list(prompt_ids), reference_ids)
    stage = dict.fromkeys(STAGES, 0.0)
    t0 = _clock(dev)
    state, ver = _prefill(model, prompt_ids, capture, drafter, route.commit)
    out = [route.rule.pick(ver.logits[-1], 0)]
    t1 = _clock(dev)
    lengths: list[int] = []
    sizes: list[int] = []
    paths: list[list[int]] = []
    _, finish = _cut(out, stops, max_new_tokens)
    ctx = DraftContext(list(prompt_ids), out, ver, list(range(ver.tree.size)))
    while finish is None:
        ta = _clock(dev)
        proposal = drafter.propose(ctx) if drafter else None
        tb = _clock(dev)
        rng = step_rng(route.rule.seed, len(out)) if route.random else None
        tree = route.builder.build(out[-1], proposal, rng)
        tc = _clock(dev)
        ver = model.verify(state, tree, capture, route.commit, route.verifier)
        acc = route.rule.accept(tree, ver.logits, len(out), rng)
        td = _clock(dev)
        state = model.commit(state, ver, acc.path)
        te = _clock(dev)
        for name, dt in zip(STAGES, (tb - ta, tc - tb, td - tc, te - td)):
            stage[name] += dt
        new = tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
        new, finish = _cut(new, stops, max_new_tokens - len(out))
        out.extend(new)
        lengths.append(len(new))
        sizes.append(tree.size)
        paths.append(acc.path)
        ctx = DraftContext(list(prompt_ids), out, ver, acc.path)
    t2 = _clock(dev)
    return DecodeResult(out, lengths, sizes, t1 - t0, t2 - t1, stage, finish, paths)
