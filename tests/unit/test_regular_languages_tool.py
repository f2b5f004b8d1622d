"""tools/regular_languages.py: the JSON records, the Max/Avg table of Table 6.1, the plot, refusals."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kerple.regular_languages import bench
from kerple.regular_languages.bench import summary_rows, summary_table

REPO = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("tool_regular_languages", REPO / "tools" / "regular_languages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_max_and_avg_over_seeds_beside_the_thesis() -> None:
    settings = {"chunk_size": 2}
    records = [
        {"task": "parity_check", "arch": "rnn", "mean_accuracy": value, "settings": settings} for value in (1.0, 0.5, 0.75)
    ] + [{"task": "parity_check", "arch": "regulargpt", "mean_accuracy": 0.6, "settings": settings}]
    rows = {(r["task"], r["arch"]): r for r in summary_rows(records)}
    assert rows["parity_check", "rnn"]["max"] == pytest.approx(100.0)
    assert rows["parity_check", "rnn"]["avg"] == pytest.approx(75.0)
    assert rows["parity_check", "rnn"]["seeds"] == 3
    # thesis Table 6.1, Parity Check: RNN 100.0 / 98.9, RegularGPT C = 2 100.0 / 100.0
    table = summary_table(list(rows.values()))
    assert "| parity_check | 100.0 / 75.0 (3) | 100.0 / 98.9 | 60.0 / 60.0 (1) | 100.0 / 100.0 |" in table


def test_the_transformer_column_names_its_embedding_and_the_thesis_baseline() -> None:
    # the thesis' Transformer has Transformer-XL's relative positions (§6.4.2), whatever --pos-emb is here
    records = [{"task": "parity_check", "arch": "transformer", "mean_accuracy": 0.5,
                "settings": {"chunk_size": 2, "pos_emb": "alibi"}}]
    table = summary_table(summary_rows(records))
    header = table.splitlines()[0]
    assert "transformer (alibi): ours" in header
    assert "transformer (Transformer-XL positions): thesis" in header
    assert "| parity_check | 50.0 / 50.0 (1) | 52.3 / 50.1 |" in table


def test_table61_runs_every_task_and_resume_skips_what_is_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = load_tool()
    calls = []

    def fake_run(task, arch, seed, settings, lengths, progress=False):
        calls.append((task.name, arch, seed))
        return {"task": task.name, "arch": arch, "seed": seed, "train_max_length": task.train_max_length,
                "accuracy": {str(length): 0.5 for length in lengths}, "mean_accuracy": 0.5, "train_length_accuracy": 0.5,
                "steps": settings.steps, "train_seconds": 0.0, "test_seconds": 0.0, "settings": {"chunk_size": 2}}

    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr(bench, "plot_accuracy", lambda results, path: Path(path).write_bytes(b"png"))
    output = tmp_path / "t.json"
    assert tool.main(["--table61", "--seeds", "1", "--output", str(output)]) == 0
    assert len(calls) == 12 * 2 and {arch for _, arch, _ in calls} == {"regulargpt", "transformer"}
    calls.clear()
    assert tool.main(["--table61", "--seeds", "2", "--resume", "--output", str(output)]) == 0
    assert {seed for _, _, seed in calls} == {101} and len(calls) == 24  # seed 100 was kept
    assert len(json.loads(output.read_text())["results"]) == 48


def test_tool_writes_results_table_and_plot(tmp_path: Path) -> None:
    output = tmp_path / "out.json"
    argv = ["--task", "parity_check", "--arch", "regulargpt", "transformer", "rnn", "--seeds", "2", "--steps", "2",
            "--warmup", "0", "--batch-size", "4", "--hidden-size", "16", "--eval-samples", "6", "--test-lengths", "41,50,64",
            "--probability", "0.3", "--output", str(output)]
    assert load_tool().main(argv) == 0
    doc = json.loads(output.read_text())
    assert len(doc["results"]) == 6
    for record in doc["results"]:
        assert record["task"] == "parity_check" and record["train_max_length"] == 40
        assert list(record["accuracy"]) == ["41", "50", "64"]
        assert record["mean_accuracy"] == pytest.approx(sum(record["accuracy"].values()) / 3)
        assert record["settings"]["probability"] == 0.3
    assert {(r["arch"], r["seeds"]) for r in doc["summary"]} == {("regulargpt", 2), ("transformer", 2), ("rnn", 2)}
    assert output.with_suffix(".md").read_text().startswith("| task |")
    assert output.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_bad_lengths_are_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--task", "tomita3", "--arch", "rnn", "--test-lengths", "a:b", "--output", str(tmp_path / "x.json")]
    assert load_tool().main(argv) == 2
    assert "--test-lengths" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--steps", "-1"], "--steps -1: expected at least 1"),
    (["--lr", "0"], "--lr 0.0: expected more than 0"),
    (["--chunk-size", "1"], "--chunk-size 1: expected at least 2"),
    (["--probability", "1.5"], "--probability 1.5: expected more than 0 and below 1"),
    (["--test-lengths", "5:1"], "--test-lengths '5:1': gives no length"),
    (["--test-lengths", "0,3"], "--test-lengths '0,3': gives a length below 1"),
])
def test_numbers_below_their_least_are_refused_before_any_run(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    tool = load_tool()
    assert tool.main(["--task", "parity_check", *flags, "--output", str(tmp_path / "r.json")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_the_learning_rate_warms_up_linearly_then_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    import torch

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from kerple.regular_languages.bench import RunSettings, build_classifier, train
    from kerple.regular_languages.tasks import get_task

    seen: list[float] = []
    handle = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(optimizer.param_groups[0]["lr"]))
    try:
        task = get_task("parity_check")
        settings = RunSettings(hidden_size=16, batch_size=2, steps=6, learning_rate=2e-3, warmup_steps=4)
        torch.manual_seed(0)
        train(build_classifier("regulargpt", task, settings), task, settings, np.random.default_rng(0), False)
    finally:
        handle.remove()
    # step s (from 0) uses lr · min(1, (s + 1) / warmup): 1/4, 2/4, 3/4, then the full rate
    assert seen == pytest.approx([0.5e-3, 1e-3, 1.5e-3, 2e-3, 2e-3, 2e-3])


def test_warmup_and_progress_flags_reach_the_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    tool = load_tool()
    seen = []
    monkeypatch.setattr(bench, "run", lambda task, arch, seed, settings, lengths, progress=False: seen.append((settings, progress)) or
                        {"task": task.name, "arch": arch, "seed": seed, "train_max_length": 40, "accuracy": {"41": 1.0},
                         "mean_accuracy": 1.0, "train_length_accuracy": 1.0, "steps": 1, "train_seconds": 0.0,
                         "test_seconds": 0.0, "settings": {"chunk_size": 2}})
    monkeypatch.setattr(bench, "plot_accuracy", lambda results, path: Path(path).write_bytes(b"png"))
    argv = ["--task", "parity_check", "--seeds", "1", "--output", str(tmp_path / "w.json")]
    assert tool.main([*argv, "--warmup", "7"]) == 0
    assert seen[0][0].warmup_steps == 7 and seen[0][0].learning_rate == 1e-3
    assert seen[0][1]  # a seed trains for minutes: its bars are shown unless --no-progress
    assert tool.main([*argv, "--no-progress", "--output", str(tmp_path / "q.json")]) == 0 and not seen[1][1]
    assert tool.main([*argv, "--warmup", "-1"]) == 2
    assert "--warmup -1: expected at least 0" in capsys.readouterr().err


def load_seeds_benchmark():
    spec = importlib.util.spec_from_file_location("bench_regular_seeds", REPO / "benchmarks" / "regular_seeds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_seeds_benchmark_counts_the_seeds_at_the_threshold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    bench = load_seeds_benchmark()
    accuracy = {100: 0.99, 101: 0.94, 102: 0.95}  # seed 101 is short of 95%

    def fake_seed(name, seed, lengths, threads):
        return {"task": name, "arch": "regulargpt", "seed": seed, "steps": 10 * seed, "train_seconds": 1.0,
                "test_seconds": 2.0, "train_length_accuracy": 1.0, "mean_accuracy": accuracy[seed],
                "accuracy": {str(length): accuracy[seed] for length in lengths}}

    monkeypatch.setattr(bench, "one_seed", fake_seed)
    output = tmp_path / "seeds.json"
    assert bench.main(["--seeds", "3", "--expect", "2", "--output", str(output)]) == 0
    assert "parity_check: 2 of 3 seeds at or above 95%" in capsys.readouterr().out
    assert bench.main(["--seeds", "3", "--expect", "3", "--output", str(output), "--resume"]) == 1  # nothing re-run
    assert [r["seed"] for r in json.loads(output.read_text())["results"]] == [100, 101, 102]
    with pytest.raises(SystemExit):
        bench.main(["--task", "nope"])
    assert bench.main(["--jobs", "0"]) == 2
    assert "--jobs 0: expected at least 1" in capsys.readouterr().err
    assert bench.main(["--seeds", "3", "--expect", "4"]) == 2  # could never pass
    assert "--expect 4 is more than --seeds 3" in capsys.readouterr().err
    assert bench.main(["--threshold", "nan"]) == 2
    assert bench.main(["--seeds", "3", "--every", "2", "--output", str(output), "--resume"]) == 2
    assert "holds parity_check regulargpt seed 100 run with test lengths 41-500 (460)" in capsys.readouterr().err


def fake_record(task, arch, seed, settings, lengths, progress=False) -> dict:
    from dataclasses import asdict

    return {"task": task.name, "arch": arch, "seed": seed, "train_max_length": task.train_max_length,
            "accuracy": {str(length): 0.5 for length in lengths}, "mean_accuracy": 0.5, "train_length_accuracy": 0.5,
            "steps": settings.steps, "train_seconds": 0.0, "test_seconds": 0.0, "settings": asdict(settings)}


@pytest.mark.parametrize("flags, message", [
    (["--lr", "nan"], "--lr nan: expected a finite number more than 0"),
    (["--lr", "inf"], "--lr inf: expected a finite number more than 0"),
    (["--stop-loss", "nan"], "--stop-loss nan: expected a finite number at least 0"),
    (["--stop-loss=-inf"], "--stop-loss -inf: expected a finite number at least 0"),
    (["--probability", "nan"], "--probability nan: expected a finite number more than 0 and below 1"),
    (["--warmup", "9000"], "--warmup 9000 is more than --steps 8000: the learning rate would never reach --lr"),
    (["--steps", "10", "--warmup", "11"], "--warmup 11 is more than --steps 10"),
    (["--steps", "100"], "--warmup 1000 (the default) is more than --steps 100"),
    (["--task", "tomita3", "--probability", "0.3"], "--probability: applies to parity_check only"),
    (["--arch", "transformer", "--chunk-size", "3"], "--chunk-size: applies to regulargpt only"),
    (["--arch", "rnn", "--padding", "none"], "--padding: applies to regulargpt only"),
    (["--pos-emb", "alibi"], "--pos-emb: applies to transformer only"),
    (["--layers", "2"], "--layers: applies to transformer only"),
    (["--task", "parity_check", "parity_check"], "--task: parity_check is named twice"),
    (["--arch", "rnn", "rnn"], "--arch: rnn is named twice"),
    # the settings below used to train for minutes and then stop on a traceback (or, for the test
    # lengths, report lengths the model trained on as extrapolation)
    (["--hidden-size", "10"], "--hidden-size 10: must be a multiple of the 4 attention heads, e.g. 8"),
    (["--arch", "transformer", "--pos-emb", "learned"],
     "--pos-emb learned with --hidden-size 64 cannot run parity_check up to length 500"),
    (["--arch", "transformer", "--pos-emb", "rotary", "--hidden-size", "12"], "--pos-emb rotary with --hidden-size 12"),
    (["--task", "tomita3", "--test-lengths", "41:501:10"], "tomita3 trains on lengths 1-50, so 41 is no extrapolation"),
    (["--test-lengths", "40,41"], "parity_check trains on lengths 1-40, so 40 is no extrapolation; give lengths above 40"),
])
def test_flags_that_cannot_do_what_they_say_are_refused_before_any_run(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "run", lambda *args, **kwargs: pytest.fail("a run started"))
    argv = ["--task", "parity_check", *flags] if "--task" not in flags else flags
    assert load_tool().main([*argv, "--output", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["r.md", "r.png", "r"])
def test_an_output_the_table_or_plot_would_overwrite_is_refused(name: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    assert load_tool().main(["--task", "parity_check", "--output", str(tmp_path / name)]) == 2
    assert f"--output {tmp_path / name}: name a .json file" in capsys.readouterr().err


def test_options_of_the_runs_asked_for_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(bench, "run", lambda *args, **kwargs: seen.append(args[3]) or fake_record(*args))
    monkeypatch.setattr(bench, "plot_accuracy", lambda results, path: Path(path).write_bytes(b"png"))
    argv = ["--task", "parity_check", "--arch", "transformer", "regulargpt", "--pos-emb", "alibi", "--layers", "2",
            "--chunk-size", "3", "--probability", "0.3", "--seeds", "1", "--test-lengths", "41",
            "--output", str(tmp_path / "r.json")]
    assert load_tool().main(argv) == 0
    assert {(s.pos_emb, s.transformer_layers, s.chunk_size, s.probability) for s in seen} == {("alibi", 2, 3, 0.3)}


def test_resume_with_other_settings_is_refused_not_reported_as_their_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(bench, "run", fake_record)
    monkeypatch.setattr(bench, "plot_accuracy", lambda results, path: Path(path).write_bytes(b"png"))
    output = tmp_path / "r.json"
    common = ["--task", "parity_check", "--seeds", "1", "--warmup", "10", "--output", str(output)]
    argv = [*common, "--test-lengths", "41,50"]
    assert load_tool().main([*argv, "--steps", "100"]) == 0
    before = output.read_text()
    capsys.readouterr()
    assert load_tool().main([*argv, "--steps", "200", "--resume"]) == 2
    assert "holds parity_check regulargpt seed 100 run with steps 100 (now 200)" in capsys.readouterr().err
    assert load_tool().main([*common, "--test-lengths", "41", "--steps", "100", "--resume"]) == 2
    assert "test lengths 41-50 (2)" in capsys.readouterr().err
    assert output.read_text() == before
    assert load_tool().main([*argv, "--steps", "100", "--resume"]) == 0  # the same flags: nothing to run again
    assert len(json.loads(output.read_text())["results"]) == 1


def test_a_refusal_costs_no_torch_import(tmp_path: Path) -> None:
    import subprocess
    import sys

    probe = ("import runpy, sys; sys.argv = ['regular_languages.py', '--task', 'parity_check', '--lr', 'nan', "
             f"'--output', {str(tmp_path / 'r.json')!r}]\n"
             "try:\n    runpy.run_path('tools/regular_languages.py', run_name='__main__')\n"
             "except SystemExit as done:\n    print(done.code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["2", "False"], done.stderr


def test_default_seeds_were_not_used_to_choose_the_defaults(tmp_path: Path) -> None:
    """Seeds 0-19 served to find the training defaults (docs/regular-languages.md): a result claimed
    with the defaults must come from seeds fixed before looking, as benchmarks/regular_seeds.py's."""
    args = load_tool().parse_arguments(["--table61", "--output", str(tmp_path / "t.json")])
    assert set(range(args.first_seed, args.first_seed + args.seeds)).isdisjoint(range(20))
    assert args.first_seed == load_seeds_benchmark().parse_args([]).first_seed


def test_results_of_a_command_that_stopped_say_they_are_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files are rewritten after every run: if a later run fails, what is left must not read as
    the final table; once every run is in (after --resume), it does."""
    monkeypatch.setattr(bench, "plot_accuracy", lambda results, path: Path(path).write_bytes(b"png"))
    calls = []

    def second_run_fails(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:
            raise RuntimeError("planted failure in the second run")
        return fake_record(*args)

    monkeypatch.setattr(bench, "run", second_run_fails)
    output = tmp_path / "r.json"
    argv = ["--task", "parity_check", "--seeds", "3", "--test-lengths", "41", "--output", str(output)]
    with pytest.raises(RuntimeError, match="planted"):
        load_tool().main(argv)
    doc = json.loads(output.read_text())
    assert (len(doc["results"]), doc["runs_missing"], doc["complete"]) == (1, 2, False)
    assert "Incomplete: 2 of the 3 runs asked for are missing" in output.with_suffix(".md").read_text()
    monkeypatch.setattr(bench, "run", fake_record)
    assert load_tool().main([*argv, "--resume"]) == 0
    doc = json.loads(output.read_text())
    assert (len(doc["results"]), doc["complete"]) == (3, True)
    assert "Incomplete" not in output.with_suffix(".md").read_text()
