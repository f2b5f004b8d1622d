"""tools/gpu_wheels.py: requirement markers for the target, and the checks of a wheel folder."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import gpu_wheels  # noqa: E402


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    metadata = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {requirement}" for requirement in requires]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(metadata) + "\n")
    return path


def test_requirements_follow_the_target_markers(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "alpha", "1.0", [
        "numpy", "old; python_version < '3.10'", "linuxonly; sys_platform == 'linux'",
        "winonly; sys_platform == 'win32'", "dev; extra == 'test'"])
    assert [r.name for r in gpu_wheels.requirements_of(wheel)] == ["numpy", "linuxonly"]


@pytest.fixture()
def no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_wheels, "_dry_run", lambda folder, names: [])


def test_complete_folder_has_no_problems(tmp_path: Path, no_pip: None) -> None:
    _wheel(tmp_path, "alpha", "1.0", ["beta>=2", "numpy", "torch>=2.0"])  # numpy, torch: on the image
    _wheel(tmp_path, "beta", "2.1", [])
    assert gpu_wheels.verify(tmp_path) == []


def test_unmet_missing_and_duplicate_requirements_are_found(tmp_path: Path, no_pip: None) -> None:
    _wheel(tmp_path, "alpha", "1.0", ["beta>=2", "gamma"])
    _wheel(tmp_path, "beta", "1.5", [])
    _wheel(tmp_path, "beta", "1.6", [])
    problems = gpu_wheels.verify(tmp_path)
    assert any("two versions of beta" in p for p in problems)
    assert any("needs beta>=2 but .whl has beta" in p for p in problems)
    assert any("needs gamma: neither in .whl nor on the image" in p for p in problems)
