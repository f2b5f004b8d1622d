"""prepare_data.py when it is stopped or asked again: Ctrl-C with workers, a trained tokenizer kept only
with its dataset, a dataset asked for with other settings, and held-out parts of a small corpus."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kerple.data import preprocess, sources
from kerple.data.errors import DataError

REPO = Path(__file__).resolve().parents[3]


def run_prepare(tmp_path: Path, *argv: str) -> int:
    return preprocess.main(["stdlib", "-d", str(tmp_path / "data"), "--quiet", *argv])


def test_a_small_corpus_gives_every_weighted_part_a_document(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """With --limit 20 the test share of 949,50,1 rounds to 0 documents: the part was silently absent."""
    assert run_prepare(tmp_path, "--limit", "20", "-t", "CharLevelTokenizer") == 0
    info = json.loads(next((tmp_path / "data").rglob("*.info.json")).read_text())
    assert all(info["parts"][name]["documents"] >= 1 for name in ("train", "valid", "test"))
    assert sum(int(count) for count in info["split"].split(",")) == 20


def test_a_part_of_weight_zero_is_said_to_be_left_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert run_prepare(tmp_path, "--limit", "20", "-t", "CharLevelTokenizer", "--split", "949,50") == 0
    assert "test: none (--split 949,50 gives it weight 0)" in capsys.readouterr().out


def test_too_few_documents_for_the_weighted_parts_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert run_prepare(tmp_path, "--limit", "2", "-t", "CharLevelTokenizer") == 2
    err = capsys.readouterr().err
    assert "2 document(s) cannot fill the 3 parts --split 949,50,1 gives a weight" in err
    refs = sorted(sources.stdlib_refs(), key=lambda ref: ref.key)[:2]
    assert [len(part) for part in sources.hold_out(refs, "1,1").values()] == [1, 1, 0]


def test_a_prepared_dataset_asked_for_with_another_split_or_limit_is_refused(tmp_path: Path) -> None:
    assert run_prepare(tmp_path, "--limit", "20", "-t", "CharLevelTokenizer") == 0
    with pytest.raises(DataError, match="already prepared with --split 949,50,1, not 90,5,5; pass --force"):
        preprocess.run(["stdlib", "-d", str(tmp_path / "data"), "--limit", "20", "-t", "CharLevelTokenizer",
                        "--split", "90,5,5"])
    with pytest.raises(DataError, match="already prepared with --limit 20, not 30"):
        preprocess.run(["stdlib", "-d", str(tmp_path / "data"), "--limit", "30", "-t", "CharLevelTokenizer"])


def test_a_trained_tokenizer_is_not_trained_again_for_a_prepared_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    assert run_prepare(tmp_path, "--limit", "20", "--train-tokenizer", "300") == 0
    tokenizer = tmp_path / "data" / "stdlib" / "stdlib_bpe300.json"
    before = tokenizer.read_bytes()
    monkeypatch.setattr(preprocess, "train_bpe_tokenizer", lambda *args: pytest.fail("trained again"))
    capsys.readouterr()
    assert run_prepare(tmp_path, "--limit", "20", "--train-tokenizer", "300") == 0
    assert "already prepared" in capsys.readouterr().out and tokenizer.read_bytes() == before


@pytest.mark.parametrize("earlier", [False, True], ids=["new", "over-an-earlier-one"])
def test_an_interrupted_run_leaves_no_tokenizer_of_its_own(
    earlier: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Stopped after the BPE was trained, the run left a tokenizer file for a dataset never written."""
    tokenizer = tmp_path / "data" / "stdlib" / "stdlib_bpe300.json"
    if earlier:
        tokenizer.parent.mkdir(parents=True)
        tokenizer.write_text("the earlier file")

    def interrupted(*args: object, **kwargs: object) -> None:
        assert tokenizer.is_file() and tokenizer.read_text() != "the earlier file"  # the new one was written
        raise KeyboardInterrupt

    monkeypatch.setattr(preprocess, "tokenize_corpus", interrupted)
    assert run_prepare(tmp_path, "--limit", "20", "--train-tokenizer", "300", "--force") == 130
    assert "interrupted" in capsys.readouterr().err
    assert (tokenizer.read_text() == "the earlier file") if earlier else not tokenizer.exists()


DRIVER = textwrap.dedent("""
    import os, signal, sys, threading, time
    from kerple.data import preprocess
    from kerple.data.sources import Corpus
    from kerple.data.tokenizers import CharLevelTokenizer
    from kerple.errors import entry_point

    class SlowTokenizer(CharLevelTokenizer):
        def tokenize_batch(self, texts):
            open(os.path.join(os.path.dirname(sys.argv[1]), f"working-{os.getpid()}"), "w").close()
            time.sleep(60)
            return super().tokenize_batch(texts)

    def interrupt_when_working():
        # a terminal's Ctrl-C (the whole group) once a worker tokenizes: the pool has started by then
        # (a Ctrl-C while the workers start is ignored with them; on a loaded machine that took over 4 s)
        folder = os.path.dirname(sys.argv[1])
        while not any(name.startswith("working-") for name in os.listdir(folder)):
            time.sleep(0.05)
        os.killpg(0, signal.SIGINT)

    @entry_point("prepare_data.py")
    def main():
        corpus = Corpus({"all": lambda stats: iter(["some text"] * 400)})
        print("started", flush=True)
        preprocess.tokenize_corpus(corpus, SlowTokenizer(), sys.argv[1], workers=2, progress=False)
        return 0

    if __name__ == "__main__":
        threading.Thread(target=interrupt_when_working, daemon=True).start()
        sys.exit(main())
""")


def test_ctrl_c_with_workers_stops_in_one_line(tmp_path: Path) -> None:
    """With --workers 2, Ctrl-C printed each worker's traceback and left the parent waiting forever."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    done = subprocess.run([sys.executable, str(driver), str(tmp_path / "out_text_document")], cwd=REPO,
                          capture_output=True, text=True, timeout=90, start_new_session=True)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "prepare_data.py: interrupted", done.stderr
    assert not list(tmp_path.glob("out_*"))
    assert list(tmp_path.glob("working-*")), "no worker started"
