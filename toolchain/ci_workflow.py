"""`doit ci-workflow`: the release matrix rendered as a GitHub Actions workflow.

Each entry becomes one job on a runner of its platform (toolchain/data/ci.toml,
overridden by release.runners), with a compiler cache keyed by the toolchain
fingerprint that the job computes on its runner (python -m toolchain.fingerprint).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from .config import ResolvedConfig
from .config.release import release_entries
from .errors import ConfigError

__all__ = ["render_workflow", "workflow_path"]

TEMPLATE_DIR = Path(__file__).parent / "templates" / "ci"


def workflow_path(root: Path, rc: ResolvedConfig) -> Path:
    assert rc.config.release is not None
    return root / ".github" / "workflows" / f"release-{rc.config.release.name}.yml"


def _runner_table() -> dict[str, dict[str, Any]]:
    text = resources.files("toolchain.data").joinpath("ci.toml").read_text(encoding="utf-8")
    targets: dict[str, dict[str, Any]] = tomllib.loads(text)["targets"]
    return targets


def render_workflow(root: Path, rc: ResolvedConfig) -> str:
    release = rc.config.release
    if release is None:
        raise ConfigError(f"{rc.file} has no [release] table; ci-workflow renders a release matrix")
    table = _runner_table()
    try:
        config = rc.file.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise ConfigError(
            f"{rc.file} is outside the project; CI checks out the project, so the config must be in it"
        ) from None
    entries = []
    for e in release_entries(release):
        target = f"{e.os}-{e.api}"
        row = table[target]
        runs_on = release.runners.get(target, row["runs-on"])  # type: ignore[call-overload]
        linux_job = not str(runs_on).startswith("windows")
        launcher = rc.config.cache.launcher
        entries.append(
            {
                "id": e.id,
                "runs_on": runs_on,
                "container": row.get("container", "") if linux_job else "",
                "install": row.get("install", ""),
                "installer": row.get("installer", ""),
                # the Windows GPU compiles are one compile-and-link step each, which no cache serves
                "launcher": (launcher if launcher != "none" else "ccache") if linux_job else "none",
            }
        )
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        block_start_string="[%",
        block_end_string="%]",
        variable_start_string="[[",
        variable_end_string="]]",
    )
    return env.get_template("release.yml.j2").render(
        name=release.name,
        config=config,
        version=rc.config.version,
        cache_dir=rc.config.cache.dir,
        entries=entries,
    )
