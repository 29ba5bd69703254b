"""Run a decode experiment: every route on every prompt and turn, records written as they go.

Prompts are interleaved across routes (for each prompt and turn, every route in turn, AR
first), so that speedups compare routes under the same machine conditions. AR's output is the
reference for the lossless check and for synthetic drafters. MT-Bench's second turn is asked
after the route's own first-turn answer. Routes of kind ``external`` run another implementation's
decode loop (:mod:`repro.engines.external_route`) in the same interleaving and write the same records.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from repro.data.suites import Prompt
from repro.decoding.engine import DecodeResult, Route, generate
from repro.decoding.routes import build_route, family_of, prepare_graphs
from repro.decoding.switches import applied
from repro.engines.external_route import ExternalRoute, build_external, is_external
from repro.errors import ConfigError, ReproError, RunDirError
from repro.harness.parallel import Shard, expected_keys, experiment_prompts, shard_prompts
from repro.models.graphed import GraphedTarget
from repro.models.hybrid import HybridLM
from repro.models.target import open_target
from repro.models.tokenizer import Tokenizer
from repro.reporting.records import (
    RECORDS_FILE,
    DecodeRecord,
    compare_to_reference,
    foreign_record,
    reference_route,
    sha256_ids,
)
from repro.reporting.rundir import RunDir

WARMUP_PROMPT = "Warm-up: say something short."

ProgressFn = Callable[[str], None]


def make_record(
    route: Route,
    prompt: Prompt,
    turn: int,
    prompt_ids: list[int],
    result: DecodeResult,
    cfg: dict,
    vs_ar: str,
) -> DecodeRecord:
    return DecodeRecord(
        route=route.name,
        route_params=route.params,
        suite=prompt.suite,
        prompt_id=prompt.id,
        turn=turn,
        prompt_sha256=sha256_ids(prompt_ids),
        prompt_tokens=len(prompt_ids),
        new_tokens=len(result.output_ids),
        steps=result.steps,
        accepted_lengths=result.accepted_lengths,
        tree_sizes=result.tree_sizes,
        prefill_s=result.prefill_s,
        decode_s=result.decode_s,
        stage_s=result.stage_s,
        device_stage_s=result.device_stage_s,
        busy_stage_s=result.busy_stage_s,
        graph_captures=result.graph_captures,
        launched_steps=result.launched_steps,
        host_wait_s=result.host_wait_s,
        output_ids=result.output_ids,
        output_sha256=sha256_ids(result.output_ids),
        finish_reason=result.finish_reason,
        vs_ar=vs_ar,
        temperature=float(cfg["temperature"]),
        seed=int(cfg["seed"]),
    )


def answer_text(tokenizer: Tokenizer, ids: list[int]) -> str:
    """The assistant's answer as history for the next turn (stop tokens dropped)."""
    stops = set(tokenizer.stop_token_ids)
    return tokenizer.decode([t for t in ids if t not in stops])


