"""What a run of the task graph loads before it makes any task: the config (file <
environment < doit variables), the toolchains found, and the build plans (one for
`doit build`, one per platform of a release config's matrix). No doit here: the
CI cache key (`python -m toolchain.fingerprint`) loads the same without it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ResolvedConfig, load_config
from .config.folders import folder_problems
from .config.release import ReleaseEntry, release_entries
from .discover import Toolchains, discover
from .errors import ConfigError
from .plan import Plan, make_plan, make_release_plans
from .probe import Prober

__all__ = ["Loaded", "ReleaseRun", "entry_fingerprint", "load_plan"]


@dataclass(frozen=True)
class ReleaseRun:
    entries: tuple[ReleaseEntry, ...]
    not_built: Mapping[str, str]  # entry id -> what this machine lacks to build it


@dataclass(frozen=True)
class Loaded:
    """What dodo.py builds: one plan per platform (one for `doit build`, one per platform
    of the matrix for a release config) and, for a release config, its entries."""

    rc: ResolvedConfig
    root: Path
    toolchains: Toolchains
    plans: tuple[Plan, ...]
    release: ReleaseRun | None

    @property
    def folders(self) -> tuple[Path, Path]:
        """The build and dist folders, absolute."""
        return self.rc.folders(self.root)


def load_plan(root: Path, variables: Mapping[str, str], env: Mapping[str, str]) -> Loaded:
    """Config (file < env < variables), toolchain discovery, and the build plans."""
    config_file = Path(variables.get("config") or env.get("COLI_CONFIG") or root / "configs/default.toml")
    rc: ResolvedConfig = load_config(config_file, env, variables)
    problems = folder_problems(rc, root)
    if problems:
        raise ConfigError(problems)
    prober = Prober((root / rc.config.build.build_dir / ".cache" / "probes.json").absolute())
    toolchains = discover(rc, env, prober)
    release = rc.config.release
    if release is None:
        return Loaded(rc, root, toolchains, (make_plan(rc, toolchains, root, env=env),), None)
    given = [f"{v}=" for v in ("arch", "os") if v in variables]
    if given:
        raise ConfigError(
            f"{' and '.join(given)} do not apply to a release config ({config_file}): its [release] table says "
            "what to build; pick entries with entry=<id>[,<id>...]"
        )
    entries = release_entries(release)
    plans, skipped = make_release_plans(rc, toolchains, root, entries, env=env)
    run = ReleaseRun(tuple(entries), {e.id: why for e, why in skipped})
    return Loaded(rc, root, toolchains, tuple(plans), run)


def entry_fingerprint(loaded: Loaded, entry_id: str) -> dict[str, Any]:
    """The host and API toolchains one release entry is built with; what it lacks when it cannot be built."""
    for plan in loaded.plans:
        for spec in plan.backends:
            if spec.task == entry_id:
                return {"host": plan.fingerprint("host"), spec.api: plan.fingerprint(spec.api)}
    if loaded.release is not None and entry_id in loaded.release.not_built:
        return {"not-built": loaded.release.not_built[entry_id]}
    raise ConfigError(f"no release entry '{entry_id}' in {loaded.rc.file}")
