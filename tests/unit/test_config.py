from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from toolchain.config import load_config
from toolchain.config.folders import folder_problems
from toolchain.errors import ConfigError, os_error_line

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "default.toml"


def _toml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_default_config_loads_with_its_origins() -> None:
    rc = load_config(DEFAULT, {}, {})
    assert rc.config.build.os == "linux"
    assert rc.config.build.arch == ()
    assert rc.origin("build.os") == f"file {DEFAULT}"
    assert rc.origin("build.build_dir") == "default"


def test_precedence_defaults_file_env_vars(tmp_path: Path) -> None:
    f = _toml(tmp_path, '[build]\nprofile = "debug"\narch = ["cpu"]\n')
    rc = load_config(f, {}, {})
    assert rc.config.build.profile == "debug"
    assert rc.origin("build.profile") == f"file {f}"
    rc = load_config(f, {"COLI_ARCH": "gfx1030, gfx90a"}, {})
    assert rc.config.build.arch == ("gfx1030", "gfx90a")
    assert rc.origin("build.arch") == "env COLI_ARCH"
    rc = load_config(f, {"COLI_ARCH": "gfx1030"}, {"arch": "sm_90"})
    assert rc.config.build.arch == ("sm_90",)
    assert rc.origin("build.arch") == "var arch="


def test_cuda_home_wins_over_cuda_path(tmp_path: Path) -> None:
    rc = load_config(DEFAULT, {"CUDA_PATH": "/a", "CUDA_HOME": "/b"}, {})
    assert rc.config.cuda.home == "/b"
    assert rc.origin("cuda.home") == "env CUDA_HOME"


def test_config_is_frozen() -> None:
    rc = load_config(DEFAULT, {}, {})
    with pytest.raises(Exception, match="frozen"):
        rc.config.build.os = "windows"  # type: ignore[misc]


def test_misspelt_key_gets_did_you_mean_with_file(tmp_path: Path) -> None:
    f = _toml(tmp_path, '[build]\narhc = ["cpu"]\n')
    with pytest.raises(ConfigError) as exc:
        load_config(f, {}, {})
    line = exc.value.one_line()
    assert f"file {f}: unknown key 'build.arhc'; did you mean 'build.arch'?" in line
    assert "\n" not in line


