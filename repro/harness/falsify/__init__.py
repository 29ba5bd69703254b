"""The reviewers' falsification checks, one module each (``repro falsify``):

- :mod:`.exactness`: SpecLA's check 2, tree verification vs the float64 recurrence on every path;
- :mod:`.pool_mass`: the target's mass outside DFlash's top-K pool, the K vs 2K rerun and the verdict;
- :mod:`.oracle`: the Fig. 4 bound on the per-depth acceptance of any purely marginal drafter;
- :mod:`.timed`: what was timed in a decode run (layers executed per verify, the stage breakdown);
- :mod:`.protocol`: every method under one acceptance rule beside the best-of-protocol table.

The tree-exactness names are re-exported here (the check's original home).
"""

from repro.harness.falsify.exactness import (
    KIND,
    ExactnessRow,
    ReproError,
    open_exactness_run,
    positional_gate,
    tree_exactness,
    write_exactness,
)

__all__ = [
    "KIND",
    "ExactnessRow",
    "ReproError",
    "open_exactness_run",
    "positional_gate",
    "tree_exactness",
    "write_exactness",
]
