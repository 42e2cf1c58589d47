"""One error hierarchy; each class carries its process exit code (the table in README.md)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    USER_ERROR = 1  # bad model file, bad option value, unsupported model, tampered artifact
    USAGE = 2  # unknown command or option (typer/click)
    ACCURACY = 3  # the compiled model does not match its reference
    MISSING_DEPENDENCY = 4  # an optional package or tool is not installed
    INTERNAL = 70  # a bug in mlc or a crash inside TVM


class MlcError(Exception):
    """An error the user can act on. `str(err)` is the one-line message shown to the user."""

    exit_code: ExitCode = ExitCode.USER_ERROR

    def __init__(self, message: str):
        # One line, always: a value echoed from the user or a model may carry line breaks.
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


class InputError(MlcError):
    """A file or an option value is wrong."""


class UnsupportedModelError(MlcError):
    """The model is valid but uses something mlc/TVM cannot compile."""


class NodeConversionError(UnsupportedModelError):
    """TVM's converter failed on one node of a valid model (an op it converts in other forms)."""


class TargetError(MlcError):
    """An unknown or unusable target."""


class IntegrityError(MlcError):
    """An artifact is incomplete, tampered with, or from a newer mlc."""


class AccuracyError(MlcError):
    exit_code = ExitCode.ACCURACY


class MissingDependencyError(MlcError):
    exit_code = ExitCode.MISSING_DEPENDENCY


class CompilerError(MlcError):
    """TVM failed or crashed on a model that passed our checks. `stage` names the worker step that failed
    ("import", "passes", "build", "export", "run", ...; None when the worker died without saying); `detail` TVM's
    own one-line message, where the worker reported one (the message adds where the log is)."""

    exit_code = ExitCode.INTERNAL

    def __init__(self, message: str, stage: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.stage = stage
        self.detail = detail
