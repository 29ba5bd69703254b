"""User-facing errors: one line that names the problem and what to do.

The CLI's exit codes: 0 success, 2 bad usage or input (:class:`ReproError`), 3 a check failed
(:class:`CheckFailed`), 130 interrupted.
"""

from pathlib import Path


class ReproError(Exception):
    """An error caused by bad input; the CLI prints it as one line and exits with ``exit_code`` (2)."""

    exit_code = 2


class CheckFailed(ReproError):
    """A check that ran to the end and failed (e.g. a lossless route diverged from AR); exit code 3."""

    exit_code = 3


class TreeError(ReproError):
    """A draft tree that is not a valid topologically ordered tree."""


class CheckpointError(ReproError):
    """A checkpoint directory that is missing, incomplete or of an unsupported architecture."""


class SuiteError(ReproError):
    """A suite that is unknown, missing or whose frozen file does not match its manifest."""


class ConfigError(ReproError):
    """An experiment, route or override that cannot be used."""


class RunDirError(ReproError):
    """An output directory that holds records of a different configuration."""


def not_a_folder(path: object, what: str) -> str:
    """The one line about ``path`` (``what`` names it), which should be an existing folder and is not: a
    file there, or nothing."""
    return (
        f"{what} {path} is a file, not a folder"
        if Path(str(path)).exists()
        else f"{what} {path} does not exist"
    )


def describe(exc: BaseException, limit: int = 300) -> str:
    """One line naming an unexpected exception for a record: ``Type: message`` of it and of the errors
    behind it (``inner_exception`` of torch's BackendCompilerFailed, else the cause or the context), each
    with its first informative line (not a bare ``... raised:`` header), at most ``limit`` characters."""
    parts, seen = [], set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen and len(parts) < 4:
        seen.add(id(err))
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        informative = [line for line in lines if not line.endswith("raised:")]
        part = f"{type(err).__name__}: {informative[0] if informative else ''}".rstrip(": ")
        if not any(part in p for p in parts):  # BackendCompilerFailed quotes its inner error
            parts.append(part)
        inner = getattr(err, "inner_exception", None)
        err = inner or err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    text = " <- ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."
