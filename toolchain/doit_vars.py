"""The `doit` command line's variables (`doit build arch=sm_90 os=windows`).

doit's public `get_var(name)` answers for one name it is asked; the task graph
needs every variable given, so that a misspelt one (`arhc=cpu`) is an error and
not silently ignored, and doit keeps them only in `doit.doit_cmd._CMDLINE_VARS`.
That private name is read here and nowhere else; tests/unit/test_doit_vars.py
runs doit and fails on a doit release that moves it.
"""

from __future__ import annotations

from .errors import ConfigError

__all__ = ["command_line_variables"]


def command_line_variables() -> dict[str, str]:
    """Every `name=value` of the doit command line (empty outside a doit run)."""
    from doit import doit_cmd

    if not hasattr(doit_cmd, "_CMDLINE_VARS"):
        import doit

        version = ".".join(map(str, getattr(doit, "__version__", ("?",))))
        raise ConfigError(
            f"doit {version} keeps its command-line variables elsewhere than coli-build reads them "
            "(doit.doit_cmd._CMDLINE_VARS); install doit>=0.36,<0.38 (pyproject.toml)"
        )
    return dict(doit_cmd._CMDLINE_VARS or {})
