"""``scripts/gpu/routes-ab.py`` as a module (its file name has a dash), for the device scripts beside it:
one setup of the family target, prompts, device, dtype and graphed routes. In a script under scripts/gpu/
(its folder is first on ``sys.path`` when run as ``python3 scripts/gpu/NAME.py``): ``from _routes_ab import
ab``. Not a benchmark itself: scripts/gpu_session.sh skips the names starting with ``_``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("routes_ab", Path(__file__).with_name("routes-ab.py"))
assert _spec is not None and _spec.loader is not None
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)
