"""``make gpu-check``: runs the GPU check's steps in order and keeps the report current after each one.

Each step runs in its own Python process by default: a step that crashes, hangs or exhausts the GPU
cannot take the next ones with it, and every step starts with an empty GPU and compile cache. The
step process writes its result (atomically, after every case) to ``<work>/step<N>.json``; when it
overruns its budget by ``KILL_GRACE_S`` the runner kills its process group and reports the cases it
had finished, as failed. A whole-check budget (``--total-budget``) shortens or skips the last steps
so the check ends in time. ``--in-process`` runs the steps in this process instead (the CPU test).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from kerple.errors import UsageError, entry_point
from kerple.flags import POSITIVE, check_flags
from kerple.jobs.gpu_check import STEP_MODULES
from kerple.jobs.gpu_check import report as reports
from kerple.jobs.gpu_check.context import KILL_GRACE_S, REPO, SCALES, Skip, StepContext
from kerple.jobs.gpu_check.report import StepResult
from kerple.jobs.process import run_child

WORK = Path(tempfile.gettempdir()) / "kerple-gpu-check"  # scratch: never inside the report folder
SITE = Path(tempfile.gettempdir()) / "kerple-gpu-site"  # distributions installed from .whl/


def step_module(number: int):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"kerple.jobs.gpu_check.{STEP_MODULES[number]}")


def run_step_here(number: int, args: argparse.Namespace, budget: float) -> StepResult:
    """Run step ``number`` in this process; any exception becomes a failed result. The result goes to
    ``<work>/step<N>.json`` and is merged into the report after every case (report.json and report.md:
    a run killed from outside keeps what it finished)."""
    import torch

    from kerple.atomic import write_json_atomic

    env = reports.environment(os.environ.get("DS_ACCELERATOR", "cpu"))

    def save(result: StepResult) -> None:
        write_json_atomic(args.work / f"step{number}.json", result.to_dict())
        reports.write(args.output, reports.merge(reports.load(args.output / "report.json"), result, env))

    module = step_module(number)
    result = StepResult(number, module.NAME, budget_seconds=budget)
    started = time.monotonic()
    ctx = StepContext(torch.device(args.device), SCALES[args.scale], args.work, result, started + budget, save)
    try:
        module.run(ctx)
    except Skip as reason:
        result.status, result.reason = "skipped", str(reason)
    except Exception as error:  # the report says what broke; the next step still runs
        result.status, result.reason = "failed", f"{type(error).__name__}: {str(error)[:300]}"
        result.notes.append("traceback: " + " / ".join(traceback.format_exc().splitlines()[-8:]))
    result.seconds = time.monotonic() - started
    save(result)
    return result


def run_step_isolated(number: int, args: argparse.Namespace, budget: float) -> StepResult:
    """Run step ``number`` in a child process (its own session); kill it past budget + grace."""
    result_file = args.work / f"step{number}.json"
    result_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "kerple.jobs.gpu_check.runner", "--worker-step", str(number), "--device", args.device,
               "--scale", args.scale, "--work", args.work, "--budget", budget, "--output", args.output]
    outcome = run_child(command, deadline=time.monotonic() + budget + KILL_GRACE_S, stop_signal=None)
    try:
        result = StepResult.from_dict(json.loads(result_file.read_text()))
    except (OSError, ValueError):
        result = StepResult(number, step_module(number).NAME, budget_seconds=budget)
        result.reason = f"the step process exited with {outcome.returncode} before reporting"
    result.seconds = outcome.seconds
    if outcome.killed:
        result.status = "failed"
        result.reason = (f"killed after {result.seconds:.0f} s (budget {budget:.0f} s + {KILL_GRACE_S:.0f} s); "
                         f"finished cases are listed. {result.reason}").strip()
    return result


def parse_steps(text: str, default: tuple[int, ...]) -> list[int]:
    """``"3,4"`` -> [3, 4]; empty or ``all`` -> ``default``."""
    if text.strip().lower() in ("", "all"):
        return sorted(default)
    steps = []
    for part in text.split(","):
        if not part.strip().isdigit() or int(part) not in STEP_MODULES:
            raise UsageError(f"unknown step {part.strip()!r} in STEPS={text!r}; steps are 1-{max(STEP_MODULES)}")
        steps.append(int(part))
    return sorted(set(steps))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=(__doc__ or "").split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="one short lease: steps 1, 3, 4 at the 162M shape in bf16 for the key embeddings, "
                           "the most valuable first, 540 s in all")
    mode.add_argument("--profile", action="store_true",
                      help="step 8 alone: where a 162M bf16 training step's time goes (none, kerple_log), 150 s")
    parser.add_argument("--steps", default="all",
                        help="comma-separated step numbers (default: 1-7, or 1,3,4 with --quick, 8 with --profile)")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="auto: cuda, refused without a CUDA device; cpu: the harness's own test at tiny scale")
    parser.add_argument("--scale", default="auto", choices=("auto", *SCALES),
                        help="full (or quick, profile) on CUDA, tiny (or tiny-quick, tiny-profile: the harness's own "
                             "tests) on CPU")
    parser.add_argument("--output", type=Path, default=REPO / "gpu-report", help="report folder (report.json, report.md)")
    parser.add_argument("--work", type=Path, help=f"scratch folder (default: one per report under {WORK})")
    parser.add_argument("--budget", type=float, help="seconds per selected step (default: each step's own)")
    parser.add_argument("--total-budget", type=float,
                        help="seconds for the whole check (default: 18 min at full scale, 9 min with --quick, "
                             "150 s with --profile)")
    parser.add_argument("--in-process", action="store_true", help="run the steps in this process")
    parser.add_argument("--worker-step", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_flags(args, {"--budget": POSITIVE, "--total-budget": POSITIVE})
    if args.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            built = "built without CUDA" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            parser.exit(2, f"gpu_check.py: error: torch {torch.__version__} ({built}) sees no CUDA device: nothing was "
                           "checked. Run it on a GPU machine; --device cpu runs the harness itself at tiny scale "
                           "(its own test, not a check of this machine)\n")
        args.device = "cuda"
    if args.scale == "auto":
        mode = "quick" if args.quick else "profile" if args.profile else "full"
        args.scale = mode if args.device == "cuda" else {"full": "tiny"}.get(mode, f"tiny-{mode}")
    # one scratch folder per report folder: checks of two reports never share scratch files
    args.work = args.work or WORK / hashlib.sha1(str(args.output.resolve()).encode()).hexdigest()[:12]
    if args.worker_step is None:
        args.steps = parse_steps(args.steps, SCALES[args.scale].steps)
    return args


def install_wheels() -> list[str]:
    """Install what this interpreter lacks (or has too old) from ``.whl/`` into :data:`SITE`, offline
    (``tools/gpu_wheels.py install``), and put it first on the steps' ``PYTHONPATH`` (the steps
    run in child processes; ``--in-process`` runs without it). Returns notes for the report. Nothing
    here stops the check: a step that needs a distribution still missing reports that itself."""
    outcome = run_child([sys.executable, REPO / "tools" / "gpu_wheels.py", "install", SITE], capture=True)
    if outcome.returncode not in (0, 1):  # 1: some distributions have no wheel, said in its output
        return [f"installing .whl/ into {SITE} failed: {outcome.last_line()}"]
    if SITE.is_dir():
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))
    return [line for line in outcome.tail if line.strip() and not line.endswith("nothing (all present)")]


@entry_point("gpu_check.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # DeepSpeed picks its accelerator from this variable (the Makefile defaults it to cpu); child
    # processes (steps, pytest, evaluation workers) import this checkout's kerple
    os.environ["DS_ACCELERATOR"] = "cuda" if args.device == "cuda" else "cpu"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    args.work.mkdir(parents=True, exist_ok=True)
    if args.worker_step is not None:
        run_step_here(args.worker_step, args, args.budget)
        return 0
    for note in install_wheels():
        print(f"gpu check: {note}", flush=True)
    return run_all(args, args.steps)


def run_all(args: argparse.Namespace, steps: list[int]) -> int:
    """Every step of ``steps`` in order; the report is rewritten after each. Exit 1 if any failed."""
    env = reports.environment(args.device)
    report = reports.load(args.output / "report.json")
    deadline = time.monotonic() + (args.total_budget or SCALES[args.scale].total_budget)
    print(f"gpu check: steps {steps} on {env['device']} ({args.scale} scale); report in {args.output}", flush=True)
    for number in steps:
        budget = min(args.budget or SCALES[args.scale].budgets[number], deadline - time.monotonic())
        if budget <= 0:
            result = StepResult(number, step_module(number).NAME, status="skipped",
                                reason="the whole check's time budget was used up by earlier steps")
        elif args.in_process:
            result = run_step_here(number, args, budget)
        else:
            result = run_step_isolated(number, args, budget)
        report = reports.merge(report, result, env)
        reports.write(args.output, report)
        print(f"step {number} ({result.name}): {result.status} in {result.seconds:.1f} s - {result.reason}", flush=True)
    statuses = {n: report["steps"][str(n)]["status"] for n in steps}
    print(f"gpu check done: {statuses}; wrote {args.output / 'report.md'}", flush=True)
    return 1 if "failed" in statuses.values() else 0


if __name__ == "__main__":
    sys.exit(main())
