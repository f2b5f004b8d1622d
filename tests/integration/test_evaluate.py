"""evaluate.py end to end on a checkpoint that train.py wrote."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "training"))

from kerple.evaluation import cli  # noqa: E402
from tiny_run import REPO, tiny_overrides, write_corpus  # noqa: E402

LENGTHS = "32,64,128"


def as_arguments(overrides: dict) -> list[str]:
    return [f"{key}={'' if value is None else value}" for key, value in overrides.items()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A 20-step kerple_log checkpoint and the config arguments that describe it."""
    root = tmp_path_factory.mktemp("evaluate")
    corpus = write_corpus(root / "corpus", documents=400)
    checkpoints = root / "ckpt"
    overrides = tiny_overrides(
        corpus, train_iters=20, lr_decay_iters=20, save=str(checkpoints), save_interval=20, num_workers=0
    )
    arguments = ["configs/models/tiny.yml", *as_arguments(overrides)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "train.py", *arguments], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return checkpoints, arguments


def evaluate(trained: tuple[Path, list[str]], output: Path, *extra: str) -> dict:
    checkpoints, arguments = trained
    argv = [*arguments, "--load", str(checkpoints), "--output", str(output), "--no-progress", *extra]
    assert cli.main([str(REPO / a) if a.endswith(".yml") else a for a in argv]) == 0
    return json.loads(output.read_text())


