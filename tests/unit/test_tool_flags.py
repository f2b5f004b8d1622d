"""Every script's flags are checked as the config keys are (finite, in bounds, consistent), each refusal
one line and exit status 2, before torch loads; every script's Ctrl-C is one line and status 130."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# scripts whose flags need torch to be read (defaults that depend on the device)
NEEDS_TORCH = {"benchmarks/train_throughput.py", "tools/gpu_check.py"}
PROBE = textwrap.dedent("""
    import atexit, runpy, sys
    atexit.register(lambda: print("torch imported:", "torch" in sys.modules))
    script, *sys.argv[1:] = sys.argv[1:]
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")
""")

CASES = [
    ("tools/regular_languages.py", ["--task", "parity_check", "--lr", "inf", "--output", "r.json"],
     "--lr inf: expected a finite number more than 0"),
    ("tools/regular_languages.py", ["--task", "parity_check", "--warmup", "50", "--steps", "10", "--output", "r.json"],
     "--warmup 50 is more than --steps 10"),
    ("tools/demo.py", ["--lr", "nan"], "--lr nan: expected a finite number more than 0"),
    ("tools/demo.py", ["--pos-emb", "alibi,alibi"], "--pos-emb: alibi is named twice"),
    ("tools/demo_extension.py", ["--eval-factors", "1,0"], "--eval-factors '1,0': every entry must be at least 1, got 0"),
    ("tools/analysis_demo.py", ["--num-samples", "0"], "--num-samples 0: expected at least 1"),
    ("tools/benchmark_speed.py", ["configs/models/tiny.yml", "--steps", "0"], "--steps 0: expected at least 1"),
    ("tools/compare_runs.py", ["r.json", "--alpha", "nan"], "--alpha nan: expected a finite number"),
    ("tools/generate_ymls.py", ["--grid", "extension", "--pe", "alibi"], "--pe with --grid extension"),
    ("tools/gpu_check.py", ["--device", "cpu", "--total-budget", "inf"], "--total-budget inf: expected a finite number"),
    ("tools/gpu_wheels.py", ["missing", "/tmp"], "missing takes no folder"),
    ("tools/neox_defaults_table.py", ["--source", "nope"], "--source 'nope': expected NAME=GIT_DIR@COMMIT"),
    ("benchmarks/attention_impls.py", ["--impls", "eager,eager"], "--impls: eager is named twice"),
    ("benchmarks/bias_attention.py", ["--shape", "4,4,512"], "--shape '4,4,512': expected 4 positive integers"),
    ("benchmarks/bias_gradient.py", ["--shape", "4,4,512"], "--shape '4,4,512': expected 4 positive integers"),
    ("benchmarks/bias_gradient.py", ["--rounds", "0"], "--rounds 0: expected at least 1"),
    ("benchmarks/long_context.py", ["--impls", "flex,fast"], "--impls: 'fast' is not one of"),
    ("benchmarks/long_context.py", ["--warmup=-1"], "--warmup -1: expected at least 0"),
    ("benchmarks/eval_memory.py", ["--max-seconds", "nan"], "--max-seconds nan: expected a finite number"),
    ("benchmarks/host_overhead.py", ["--micro-batch", "1", "0"], "--micro-batch 0: expected at least 1"),
    ("benchmarks/peak_memory.py", ["--micro-batch", "2", "0"], "--micro-batch 0: expected at least 1"),
    ("benchmarks/peak_memory.py", ["--top=-1"], "--top -1: expected at least 0"),
    ("benchmarks/lm_loss_memory.py", ["--tokens", "0"], "--tokens, --vocab, --hidden and --repeats must be >= 1"),
    ("benchmarks/preprocess.py", ["--limit", "-5"], "--limit -5: expected at least 0"),
    ("benchmarks/regular_parity.py", ["--threshold", "1.5"], "--threshold 1.5: expected more than 0 and at most 1"),
    ("benchmarks/regular_seeds.py", ["--seeds", "2", "--expect", "3"], "--expect 3 is more than --seeds 2"),
    ("benchmarks/train_throughput.py", ["--warmup=-1"], "--warmup -1: expected at least 0"),
    ("evaluate.py", ["--eval-lengths", "64", "--num-windows", "0", "--output", "r.json"], "--num-windows 0"),
    ("generate.py", ["--load", "x", "--prompt", "a", "--top-p", "0.5"], "--top-p shape sampling"),
    ("prepare_data.py", ["stdlib", "--split", "1,2,3,4"], "--split 1,2,3,4: expected one to three weights"),
]


@pytest.mark.parametrize(("script", "argv", "message"), CASES, ids=[f"{s}-{' '.join(a)}" for s, a, _ in CASES])
def test_a_bad_flag_is_one_line_before_torch_loads(script: str, argv: list[str], message: str,
                                                   tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, str(REPO / script), *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    prog = Path(script).name
    errors = [line for line in done.stderr.splitlines() if not line.startswith(("usage:", " "))]
    assert done.returncode == 2, done.stderr
    assert errors == [errors[0]] and errors[0].startswith(f"{prog}: error: ") and message in errors[0], done.stderr
    if script not in NEEDS_TORCH:
        assert "torch imported: False" in done.stdout, f"{script} loaded torch before refusing"
    assert not list(tmp_path.iterdir())


TINY = str(REPO / "configs/models/tiny.yml")
UNKNOWN_EMBEDDING = [
    ("tools/benchmark_speed.py", [TINY, "--pos-emb", "alibi,kerple-log"], "--pos-emb"),
    ("benchmarks/train_throughput.py", ["--pe", "alibi", "kerple-log", "--steps", "1", "--warmup", "0"], "--pe"),
    ("benchmarks/host_overhead.py", ["--model", TINY, "--pe", "none", "kerple-log", "--micro-batch", "1"], "--pe"),
    ("benchmarks/peak_memory.py", ["--model", TINY, "--pe", "none", "kerple-log", "--micro-batch", "1"], "--pe"),
    ("benchmarks/long_context.py", ["--pe", "kerple-log", "--lengths", "64", "--steps", "1", "--warmup", "0"], "--pe"),
    ("benchmarks/bias_gradient.py", ["--pe", "kerple-log", "--rounds", "1", "--shape", "1,2,16,8"], "--pe"),
]


@pytest.mark.parametrize(("script", "argv", "flag"), UNKNOWN_EMBEDDING, ids=[s for s, _, _ in UNKNOWN_EMBEDDING])
def test_an_unknown_embedding_is_refused_before_any_model_is_built(script: str, argv: list[str], flag: str,
                                                                   tmp_path: Path) -> None:
    """The benchmarks timed the other embeddings, then printed 'failed' and exited 1 (bias_gradient.py
    traced back with a KeyError)."""
    done = subprocess.run([sys.executable, str(REPO / script), *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith(f"{Path(script).name}: error: {flag}: 'kerple-log' is not a positional embedding; "
                                  "did you mean 'kerple_log'? choose from none, learned"), done.stderr


SCRIPTS = sorted([*REPO.glob("tools/*.py"), *REPO.glob("benchmarks/*.py"),
                  *(REPO / name for name in ("prepare_data.py", "evaluate.py", "generate.py", "analyze.py"))])


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_script_reports_errors_and_ctrl_c_through_an_entry_point(path: Path) -> None:
    """The main that a script runs is decorated with kerple.errors.entry_point (a project error: one
    line and 2; Ctrl-C: one line and 130), or the script hands over to one that is."""
    tree = ast.parse(path.read_text())
    names = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    if "main" not in names:  # a thin entry script: it imports the main of a module
        imported = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and any(alias.name == "main" for alias in node.names)]
        assert imported, f"{path.name} has no main"
        module = REPO / (imported[0].module.replace(".", "/") + ".py")
        names = {node.name: node for node in ast.parse(module.read_text()).body if isinstance(node, ast.FunctionDef)}
    decorators = [ast.unparse(decorator) for decorator in names["main"].decorator_list]
    assert any(decorator.startswith("entry_point(") for decorator in decorators), (path.name, decorators)


SLOW_IMPORT = textwrap.dedent("""
    import sys, time
    from kerple.flags import heavy_imports
    with heavy_imports("slow.py", None):
        print("importing", flush=True)
        time.sleep(60)  # an import that takes long (torch on a loaded machine)
""")


def test_ctrl_c_during_the_heavy_imports_is_one_line_and_130() -> None:
    """A KeyboardInterrupt inside an import traced back (or was swallowed by a library)."""
    child = subprocess.Popen([sys.executable, "-c", SLOW_IMPORT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True, cwd=REPO)
    try:
        assert child.stdout.readline().strip() == "importing"
        os.killpg(child.pid, signal.SIGINT)
        _, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130 and err == "slow.py: interrupted\n"
