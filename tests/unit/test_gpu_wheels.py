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


def test_missing_compares_versions_with_what_the_wheels_ask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image package too old for a wheel's requirement is missing; one new enough is not (its
    conditional wheel is left out, so it never shadows the image's)."""
    versions = {"typing-extensions": "4.12.2", "packaging": "25.0", "pydantic": None, "hjson": "3.1.0"}
    monkeypatch.setattr(gpu_wheels, "installed_version", lambda name: versions.get(name))
    _wheel(tmp_path, "pydantic", "2.14.4", ["typing-extensions>=4.16.0"])
    _wheel(tmp_path, "megatron_core", "0.16.1", ["packaging>=24.2"])
    _wheel(tmp_path, "typing_extensions", "4.16.0", [])
    _wheel(tmp_path, "packaging", "26.4", [])
    _wheel(tmp_path, "hjson", "3.1.0", [])
    versions["megatron-core"] = "0.16.1"
    assert gpu_wheels.missing(tmp_path) == ["pydantic", "typing-extensions"]
    versions["typing-extensions"] = "4.16.0"
    assert gpu_wheels.missing(tmp_path) == ["pydantic"]


def test_install_puts_only_the_missing_wheels_into_the_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_wheels, "installed_version", lambda name: {"packaging": "26.0"}.get(name))
    _wheel(tmp_path, "deepspeed", "0.19.8", ["packaging>=20.0", "hjson"])
    _wheel(tmp_path, "packaging", "26.4", [])
    calls: list[list[str]] = []
    monkeypatch.setattr(gpu_wheels.subprocess, "run", lambda command, check: calls.append(command))
    installed, absent = gpu_wheels.install(tmp_path / "site", tmp_path)
    assert (installed, absent) == (["deepspeed"], [])  # packaging 26.0 meets >=20.0: its wheel stays out
    assert len(calls) == 1 and calls[0][-1].endswith("deepspeed-0.19.8-py3-none-any.whl")
    assert "--no-index" in calls[0] and calls[0][calls[0].index("--target") + 1] == str(tmp_path / "site")


def test_an_empty_folder_reports_the_roots_missing_and_installs_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_wheels, "installed_version", lambda name: None)
    monkeypatch.setattr(gpu_wheels.subprocess, "run", lambda command, check: pytest.fail("nothing to install"))
    assert gpu_wheels.install(tmp_path / "site", tmp_path) == ([], ["deepspeed", "megatron-core"])
