"""repro: a reference harness for speculative decoding on Gated DeltaNet language models."""

import importlib.util
import os
from pathlib import Path

__version__ = "0.1.0"

CACHE_ENV = "REPRO_CACHE"

# Triton's CPU interpreter (TRITON_INTERPRET=1): repro's patches to it, before any kernel runs
if os.environ.get("TRITON_INTERPRET") and importlib.util.find_spec("triton") is not None:
    from repro import triton_interpreter  # noqa: E402, F401


def cache_dir() -> Path:
    """repro's cache folder (downloaded archives, checkpoint fingerprints): $REPRO_CACHE, else
    ~/.cache/repro."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "repro"
