"""Every entry point: a user error is one line ``prog: error: ...`` and exit status 2; an internal
bug (a function made to raise) is not swallowed, so it keeps its traceback. The bugs include a
``ValueError``, which the entry points used to catch."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import kerple.config as config_module
from kerple.data import preprocess
from kerple.evaluation import cli as evaluate_cli
from kerple.training import cli as training_cli

generate_module = importlib.import_module("kerple.inference.generate")  # the package exports a function of that name
REPO = Path(__file__).resolve().parents[2]
TINY = [str(REPO / "configs/models/tiny.yml"), str(REPO / "configs/pe/kerple_log.yml")]


def load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"tool_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_error_line(capsys: pytest.CaptureFixture, prog: str) -> str:
    """The one error line on stderr; the other lines may only be the config's logged overrides."""
    lines = capsys.readouterr().err.splitlines()
    errors = [line for line in lines if " -> " not in line]
    assert len(errors) == 1 and errors[0].startswith(f"{prog}: error: "), lines
    return errors[0]


def boom(*args: object, **kwargs: object) -> None:
    raise ZeroDivisionError("injected bug")


def bad_value(*args: object, **kwargs: object) -> None:
    raise ValueError("injected bug")


@pytest.fixture
def typo(tmp_path: Path) -> str:
    path = tmp_path / "typo.yml"
    path.write_text("hiden_size: 768\n")
    return str(path)


def test_train_reports_a_config_error(typo: str, capsys: pytest.CaptureFixture) -> None:
    assert training_cli.train_main([typo, "seed=1"]) == 2
    line = one_error_line(capsys, "train.py")
    assert typo in line and "'hiden_size'" in line and "did you mean 'hidden_size'" in line


def test_train_refuses_a_parallel_combination_when_the_config_loads(capsys: pytest.CaptureFixture) -> None:
    argv = [*TINY, "pipe_parallel_size=2", "no_weight_tying=false", "--dry-run"]
    assert training_cli.train_main(argv) == 2
    line = one_error_line(capsys, "train.py")
    assert "<command line>" in line and "'pipe_parallel_size' and 'no_weight_tying'" in line


def test_deepy_reports_a_config_error(typo: str, capsys: pytest.CaptureFixture) -> None:
    assert training_cli.deepy_main(["train.py", typo]) == 2
    assert typo in one_error_line(capsys, "deepy.py")


@pytest.mark.parametrize("script", ["train.py", "deepy.py"])
def test_an_unknown_flag_is_reported_as_a_flag(script: str, capsys: pytest.CaptureFixture) -> None:
    main = training_cli.train_main if script == "train.py" else training_cli.deepy_main
    argv = [*TINY, "--bogus-flag"] if script == "train.py" else ["train.py", *TINY, "--bogus-flag"]
    with pytest.raises(SystemExit) as exit_status:
        main(argv)
    err = capsys.readouterr().err
    assert exit_status.value.code == 2
    assert "unrecognized arguments: --bogus-flag" in err and "cannot read" not in err


@pytest.mark.parametrize(("script", "argv", "hint"), [
    ("train.py", [*TINY, "--train-iters", "5"], "(train.py's flags: --dry-run, --trust-checkpoint; config keys are "
                                                "key=value words: train_iters=5)"),
    ("deepy.py", ["train.py", *TINY, "--seq_length=256"], "; config keys are key=value words: seq_length=256)"),
    ("evaluate.py", [*TINY, "--eval-lengths", "64", "--output", "r.json", "--seq-length", "256"],
     "(config keys are key=value words: seq_length=256)"),
])
def test_a_config_key_given_as_a_flag_says_how_to_set_it(script: str, argv: list[str], hint: str,
                                                           capsys: pytest.CaptureFixture) -> None:
    """torchtitan- and argparse-style `--train-iters 5` was refused without saying that keys are key=value."""
    main = {"train.py": training_cli.train_main, "deepy.py": training_cli.deepy_main, "evaluate.py": evaluate_cli.main}[script]
    with pytest.raises(SystemExit) as exit_status:
        main(argv)
    assert exit_status.value.code == 2 and hint in capsys.readouterr().err


