"""The generic decode loop: draft -> tree -> verify -> accept -> commit, with stage timers.

It knows nothing about any particular route: a route supplies a drafter (or none), a tree
builder and an acceptance rule.

On a graphed target (:class:`~repro.models.graphed.GraphedTarget`) with the greedy rule and a
non-sampling builder, a step takes the device path: the builder's ``build_device`` tree (a
:class:`~repro.tree.DeviceTree` where the proposal lives on the device), the slot's verify graph,
then ``commit_greedy`` (acceptance, path and commit on the device, one read of the result): one
device-to-host sync per step, besides the drafter's own. AR there runs groups of decode steps, one group
ahead of the host (:meth:`~repro.models.graphed.GraphedTarget.greedy_decode`: the next group of decode
steps is launched before the last one's tokens are read; one read a group; sampled AR the same way, its picks
made on the device: :func:`device_ar_sampling`); drafted greedy routes whose
drafter can draft after a launched step (DFlash, Weaver, static EAGLE: :func:`pipelined`) run one step ahead
the same way (:func:`_pipelined`: step k + 1's drafter and tree read step k's result on the device, then step
k is read; :data:`PIPELINE_DEPTH` steps ahead, up to three). A sampling rule at
temperature > 0 (or the replayed acceptance) on a drafted, non-sampling builder takes the same path with its
device twin (:mod:`repro.decoding.device_acceptance`: its draws keyed by the root's output position, read
on the device, so it pipelines too): sample_match gives the host path's tokens (AR's), spec_sampling and
traversal the same law from the device's keyed uniforms. Elsewhere the host rule walks the logits.
sample_match's uniforms (and the replayed depths) are drawn on the host for every output position of the
generation before its clock starts: they stand in for a sampler's device generator (a real one draws inside
its kernel) so that the host and device paths pick the same tokens, and their cost (~20 us a position, a
numpy generator each) is the harness's, not the route's; a cache keeps sample_match's across the routes of
a prompt, so timing them would charge whichever route ran first on it (AR, 2026-12-05: ~30 ms a generation).

Stage times: ``stage_s`` is wall-clock per stage (on the host path each boundary first synchronizes
the device; on the device path none does, so a stage's wall time is its host time, and the wait for a
step's read-back falls between one step's last mark and the next one's first, in no stage: it is in
``decode_s``, not in ``stage_s``); ``device_stage_s`` is device time per stage from CUDA events recorded at
the same boundaries and read once at the end (the current clocks' values where there are no events,
e.g. on CPU). Both include the device's idle gaps: when the host is the bottleneck, an event recorded on
an idle stream completes at once and device time follows wall time. ``busy_stage_s`` is the graphs' busy
time per stage: every CUDA-graph replay of the decode loop (:func:`repro.models.graphs.busy_recorder`)
bracketed by two events, its duration summed into the stage whose mark came last; None without replays
(CPU, ``graphs=False``). A replay launched on an idle stream counts its launch latency too (its first
event completes before the graph reaches the device), so busy is an upper bound on the graphs' run time.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from repro.decoding.acceptance import Acceptance, SamplingRule, TargetMatch
from repro.decoding.device_acceptance import DeviceRule, device_rule, has_device_rule
from repro.decoding.sampling import step_rng
from repro.decoding.tree_builders import (
    BestFirst,
    Chain,
    DrafterTree,
    SingleNode,
    TreeBuilder,
    tree_in_drafter,
)
from repro.drafters.base import DraftContext, Drafter, PipelinedDrafter
from repro.errors import ConfigError
from repro.models.graphed import GraphedState, GraphedTarget, LaunchedStep, read_wait_s
from repro.models.graphs import busy_recorder, generation_stream, graphs_captured
from repro.models.hybrid import PREFILL_CHUNK, HybridLM, Verification
from repro.models.state import ModelState
from repro.tree import Tree

if TYPE_CHECKING:
    from repro.drafters.dflash import DFlashDrafter

STAGES = ("draft", "tree", "verify", "commit")  # on the device path "commit" holds the acceptance too
# timing events of finished clocks by device, reused by later clocks: a decode step records ~11 (its stage
# marks and two a graph replay) and reads none, so the loop neither makes nor reads events once warm
_EVENTS: dict[torch.device, list[torch.cuda.Event]] = {}
# StageClock records its CUDA events (stage marks, graph replays) on every EVENT_EVERY-th step, and scales the
# sampled steps' sums to all steps; 1: every step. The events cost 2.5-4% of wall time with every step
# (results/2026-12-04-h200-host-loop-profiles). Every 4th step took that back, but the sampled steps' device
# time did not stand for the others' (chain DFlash 0.287 -> 0.303 ms a step once scaled;
# results/2026-12-04-h200-derive-rows/callCG), so every step is measured.
EVENT_EVERY = 1
# Python's cyclic garbage collector is paused while a generation is timed (prefill and decode: generate())
# and restored after it, so that the cycles it leaves are collected between generations: a collection pauses
# the host (here a generation-1 one ~0.3 ms, a full one ~40 ms), and inside a 5-10 ms turn of the tiny family
# it lands on whichever route and turn it falls in (inference servers do the same: vLLM, SGLang and LightLLM
# freeze or disable the collector around their decode loops and graph captures). scripts/gpu/gc-probe.py
# counts the collections inside timed generations with it off.
PAUSE_GC = True
# greedy device routes whose drafter pipelines run one step ahead of the host (:func:`pipelined`); False: each
# step read before the next is drafted (the A/B of scripts/gpu/busy-time.py)
PIPELINE = True
# steps a pipelined loop keeps launched ahead of the one it reads (1: step k + 1 runs while the host reads
# step k; 2: steps k + 1 and k + 2), so the host may fall behind by that many steps before the device idles;
# at most slot_kernels.TAG_ROWS - 1 (the host rows a step's result lands in). Steps that would start past
# max_new_tokens (the unread ones commit at least one token each) are not launched at any depth
PIPELINE_DEPTH = 1
# a pipelined DDTree or chain DFlash step builds its tree inside the DFlash drafter's graph
# (``propose_after``'s ``tree``: BestFirst / Chain ``device_tree`` on the drafter's marginals and top-k ids,
# rooted at the launched step's bonus), not after it: DDTree's best-first graph (and its root's copy), chain
# DFlash's eager token concatenation a step fewer; the tree stage's time then falls in the draft stage. Off:
# the A/B on the H200 (scripts/gpu/routes-ab.py fuse_tree, results/2026-12-05-h200-prepare-per-loop) gave
# device ms a step DDTree 0.336 -> 0.331, chain DFlash 0.266 -> 0.260 (1.5-2%, the size of the moves between
# variants of one process), same tokens
FUSE_TREE = False


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
    device_stage_s: dict[str, float] | None = None  # device time per stage (module docstring)
    busy_stage_s: dict[str, float] | None = None  # graph replay time per stage; None without replays
    graph_captures: int = 0  # CUDA graphs captured inside the decode (their capture time is in decode_s)
    # verify steps run: the recorded ones plus the pipelined loop's steps launched past the end, whose time
    # is in decode_s and the stage sums (None: no step ran past the end)
    launched_steps: int | None = None
    # seconds of decode_s the host waited for step results not on the host yet (graphed.read_wait_s: the
    # host ahead of the device); None off the graphed target
    host_wait_s: float | None = None

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


class StageClock:
    """Per-stage wall, device and graph-busy time over the steps of one generation.

    ``mark()`` at every stage boundary of a step (len(STAGES) + 1 marks per step): a wall-clock reading
    (after a device sync when ``sync``) and, on CUDA, an event recorded without a sync on ``stream``, the
    stream current when the clock was made (the generation's: it runs on one stream; resolved once, as
    looking it up costs host time on every event). Nothing is read while the steps run: ``device_s()``
    waits for the last event (one sync, after the caller's decode time was taken), sums the device time
    per stage and gives the events back to the device's pool (``_EVENTS``: the next generation's clock
    takes them, so a warm decode loop makes no events either); without events it gives the wall-clock sums.

    It is also a :class:`~repro.models.graphs.ReplayRecorder`: inside ``busy_recorder(clock)`` every graph
    replay's (start, end) events, from the same pool, are attributed to the stage whose mark came last
    (after a step's last mark: its last stage), summed like the marks by ``busy_s()``.

    ``every`` (default :data:`EVENT_EVERY`): events only on steps 0, every, 2 every, ... (their marks and
    their replays, ``recording``); ``device_s()`` and ``busy_s()`` scale the sampled steps' sums by
    steps / sampled steps. Wall-clock sums take every step.
    """

    def __init__(self, device: torch.device, sync: bool, every: int | None = None) -> None:
        self.device, self.sync = device, sync
        self.every = every or EVENT_EVERY
        if self.every < 1:
            raise ValueError(f"StageClock samples every >= 1 steps, got {self.every}")
        self.steps = 0  # complete steps (len(STAGES) + 1 marks each)
        self.sampled = 0  # complete steps whose events were recorded
        self.recording = True  # whether the step now running records events (step 0 does)
        self.events = device.type == "cuda"
        self.stream = generation_stream(device)
        self.wall = dict.fromkeys(STAGES, 0.0)
        self.device_sums = dict.fromkeys(STAGES, 0.0)
        self.busy_sums = dict.fromkeys(STAGES, 0.0)
        self.replays = 0  # replays recorded so far
        self._times: list[float] = []
        self._steps: list[list[torch.cuda.Event]] = []  # recorded, not yet summed
        self._pool = _EVENTS.setdefault(device, []) if self.events else []
        self._stage = 0  # index into STAGES of the stage now running
        self._pairs: deque[tuple[int, Any, Any]] = deque()  # (stage, start, end) of replays not yet summed

    def event(self) -> torch.cuda.Event:
        """A timing event from the pool (a new one when it is empty)."""
        return self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)

    def replayed(self, start: Any, end: Any) -> None:
        """A graph replay between the recorded ``start`` and ``end``: busy time of the current stage."""
        self._pairs.append((self._stage, start, end))
        self.replays += 1

    def mark(self) -> None:
        self._stage = min(len(self._times), len(STAGES) - 1)
        if not self._times:  # a step's first mark
            self.recording = self.steps % self.every == 0
        self._times.append(_clock(self.device) if self.sync else time.perf_counter())
        if self.events and self.recording:
            if len(self._times) == 1:
                self._steps.append([])
            event = self.event()
            event.record(self.stream)
            self._steps[-1].append(event)
        if len(self._times) == len(STAGES) + 1:
            for name, a, b in zip(STAGES, self._times, self._times[1:]):
                self.wall[name] += b - a
            self._times = []
            self.steps += 1
            self.sampled += self.recording

    def _harvest(self) -> None:
        """Wait for the recorded steps and replays, sum their device time and give their events back."""
        while self._steps and len(self._steps[0]) == len(STAGES) + 1:
            marks = self._steps.pop(0)
            marks[-1].synchronize()
            for name, a, b in zip(STAGES, marks, marks[1:]):
                self.device_sums[name] += a.elapsed_time(b) / 1000.0
            self._pool += marks
        while self._pairs:
            stage, start, end = self._pairs.popleft()
            end.synchronize()
            self.busy_sums[STAGES[stage]] += start.elapsed_time(end) / 1000.0
            self._pool += (start, end)

    def _scaled(self, sums: dict[str, float]) -> dict[str, float]:
        """The sampled steps' ``sums`` over all steps (as they are with every step sampled)."""
        scale = self.steps / self.sampled if self.sampled and self.every > 1 else 1.0
        return {name: v * scale for name, v in sums.items()}

    def device_s(self) -> dict[str, float]:
        if not self.events:
            return dict(self.wall)
        self._harvest()
        return self._scaled(self.device_sums)

    def busy_s(self) -> dict[str, float] | None:
        """Summed graph replay time per stage (waits for the replays still running); None without
        events or without a replay (nothing ran as a graph: not zero time)."""
        if not self.events or not self.replays:
            return None
        self._harvest()
        return self._scaled(self.busy_sums)


def device_greedy(model: HybridLM | GraphedTarget, route: Route) -> bool:
    """Whether ``route`` decodes on ``model`` through the greedy device path (module docstring)."""
    greedy = type(route.rule) is TargetMatch and route.rule.temperature == 0
    return isinstance(model, GraphedTarget) and greedy and not route.random


def device_ar_sampling(model: HybridLM | GraphedTarget, route: Route) -> bool:
    """Whether ``route`` is sample_match AR on a graphed target: its picks made on the device (the rule's
    twin, :meth:`~repro.decoding.device_acceptance.DeviceRule.pick`: ``TargetMatch.pick``, the same tokens)
    in groups of graphed steps, one group ahead of the host, as greedy AR (AR routes under spec_sampling
    or traversal are sample_match AR: :func:`~repro.decoding.routes.build_route`)."""
    ar = route.drafter is None and isinstance(route.builder, SingleNode)
    return (
        isinstance(model, GraphedTarget)
        and ar
        and type(route.rule) is TargetMatch
        and route.rule.temperature > 0
    )


def device_sampling(model: HybridLM | GraphedTarget, route: Route) -> bool:
    """Whether ``route`` decodes on ``model`` through the sampling device path: a sampling rule at
    temperature > 0 or the replayed acceptance (:mod:`repro.decoding.device_acceptance`) on given (not
    sampled) draft trees (sampled AR: :func:`device_ar_sampling`)."""
    drafted = not isinstance(route.builder, SingleNode) and not getattr(route.builder, "sample", False)
    return isinstance(model, GraphedTarget) and drafted and has_device_rule(route.rule)


def prepare_sampling(model: HybridLM | GraphedTarget, routes: list[Route], max_size: int = 64) -> None:
    """Capture ahead the graphs of the sampling device path of ``routes`` (their rules' device twins on
    slots up to ``max_size`` nodes), after the target's ``prepare`` of the same routes."""
    for route in routes:
        if not isinstance(model, GraphedTarget):
            continue
        positions = model.max_len + model.max_nodes + 1  # any generation the target's buffers hold
        if device_ar_sampling(model, route):
            model.prepare_picker(device_rule(route.rule, model.device, model.max_nodes, positions))
        if device_sampling(model, route):
            twin = device_rule(route.rule, model.device, model.max_nodes, positions)
            chain = route.verifier == "chain"
            loop = decode_loop(model, route)
            model.prepare_accept(twin.accept, twin.graph_key, (route.commit,), max_size, chain, loop)


def pipelined(model: HybridLM | GraphedTarget, route: Route) -> bool:
    """Whether ``route`` decodes on ``model`` one step ahead of the host (:func:`_pipelined`): the greedy or
    sampling device path with a drafter that drafts after a launched step (``pipelines()``: DFlash, Weaver
    and EAGLE on static buffers) and a builder of device trees; :data:`PIPELINE` off turns it off."""
    drafter = route.drafter
    return (
        PIPELINE
        and (device_greedy(model, route) or device_sampling(model, route))
        and drafter is not None
        and getattr(drafter, "pipelines", lambda: False)()
        and isinstance(route.builder, (Chain, BestFirst, DrafterTree))
    )


def decode_loop(model: HybridLM | GraphedTarget, route: Route) -> str:
    """Which of :func:`generate`'s loops decodes ``route`` on ``model``: ``"ar"`` (AR on the device path,
    a group of graphed steps ahead of the host), ``"pipelined"`` (:func:`pipelined`), ``"stepwise"`` (one
    verify step at a time, accepted on the device) or ``"host"`` (one step at a time, accepted on the
    host: every route off a graphed target)."""
    single = route.drafter is None and isinstance(route.builder, SingleNode)
    if (single and device_greedy(model, route)) or device_ar_sampling(model, route):
        return "ar"
    if pipelined(model, route):
        return "pipelined"
    return "stepwise" if device_greedy(model, route) or device_sampling(model, route) else "host"


def _pipelined(
    model: GraphedTarget,
    route: Route,
    state: GraphedState,
    ctx: DraftContext,
    out: list[int],
    max_new_tokens: int,
    stops: set[int],
    capture: tuple[int, ...],
    clock: StageClock,
    twin: DeviceRule | None,
) -> tuple[str, list[int], list[int], list[list[int]], int]:
    """Device steps (greedy, or ``twin``'s rule: its draws keyed by the root's position on the device), each
    launched before the previous :data:`PIPELINE_DEPTH` are read: step k + 1's drafter reads step
    k's accepted path and bonus where its commit wrote them (:class:`~repro.models.graphed.LaunchedStep`;
    with ``graphed.FUSE_ACCEPT`` the verification runs the acceptance and commit in its own graph),
    its tree takes that bonus as root (with :data:`FUSE_TREE` built inside the drafter's graph), and only
    then is step k's result read (one wait a step), so the
    device runs step k + 1 while the host reads step k and launches step k + 2. The first step drafts from
    ``ctx`` (the prefill). ``out`` grows by the read tokens; returns the finish reason, the accepted
    lengths, tree sizes and paths per read step, and the number of steps launched past the end: the steps
    launched past a stop (or the last token) are folded in and waited for (the sequence must end there, as
    after :meth:`GraphedTarget.greedy_decode`), their time part of the decode's. No step is launched once
    the unread ones must reach ``max_new_tokens`` (each commits at least one token)."""
    from repro.models.slot_kernels import TAG_ROWS  # the device path's kernels (Triton) are in use by now

    drafter, builder = cast(PipelinedDrafter, route.drafter), route.builder
    if not 1 <= PIPELINE_DEPTH < TAG_ROWS:
        raise ConfigError(f"engine.PIPELINE_DEPTH must be 1 .. {TAG_ROWS - 1}, got {PIPELINE_DEPTH}")
    position = state.position  # exact: the tokens committed before the oldest unread step
    launched: deque[LaunchedStep] = deque()
    lengths: list[int] = []
    sizes: list[int] = []
    paths: list[list[int]] = []
    finish = None
    inside = FUSE_TREE and tree_in_drafter(builder, drafter)  # the trees inside the drafter's graph
    tree_fn = cast(BestFirst | Chain, builder).device_tree if inside else None
    accept = (twin.accept, twin.graph_key) if twin else (None, ())  # the device acceptance, every step
    while finish is None:
        if not launched or len(out) + len(launched) < max_new_tokens:  # the unread steps may leave room
            clock.mark()
            last = launched[-1] if launched else None
            fused = last is not None and inside
            if fused:
                proposal = cast("DFlashDrafter", drafter).propose_after(last, tree=tree_fn)
            else:
                proposal = drafter.propose_after(last) if last else drafter.propose(ctx)
            clock.mark()
            tree = proposal.tree if fused else builder.build_device(last.root if last else out[-1], proposal)
            clock.mark()
            # the unread steps' lengths are bounded by their trees' sizes: the buffers grow for the bound
            handle = model.handle(position + sum(step.verification.tree.size for step in launched))
            ver = model.verify(handle, tree, capture, route.commit, route.verifier, then=accept)
            clock.mark()
            launched.append(model.launch_accepted(handle, ver, *accept))
            clock.mark()
            if len(launched) <= PIPELINE_DEPTH:
                continue
        step = launched.popleft()
        path, tokens, bonus = model.read_launched(step)
        if launched:
            drafter.settle(len(path))  # the launched step behind it ingested this path
        if twin:
            twin.done(path, len(out))
        position += len(path)
        new, finish = _cut(tokens[1:] + [bonus], stops, max_new_tokens - len(out))
        out.extend(new)
        lengths.append(len(new))
        sizes.append(step.verification.tree.size)
        paths.append(path)
    for i, step in enumerate(launched):  # launched past the stop: folded in; their copies waited for
        path, _, _ = model.read_launched(step)
        if i + 1 < len(launched):
            drafter.settle(len(path))
    return finish, lengths, sizes, paths, len(launched)


def _device_accept(
    model: GraphedTarget,
    route: Route,
    state: GraphedState,
    ver: Verification,
    position: int,
    twin: DeviceRule | None,
) -> tuple[GraphedState, list[int], list[int], int]:
    """The sampling step's end on the device through ``twin`` (one read); a one-node verification folded in
    by the decode step (no slot) takes the host rule, which reads its logits once."""
    tree = ver.tree
    slot = getattr(ver, "slot", None)
    if slot is None:
        assert isinstance(tree, Tree)
        acc = route.rule.accept(tree, ver.logits, position, step_rng(route.rule.stream, position))
        state = model.commit(state, ver, acc.path)
        return state, acc.path, tree.tokens[acc.path].tolist(), acc.bonus
    if isinstance(tree, Tree) and tree.draw != "given":
        raise ValueError("the device sampling rules take given (top-k) children, not sampled ones")
    assert twin is not None, "a sampling device step needs the rule's twin"
    state, path, tokens, bonus = model.commit_accepted(state, ver, twin.accept, twin.graph_key)
    twin.done(path, position)
    return state, path, tokens, bonus


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


@contextlib.contextmanager
def gc_paused(pause: bool) -> Iterator[None]:
    """With ``pause``, Python's cyclic garbage collector disabled inside the block (reference counting still
    frees; the collector's state on entry restored on exit); else nothing."""
    was = gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause and was:
            gc.enable()


def generate(
    model: HybridLM,
    prompt_ids: list[int],
    route: Route,
    max_new_tokens: int,
    stop_ids: Iterable[int] = (),
    reference_ids: list[int] | None = None,
) -> DecodeResult:
    """Decode up to ``max_new_tokens`` after ``prompt_ids`` with ``route`` (and its commit strategy), the
    garbage collector paused (:data:`PAUSE_GC`)."""
    with gc_paused(PAUSE_GC):
        return _generate(model, prompt_ids, route, max_new_tokens, stop_ids, reference_ids)


def _generate(
    model: HybridLM,
    prompt_ids: list[int],
    route: Route,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    reference_ids: list[int] | None,
) -> DecodeResult:
    stops = set(stop_ids)
    dev = model.device
    drafter = route.drafter
    capture = drafter.capture_layers if drafter else ()
    route.rule.begin(prompt_ids)  # the generation's draws: keyed by the prompt too
    if drafter:
        drafter.begin(list(prompt_ids), reference_ids)
    greedy = device_greedy(model, route)
    sampled_ar = device_ar_sampling(model, route)
    loop = decode_loop(model, route)
    on_device = loop != "host"  # AR groups, pipelined or stepwise: accepted on the device
    twin = None
    if on_device and not greedy:  # the sampling rule's device twin (sampled AR's picker), its draws made
        assert isinstance(model, GraphedTarget)  # before the clock starts (module docstring)
        twin = device_rule(route.rule, dev, model.max_nodes, max_new_tokens + model.max_nodes + 1)
        twin.begin(len(prompt_ids), max_new_tokens)
    t0 = _clock(dev)
    state, ver = _prefill(model, prompt_ids, capture, drafter, route.commit)
    out = [route.rule.pick(ver.logits[-1], 0)]
    t1 = _clock(dev)
    captured, waited = graphs_captured(), read_wait_s()
    clock = StageClock(dev, sync=not on_device)
    lengths: list[int] = []
    sizes: list[int] = []
    paths: list[list[int]] = []
    past_end = 0  # steps launched past the end (the pipelined loop's one, AR's groups ahead of a stop)
    _, finish = _cut(out, stops, max_new_tokens)
    ctx = DraftContext(list(prompt_ids), out, ver, list(range(ver.tree.size)))
    with busy_recorder(clock):  # the graph replays of the decode loop: busy time per stage
        if finish is None and loop == "ar":
            assert isinstance(model, GraphedTarget)  # AR on the device path: one group ahead of the host
            room = max_new_tokens - len(out)
            picker = twin if sampled_ar else None
            before = state.position
            state, picked = model.greedy_decode(state, out[-1], room, stops.__contains__, clock.mark, picker)
            new, finish = _cut(picked, stops, room)
            out.extend(new)
            lengths, sizes, paths = [1] * len(new), [1] * len(new), [[0] for _ in new]
            past_end = state.position - before - len(new)  # groups launched ahead of a stop: run, timed
        if finish is None and loop == "pipelined":
            assert (
                isinstance(model, GraphedTarget) and isinstance(state, GraphedState) and drafter is not None
            )
            finish, lengths, sizes, paths, past_end = _pipelined(
                model, route, state, ctx, out, max_new_tokens, stops, capture, clock, twin
            )
        while finish is None:
            clock.mark()
            proposal = drafter.propose(ctx) if drafter else None
            clock.mark()
            if on_device:
                tree = route.builder.build_device(out[-1], proposal)
                clock.mark()
                ver = model.verify(state, tree, capture, route.commit, route.verifier)
                clock.mark()
                if greedy:
                    state, path, tokens, bonus = model.commit_greedy(state, ver)
                else:
                    state, path, tokens, bonus = _device_accept(model, route, state, ver, len(out), twin)
                acc = Acceptance(path, bonus)
            else:
                rng = step_rng(route.rule.stream, len(out)) if route.random else None
                tree = route.builder.build(out[-1], proposal, rng)
                clock.mark()
                ver = model.verify(state, tree, capture, route.commit, route.verifier)
                acc = route.rule.accept(tree, ver.logits, len(out), rng)
                clock.mark()
                state = model.commit(state, ver, acc.path)
                tokens = tree.tokens[acc.path].tolist()
            clock.mark()
            new, finish = _cut(tokens[1:] + [acc.bonus], stops, max_new_tokens - len(out))
            out.extend(new)
            lengths.append(len(new))
            sizes.append(tree.size)
            paths.append(acc.path)
            ctx = DraftContext(list(prompt_ids), out, ver, acc.path)
    if isinstance(model, GraphedTarget):
        model.flush()  # a delayed commit's last state update (repro.models.graphed)
    t2 = _clock(dev)
    result = DecodeResult(out, lengths, sizes, t1 - t0, t2 - t1, clock.wall, finish, paths)
    result.device_stage_s = clock.device_s()
    result.busy_stage_s = clock.busy_s()
    result.graph_captures = graphs_captured() - captured
    if isinstance(model, GraphedTarget):
        result.host_wait_s = read_wait_s() - waited
    if past_end:
        result.launched_steps = len(lengths) + past_end
    return result
