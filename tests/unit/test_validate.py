"""toolchain/validate.py's engine runs: a launcher (Wine) that fails to start the
engine and prints nothing gets one more go; nothing else is retried."""

from __future__ import annotations

import stat
from pathlib import Path

from toolchain import validate


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _host(tmp_path: Path) -> Path:
    """An engine that counts its runs and prints its JSON line."""
    return _script(tmp_path / "coli", f'echo run >> "{tmp_path / "runs"}"\necho \'{{"ok": true}}\'\n')


def _launcher(tmp_path: Path, silent_failures: int) -> list[str]:
    """Fails silently its first `silent_failures` times, then runs the engine."""
    tries = tmp_path / "tries"
    body = f"""n=$(cat "{tries}" 2>/dev/null || echo 0); echo $((n + 1)) > "{tries}"
[ "$n" -lt {silent_failures} ] && exit 1
exec "$@"
"""
    return [str(_script(tmp_path / "launcher", body))]


def _runs(tmp_path: Path) -> int:
    runs = tmp_path / "runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_a_launcher_that_fails_silently_once_gets_one_more_go(tmp_path: Path) -> None:
    run = validate._engine(_launcher(tmp_path, 1), _host(tmp_path), [])
    assert (run.rc, run.data) == (0, {"ok": True})
    assert _runs(tmp_path) == 1


def test_a_launcher_that_fails_silently_twice_fails(tmp_path: Path) -> None:
    run = validate._engine(_launcher(tmp_path, 2), _host(tmp_path), [])
    assert (run.rc, run.data, run.message) == (1, None, "")
    assert _runs(tmp_path) == 0


def test_an_engine_that_says_why_is_not_run_again(tmp_path: Path) -> None:
    host = _script(tmp_path / "coli", f'echo run >> "{tmp_path / "runs"}"\necho "coli: bad model" >&2\nexit 2\n')
    run = validate._engine(_launcher(tmp_path, 0), host, [])
    assert (run.rc, run.message) == (2, "coli: bad model")
    assert _runs(tmp_path) == 1


def test_a_native_engine_is_not_run_again(tmp_path: Path) -> None:
    host = _script(tmp_path / "coli", f'echo run >> "{tmp_path / "runs"}"\nexit 1\n')
    run = validate._engine([], host, [])
    assert run.rc == 1
    assert _runs(tmp_path) == 1


def _engine_printing(tmp_path: Path, cpu: str, backend: str) -> Path:
    """An engine (a test double) that prints `cpu` for --backend none and `backend` otherwise."""
    return _script(
        tmp_path / "coli",
        f"""case "$*" in *"--backend none"*) echo '{cpu}' ;; *) echo '{backend}' ;; esac\n""",
    )


def _greedy(tmp_path: Path, backend: str) -> dict[str, object]:
    cpu = '{"generated": [1, 2, 3]}'
    host = _engine_printing(tmp_path, cpu, backend)
    exp = {"prompt": [5, 6]}
    return validate._greedy_check([], host, "lib", tmp_path, exp, "int8", str, None)


def test_the_greedy_check_wants_the_cpu_tokens_through_the_step_in_two_copies_a_token(tmp_path: Path) -> None:
    n = validate.GREEDY_TOKENS - 1
    good = f'{{"generated": [1, 2, 3], "tier": "step", "decode_round_trips": {2 * n}}}'
    assert _greedy(tmp_path, good)["ok"] is True
    cases = {
        f'{{"generated": [1, 2, 4], "tier": "step", "decode_round_trips": {2 * n}}}': "position 2: backend 4, cpu 3",
        f'{{"generated": [1, 2, 3], "tier": "matmuls", "decode_round_trips": {2 * n}}}': "tier matmuls",
        f'{{"generated": [1, 2, 3], "tier": "step", "decode_round_trips": {2 * n + 1}}}': "at most 2 each",
    }
    for out, why in cases.items():
        check = _greedy(tmp_path, out)
        assert check["ok"] is False and any(why in m for m in check["mismatches"]), check  # type: ignore[attr-defined]