def test_evaluate_py_nonoverlap_is_repeatable(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    checkpoints, arguments = trained
    output = tmp_path / "a.json"
    done = subprocess.run(
        [sys.executable, "evaluate.py", *arguments, "--load", str(checkpoints), "--eval-lengths", LENGTHS,
         "--per-position", "--output", str(output)],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "length  windows" in done.stdout
    first = json.loads(output.read_text())
    assert first["run"]["pos_emb"] == "kerple_log" and first["run"]["iteration"] == 20
    assert first["run"]["dataset"] == "corpus" and first["run"]["train_seq_length"] == 32
    rows = first["results"]
    assert [r["length"] for r in rows] == [32, 64, 128]
    assert len({r["scored_tokens"] for r in rows}) == 1  # the same tokens at every length
    assert [r["num_windows"] * r["length"] for r in rows] == [r["scored_tokens"] for r in rows]
    for row in rows:
        assert row["ppl"] == pytest.approx(math.exp(row["loss"]))
        assert math.log(64) * 0.3 < row["loss"] < math.log(64) * 1.5  # trained, vocab 64
        assert sum(row["per_position_loss"]) / row["length"] == pytest.approx(row["loss"], rel=1e-9)
    again = evaluate(trained, tmp_path / "b.json", "--eval-lengths", LENGTHS, "--per-position")
    assert again["results"] == [{**r, "seconds": s["seconds"]} for r, s in zip(rows, again["results"])]


def test_sliding_and_last_token(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    sliding = evaluate(trained, tmp_path / "s.json", "--eval-lengths", "32,64", "--protocol", "sliding", "--stride", "16")
    assert sliding["protocol"]["name"] == "sliding" and sliding["protocol"]["stride"] == 16
    assert len({r["scored_tokens"] for r in sliding["results"]}) == 1
    last = evaluate(trained, tmp_path / "l.json", "--eval-lengths", LENGTHS, "--protocol", "last_token")
    counts = {r["scored_tokens"] for r in last["results"]}
    assert counts == {r["num_windows"] for r in last["results"]} and len(counts) == 1
    assert [r["input_length"] for r in last["results"]] == [31, 63, 127]


def test_windowed_attention_changes_only_long_lengths(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    plain = evaluate(trained, tmp_path / "p.json", "--eval-lengths", LENGTHS)
    windowed = evaluate(trained, tmp_path / "w.json", "--eval-lengths", LENGTHS, "--attention-window", "32")
    assert windowed["protocol"]["attention_window"] == 32
    assert windowed["results"][0]["loss"] == pytest.approx(plain["results"][0]["loss"], rel=1e-6)
    assert windowed["results"][2]["loss"] != pytest.approx(plain["results"][2]["loss"], rel=1e-6)


def test_cache_window_matches_attention_window(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    """A W-entry KV cache equals full attention when W covers the window and equals the
    attention_window=W mask otherwise (thesis §4.9.2)."""
    plain = evaluate(trained, tmp_path / "p.json", "--eval-lengths", "32,64")
    masked = evaluate(trained, tmp_path / "m.json", "--eval-lengths", "32,64", "--attention-window", "32")
    cached = evaluate(trained, tmp_path / "c.json", "--eval-lengths", "32,64", "--cache-window", "32")
    assert cached["protocol"]["cache_window"] == 32
    assert cached["results"][0]["loss"] == pytest.approx(plain["results"][0]["loss"], rel=1e-5)
    assert cached["results"][1]["loss"] == pytest.approx(masked["results"][1]["loss"], rel=1e-5)
    assert cached["results"][1]["loss"] != pytest.approx(plain["results"][1]["loss"], rel=1e-5)


def test_auto_implementation_is_resolved_per_length(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    plain = evaluate(trained, tmp_path / "p.json", "--eval-lengths", "32,64")
    auto = evaluate(trained, tmp_path / "a.json", "--eval-lengths", "32,64", "--attention-impl", "auto")
    # Short CPU evaluations of a bias kernel pick sdpa (flex only from 2048 tokens on CPU).
    assert auto["protocol"]["attention_impl_per_length"] == {"32": "sdpa", "64": "sdpa"}
    for a, b in zip(auto["results"], plain["results"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_triton_kernel_scores_as_sdpa(trained: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    """``--attention-impl triton`` (here in Triton's CPU interpreter) gives sdpa's perplexity; where the kernel
    cannot run, one line says so, exit 2, and no results file is left."""
    pytest.importorskip("triton")
    flags = ("--eval-lengths", "32,64", "--num-tokens", "256")
    plain = evaluate(trained, tmp_path / "p.json", *flags, "--attention-impl", "sdpa")
    fused = evaluate(trained, tmp_path / "t.json", *flags, "--attention-impl", "triton")
    assert fused["protocol"]["attention_impl_per_length"] == {"32": "triton", "64": "triton"}
    for a, b in zip(fused["results"], plain["results"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    if torch_has_cuda():
        return
    monkeypatch.setattr("kerple.model.triton_attention.runs_on", lambda device_type: False)
    checkpoints, arguments = trained
    argv = [str(REPO / a) if a.endswith(".yml") else a for a in arguments]
    output = tmp_path / "x.json"
    assert cli.main([*argv, "--load", str(checkpoints), "--output", str(output), "--no-progress", *flags,
                     "--attention-impl", "triton"]) == 2
    assert "Triton attention kernel needs CUDA" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not output.exists()


def torch_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_refusals_exit_2_with_a_reason(
    trained: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    checkpoints, arguments = trained
    base = [str(REPO / a) if a.endswith(".yml") else a for a in arguments]
    common = ["--load", str(checkpoints), "--output", str(tmp_path / "x.json"), "--no-progress"]
    learned = [*base, "pos_emb=learned", "--eval-lengths", "32,128", *common]
    assert cli.main([a for a in learned if a != "pos_emb=kerple_log"]) == 2
    assert "max_position_embeddings" in capsys.readouterr().err
    assert cli.main([*base, "--eval-lengths", "128,1000000", *common]) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith(f"evaluate.py: error: the valid split of {checkpoints.parent / 'corpus'}: --eval-lengths "
                              "1000000 needs at least 1000001 tokens") and message.endswith("or a larger split")
    monkeypatch.setattr(cli, "available_bytes", lambda device: 1_000_000)
    assert cli.main([*base, "--eval-lengths", "128", *common]) == 2
    assert "does not fit in memory" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_unwritable_output_is_refused_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # The checkpoint does not exist either: the output is checked first, before configs and weights.
    argv = [str(REPO / "configs/models/tiny.yml"), "--load", str(tmp_path / "missing"), "--eval-lengths", "32",
            "--output", str(blocker / "out.json"), "--no-progress"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--output" in err and "a-file is a file, not a folder" in err
    assert cli.main([*argv[:-3], "--output", str(tmp_path), "--no-progress"]) == 2
    assert "is a folder; name a file" in capsys.readouterr().err


def test_an_interrupted_run_keeps_the_finished_lengths(
    trained: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Ctrl-C printed a traceback and exit status 1; now one line, 130, and what the file keeps."""
    real = cli.evaluate_plan

    def interrupted_at_64(loss_fn, stream, plan, **kwargs):  # noqa: ANN001, ANN202
        if plan.length == 64:
            raise KeyboardInterrupt
        return real(loss_fn, stream, plan, **kwargs)

    monkeypatch.setattr(cli, "evaluate_plan", interrupted_at_64)
    output = tmp_path / "partial.json"
    checkpoints, arguments = trained
    argv = [*arguments, "--load", str(checkpoints), "--output", str(output), "--no-progress", "--eval-lengths", LENGTHS]
    capsys.readouterr()
    assert cli.main([str(REPO / a) if a.endswith(".yml") else a for a in argv]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"evaluate.py: interrupted; {output} holds the lengths it finished (32; complete: false)"
    partial = json.loads(output.read_text())
    assert partial["complete"] is False and [r["length"] for r in partial["results"]] == [32]
    monkeypatch.setattr(cli, "evaluate_plan", real)
    assert evaluate(trained, output, "--eval-lengths", LENGTHS)["complete"] is True


def test_plan_and_estimate_are_printed_first(
    trained: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    evaluate(trained, tmp_path / "p.json", "--eval-lengths", LENGTHS)
    err = capsys.readouterr().err
    assert "plan: nonoverlap on the valid split" in err and " in all (timed on one batch)" in err
    assert err.index("plan:") < err.index("L=32: loss")
    assert "at iteration 20" in err


def test_default_token_budget() -> None:
    def budget(lengths: list[int], stream: int, **flags: object) -> int | None:
        args = argparse.Namespace(protocol="nonoverlap", num_windows=None, num_tokens=None)
        vars(args).update(flags)
        return cli.scored_token_budget(args, lengths, stream)

    assert budget([128, 2048], 300_000) == cli.DEFAULT_NUM_TOKENS == 32768
    assert budget([65536], 300_000) == 65536  # at least one window of the longest length
    assert budget([128], 1000) == 999  # no more than the split holds
    assert budget([128], 300_000, num_tokens="all") is None
    assert budget([128], 300_000, num_tokens="5000") == 5000
    assert budget([128], 300_000, num_windows=3) is None
    assert budget([128], 300_000, protocol="last_token") is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-tokens", "-5"], "--num-tokens -5"),
        (["--num-tokens", "0"], "--num-tokens 0"),
        (["--num-tokens", "many"], "--num-tokens 'many'"),
        (["--num-windows", "0"], "--num-windows 0"),
        (["--protocol", "sliding", "--stride", "-1"], "--stride -1"),
        (["--tokens-per-batch", "0"], "--tokens-per-batch 0"),
    ],
)
def test_bad_numbers_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str
) -> None:
    argv = [str(REPO / "configs/models/tiny.yml"), "--load", str(tmp_path), "--eval-lengths", "32",
            "--output", str(tmp_path / "x.json"), "--no-progress", *flags]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_per_document_perplexity(trained: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    doc = evaluate(trained, tmp_path / "d.json", "--eval-lengths", "32,64", "--per-document")
    assert "documents; the 10 with most scored tokens" in capsys.readouterr().err
    for row in doc["results"]:
        documents = row["per_document"]
        tokens = [d["tokens"] for d in documents]
        assert tokens == sorted(tokens, reverse=True) and sum(tokens) == row["scored_tokens"]
        assert 1 <= max(tokens) <= 121  # a corpus document holds 21-120 tokens and its end-of-document
        mean = sum(d["loss"] * d["tokens"] for d in documents) / row["scored_tokens"]
        assert mean == pytest.approx(row["loss"], rel=1e-9)


def test_load_without_yaml_reads_the_checkpoint_configs(
    trained: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    checkpoints, _ = trained
    with_yaml = evaluate(trained, tmp_path / "y.json", "--eval-lengths", "32,64")
    argv = ["--load", str(checkpoints), "--eval-lengths", "32,64", "--output", str(tmp_path / "n.json"), "--no-progress"]
    assert cli.main(argv) == 0
    assert "resolved.yml (from the checkpoint)" in capsys.readouterr().err
    without = json.loads((tmp_path / "n.json").read_text())
    assert [r["loss"] for r in without["results"]] == pytest.approx([r["loss"] for r in with_yaml["results"]], rel=1e-9)
    assert cli.main(["--eval-lengths", "32", "--output", str(tmp_path / "m.json")]) == 2
    assert "pass --load DIR" in capsys.readouterr().err


def test_per_document_names_the_files(trained: tuple[Path, list[str]], tmp_path: Path,
                                      capsys: pytest.CaptureFixture) -> None:
    """It printed "document 1"; prepare_data.py records the held-out files' names in info.json."""
    import shutil

    checkpoints, arguments = trained
    corpus = next(word.split("=", 1)[1] for word in arguments if word.startswith("data_path="))
    copy = tmp_path / "corpus"
    for suffix in (".bin", ".idx"):
        shutil.copyfile(corpus + suffix, str(copy) + suffix)
    names = [f"pkg/module_{index}.py" for index in range(40)]  # split 90,10,0 of 400 documents: 40 held out
    Path(f"{copy}.info.json").write_text(json.dumps({"split": "90,10,0", "documents": {"valid": names}}))
    argv = [str(REPO / a) if a.endswith(".yml") else a for a in arguments if not a.startswith("data_path=")]
    argv += [f"data_path={copy}", "--load", str(checkpoints), "--output", str(tmp_path / "d.json"), "--no-progress",
             "--eval-lengths", "32", "--per-document"]
    capsys.readouterr()
    assert cli.main(argv) == 0
    rows = json.loads((tmp_path / "d.json").read_text())["results"][0]["per_document"]
    assert [row["name"] for row in rows] == [names[row["document"]] for row in rows]
    printed = capsys.readouterr().err
    assert f"    {rows[0]['name']}" in printed and "document " not in printed.split("with most scored tokens:")[1]


def test_perplexity_equals_a_plain_forward_by_hand(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    """The loss at length 64 against log-softmax of the loaded model's logits over the validation
    documents (400 documents split 90/10: the last 40), windows [64k, 64k + 64) with labels shifted by
    one; and with ``eod_mask_loss`` (a BPE whose end-of-document id is 0) the labels after a 0 left out."""
    import numpy as np
    import torch

    from kerple.config import load_config
    from kerple.data.indexed_dataset import MMapIndexedDataset
    from kerple.data.tokenizers import train_bpe_tokenizer
    from kerple.runs import load_run

    checkpoints, arguments = trained
    overrides = dict(argument.split("=", 1) for argument in arguments[1:])
    indexed = MMapIndexedDataset(overrides["data_path"])
    stream = np.concatenate([np.asarray(indexed[i], dtype=np.int64) for i in range(360, 400)])
    labels = (len(stream) - 1) // 128 * 128  # the budget shared by 32, 64 and 128: all labels, whole windows of 128
    cfg = load_config([REPO / arguments[0]], {"pos_emb": "kerple_log", "num_layers": 2, "hidden_size": 32,
                                              "num_attention_heads": 4, "vocab_size": 64, "make_vocab_size_divisible_by": 8})
    model = load_run(cfg, str(checkpoints), quiet=True).model
    losses, inputs = [], []
    with torch.no_grad():
        for start in range(0, labels, 64):
            window = torch.from_numpy(stream[start : start + 64])[None]
            log_probs = torch.log_softmax(model(window)[0].double(), dim=-1)
            losses.append(-log_probs[torch.arange(64), torch.from_numpy(stream[start + 1 : start + 65])])
            inputs.append(window[0])
    losses, inputs = torch.cat(losses), torch.cat(inputs)

    plain = evaluate(trained, tmp_path / "plain.json", "--eval-lengths", LENGTHS)["results"][1]
    assert plain["scored_tokens"] == labels
    assert plain["loss"] == pytest.approx(losses.mean().item(), rel=1e-6)
    assert plain["ppl"] == pytest.approx(math.exp(losses.mean().item()), rel=1e-6)

    tokenizer = train_bpe_tokenizer(["abc abd"] * 5, 260, tmp_path / "tokenizer.json")
    assert tokenizer.eod == 0 and (inputs == 0).sum() > 0
    masked = evaluate(trained, tmp_path / "masked.json", "eod_mask_loss=true", "tokenizer_type=HFTokenizer",
                      f"vocab_file={tokenizer.tokenizer_file}", "--eval-lengths", LENGTHS)
    assert masked["protocol"]["eod_mask_loss"] is True
    kept = inputs != 0
    assert [row["scored_tokens"] for row in masked["results"]] == [int(kept.sum())] * 3
    assert masked["results"][1]["loss"] == pytest.approx(losses[kept].mean().item(), rel=1e-6)
