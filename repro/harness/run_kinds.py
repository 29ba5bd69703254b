"""Every kind of run directory the harness writes, for reading any of them back (``repro report``).

Each kind is declared by the module that builds its report: decode runs in
:mod:`repro.reporting.report`, the benchmarks in :mod:`repro.bench`, the falsifiers and the family report
in :mod:`repro.harness`, external decode loops in :mod:`repro.engines`, the paper artefacts in
:mod:`repro.paper`.
"""

from __future__ import annotations

from pathlib import Path

from repro.bench import kernels_report, model_report
from repro.bench import scale as bench_scale
from repro.engines import tables as external
from repro.errors import ConfigError
from repro.harness import family_report
from repro.harness.falsify import exactness, pool_mass, protocol, timed
from repro.paper import specla_acceptance, specla_table, sweep, table2
from repro.reporting import rundir
from repro.reporting.report import DECODE_KIND
from repro.reporting.rundir import Run, RunKind

KINDS: dict[str, RunKind] = {
    kind.name: kind
    for kind in (
        DECODE_KIND,
        kernels_report.KIND,
        model_report.KIND,
        bench_scale.KIND,
        exactness.KIND,
        pool_mass.KIND,
        timed.KIND,
        protocol.KIND,
        family_report.KIND,
        external.KIND,
        table2.KIND,
        specla_table.KIND,
        specla_acceptance.KIND,
        sweep.KIND,
    )
}
# an experiment's ``kind`` setting -> the run-directory kind it writes (a paper artefact, or plain decode)
EXPERIMENT_KINDS: dict[str, RunKind] = {
    "decode": DECODE_KIND,
    table2.EXPERIMENT: table2.KIND,
    specla_table.EXPERIMENT: specla_table.KIND,
    specla_acceptance.EXPERIMENT: specla_acceptance.KIND,
    sweep.EXPERIMENT: sweep.KIND,
}


def experiment_kind(name: str) -> RunKind:
    """The run-directory kind of an experiment's ``kind`` setting, or a one-line ConfigError."""
    if name not in EXPERIMENT_KINDS:
        raise ConfigError(f"unknown experiment kind {name!r}: choose one of {', '.join(EXPERIMENT_KINDS)}")
    return EXPERIMENT_KINDS[name]


def load_run(path: str | Path) -> Run:
    """A run directory of any kind read back."""
    return rundir.load_run(path, KINDS)


def rebuild_report(path: str | Path, figures: str | Path | None = None) -> str:
    """Rebuild the report, tables and figures of a run directory of any kind from its records."""
    return rundir.rebuild_report(path, KINDS, figures)
