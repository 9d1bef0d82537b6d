"""Check sessions. `nox -s ci` runs everything CI runs; the others are its parts."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["ci"]


def _install(session: nox.Session) -> None:
    session.install("-q", "-e", ".[dev]")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and format check."""
    _install(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def types(session: nox.Session) -> None:
    """mypy --strict over the package, the tests, dodo.py and this file."""
    _install(session)
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """pytest, including the real-compiler builds; any skip fails (no tool may be silently missing)."""
    _install(session)
    session.run("pytest", *session.posargs, env={"COLI_FAIL_ON_SKIP": "1"})


@nox.session
def build(session: nox.Session) -> None:
    """doit build with the default config (arguments go to doit, e.g. arch=cpu)."""
    _install(session)
    session.run("doit", "build", *session.posargs)


@nox.session
def ci(session: nox.Session) -> None:
    """Everything: lint, types, tests."""
    _install(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("pytest", *session.posargs, env={"COLI_FAIL_ON_SKIP": "1"})
