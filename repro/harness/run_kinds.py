"""Every kind of run directory the harness writes, for reading any of them back (``repro report``).

Each kind is declared by the module that writes it: decode runs in :mod:`repro.reporting.rundir`,
the benchmarks in :mod:`repro.bench`, the falsifiers and the family report in :mod:`repro.harness`,
external decode loops in :mod:`repro.engines`.
"""

from __future__ import annotations

from pathlib import Path

from repro.bench import kernels as bench_kernels
from repro.bench import model as bench_model
from repro.engines import tables as external
from repro.harness import family_report
from repro.harness.falsify import exactness, pool_mass, protocol, timed
from repro.reporting import rundir
from repro.reporting.rundir import DECODE_KIND, Run, RunKind

KINDS: dict[str, RunKind] = {
    kind.name: kind
    for kind in (
        DECODE_KIND,
        bench_kernels.KIND,
        bench_model.KIND,
        exactness.KIND,
        pool_mass.KIND,
        timed.KIND,
        protocol.KIND,
        family_report.KIND,
        external.KIND,
    )
}


def load_run(path: str | Path) -> Run:
    """A run directory of any kind read back."""
    return rundir.load_run(path, KINDS)


def rebuild_report(path: str | Path, figures: str | Path | None = None) -> str:
    """Rebuild the report, tables and figures of a run directory of any kind from its records."""
    return rundir.rebuild_report(path, KINDS, figures)