class ExperimentRunner:
    """Holds the target, tokenizer and routes of one resolved experiment config."""

    def __init__(self, cfg: dict[str, Any], shard: Shard | None = None) -> None:
        self.cfg = cfg
        self.shard = shard  # decode only this shard's prompts (repro.harness.parallel)
        if cfg["device"] == "cpu" and cfg["cpu_threads"]:
            torch.set_num_threads(int(cfg["cpu_threads"]))
        # external routes first: a missing package or checkpoint is refused before any weights load
        external = {s["name"]: build_external(s, str(cfg["target"])) for s in cfg["routes"] if is_external(s)}
        self.model: HybridLM
        self.model, self.tokenizer = open_target(
            cfg["target"], cfg["dtype"], cfg["device"], cfg["target_seed"]
        )
        self.model.set_gdn_backend(cfg["gdn_backend"])
        self.context = self.model.config.max_position_embeddings
        if self.context is not None and int(cfg["max_new_tokens"]) >= self.context:
            raise ConfigError(
                f"max_new_tokens {cfg['max_new_tokens']} does not fit the target's context of "
                f"{self.context} tokens (max_position_embeddings) with any prompt"
            )
        vocab = self.model.config.vocab_size
        rule = (cfg["acceptance"], float(cfg["temperature"]), int(cfg["seed"]))
        # the target the routes decode on: HybridLM itself, or its static decoder (CUDA graphs on CUDA);
        # routes are built on it, so that drafters take their static paths on the graphed engine
        self.target: HybridLM | GraphedTarget = self.model
        if cfg.get("engine", "eager") == "graphed":
            self.target = GraphedTarget(self.model)
        self.routes = [
            build_route(
                spec, vocab, *rule, target=self.target, commit=cfg["commit"], family=family_of(cfg["target"])
            )
            for spec in cfg["routes"]
            if not is_external(spec)
        ]
        built = {r.name: r for r in self.routes}
        # every route in config order: repro's own and the external ones
        self.all_routes: list[Route | ExternalRoute] = [
            external.get(s["name"]) or built[s["name"]] for s in cfg["routes"]
        ]
        self.stop_ids = () if cfg["ignore_eos"] else tuple(self.tokenizer.stop_token_ids)
        if isinstance(self.target, GraphedTarget) and self.routes:
            prepare_graphs(self.target, self.routes)

    def decode(self, route: Route, prompt_ids: list[int], reference: list[int] | None) -> DecodeResult:
        """One decode with ``route`` (its own commit strategy: the experiment's unless it names one); a
        warning line on stderr when prompt + max_new_tokens exceed the target's context
        (positions beyond max_position_embeddings are outside what the model was built for)."""
        need = len(prompt_ids) + int(self.cfg["max_new_tokens"])
        if self.context is not None and need > self.context:
            print(
                f"warning: a prompt of {len(prompt_ids)} tokens plus max_new_tokens "
                f"{self.cfg['max_new_tokens']} exceed the target's context of {self.context} tokens "
                "(max_position_embeddings)",
                file=sys.stderr,
            )
        return generate(
            self.target, prompt_ids, route, int(self.cfg["max_new_tokens"]), self.stop_ids, reference
        )

    def warm_up(self) -> None:
        ids = self.tokenizer.chat_prompt([{"role": "user", "content": WARMUP_PROMPT}])
        for _ in range(int(self.cfg["warmup"])):
            ref = None
            for route in self.routes:
                short = generate(self.target, ids, route, 8, (), ref)
                ref = ref or short.output_ids

    def prompts(self) -> list[Prompt]:
        """The suites' seeded subsamples, in order; only this runner's shard of them when it has one."""
        return shard_prompts(experiment_prompts(self.cfg), self.shard)

    def run(self, run_dir: RunDir, progress: ProgressFn | None = None) -> int:
        """Decode every (prompt, turn, route) not yet in ``run_dir``; returns records written."""
        prompts = self.prompts()
        try:
            self.check_resumed(run_dir.scanned)
        except ReproError as e:
            raise RunDirError(f"cannot resume {run_dir.path}: {e}") from None
        done = run_dir.done_keys()
        ref_route = reference_route((r.name, r.params) for r in self.all_routes)
        self.warm_up()
        written = 0
        for prompt in prompts:
            history: dict[str, list[dict[str, str]]] = {r.name: [] for r in self.all_routes}
            reference: list[int] | None = None
            for turn, user_text in enumerate(prompt.turns):
                for route in self.all_routes:
                    messages = history[route.name] + [{"role": "user", "content": user_text}]
                    key = (route.name, prompt.suite, prompt.id, turn)
                    prompt_ids = self.tokenizer.chat_prompt(messages)
                    if key in done:  # its prompt checked by check_resumed
                        record = run_dir.get(*key)
                    else:
                        if isinstance(route, ExternalRoute):
                            record = self.decode_external(route, prompt, turn, prompt_ids, reference, run_dir)
                        else:
                            result = self.decode(route, prompt_ids, reference)
                            if route.name == ref_route:
                                vs_ar = "reference"
                            elif reference is None:
                                vs_ar = "no reference"
                            else:
                                vs_ar = compare_to_reference(result.output_ids, reference)
                            record = make_record(route, prompt, turn, prompt_ids, result, self.cfg, vs_ar)
                        run_dir.append(record)
                        written += 1
                    if route.name == ref_route:
                        reference = list(record.output_ids)
                    history[route.name] = self.answered(messages, record.output_ids)
                    if progress:
                        progress(f"{prompt.suite}/{prompt.id} turn {turn} {route.name}")
        return written

    def decode_external(
        self,
        route: ExternalRoute,
        prompt: Prompt,
        turn: int,
        prompt_ids: list[int],
        reference: list[int] | None,
        run_dir: RunDir,
    ) -> DecodeRecord:
        """One generation by an external route's loop as a record; the first time a route runs, how its
        loop ran (engine, notes) goes into the manifest's ``external_routes``."""
        result = route.decode(prompt_ids, self.cfg, self.stop_ids)
        seen = run_dir.manifest.get("external_routes") or {}
        if route.name not in seen:
            run_dir.update_manifest(external_routes={**seen, route.name: route.notes(result)})
        return route.record(prompt, turn, prompt_ids, result, reference, self.cfg, self.stop_ids)

    def answered(self, messages: list[dict[str, str]], output_ids: list[int]) -> list[dict[str, str]]:
        """The conversation ``messages`` followed by the answer ``output_ids`` (the next turn's history)."""
        return messages + [{"role": "assistant", "content": answer_text(self.tokenizer, output_ids)}]

    def check_resumed(self, records: list[tuple[int, DecodeRecord]]) -> None:
        """Refuse records (of a resumed run: (line number, record) pairs) that this configuration did not
        write: each must be of one of these routes with the same resolved parameters, of one of this run's
        (shard's) prompts and turns, of its seed and temperature and within its max_new_tokens, and decoded
        from the prompt this run builds for it (a record edited by hand or written by another configuration
        is not mixed in). ReproError, one line, before anything is decoded."""
        params = {route.name: route.params for route in self.all_routes}
        keys = expected_keys(self.cfg, self.shard or Shard(0, 1))
        for lineno, record in records:
            if why := foreign_record(record, self.cfg, keys, params):
                raise ReproError(
                    f"{RECORDS_FILE} line {lineno}: {why}; the records were not written by this configuration"
                )
        if why := self.other_prompt({record.key: (lineno, record) for lineno, record in records}):
            raise ReproError(why)

    def other_prompt(self, held: dict[tuple, tuple[int, DecodeRecord]]) -> str | None:
        """Why a record ``held`` (key -> (line number, record)) was not decoded from the prompt this run
        builds for it (each turn after the route's own earlier answers), or None."""
        for prompt in self.prompts():
            for route in self.all_routes:
                history: list[dict[str, str]] = []
                missing = None
                for turn, user_text in enumerate(prompt.turns):
                    messages = history + [{"role": "user", "content": user_text}]
                    lineno, record = held.get((route.name, prompt.suite, prompt.id, turn), (0, None))
                    where = (
                        f"{RECORDS_FILE} line {lineno}: the record of {prompt.suite}/{prompt.id} turn {turn}"
                    )
                    if record is None:
                        missing = turn
                    elif missing is not None:
                        return f"{where} {route.name} has no turn {missing} before it"
                    elif record.prompt_sha256 != sha256_ids(self.tokenizer.chat_prompt(messages)):
                        return (
                            f"{where} {route.name} was decoded from another prompt than this run builds (the"
                            " suite text, chat template or tokenizer changed)"
                        )
                    else:
                        history = self.answered(messages, record.output_ids)
        return None

    def total_units(self) -> int:
        return sum(len(p.turns) for p in self.prompts()) * len(self.all_routes)


@contextlib.contextmanager
def opened_runner(cfg: dict[str, Any], shard: Shard | None = None) -> Iterator[ExperimentRunner]:
    """An :class:`ExperimentRunner` of ``cfg`` built and used under the config's engine switches
    (:func:`repro.decoding.switches.applied`: its graphs are captured and its routes decode with them); the
    switches are restored when the block ends."""
    with applied(cfg.get("switches") or {}):
        yield ExperimentRunner(cfg, shard)


def default_out_dir(cfg: dict[str, Any]) -> Path:
    return Path("runs") / str(cfg["name"])
