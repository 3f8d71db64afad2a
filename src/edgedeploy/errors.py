"""One error hierarchy for the whole package.

Library code raises these; only the CLI turns them into exit codes. A message
says what went wrong and where; ``hint`` says how to fix it.
"""

from __future__ import annotations


class EdgeDeployError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __reduce__(self):  # keep the hint when an error crosses a process boundary
        return (type(self), (self.message, self.hint))

    def one_line(self) -> str:
        text = self.message.rstrip(". ")
        return f"{text}. {self.hint}" if self.hint else text


class UsageError(EdgeDeployError):
    """The command line or a project file asks for something impossible."""

    exit_code = 2


class InvalidInputError(EdgeDeployError):
    """A model, data file or target file is missing, corrupt or unsuitable."""

    exit_code = 3


class TargetError(InvalidInputError):
    """An unknown target name or a target file with a bad value."""

    exit_code = 4


class ToolMissingError(EdgeDeployError):
    """An external tool (Vela, an FVP, a compiler) is not installed."""

    exit_code = 5


class ToolFailedError(EdgeDeployError):
    """An external tool ran and failed."""

    exit_code = 6


class CpuFallbackError(InvalidInputError):
    """Operators would run on the CPU where the NPU was required."""

    exit_code = 7


class BudgetExceededError(EdgeDeployError):
    """A result does not meet a stated requirement (size, accuracy, latency)."""

    exit_code = 8


class PreservationError(EdgeDeployError):
    """An optimization stage lost the sparsity or clustering of its parent."""

    exit_code = 9


class RegressionError(EdgeDeployError):
    """A result got worse than a saved reference beyond the tolerance."""

    exit_code = 10


class NpuModelError(EdgeDeployError):
    """The functional NPU model met a command, register setting or stream it does not implement or cannot read."""

    exit_code = 11


class MismatchError(EdgeDeployError):
    """The functional NPU model's outputs differ from TFLite's reference kernels."""

    exit_code = 12


class DiskFullError(EdgeDeployError):
    """A disk or a disk quota is full: a file edgedeploy writes could not be written (nothing half-written is kept)."""

    exit_code = 13