def test_all_problems_are_reported_together(tmp_path: Path) -> None:
    f = _toml(tmp_path, '[build]\nos = 3\nprofile = "release"\n[hipp]\nx = 1\n[cuda]\ndefault_arches = ["sm_1"]\n')
    with pytest.raises(ConfigError) as exc:
        load_config(f, {}, {})
    problems = exc.value.problems
    assert len(problems) == 3
    assert any("build.os: Input should be 'linux' or 'windows' (got 3)" in p for p in problems)
    assert any("unknown key 'hipp'; did you mean 'hip'?" in p for p in problems)
    assert any("cuda.default_arches: unknown arch 'sm_1'" in p for p in problems)


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("gfx9999", "unknown arch 'gfx9999'"),
        ("sm_1", "unknown arch 'sm_1'"),
        ("gfx1030,gfx1030", "arch listed twice"),
        ("rdna9", "unknown arch 'rdna9' (did you mean rdna"),
        ("rdna2,gfx1031", "arch listed twice in ['gfx1030', 'gfx1031',"),
    ],
)
def test_bad_arch_variables(arch: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(DEFAULT, {}, {"arch": arch})
    assert expected in exc.value.one_line()
    assert "var arch=" in exc.value.one_line()
    assert "allowed" in exc.value.one_line() or "twice" in expected


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("rdna2", ("gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036")),
        ("cpu,hopper,gfx90a", ("cpu", "sm_90", "sm_90a", "gfx90a")),
    ],
)
def test_an_arch_family_stands_for_its_members(arch: str, expected: tuple[str, ...]) -> None:
    """arch= takes a family's name as release groups do (toolchain/data/arches.toml)."""
    assert load_config(DEFAULT, {}, {"arch": arch}).config.build.arch == expected


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        (
            "",
            "var arch=: build.arch: empty; leave arch= out for the default, or list the values "
            "(e.g. arch=gfx1030,sm_90)",
        ),
        ("  ", "build.arch: empty"),
        ("gfx1030,,gfx90a", "var arch=: build.arch: an empty item in 'gfx1030,,gfx90a'; write arch=gfx1030,gfx90a"),
        ("gfx1030,", "an empty item in 'gfx1030,'; write arch=gfx1030"),
    ],
)
def test_an_empty_arch_list_or_item_is_an_error(arch: str, expected: str) -> None:
    """Neither the default set nor a dropped item: the user is told what to write."""
    with pytest.raises(ConfigError) as exc:
        load_config(DEFAULT, {}, {"arch": arch})
    assert expected in exc.value.one_line()
    with pytest.raises(ConfigError) as exc:
        load_config(DEFAULT, {"COLI_ARCH": arch}, {})
    assert "env COLI_ARCH" in exc.value.one_line()


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("gfx1030:xnack+", "'gfx1030:xnack+': gfx1030 takes no target features (write gfx1030)"),
        ("gfx90a:xnack", "'gfx90a:xnack': gfx90a takes sramecc+ or sramecc-, xnack+ or xnack-"),
        ("gfx90a:tgsplit+", "'gfx90a:tgsplit+': gfx90a takes sramecc+ or sramecc-, xnack+ or xnack-"),
        ("gfx942:xnack+:xnack-", "'gfx942:xnack+:xnack-': xnack given twice"),
        ("gfx90z:xnack-", "unknown arch 'gfx90z:xnack-'"),
    ],
)
def test_amd_target_ids_are_checked(arch: str, expected: str) -> None:
    """AMD target ids: the features each arch allows (toolchain/data/arches.toml), each
    with its sign, once; a wrong one is one line naming what the arch takes."""
    with pytest.raises(ConfigError) as exc:
        load_config(DEFAULT, {}, {"arch": arch})
    assert expected in exc.value.one_line() and "var arch=" in exc.value.one_line()


def test_target_ids_and_specific_cuda_targets_are_accepted() -> None:
    arches = "gfx90a:xnack-,gfx942:sramecc+:xnack-,gfx1030,sm_90a,sm_100f,sm_120a"
    rc = load_config(DEFAULT, {}, {"arch": arches})
    assert rc.config.build.arch == tuple(arches.split(","))


def test_unknown_variable_and_profile() -> None:
    with pytest.raises(ConfigError, match=r"unknown variable 'arhc='; did you mean 'arch='\?"):
        load_config(DEFAULT, {}, {"arhc": "cpu"})
    with pytest.raises(ConfigError, match=r"no profile 'fast' \(allowed: debug, release\)"):
        load_config(DEFAULT, {}, {"profile": "fast"})


def test_wrong_type_in_file(tmp_path: Path) -> None:
    f = _toml(tmp_path, '[hip]\ndefault_arches = "gfx1030"\n')
    with pytest.raises(ConfigError, match=r"hip.default_arches: Input should be a valid tuple"):
        load_config(f, {}, {})


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", {}, {})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_toml(tmp_path, "[build\n"), {}, {})


def test_version_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="version"):
        load_config(_toml(tmp_path, 'version = "one"\n'), {}, {})


