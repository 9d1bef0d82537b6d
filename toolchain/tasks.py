"""The task graph: config -> toolchain -> codegen -> host, backends -> verify ->
validate -> package. dodo.py only calls `load_plan` and `make_tasks`.

Every task that writes files declares file_dep and targets, and its uptodate
carries exactly the command line and toolchain fingerprint it depends on, so a
changed SDK rebuilds and an unchanged one does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from .abi import RENDERINGS, load_abi, render_abi
from .atomic import write_atomic
from .build import run_command
from .clean import DEP_FILE, clean
from .closure import closure_problems
from .commands import Command, backend_command, backend_inputs, host_command, host_inputs, launcher
from .discover import Missing
from .errors import ColiError, ReleaseError, ToolchainError, ValidateError, VerifyError, os_error_line
from .known_bad import known_bad
from .lock import lock_differences, lock_of, read_lock, render_lock
from .package import HipRuntime, build_info, package_files, write_package
from .plan import BackendSpec, Plan
from .project import Loaded, ReleaseRun
from .provenance import PROVENANCE
from .publish import MANIFEST, SUMS, BuiltEntry, format_summary, publish_release, release_rows
from .report import ColiReporter
from .revision import source_revision
from .sizes import budget_problem, device_code, size_table
from .table import aligned
from .validate import Validation, format_validation, validate_backend, validate_host
from .verify import Report, format_table, runtime_agreement, verify_artifact
from .windows_sdk import WinHipSdk

__all__ = ["doit_config", "make_tasks"]

TEMPLATE_DIR = Path(__file__).parent / "templates"


def doit_config(loaded: Loaded) -> dict[str, Any]:
    return {
        "default_tasks": ["build"],
        "dep_file": str(loaded.folders[0] / DEP_FILE),
        "backend": "sqlite3",
        "reporter": ColiReporter,
        "par_type": "thread",  # actions wait on compilers; threads share the plan safely
    }


def _task(
    *,
    name: str | None = None,
    doc: str | None = None,
    actions: list[Any] | None = None,
    file_dep: list[Path] | None = None,
    targets: list[Path] | None = None,
    task_dep: list[str] | None = None,
    uptodate: list[Any] | None = None,
    verbosity: int | None = None,
) -> dict[str, Any]:
    """A doit task dict; keyword-only so a misspelt key fails when dodo.py loads."""
    d: dict[str, Any] = {"actions": actions or []}
    if name is not None:
        d["name"] = name
    if doc is not None:
        d["doc"] = doc
    for key, value in (("file_dep", file_dep), ("targets", targets)):
        if value is not None:
            d[key] = [str(p) for p in value]
    if task_dep is not None:
        d["task_dep"] = task_dep
    if uptodate is not None:
        d["uptodate"] = uptodate
    if verbosity is not None:
        d["verbosity"] = verbosity
    return d


def _guard(fn: Callable[..., None], *args: Any) -> Callable[[], TaskFailed | None]:
    """Turn a ColiError, or the file system's refusal (a folder that cannot be made, a full
    disk), into a one-line doit failure instead of a traceback (COLI_DEBUG=1 keeps it)."""

    def action() -> TaskFailed | None:
        try:
            fn(*args)
        except ColiError as exc:
            return TaskFailed(exc.one_line())
        except OSError as exc:
            if os.environ.get("COLI_DEBUG") == "1":
                raise
            return TaskFailed(os_error_line(exc))
        return None

    action.__name__ = getattr(fn, "__name__", "action")
    return action


def _raise(error: ColiError) -> None:
    raise error


_SAY = threading.Lock()


def _say(text: str) -> None:
    """Print a report to the terminal. doit swaps sys.stdout per task to capture output, and with
    `-n N` threads one swap can undo another's, so reports go to the process's own stdout."""
    out = sys.__stdout__ or sys.stdout
    with _SAY:
        out.write(text + "\n")
        out.flush()


def _command_state(cmd: Command, fingerprint: Mapping[str, str]) -> dict[str, Any]:
    return {
        "argv": list(cmd.argv),
        "env": dict(cmd.env),
        "unset": list(cmd.unset),
        "cwd": str(cmd.cwd),
        "before": [list(step) for step in cmd.before],
        "stage": [[name, str(source)] for name, source in cmd.stage],
        "toolchain": dict(fingerprint),
    }


class _Graph:
    """Task generators bound to one plan."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.root = plan.root
        self.abi_file = self.root / "kernels" / "abi.toml"
        self.revision = source_revision(self.root, os.environ)

    # ---- paths -----------------------------------------------------------
    def verify_json(self, name: str) -> Path:
        return self.plan.build_dir / self.plan.platform / "reports" / f"verify-{name}.json"

    def validate_json(self, spec: BackendSpec) -> Path:
        return self.plan.build_dir / self.plan.platform / "reports" / f"validate-{spec.key}.json"

    def package_path(self, spec: BackendSpec) -> Path:
        ext = ".zip" if spec.windows else ".tar.gz"
        return self.plan.dist_dir / f"{self.package_name(spec)}{ext}"

    def package_name(self, spec: BackendSpec) -> str:
        return f"coli-{self.plan.rc.config.version}-{spec.platform}-{spec.api}-{spec.archkey}"

    def fingerprint(self, api: str) -> dict[str, str]:
        return self.plan.fingerprint(api)

    def forbidden_paths(self) -> list[str]:
        return self.plan.build_machine_paths()

    # ---- tasks -----------------------------------------------------------
    def task_host(self) -> Iterator[dict[str, Any]]:
        """Compile the host executable (engine + loader)."""
        cmd = host_command(self.plan, self.plan.host_exe)
        yield _task(
            name=self.plan.platform,
            actions=[_guard(run_command, cmd, "host")],
            file_dep=host_inputs(self.plan),
            targets=[self.plan.host_exe],
            task_dep=["preflight"],
            uptodate=[config_changed(_command_state(cmd, self.fingerprint("host")))],
        )

    def task_backend(self) -> Iterator[dict[str, Any]]:
        """Compile each backend library (one per API and arch group)."""
        for spec in self.plan.backends:
            lib = self.plan.backend_lib(spec)
            cmd = backend_command(self.plan, spec, lib)
            yield _task(
                name=spec.task,
                doc=f"{spec.lib_name} for {', '.join(spec.arches)}",
                actions=[_guard(run_command, cmd, f"backend {spec.key}")],
                file_dep=backend_inputs(self.plan, spec),
                targets=[lib],
                task_dep=["preflight"],
                uptodate=[config_changed(_command_state(cmd, self.fingerprint(spec.api)))],
            )

    def task_verify(self) -> Iterator[dict[str, Any]]:
        """Inspect every artifact: format, exports = ABI, imports in allowlist, no build paths, device code."""
        yield _task(
            name=f"{self.plan.platform}-host",
            actions=[_guard(self._verify, self.plan.host_exe, "host", (), self.verify_json("host"))],
            file_dep=[self.plan.host_exe, self.abi_file],
            targets=[self.verify_json("host")],
            uptodate=[config_changed({"forbidden": self.forbidden_paths()})],
            verbosity=2,
        )
        for spec in self.plan.backends:
            out = self.verify_json(spec.key)
            lib = self.plan.backend_lib(spec)
            yield _task(
                name=spec.task,
                actions=[_guard(self._verify, lib, spec.api, spec.arches, out)],
                file_dep=[lib, self.abi_file, *([self.plan.host_exe] if spec.api == "hip" else [])],
                targets=[out],
                uptodate=[config_changed({"arches": list(spec.arches), "forbidden": self.forbidden_paths()})],
                verbosity=2,
            )

    def _verify(self, artifact: Path, kind: str, arches: tuple[str, ...], out: Path) -> None:
        report = verify_artifact(artifact, kind, load_abi(self.abi_file).exports, arches, self.forbidden_paths())
        if kind == "hip" and report.format != "unknown":  # the package's host must bind what this backend imports
            agreement = runtime_agreement(self.plan.host_exe, artifact)
            report = Report(report.artifact, report.kind, report.format, (*report.checks, agreement))
        write_atomic(out, report.to_json())
        _say(format_table([report]))
        if not report.ok:
            raise VerifyError(f"{artifact.name}: " + "; ".join(report.failures()))

    def launcher(self) -> list[str]:
        if not self.plan.cross:
            return []
        wine = self.plan.toolchains.wine
        if isinstance(wine, Missing):
            return []
        return [str(wine.path)]

    def host_path(self, path: Path) -> str:
        """A path as the host executable sees it: Wine maps the Unix root to drive Z:."""
        return "Z:" + str(path).replace("/", "\\") if self.plan.cross else str(path)

    def models(self) -> list[Path]:
        return [self.root / m for m in self.plan.rc.config.validate_.models]

    def model_files(self) -> list[Path]:
        return sorted(f for m in self.models() for f in m.iterdir() if f.is_file())

    def validate_host_json(self) -> Path:
        return self.plan.build_dir / self.plan.platform / "reports" / "validate-host.json"

    def task_validate(self) -> Iterator[dict[str, Any]]:
        """Run the engine: CPU vs the oracle models, and each backend vs the CPU at every weight format."""
        state = {
            "launcher": self.launcher(),
            "models": [str(m) for m in self.models()],
            "quants": list(self.plan.rc.config.validate_.quants),
        }
        yield _task(
            name=f"{self.plan.platform}-host",
            actions=[_guard(self._validate_host)],
            file_dep=[self.plan.host_exe, self.verify_json("host"), *self.model_files()],
            targets=[self.validate_host_json()],
            uptodate=[config_changed(state)],
            verbosity=2,
        )
        for spec in self.plan.backends:
            out = self.validate_json(spec)
            lib = self.plan.backend_lib(spec)
            yield _task(
                name=spec.task,
                actions=[_guard(self._validate_backend, spec, out)],
                file_dep=[
                    self.plan.host_exe,
                    lib,
                    self.verify_json("host"),
                    self.verify_json(spec.key),
                    *self.model_files(),
                ],
                targets=[out],
                uptodate=[config_changed(state)],
                verbosity=2,
            )

    def _no_wine(self, label: str) -> Validation | None:
        if self.plan.cross and not self.launcher():
            return Validation(label, "not-run", f"no Wine to run Windows binaries: {self.plan.toolchains.wine}")
        if self.plan.cross:
            os.environ.setdefault("WINEDEBUG", "-all")
        return None

    def _validate_host(self) -> None:
        label = f"{self.plan.platform} host"
        result = self._no_wine(label) or validate_host(
            self.launcher(), self.plan.host_exe, self.models(), self.host_path, label
        )
        self._report(result, self.validate_host_json())

    def _validate_backend(self, spec: BackendSpec, out: Path) -> None:
        cfg = self.plan.rc.config.validate_
        lib = self.host_path(self.plan.backend_lib(spec))
        # the HIP backend binds exactly the configured runtime: here, the SDK's own
        env = {"COLI_HIP_RUNTIME_DIR": self.hip_runtime_dir()} if spec.api == "hip" else {}
        # a GPU backend's selftest takes the shapes that pick each of its kernels
        shapes = "core" if spec.api == "ref" else "gpu"
        result = self._no_wine(spec.key) or validate_backend(
            self.launcher(), self.plan.host_exe, lib, self.models(), cfg.quants, self.host_path, spec.key, env, shapes
        )
        self._report(result, out)

    def _report(self, result: Validation, out: Path) -> None:
        write_atomic(out, result.to_json())
        _say(format_validation(result))
        if result.status == "failed":
            raise ValidateError(result.summary())

    def task_package(self) -> Iterator[dict[str, Any]]:
        """Package each backend with the host, build-info.json and SHA256SUMS into dist/."""
        for spec in self.plan.backends:
            dest = self.package_path(spec)
            deps = [
                self.plan.host_exe,
                self.plan.backend_lib(spec),
                self.verify_json("host"),
                self.verify_json(spec.key),
                self.validate_host_json(),
                self.validate_json(spec),
            ]
            state = {
                "bundle_runtime": self.bundled(spec),
                "name": self.package_name(spec),
                "revision": self.revision.label,
                "epoch": self.revision.epoch,
                "fingerprint": self.fingerprint(spec.api),
                "budget": self.plan.rc.config.package.budget(spec.api),
            }
            yield _task(
                name=spec.task,
                actions=[_guard(self._package, spec, dest)],
                file_dep=deps,
                targets=[dest],
                uptodate=[config_changed(state)],
            )

    def _package(self, spec: BackendSpec, dest: Path) -> None:

        host, lib = self.plan.host_exe, self.plan.backend_lib(spec)

        def report(path: Path) -> dict[str, Any]:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return data

        abi = load_abi(self.abi_file)
        runtime = self._hip_runtime(spec) if spec.api == "hip" else None
        code = device_code(lib)
        info = build_info(
            name=self.package_name(spec),
            version=self.plan.rc.config.version,
            spec=spec,
            abi=f"{abi.major}.{abi.minor}",
            revision=self.revision,
            toolchain={"host": self.fingerprint("host"), spec.api: self.fingerprint(spec.api)},
            verify={"host": report(self.verify_json("host")), spec.lib_name: report(self.verify_json(spec.key))},
            validate={"host": report(self.validate_host_json()), spec.lib_name: report(self.validate_json(spec))},
            hip_runtime=runtime.name if runtime else None,
            device_code=[c.to_json() for c in code],
        )
        files = package_files(spec, host, lib, info, runtime)
        problems = closure_problems(files, spec.windows)
        if problems:  # nothing is written: a package that cannot load is not a package
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise VerifyError(f"package {self.package_name(spec)}: {problems[0]}{more}")
        write_package(dest, self.package_name(spec), files, {host.name}, self.revision.epoch)
        sizes = self.plan.rc.config.package
        size, budget = dest.stat().st_size, sizes.budget(spec.api)
        setting = f"package.max_bytes_by_api.{spec.api}" if spec.api in sizes.max_bytes_by_api else "package.max_bytes"
        over = budget_problem(dest.name, code, size, budget, setting)
        if over:  # not kept: a package over its budget is not one to publish
            dest.unlink()
            raise VerifyError(over)
        _say(size_table(dest.name, code, size, budget))

    def bundled(self, spec: BackendSpec) -> bool:
        """Whether the HIP runtime goes into the package: the release target's choice, else hip.bundle_runtime."""
        own = spec.bundle_hip_runtime
        return own if own is not None else self.plan.rc.config.hip.bundle_runtime

    def hip_runtime_dir(self) -> str:
        """The runtime validation binds: the SDK's own (lib on Linux, bin on Windows)."""
        win = self.plan.toolchains.win_hip
        return str(win.bin_dir) if self.plan.windows and isinstance(win, WinHipSdk) else str(self.plan.hip.lib_dir)

    def _hip_runtime(self, spec: BackendSpec) -> HipRuntime:
        """The HIP runtime a package's backend binds: its SDK's (Windows or Linux)."""
        win = self.plan.toolchains.win_hip
        if spec.windows and isinstance(win, WinHipSdk):
            return HipRuntime(win.runtime_dll, Path(str(win.bin_dir)), win.version, self.bundled(spec))
        hip = self.plan.hip
        return HipRuntime(hip.runtime_name, hip.lib_dir, hip.version, self.bundled(spec))


