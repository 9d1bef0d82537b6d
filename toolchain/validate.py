"""Running the engine and judging its answers.

- host: the CPU path against the oracle (teacher forcing at every position, and
  the greedy decode) on every reference model, with each form of its KV cache;
- backend: the backend's selftest, then the engine through the backend against
  the CPU path at each weight format, token-exact at every position (the CPU path
  with the expanded cache, the form the backend's step keeps).

A backend whose device cannot start here (no GPU) is reported as not run, with
the engine's own reason; only a wrong answer fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .wine import warm

__all__ = ["VALIDATE_VERSION", "Validation", "format_validation", "run_selftest", "validate_backend", "validate_host"]

VALIDATE_VERSION = 3
UNAVAILABLE = 3

PathFn = Callable[[Path], str]  # how the host sees a path (Wine: Z:\...)


@dataclass(frozen=True)
class Validation:
    subject: str
    status: str  # passed, failed, not-run
    reason: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    selftest: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"version": VALIDATE_VERSION, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    def summary(self) -> str:
        return f"{self.subject}: {self.status}" + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class _Run:
    data: dict[str, Any] | None
    rc: int
    message: str  # the engine's last stderr line


def _engine(
    launcher: Sequence[str], host: Path, args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 600
) -> _Run:
    argv = [*launcher, str(host), *args, "--json"]
    for _ in range(2 if launcher else 1):
        warm(launcher)
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _Run(None, -1, f"cannot run {host.name}: {exc}")
        # The engine says why on every failure; a failed run that printed nothing at all
        # is the launcher's (Wine failed to start it, seen once in a full CI run): one
        # more go. An engine that fails silently every time still fails.
        if proc.returncode == 0 or proc.stdout.strip() or proc.stderr.strip():
            break
    message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    except ValueError:
        data = None
    return _Run(data, proc.returncode, message)


def run_selftest(
    launcher: Sequence[str],
    host: Path,
    lib: str,
    label: str,
    env: Mapping[str, str] | None = None,
    shapes: str = "core",
) -> Validation:
    """The backend's own ops against the CPU path; not-run when its device cannot start.
    `shapes`: the selftest's set, core (every CPU-op path) or gpu (core and the shapes
    that pick each GPU kernel)."""
    run = _engine(launcher, host, ["--backend", lib, "--selftest", "--shapes", shapes], env)
    detail = run.data or {}
    if run.rc == UNAVAILABLE:
        return Validation(label, "not-run", run.message or "backend unavailable", selftest=detail)
    if run.rc == 0 and detail.get("passed") is True:
        return Validation(label, "passed", "", selftest=detail)
    bad = [c for c in detail.get("checks", []) + detail.get("bad_input", []) if not c.get("ok")]
    what = "; ".join(
        f"{c.get('format', c.get('case'))} {c.get('rows', '')}x{c.get('cols', '')} "
        f"err={c.get('max_rel_err')} {c.get('message', '')}".strip()
        for c in bad[:3]
    )
    return Validation(label, "failed", f"selftest: {what or f'exit {run.rc}: {run.message}'}", selftest=detail)


def _expected(model: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((model / "expected.json").read_text(encoding="utf-8"))
    return data


def _ids(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)


def _compare(
    name: str, got: list[int], want: list[int], margins: list[float] | None, who: str, ref: str
) -> dict[str, Any]:
    mismatches = []
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            margin = f" (top-2 margin {margins[i]:.4g})" if margins and i < len(margins) else ""
            mismatches.append(f"position {i}: {who} {a}, {ref} {b}{margin}")
    if len(got) != len(want):
        mismatches.append(f"{who} gave {len(got)} tokens, {ref} {len(want)}")
    check: dict[str, Any] = {"name": name, "ok": not mismatches, "positions": len(want), "mismatches": mismatches}
    if margins is not None:
        check["top2_margin"] = margins
        check["min_margin"] = min(margins) if margins else None
    return check


def _failed_run(name: str, run: _Run) -> dict[str, Any]:
    return {"name": name, "ok": False, "positions": 0, "mismatches": [f"engine exit {run.rc}: {run.message}"]}


def validate_host(
    launcher: Sequence[str], host: Path, models: Sequence[Path], path_of: PathFn, label: str
) -> Validation:
    """CPU f32 against the oracle, with the latent cache (the CPU path's default) and the
    expanded one: teacher forcing at every position and the greedy decode."""
    checks: list[dict[str, Any]] = []
    for model in models:
        exp = _expected(model)
        for kv in KV_FORMS:
            base = ["--model", path_of(model), "--backend", "none", "--threads", "2", "--kv", kv]
            tf = _engine(launcher, host, [*base, "--ids", _ids(exp["ids"]), "--teacher-force"])
            name = f"{model.name} cpu f32 {kv} cache vs oracle: teacher forcing"
            if tf.data is None or tf.rc != 0:
                checks.append(_failed_run(name, tf))
            else:
                margins = tf.data["top2_margin"]
                checks.append(_compare(name, tf.data["tf_pred"], exp["tf_pred"], margins, "engine", "oracle"))
            prompt = [*base, "--ids", _ids(exp["prompt"]), "--generate", str(len(exp["generated"]))]
            gen = _engine(launcher, host, prompt)
            name = f"{model.name} cpu f32 {kv} cache vs oracle: greedy decode"
            if gen.data is None or gen.rc != 0:
                checks.append(_failed_run(name, gen))
            else:
                checks.append(_compare(name, gen.data["generated"], exp["generated"], None, "engine", "oracle"))
    return _judge(label, checks)


KV_FORMS = ("latent", "expanded")
# The CPU path a backend is held to: the expanded cache, the form its step keeps.
CPU_AS_BACKEND = ("--backend", "none", "--threads", "2", "--kv", "expanded")


def validate_backend(
    launcher: Sequence[str],
    host: Path,
    lib: str,
    models: Sequence[Path],
    quants: Sequence[str],
    path_of: PathFn,
    label: str,
    env: Mapping[str, str] | None = None,
    shapes: str = "core",
) -> Validation:
    """Selftest (of `shapes`), then the engine through the backend against the CPU path at
    each format: teacher forcing, and a greedy decode of GREEDY_TOKENS tokens with the
    whole step in the backend (ABI 2: at most two host copies a decoded token). `env`
    reaches the backend runs (COLI_HIP_RUNTIME_DIR for a HIP backend)."""
    selftest = run_selftest(launcher, host, lib, label, env, shapes)
    if selftest.status != "passed":
        return selftest
    checks: list[dict[str, Any]] = []
    for model in models:
        exp = _expected(model)
        for quant in quants:
            base = ["--model", path_of(model), "--ids", _ids(exp["ids"]), "--teacher-force", "--quant", quant]
            cpu = _engine(launcher, host, [*base, *CPU_AS_BACKEND])
            dev = _engine(launcher, host, [*base, "--backend", lib], env)
            name = f"{model.name} {quant}: backend vs cpu, teacher forcing"
            if cpu.data is None or cpu.rc != 0:
                checks.append(_failed_run(name, cpu))
                continue
            if dev.data is None or dev.rc != 0:
                checks.append(_failed_run(name, dev))
                continue
            check = _compare(name, dev.data["tf_pred"], cpu.data["tf_pred"], cpu.data["top2_margin"], "backend", "cpu")
            check["resident_tensors"] = dev.data.get("resident_tensors", 0)
            if not dev.data.get("backend") or not check["resident_tensors"]:
                check["ok"] = False
                check["mismatches"].append(f"no tensor resident in the backend: {dev.data.get('backend_error', '')}")
            checks.append(check)
            checks.append(_greedy_check(launcher, host, lib, model, exp, quant, path_of, env))
    result = _judge(label, checks)
    return Validation(result.subject, result.status, result.reason, result.checks, selftest.selftest)


GREEDY_TOKENS = 20


def _greedy_check(
    launcher: Sequence[str],
    host: Path,
    lib: str,
    model: Path,
    exp: dict[str, Any],
    quant: str,
    path_of: PathFn,
    env: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The greedy decode through the backend's whole step against the CPU path's."""
    base = ["--model", path_of(model), "--ids", _ids(exp["prompt"]), "--generate", str(GREEDY_TOKENS), "--quant", quant]
    name = f"{model.name} {quant}: backend vs cpu, greedy decode of {GREEDY_TOKENS}"
    cpu = _engine(launcher, host, [*base, *CPU_AS_BACKEND])
    dev = _engine(launcher, host, [*base, "--backend", lib], env)
    for run in (cpu, dev):
        if run.data is None or run.rc != 0:
            return _failed_run(name, run)
    assert cpu.data is not None and dev.data is not None
    check = _compare(name, dev.data["generated"], cpu.data["generated"], None, "backend", "cpu")
    trips = dev.data.get("decode_round_trips")
    check["tier"], check["decode_round_trips"] = dev.data.get("tier"), trips
    if check["tier"] != "step":
        check["ok"] = False
        check["mismatches"].append(f"the decode did not run as one step in the backend (tier {check['tier']})")
    elif not isinstance(trips, int) or trips > 2 * (GREEDY_TOKENS - 1):
        check["ok"] = False
        check["mismatches"].append(f"{trips} host round trips for {GREEDY_TOKENS - 1} decoded tokens (at most 2 each)")
    return check


def _judge(label: str, checks: list[dict[str, Any]]) -> Validation:
    failed = [c for c in checks if not c["ok"]]
    reason = "; ".join(f"{c['name']}: {c['mismatches'][0]}" for c in failed[:3])
    return Validation(label, "failed" if failed else "passed", reason, checks)


def format_validation(v: Validation) -> str:
    lines = [f"validate {v.summary()}"]
    for c in v.checks:
        margin = f"  min top-2 margin {c['min_margin']:.4g}" if c.get("min_margin") is not None else ""
        resident = f"  {c['resident_tensors']} tensors resident" if c.get("resident_tensors") else ""
        lines.append(f"  {'ok  ' if c['ok'] else 'FAIL'}  {c['name']} ({c['positions']} positions){margin}{resident}")
        lines += [f"        {m}" for m in c["mismatches"][:5]]
    return "\n".join(lines)
