"""A compile's sources copied to a folder their content names (toolchain/staging.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolchain.staging import stage_files


def _sources(root: Path, text: str) -> list[tuple[str, Path]]:
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "a.cu").write_text(text)
    (root / "gen.h").write_text("#define X 1\n")
    return [("kernels/a.cu", root / "kernels" / "a.cu"), ("gen/gen.h", root / "gen.h")]


def test_the_same_sources_anywhere_stage_to_one_folder_and_others_to_another(tmp_path: Path) -> None:
    under = tmp_path / "stage"
    first = stage_files(_sources(tmp_path / "one checkout", "int a;\n"), under)
    again = stage_files(_sources(tmp_path / "elsewhere" / "two", "int a;\n"), under)
    other = stage_files(_sources(tmp_path / "three", "int b;\n"), under)
    assert first == again != other and first.parent == under
    assert (first / "kernels" / "a.cu").read_text() == "int a;\n" and (first / "gen" / "gen.h").is_file()
    assert (other / "kernels" / "a.cu").read_text() == "int b;\n"
    assert sorted(p.name for p in under.iterdir()) == sorted([first.name, other.name])  # no copy left half-made


def test_a_source_that_cannot_be_read_stages_nothing(tmp_path: Path) -> None:
    files = _sources(tmp_path / "src", "int a;\n")
    under = tmp_path / "stage"
    under.mkdir()
    files[1][1].unlink()
    with pytest.raises(OSError):
        stage_files(files, under)
    assert list(under.iterdir()) == []
