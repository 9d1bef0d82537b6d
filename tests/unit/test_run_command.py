"""run_command: a command's compile steps side by side, then its last step, the output whole or absent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from toolchain import build
from toolchain.build import run_command
from toolchain.commands import Command
from toolchain.errors import BuildError


def py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def wait_for(mine: Path, theirs: Path, seconds: float = 10) -> tuple[str, ...]:
    """A step that marks itself started, then needs the other step started too: it can
    succeed only if the two run at the same time (it gives up after `seconds`)."""
    return py(
        "import pathlib, sys, time\n"
        f"pathlib.Path({str(mine)!r}).touch()\n"
        f"end = time.monotonic() + {seconds}\n"
        f"while not pathlib.Path({str(theirs)!r}).exists():\n"
        "    if time.monotonic() > end: sys.exit(1)\n"
        "    time.sleep(0.01)\n"
    )


def link(output: Path, *inputs: Path) -> tuple[str, ...]:
    """The last step: concatenates the steps' outputs into the command's output (its own
    argument, which run_command points at the part file)."""
    names = [str(p) for p in inputs]
    joined = f"''.join(pathlib.Path(n).read_text() for n in {names!r})"
    return (*py(f"import pathlib, sys; pathlib.Path(sys.argv[1]).write_text({joined})"), str(output))


def test_the_steps_run_side_by_side_before_the_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "_cpus", lambda: 2)
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out.bin"
    steps = (wait_for(a, b), wait_for(b, a))
    writes = tuple(
        py(f"import pathlib; pathlib.Path({str(tmp_path / f'{n}.o')!r}).write_text({n!r})") for n in ("x", "y")
    )
    run_command(Command(link(out, tmp_path / "x.o", tmp_path / "y.o"), out, before=steps + writes), "test")
    assert out.read_text() == "xy"


def test_one_cpu_runs_the_steps_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one CPU the two steps that need each other cannot both start: the first gives up."""
    monkeypatch.setattr(build, "_cpus", lambda: 1)
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out.bin"
    cmd = Command(link(out), out, before=(wait_for(a, b, 1), wait_for(b, a, 1)))
    with pytest.raises(BuildError, match="exited with 1"):
        run_command(cmd, "test")
    assert not out.exists() and not list(tmp_path.glob("*.part*"))


def test_the_first_failing_step_in_order_is_reported_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "_cpus", lambda: 4)
    out = tmp_path / "out.bin"
    steps = (
        py("import sys, time; time.sleep(0.3); sys.stderr.write('first broke\\n'); sys.exit(3)"),
        py("import sys; sys.stderr.write('second broke\\n'); sys.exit(4)"),
        py("pass"),
    )
    with pytest.raises(BuildError) as err:
        run_command(Command(link(out), out, before=steps), "host")
    assert str(err.value).startswith("host: ") and "exited with 3" in str(err.value) and "first broke" in str(err.value)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_the_steps_messages_come_in_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build, "_cpus", lambda: 4)
    out = tmp_path / "out.bin"
    steps = tuple(
        py(f"import sys, time; time.sleep({delay}); sys.stderr.write('warning {n}\\n')")
        for n, delay in enumerate((0.3, 0.0, 0.15))
    )
    run_command(Command(link(out), out, before=steps), "host")
    assert capfd.readouterr().err.splitlines() == ["warning 0", "warning 1", "warning 2"]
    assert out.read_text() == ""


def test_a_step_that_cannot_start_is_named(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    with pytest.raises(BuildError, match=r"^backend ref: cannot run /nonexistent/cc: "):
        run_command(Command(link(out), out, before=(("/nonexistent/cc", "-c", "x.c"),)), "backend ref")
    assert not out.exists()
