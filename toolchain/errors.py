"""One error hierarchy: each kind of failure has a fixed exit code.

Errors are caught once at the top (dodo.py and the task reporter) and printed as
one line; a traceback appears only with COLI_DEBUG=1.
"""

from __future__ import annotations

__all__ = [
    "BuildError",
    "ColiError",
    "ConfigError",
    "ReleaseError",
    "ToolchainError",
    "ValidateError",
    "VerifyError",
    "os_error_line",
]


class ColiError(Exception):
    """A failure a person can act on; `str()` is the one-line message."""

    exit_code = 1
    kind = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} ({hint})")

    def one_line(self) -> str:
        return f"{self.kind}: {self}"


class ConfigError(ColiError):
    """The configuration (file, environment or command line) is invalid."""

    exit_code = 2
    kind = "config error"

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))

    def one_line(self) -> str:
        if len(self.problems) == 1:
            return f"{self.kind}: {self.problems[0]}"
        lines = [f"{self.kind}: {len(self.problems)} problems"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class ToolchainError(ColiError):
    """A compiler, SDK or runtime the request needs is missing or unsuitable."""

    exit_code = 3
    kind = "toolchain error"


class BuildError(ColiError):
    """A compile or link step failed."""

    exit_code = 4
    kind = "build error"


class VerifyError(ColiError):
    """An artifact does not have the shape it must have."""

    exit_code = 5
    kind = "verify failed"


class ValidateError(ColiError):
    """The engine gave a different answer than the reference."""

    exit_code = 6
    kind = "validate failed"


class ReleaseError(ColiError):
    """A release cannot be published as configured."""

    exit_code = 7
    kind = "release failed"


def os_error_line(exc: OSError) -> str:
    """The file system's refusal as one line: the path or paths, then the system's reason."""
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    reason = exc.strerror or str(exc)
    return f"{paths}: {reason}" if paths else reason
