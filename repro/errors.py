"""User-facing errors: one line that names the problem and what to do."""


class ReproError(Exception):
    """An error caused by bad input; the CLI prints it as one line and exits non-zero."""


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