class _Project:
    """The tasks over all plans: toolchain, config, codegen, build, release, clean-build."""

    def __init__(self, loaded: Loaded) -> None:
        self.loaded = loaded
        self.root = loaded.root
        self.graphs = [_Graph(p) for p in loaded.plans]
        self.abi_file = self.root / "kernels" / "abi.toml"
        self.gen_dir = loaded.folders[0] / "gen"
        self.revision = source_revision(self.root, os.environ)

    def task_toolchain(self) -> dict[str, Any]:
        """Print every toolchain component: path, version, where the setting came from, what is missing."""
        return _task(actions=[self._print_toolchain], verbosity=2, uptodate=[False])

    def _print_toolchain(self) -> None:
        rows = [("component", "path", "version", "from")]
        missing, arches = [], []
        for c in self.loaded.toolchains.components():
            if c.name.endswith("arches"):
                arches.append(f"  {c.name}: {c.version}")
            elif c.missing:
                missing.append(f"  {c.name}: {c.missing}")
            else:
                rows.append((c.name, c.path, c.version, c.source))
        print("\n".join(aligned(rows)))
        print("buildable arches:")
        print("\n".join(arches) or "  none")
        if missing:
            print("missing:")
            print("\n".join(missing))
        for g in self.graphs:
            print(f"plan ({g.plan.platform}): host, " + ", ".join(s.key for s in g.plan.backends))
            for note in g.plan.notes:
                print(f"  {note}")
        if self.loaded.release is not None:
            for entry_id, why in self.loaded.release.not_built.items():
                print(f"  not built here: {entry_id}: {why}")

    def task_config(self) -> dict[str, Any]:
        """Print the resolved configuration and where each value came from."""
        return _task(actions=[self._print_config], verbosity=2, uptodate=[False])

    def _print_config(self) -> None:
        rc = self.loaded.rc
        data = rc.config.model_dump(mode="json", by_alias=True)
        print(f"# config file: {rc.file}")

        def walk(node: Any, prefix: str) -> None:
            for k, v in node.items():
                key = f"{prefix}{k}"
                if isinstance(v, dict):
                    walk(v, key + ".")
                else:
                    print(f"{key} = {json.dumps(v)}    # {rc.origin(key)}")

        walk(data, "")

    def task_codegen(self) -> dict[str, Any]:
        """Render the ABI (kernels/abi.toml) into the C header, loader table, .def and version script."""
        templates = sorted(TEMPLATE_DIR.glob("abi/*.j2"))
        targets = [self.gen_dir / name for name in RENDERINGS]
        return _task(
            actions=[_guard(self._codegen)],
            file_dep=[self.abi_file, *templates, Path(__file__).parent / "abi.py"],
            targets=targets,
        )

    def _codegen(self) -> None:
        for name, text in render_abi(load_abi(self.abi_file)).items():
            target = self.gen_dir / name
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                write_atomic(target, text)

    def task_preflight(self) -> dict[str, Any]:
        """Before anything compiles: refuse a known-bad toolchain combination (toolchain/data/known_bad.toml)
        and, for a release, toolchains that differ from its lock (toolchain.lock); start sccache's server."""
        actions, fresh = self._preflight_checks()
        if self.loaded.rc.config.cache.launcher == "sccache":
            actions, fresh = [_guard(self._start_cache_server), *actions], False
        return _task(actions=actions, uptodate=[fresh], verbosity=2)

    def _preflight_checks(self) -> tuple[list[Any], bool]:
        """The checks' actions, and whether they can be skipped (nothing to refuse or write)."""
        problems = known_bad([g.plan for g in self.graphs])
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return [_guard(_raise, ToolchainError(problems[0] + more))], False
        release = self.loaded.rc.config.release
        if release is None:
            return [], True
        path = self.root / release.lock
        found = lock_of([g.plan for g in self.graphs])
        if not path.is_file():
            note = f"note: no {release.lock}: this release's toolchains are not pinned (doit lock writes it)"
            print(note, file=sys.stderr)
            return [], True
        diffs = lock_differences(read_lock(path), found)
        if not diffs:
            return [], True
        if release.lock_mode == "update":
            return [lambda: self._write_lock(path, found, len(diffs))], False
        differ = ReleaseError(
            f"{release.lock}: the toolchains found differ from the lock: {'; '.join(diffs)}; "
            "doit release lock=update accepts them"
        )
        return [_guard(_raise, differ)], False

    def _start_cache_server(self) -> None:
        """sccache's server, started here with this build's settings (its store, its base folder): a
        compile would start it inside the HIP compile's build-local TMPDIR, where its startup socket's
        path is too long for a Unix socket."""
        _, env = launcher(self.graphs[0].plan)
        full = {**os.environ, **env, "SCCACHE_IDLE_TIMEOUT": "3600"}
        try:
            proc = subprocess.run(["sccache", "--start-server"], capture_output=True, text=True, env=full)
            running = subprocess.run(["sccache", "--show-stats"], capture_output=True, text=True, env=full)
        except OSError as exc:
            raise ToolchainError(f"cache.launcher = sccache: cannot run sccache: {exc.strerror}") from None
        if proc.returncode != 0 and running.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise ToolchainError(f"cache.launcher = sccache: its server does not start: {last}")

    def _write_lock(self, path: Path, found: dict[str, Any], changes: int | None = None) -> None:
        write_atomic(path, render_lock(found))
        what = f"{changes} difference(s) accepted" if changes is not None else "written"
        _say(f"{path.name}: {what}: " + ", ".join(f"{p} {', '.join(t)}" for p, t in sorted(found.items())))

    def task_lock(self) -> dict[str, Any]:
        """Write the toolchain lockfile (release.lock, toolchain.lock): versions and SDK layouts found, per platform."""
        cfg = self.loaded.rc.config
        path = self.root / (cfg.release.lock if cfg.release else "toolchain.lock")
        found = lock_of([g.plan for g in self.graphs])
        return _task(actions=[lambda: self._write_lock(path, found)], uptodate=[False], verbosity=2)

    def task_build(self) -> dict[str, Any]:
        """Build, verify, validate and package everything the config asks for (the default task)."""
        deps = [f"package:{s.task}" for g in self.graphs for s in g.plan.backends]
        return _task(task_dep=deps + [f"verify:{g.plan.platform}-host" for g in self.graphs])

    def task_release(self) -> dict[str, Any]:
        """Publish dist/release-<version>/: each entry's package, release-manifest.json and SHA256SUMS."""
        run = self.loaded.release
        if run is None:
            message = (
                f"{self.loaded.rc.file} has no [release] table; name a release config, "
                "e.g. doit release config=configs/release-local.toml"
            )
            return _task(actions=[lambda: TaskFailed(message)], uptodate=[False])
        built = [(g, s) for g in self.graphs for s in g.plan.backends]
        dest = self.release_dir()
        release = self.loaded.rc.config.release
        sign = list(release.sign) if release else []
        return _task(
            actions=[_guard(self._release, run, built, dest)],
            file_dep=[g.package_path(s) for g, s in built] + [g.validate_json(s) for g, s in built],
            targets=[dest / MANIFEST, dest / PROVENANCE, dest / SUMS],
            uptodate=[config_changed({"head": self.release_head(), "not_built": dict(run.not_built), "sign": sign})],
            verbosity=2,
        )

    def release_dir(self) -> Path:
        return self.loaded.folders[1] / f"release-{self.loaded.rc.config.version}"

    def release_head(self) -> dict[str, Any]:
        cfg = self.loaded.rc.config
        assert cfg.release is not None
        return {
            "release": cfg.release.name,
            "version": cfg.version,
            "source_revision": self.revision.label,
            "source_date_epoch": self.revision.epoch,
        }

    def _release(self, run: ReleaseRun, built: list[tuple[_Graph, BackendSpec]], dest: Path) -> None:
        cfg = self.loaded.rc.config
        assert cfg.release is not None
        if cfg.release.require_all and run.not_built:
            missing = "; ".join(f"{k}: {v}" for k, v in run.not_built.items())
            raise ReleaseError(
                f"release.require_all is set and {len(run.not_built)} entries cannot be built here: {missing}"
            )
        done = {
            spec.task: BuiltEntry(
                g.package_path(spec),
                json.loads(g.validate_json(spec).read_text(encoding="utf-8")),
                {"host": g.fingerprint("host"), spec.api: g.fingerprint(spec.api)},
                [c.to_json() for c in device_code(g.plan.backend_lib(spec))],
            )
            for g, spec in built
        }
        entries = release_rows(run.entries, done, run.not_built)
        packages = {b.package.name: b.package for b in done.values()}
        publish_release(dest, self.release_head(), entries, packages, cfg.release.sign)
        published = json.loads((dest / MANIFEST).read_text(encoding="utf-8"))["entries"]
        _say(format_summary(published, dest))

    def task_ci_workflow(self) -> dict[str, Any]:
        """Render the release matrix as a GitHub Actions workflow (.github/workflows/release-<name>.yml)."""
        from .ci_workflow import TEMPLATE_DIR as CI_TEMPLATES
        from .ci_workflow import render_workflow, workflow_path

        rc = self.loaded.rc
        if rc.config.release is None:
            message = f"{rc.file} has no [release] table; e.g. doit ci-workflow config=configs/release-full.toml"
            return _task(actions=[lambda: TaskFailed(message)], uptodate=[False])
        out = workflow_path(self.root, rc)

        def write() -> None:
            write_atomic(out, render_workflow(self.root, rc))
            _say(f"workflow {out.relative_to(self.root)}")

        return _task(
            actions=[_guard(write)],
            file_dep=[rc.file, CI_TEMPLATES / "release.yml.j2", Path(__file__).parent / "data" / "ci.toml"],
            targets=[out],
            uptodate=[config_changed(rc.config.model_dump_json())],
            verbosity=2,
        )

    def task_clean_build(self) -> dict[str, Any]:
        """Empty the build and dist directories (the task graph's state forgotten, not removed)."""
        build = self.loaded.folders[0]
        return _task(actions=[_guard(clean, self.loaded.folders, build / DEP_FILE)], uptodate=[False])