def test_deepy_refuses_abbreviated_flags(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_status:
        training_cli.deepy_main(["train.py", *TINY, "--num-gpu", "2"])  # not --num-gpus
    assert exit_status.value.code == 2
    assert "unrecognized arguments: --num-gpu" in capsys.readouterr().err


def test_evaluate_reports_a_bad_cache_window(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = [*TINY, "--eval-lengths", "64", "--cache-window", "0", "--output", str(tmp_path / "r.json")]
    assert evaluate_cli.main(argv) == 2
    assert "--cache-window 0" in one_error_line(capsys, "evaluate.py")


def test_generate_reports_a_bad_cache_window(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = [*TINY, "--load", str(tmp_path), "--prompt", "x", "--cache-window", "0"]
    assert generate_module.main(argv) == 2
    assert "--cache-window 0" in one_error_line(capsys, "generate.py")


def test_compare_runs_reports_a_file_that_is_not_a_result(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert load_tool("compare_runs").main([str(bad)]) == 2
    assert "bad.json: not an evaluate.py results file" in one_error_line(capsys, "compare_runs.py")


@pytest.mark.parametrize(
    ("main", "module", "function", "argv"),
    [
        (training_cli.train_main, config_module, "load_config", [*TINY, "--dry-run"]),  # imported after --help
        (training_cli.deepy_main, config_module, "load_config", ["train.py", *TINY]),
        (evaluate_cli.main, evaluate_cli, "run_config", [*TINY, "--eval-lengths", "64", "--output", "r.json"]),
        (generate_module.main, generate_module, "run_config", [*TINY, "--load", "ckpt", "--prompt", "x"]),
        (preprocess.main, preprocess, "run", ["stdlib"]),
    ],
    ids=["train", "deepy", "evaluate", "generate", "prepare_data"],
)
@pytest.mark.parametrize("bug", [boom, bad_value], ids=["ZeroDivisionError", "ValueError"])
def test_an_internal_bug_propagates(
    main, module: ModuleType, function: str, argv: list[str], bug, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.setattr(module, function, bug)
    with pytest.raises((ZeroDivisionError, ValueError), match="injected bug"):
        main(argv)
    assert "error:" not in capsys.readouterr().err


def test_compare_runs_lets_a_bug_propagate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = load_tool("compare_runs")
    monkeypatch.setattr(tool, "compare", bad_value)
    with pytest.raises(ValueError, match="injected bug"):
        tool.main([str(tmp_path / "r.json")])


# Runs train.py as a script with one function replaced by a bug.
BUGGY_TRAIN = textwrap.dedent(
    """
    import runpy, sys
    import kerple.config
    def boom(*args, **kwargs):
        raise ZeroDivisionError("injected bug")
    kerple.config.load_config = boom
    sys.argv = ["train.py", *sys.argv[1:]]
    runpy.run_path("train.py", run_name="__main__")
    """
)


def test_train_py_process_exit_status_and_traceback(typo: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    user = subprocess.run([sys.executable, "train.py", typo], cwd=REPO, env=env, capture_output=True, text=True)
    assert user.returncode == 2 and len(user.stderr.splitlines()) == 1, user.stderr
    bug = subprocess.run([sys.executable, "-c", BUGGY_TRAIN, *TINY, "--dry-run"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert bug.returncode == 1
    assert "Traceback (most recent call last)" in bug.stderr and "ZeroDivisionError: injected bug" in bug.stderr


def test_key_value_words_may_follow_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from kerple.analysis import cli as analysis_cli

    seen = []
    monkeypatch.setattr(evaluate_cli, "run", seen.append)
    monkeypatch.setattr(generate_module, "run", lambda args, stream=None: seen.append(args) or "")
    monkeypatch.setattr(analysis_cli, "run_attention_stats", seen.append)
    evaluate_cli.main([*TINY, "--eval-lengths", "64", "--output", "r.json", "seed=5", "--no-progress"])
    generate_module.main([TINY[0], "--load", "ckpt", "--prompt", "a=b", TINY[1], "seed=5"])
    analysis_cli.main(["attention-stats", TINY[0], "--lengths", "64", TINY[1], "--output", "s.json", "seed=5"])
    assert [args.configs for args in seen] == [[*TINY, "seed=5"]] * 3
    assert seen[1].prompt == "a=b"


@pytest.mark.parametrize(
    ("main", "argv"),
    [(training_cli.train_main, []), (training_cli.deepy_main, []), (evaluate_cli.main, []),
     (generate_module.main, []), ("analyze", []), ("analyze", ["retrieval"])],
    ids=["train", "deepy", "evaluate", "generate", "analyze", "analyze-retrieval"],
)
def test_help_shows_the_config_files_and_overrides(main, argv: list[str], capsys: pytest.CaptureFixture) -> None:
    if main == "analyze":
        from kerple.analysis.cli import main
    with pytest.raises(SystemExit) as exit_status:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert exit_status.value.code == 0
    assert "CONFIG.yml" in out.splitlines()[0] and "KEY=VALUE" in out.splitlines()[0], out
    assert "``" not in out and ":func:" not in out  # no reStructuredText markup


def test_generate_refuses_a_config_without_a_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert generate_module.main([*TINY, "--load", str(tmp_path), "--prompt", "x"]) == 2
    assert "names no tokenizer" in one_error_line(capsys, "generate.py")


@pytest.mark.parametrize("script", ["train.py", "deepy.py"])
def test_help_is_printed_before_torch_is_imported(script: str) -> None:
    """`train.py --help` and `deepy.py --help` took 20 s: torch and DeepSpeed were imported first."""
    code = textwrap.dedent(f"""
        import runpy, sys
        sys.argv = [{script!r}, "--help"]
        try:
            runpy.run_path({script!r}, run_name="__main__")
        except SystemExit as stop:
            assert stop.code == 0
        print("torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and done.stdout.rstrip().endswith("False")
