"""What every SDK the build can use offers (the CUDA toolkit, the Linux HIP SDK,
the Windows HIP SDK), and what stands in for one that is absent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Missing", "Sdk"]


class Sdk(Protocol):
    """A GPU SDK found on this machine."""

    @property
    def version(self) -> str: ...

    @property
    def location(self) -> str:
        """Where it is installed (its root), for messages."""
        ...

    def supports(self, arch: str) -> bool:
        """Whether it can build device code for `arch`."""
        ...

    def fingerprint(self) -> dict[str, str]:
        """What the builds depend on (paths, versions): a change rebuilds them."""
        ...


@dataclass(frozen=True)
class Missing:
    """A tool or SDK that is not here: what, why, and how to get it."""

    what: str
    reason: str
    hint: str

    def __str__(self) -> str:
        return f"{self.what}: {self.reason} ({self.hint})"
