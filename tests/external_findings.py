"""The external implementations' findings on tiny-qwen35 (float64 weights, greedy, CPU), per transformers
version, pinned by tests/engines/test_findings.py and tests/harness/test_external_routes.py.

- transformers 5.17-5.24 (results/2026-12-01-external-loops): the linear-attention cache's ``crop`` rolls
  back the conv window but not the GDN recurrent state, so the ``dflash`` package's loop (which verifies a
  whole block, then crops the rejected tokens) diverges from AR at the pinned tokens; assisted generation
  refuses the stateful Qwen3.5 model.
- transformers 5.25 on (results/2026-12-03-cpu-external-loops-transformers-5.25):
  ``activate_past_recording(recurrent_states_to_keep=k)`` keeps the last k recurrent states and ``crop``
  restores the right one (bitwise here): the cause is fixed; assisted generation runs on Qwen3.5 and is
  identical to AR, also with a perturbed copy of the target as the assistant (drafts rejected, states
  rolled back); the dflash package (0.1.0) still calls ``activate_past_recording()`` without
  ``recurrent_states_to_keep`` and its first verify forward raises inside transformers.

A test failing with "verdict changed" is news (a release of either package): re-run ``repro falsify
external``, record the folder, and pin the new verdicts here.
"""

from __future__ import annotations

import transformers
from packaging.version import Version

RECORDS_RECURRENT_STATES = Version(transformers.__version__) >= Version("5.25")
FOLDER = (
    "results/2026-12-03-cpu-external-loops-transformers-5.25"
    if RECORDS_RECURRENT_STATES
    else "results/2026-12-01-external-loops"
)
CHANGED = "verdict changed (was {was!r}, now {now!r}) for {what}: re-run " + FOLDER
ASSISTED_REFUSED = (
    "refused: ValueError: assisted generation is not supported with stateful models,"
    " such as Qwen3_5ForCausalLM"
)
# the dflash package's loop per prompt (suite/id of the first turn): first divergence from AR (5.17-5.24)
DFLASH_DIVERGES = {"gsm8k/588": "diverged at token 2", "mt_bench/130": "diverged at token 7"}
DFLASH_FAILS = (
    "refused: dflash_generate failed: TypeError: '<' not supported between instances of 'int' and 'NoneType'"
)


def assisted_verdict() -> str:
    """transformers' assisted generation (the target as its own assistant) against AR."""
    return "identical" if RECORDS_RECURRENT_STATES else ASSISTED_REFUSED


def dflash_loop_verdict(prompt: str) -> str:
    """The dflash package's ``dflash_generate`` against AR on ``prompt`` ("suite/id")."""
    return DFLASH_FAILS if RECORDS_RECURRENT_STATES else DFLASH_DIVERGES[prompt]
