"""Routes at the papers' model shapes: random drafters of their real shapes, acceptance replayed.

:func:`build_scale_route` is :func:`repro.decoding.routes.build_route` with the shape's random drafter
constructors (:func:`repro.drafters.shapes.drafter_constructors`); :func:`replayed` swaps a route's
acceptance rule for :class:`repro.decoding.replayed.ReplayedAcceptance` (``repro bench scale``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from repro.decoding.engine import Route
from repro.decoding.replayed import AcceptanceProcess, ReplayedAcceptance
from repro.decoding.routes import build_route
from repro.drafters.shapes import drafter_constructors, drafter_info
from repro.models.graphed import GraphedTarget
from repro.models.hybrid import HybridLM


def build_scale_route(
    spec: dict[str, Any], shape: str, target: HybridLM | GraphedTarget, seed: int, commit: str
) -> Route:
    """``spec`` built on ``target`` (greedy acceptance) with random drafters of ``shape``'s real shapes."""
    return build_route(
        spec, target.config.vocab_size, "greedy", 0.0, seed, target=target, commit=commit,
        random_drafters=drafter_constructors(shape),
    )  # fmt: skip


def replayed(route: Route, process: AcceptanceProcess, seed: int) -> Route:
    """``route`` with its acceptance replayed from ``process`` (``acceptance: replayed`` in its params)."""
    rule = ReplayedAcceptance(process=process, seed=seed)
    return replace(route, rule=rule, params={**route.params, "acceptance": "replayed"})


def route_drafters(route: Route) -> dict[str, Any]:
    """Shapes and parameter counts of the route's drafter models."""
    return drafter_info(route.drafter)