def make_tasks(loaded: Loaded) -> dict[str, Callable[[], Any]]:
    """The task_* functions for dodo.py's namespace, in graph order."""
    project = _Project(loaded)
    tasks: dict[str, Callable[[], Any]] = {}
    stages = ["toolchain", "config", "codegen", "preflight", "host", "backend", "verify", "validate", "package"]
    for n in [*stages, "build", "release", "lock"]:
        if hasattr(project, f"task_{n}"):
            fn: Callable[[], Any] = getattr(project, f"task_{n}")
        else:
            fn = _union([getattr(g, f"task_{n}") for g in project.graphs], getattr(_Graph, f"task_{n}").__doc__)
        tasks[f"task_{n.replace('_', '-')}"] = _named(fn)
    tasks["task_ci-workflow"] = _named(project.task_ci_workflow)
    tasks["task_clean-build"] = _named(project.task_clean_build)
    for g in project.graphs:
        for note in g.plan.notes:
            print(f"note: {note}", file=sys.stderr)
    return tasks


def _union(generators: list[Callable[[], Iterator[dict[str, Any]]]], doc: str | None) -> Callable[[], Any]:
    """One task generator yielding every platform's subtasks (their names carry the platform)."""

    def task() -> Iterator[dict[str, Any]]:
        if not generators:  # doit needs a task of this name even when no platform builds here
            yield _task(name="none", actions=[], doc="nothing of this stage builds here")
        for gen in generators:
            yield from gen()

    task.__doc__ = doc
    return task


def _named(fn: Callable[[], Any]) -> Callable[[], Any]:
    def task() -> Any:
        return fn()

    task.__doc__ = fn.__doc__
    return task
