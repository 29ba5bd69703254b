"""What the serving-engine adapters (SGLang, vLLM) share: one engine kept alive across prompts (a
27B load per prompt would dominate the night), the dtypes they run, and the greedy-call convention."""

from __future__ import annotations

import atexit
from collections.abc import Callable, Hashable
from typing import Any

SERVING_DTYPES = ("bfloat16", "float16", "float32")  # neither engine runs float64 weights

_live: dict[str, tuple[Hashable, Any, Callable[[Any], None]]] = {}


def cached_engine(slot: str, key: Hashable, start: Callable[[], Any], stop: Callable[[Any], None]) -> Any:
    """The engine of ``slot`` built for ``key``: reused while the key is the same; a new key stops
    the old engine first (one engine holds the GPU at a time); every engine is stopped at exit."""
    held = _live.get(slot)
    if held is not None and held[0] == key:
        return held[1]
    close(slot)
    engine = start()
    _live[slot] = (key, engine, stop)
    return engine


def close(slot: str | None = None) -> None:
    """Stop the engine of ``slot`` (every slot when None)."""
    for name in [slot] if slot else list(_live):
        held = _live.pop(name, None)
        if held is not None:
            held[2](held[1])


atexit.register(close)


def dtype_refusal(engine: str, dtype: str) -> str | None:
    """Why ``engine`` cannot run weights of ``dtype`` (None when it can)."""
    if dtype in SERVING_DTYPES:
        return None
    return f"{engine} runs {', '.join(SERVING_DTYPES)} weights, not {dtype} (pass --dtype bfloat16)"
