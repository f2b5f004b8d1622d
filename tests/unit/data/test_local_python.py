"""The `python` source: Python files found on disk, one copy per content, held out by file, licences named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerple.data import preprocess, sources
from kerple.data.errors import DataError
from kerple.data.local_python import SourceRoot, python_files, roots_from_paths
from kerple.data.readers import ReadStats


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_duplicates_are_removed_by_content_and_empty_files_skipped(tmp_path: Path) -> None:
    write(tmp_path / "b" / "copy.py", "x = 1\n")
    write(tmp_path / "a" / "first.py", "x = 1\n")  # same bytes: the first key in sorted order is kept
    write(tmp_path / "c" / "other.py", "y = 2\n")
    write(tmp_path / "c" / "empty.py", "")
    write(tmp_path / "c" / "notes.txt", "not python")
    kept, details = python_files([SourceRoot("pkgs", tmp_path)])
    assert [item.key for item in kept] == ["pkgs/a/first.py", "pkgs/c/other.py"]
    assert details["files_found"] == 3 and details["duplicates_removed"] == 1 and details["files_kept"] == 2
    assert details["bytes_kept"] == len("x = 1\n") + len("y = 2\n")
    first, _ = python_files([SourceRoot("pkgs", tmp_path)], limit=1)
    assert [item.key for item in first] == ["pkgs/a/first.py"]


def test_the_standard_library_root_skips_its_package_folders(tmp_path: Path) -> None:
    write(tmp_path / "json" / "decoder.py", "def decode(): pass\n")
    write(tmp_path / "site-packages" / "pkg" / "mod.py", "import pkg\n")
    kept, details = python_files([SourceRoot("stdlib", tmp_path, stdlib=True)])
    assert [item.key for item in kept] == ["stdlib/json/decoder.py"]
    assert kept[0].license == "PSF-2.0" and details["licenses"] == {"PSF-2.0": 1}


def _distribution(site: Path, name: str, metadata: str, files: list[str]) -> None:
    info = site / f"{name}-1.0.dist-info"
    write(info / "METADATA", f"Metadata-Version: 2.4\nName: {name}\nVersion: 1.0\n{metadata}")
    write(info / "RECORD", "".join(f"{file},,\n" for file in files))
    for index, file in enumerate(files):
        write(site / file, f"VALUE = {index!r}  # {name}\n")


def test_licences_come_from_the_installing_distribution(tmp_path: Path) -> None:
    _distribution(tmp_path, "spdxpkg", "License-Expression: MIT\n", ["spdxpkg/__init__.py"])
    _distribution(tmp_path, "oldpkg", "Classifier: License :: OSI Approved :: BSD License\n", ["oldpkg/core.py"])
    _distribution(tmp_path, "textpkg", "License: Apache 2.0\n  long text follows\n", ["textpkg/a.py"])
    write(tmp_path / "loose.py", "print('no distribution')\n")
    kept, details = python_files([SourceRoot("site-packages", tmp_path)])
    licences = {item.key: item.license for item in kept}
    assert licences == {"site-packages/spdxpkg/__init__.py": "MIT", "site-packages/oldpkg/core.py": "BSD License",
                        "site-packages/textpkg/a.py": "Apache 2.0", "site-packages/loose.py": "unknown"}
    assert details["licenses"] == {"MIT": 1, "BSD License": 1, "Apache 2.0": 1, "unknown": 1}


def test_splits_hold_whole_files_and_no_content_twice(tmp_path: Path) -> None:
    contents = [f"def f{i}():\n    return {i}\n" for i in range(40)]
    for i, text in enumerate(contents):
        write(tmp_path / "one" / f"m{i:02d}.py", text)
        if i % 3 == 0:
            write(tmp_path / "two" / f"vendored_{i:02d}.py", text)  # the same file vendored elsewhere
    context = sources.SourceContext(tmp_path, tmp_path / ".cache", split="60,40,0", roots=(tmp_path,))
    corpus = sources.get_source("python").build(context)
    texts = {name: list(stream(ReadStats())) for name, stream in corpus.parts.items()}
    assert sorted(texts["train"] + texts["valid"] + texts["test"]) == sorted(contents)  # each file once, whole
    assert texts["valid"] and not set(texts["train"]) & set(texts["valid"])
    assert corpus.details["duplicates_removed"] == 14 and corpus.details["files_kept"] == 40


def test_prepare_data_python_with_roots_records_what_it_found(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "code"
    for i in range(12):
        write(root / f"m{i}.py", f"def function_{i}(argument):\n    return argument * {i}\n")
    write(root / "copy" / "m0.py", "def function_0(argument):\n    return argument * 0\n")
    preprocess.run(["python", "--root", str(root), "-d", str(tmp_path / "data"), "-t", "CharLevelTokenizer",
                    "--split", "75,25,0", "--quiet"])
    info = json.loads((tmp_path / "data" / "python" / "python_text_document.info.json").read_text())
    assert info["source"]["files_found"] == 13 and info["source"]["duplicates_removed"] == 1
    assert info["parts"]["train"]["documents"] + info["parts"]["valid"]["documents"] == 12
    assert "13 files found, 1 duplicates removed, 12 kept" in capsys.readouterr().out
    with pytest.raises(DataError, match="--root is for the python source"):
        preprocess.run(["stdlib", "--root", str(root), "-d", str(tmp_path / "data"), "-t", "CharLevelTokenizer"])


def test_a_missing_root_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nowhere: folder not found"):
        python_files(roots_from_paths([tmp_path / "nowhere"]))


def test_only_regular_non_empty_files_are_documents(tmp_path: Path) -> None:
    """A folder named ``*.py``, a broken link and an empty file are no documents; a file inside such a
    folder still is."""
    write(tmp_path / "real.py", "x = 1\n")
    write(tmp_path / "odd.py" / "inner.py", "y = 2\n")
    write(tmp_path / "empty.py", "")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "missing.py")
    kept, details = python_files(roots_from_paths([tmp_path]))
    root = tmp_path.name
    assert [item.key for item in kept] == [f"{root}/odd.py/inner.py", f"{root}/real.py"]
    assert details["files_found"] == 2 and details["bytes_kept"] == 12