def test_schema_and_reference_are_generated_and_current() -> None:
    """docs/config-reference.md (committed) and the JSON schema (on demand) come from the models."""
    import json
    import subprocess
    import sys

    from toolchain.config.reference import reference_markdown, schema_json

    proc = subprocess.run(
        [sys.executable, "-m", "toolchain.config.reference", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(schema_json())
    assert set(schema["properties"]) == {
        "version",
        "build",
        "host",
        "hip",
        "cuda",
        "windows",
        "validate",
        "profiles",
        "cache",
        "package",
        "release",
    }
    reference = reference_markdown()
    for key in (
        "`build.arch`",
        "`hip.device_lib_dir`",
        "`HIP_DEVICE_LIB_PATH`",
        "`arch=`",
        "`windows.msvc_toolset`",
        "`release.targets.<name>.groups`",
        "`entry=`",
        "`package.max_bytes`",
    ):
        assert key in reference


@pytest.mark.parametrize("url", ["http://cache:6379", "redis://", "redis://host:6379/db two"])
def test_a_cache_store_that_is_not_a_redis_url_is_one_line(tmp_path: Path, url: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[cache]\nremote = "{url}"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(config, {}, {})
    line = exc.value.one_line()
    assert f"cache.remote: '{url}' is not a Redis URL; write redis://host:port[/db]" in line and "\n" not in line
    config.write_text('[cache]\nremote = "redis://10.0.0.5:6379/2"\n')
    assert load_config(config, {}, {}).config.cache.remote == "redis://10.0.0.5:6379/2"


def _project(tmp_path: Path) -> Path:
    """A git checkout holding one tracked source folder, src, and an untracked file."""
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.c").write_text("int a;\n")
    (root / "notes.txt").write_text("x\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "src/a.c"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    return root


@pytest.mark.parametrize(
    ("variables", "problem"),
    [
        ({"build_dir": "."}, "build.build_dir: '.' is the project's folder or holds it; name a folder of its own"),
        ({"dist_dir": ".."}, "build.dist_dir: '..' is the project's folder or holds it"),
        ({"build_dir": "/"}, "build.build_dir: '/' is the project's folder or holds it"),
        ({"dist_dir": "notes.txt"}, "build.dist_dir: 'notes.txt' is a file, not a folder; name a folder of its own"),
        ({"build_dir": "src"}, "build.build_dir: 'src' holds files of the project (git tracks 1 there, e.g. src/a.c)"),
        ({"build_dir": "./src/.."}, "build.build_dir: './src/..' is the project's folder or holds it"),
    ],
)
def test_a_build_or_dist_folder_that_holds_the_project_is_refused(
    tmp_path: Path, variables: dict[str, str], problem: str
) -> None:
    """`doit clean-build` empties both folders: neither may be the project, hold it,
    or hold a file git tracks."""
    root = _project(tmp_path)
    rc = load_config(DEFAULT, {}, variables)
    (line,) = folder_problems(rc, root)
    assert line.startswith(f"var {next(iter(variables))}=: {problem}"), line
    assert "(the default is '" in line


def test_a_folder_of_its_own_is_accepted_inside_or_outside_the_project(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "build").mkdir()
    for variables in ({}, {"build_dir": "src/out", "dist_dir": "out"}, {"build_dir": str(tmp_path / "elsewhere")}):
        assert folder_problems(load_config(DEFAULT, {}, variables), root) == [], variables
    # outside a git checkout only the project's own folder can be told
    plain = tmp_path / "plain"
    (plain / "src").mkdir(parents=True)
    assert folder_problems(load_config(DEFAULT, {}, {"build_dir": "src"}), plain) == []


@pytest.mark.parametrize("name", ["build_dir", "dist_dir"])
def test_an_empty_folder_names_the_default(name: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(DEFAULT, {}, {name: " "})
    default = "build" if name == "build_dir" else "dist"
    assert f"var {name}=: build.{name}: empty; leave {name}= out for the default ('{default}')" in exc.value.one_line()


def test_the_file_systems_refusal_is_one_line() -> None:
    assert os_error_line(FileNotFoundError(2, "No such file or directory", "/proc/x")) == (
        "/proc/x: No such file or directory"
    )
    assert (
        os_error_line(OSError(18, "Invalid cross-device link", "/a", None, "/b"))
        == "/a -> /b: Invalid cross-device link"
    )
    assert os_error_line(OSError("no details")) == "no details"
