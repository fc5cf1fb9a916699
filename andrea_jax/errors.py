"""The project's errors: one base class that carries the exit code of the command line.

Every error a user can cause (a config, data, a checkpoint, a workdir, a model to load) derives
from `AndreaError`, whose one-line message names the key, file or step at fault; `train.py` and
the other commands catch the base and exit with its `exit_code`. Anything else is a bug and keeps
its traceback.
"""
from __future__ import annotations


class AndreaError(Exception):
    """An error whose message says all a user needs; the process exits with `exit_code`."""
    exit_code = 1


class ConfigError(AndreaError, ValueError):
    """A bad config or command line: the message names the key. Fix it and rerun (exit 2)."""
    exit_code = 2


class KernelUnavailableError(ConfigError):
    """kernels.impl asks for a backend this machine cannot run; the message names what is missing."""


class MissingExtraError(AndreaError):
    """What the command or a setting asks for needs an optional extra (pyproject.toml) that this
    install lacks: the message names the extra and the command that installs it (exit 2)."""
    exit_code = 2

    def __init__(self, needs: str, extra: str):
        super().__init__(f'{needs} needs the {extra} extra: pip install -e ".[{extra}]"')
        self.extra = extra


def is_missing(err: ImportError, *packages: str) -> bool:
    """Whether `err` says that one of `packages` (or a module inside it) is not installed, not that
    something the package imports is missing or broken (that keeps its traceback)."""
    name = err.name or ""
    return isinstance(err, ModuleNotFoundError) and any(
        name == p or name.startswith(p + ".") for p in packages)


class KernelExtraMissing(MissingExtraError, KernelUnavailableError):
    """kernels.impl=triton without jax-triton: callers that catch KernelUnavailableError skip the
    backend as on a machine without a GPU."""


class DataError(AndreaError, ValueError):
    """Bad input data that stops the run: the message names the file (or dataset)."""


class DataWarning(UserWarning):
    """Input that was read with repairs (invalid UTF-8 replaced): the message names the file."""


class WorkdirError(AndreaError, OSError):
    """The workdir cannot be used: not a folder, not writable, or held by another live run."""


class WorkdirBusy(WorkdirError):
    """Another live run holds the workdir."""


class ResumeError(AndreaError):
    """The workdir's checkpoints come from a run with other settings; the message names them."""


class CheckpointError(AndreaError, RuntimeError):
    """No checkpoint can be restored: the message names each one and says why."""


class TrainingError(AndreaError, RuntimeError):
    """Training cannot go on (a non-finite loss or parameters): the message says at which step."""


class LoadError(AndreaError, RuntimeError):
    """A run or export that cannot be loaded: the message names the path."""


class ExportError(AndreaError, ValueError):
    """An export that cannot be written."""


class TaskError(AndreaError, ValueError):
    """A task file that cannot be read: the message names the file and line."""


class PlotError(AndreaError, ValueError):
    """Metrics that cannot be plotted: the message names the file."""
