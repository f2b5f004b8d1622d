"""Command-line front ends behind ``train.py`` and ``deepy.py``.

``train.py <ymls> [key=value ...] [--dry-run]`` trains in this process (a launcher may start
several; each reads the same resolved config). ``deepy.py train.py [-d DIR] <ymls> [key=value ...]
[--hostfile H] [--num_gpus N] [--include S]`` merges and validates the config once, writes the
resolved YAML, and starts one process per rank through the DeepSpeed launcher (CUDA) or
``torch.distributed.run`` (CPU, gloo), each given that one file.

Exit status: 0 done, also after a clean stop on SIGTERM (a scheduler's preemption or the end of a
``tools/gpu_reproduce.py`` chunk: the checkpoint is written and the same command resumes, so the job
did what it was asked); 130 (128 + SIGINT, as a shell reports) after a stop by Ctrl-C, also when it
comes before training started (one line, no traceback: :data:`kerple.errors.INTERRUPTED_STATUS`);
2 a config, data, checkpoint or training error (one line ``prog: error: message`` on stderr,
:func:`kerple.errors.entry_point`). Any other exception is a bug and ends the process with its
traceback. The heavy imports (torch, DeepSpeed) come after the command line is read, so ``--help``
is quick and a Ctrl-C while they load is reported like any other.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kerple.cli import add_config_arguments, config_key_hint, parse_command_line
from kerple.errors import INTERRUPTED_STATUS, KerpleError, UsageError, entry_point, exit_on_interrupt
from kerple.outputs import check_output_folder


def planned_world_size(cfg: Any, num_gpus: int | None = None) -> int:
    """Processes a launch would start: ``WORLD_SIZE`` if set, else GPUs (or one replica on CPU)."""
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    per_replica = max(int(cfg.parallelism.pipe_parallel_size), 1) * int(cfg.parallelism.model_parallel_size)
    if num_gpus:
        return int(num_gpus)
    import torch

    if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu":
        wanted = cfg.parallelism.num_gpus or torch.cuda.device_count()
        return max(int(wanted), per_replica)
    return per_replica


def dry_run_report(cfg: Any) -> str:
    """The resolved config as YAML (with the run-time options a resume takes from its checkpoint),
    the run-time options, and the parameter count (model built on the meta device)."""
    import torch
    import yaml

    from kerple.model import build_model
    from kerple.training.resume import prepare_resume
    from kerple.training.summary import format_count, run_time_lines

    runtime = prepare_resume(cfg)  # a resume's recorded run-time options, as the run would take them
    with torch.device("meta"):
        model = build_model(cfg, flex_compile=False)
    count = sum(p.numel() for p in model.parameters())
    resolved = yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)
    derived = yaml.safe_dump(cfg.derived(), sort_keys=False, default_flow_style=False)
    run_time = "".join(f"#{line[1:]}\n" for line in run_time_lines(cfg, runtime.notes))
    return (
        f"# resolved config\n{resolved}\n# derived\n{derived}\n{run_time}"
        f"parameters: {count} ({format_count(count)})\n"
    )


RUN_FOLDERS = ("checkpointing.save", "logging.log_dir", "logging.tensorboard_dir")


def check_run_folders(cfg: Any) -> None:
    """Refuse, before any rank starts, a ``save``, ``log_dir`` or ``tensorboard_dir`` that is a file,
    lies under one, or cannot be written (:func:`kerple.outputs.check_output_folder`)."""
    for ident in RUN_FOLDERS:
        section, name = ident.split(".")
        folder = getattr(getattr(cfg, section), name)
        if folder:
            file, key = cfg.provenance(ident)
            check_output_folder(folder, f"{file}: key '{key}':")


@entry_point("train.py")
def train_main(argv: list[str]) -> int:
    """``train.py``: load the config, then train (or ``--dry-run``: print config and size)."""
    parser = argparse.ArgumentParser(
        prog="train.py", usage=TRAIN_USAGE, description="Train a GPT-NeoX-style model with DeepSpeed.", allow_abbrev=False
    )
    add_config_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and parameter count")
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="let 'load' read checkpoint pickles that need non-data globals (they can run code; trusted files only)",
    )
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    known = parse_command_line(parser, argv, "train.py's flags: --dry-run, --trust-checkpoint")
    with exit_on_interrupt("train.py"):  # nothing is written until run_training
        from kerple.config import load_config, parse_overrides, split_arguments
        from kerple.parallel.groups import prepare_environment

        paths, overrides = split_arguments(known.configs)
        if known.local_rank is not None:
            os.environ.setdefault("LOCAL_RANK", str(known.local_rank))
        if not paths:
            parser.error("give at least one YAML config file")
        cfg = load_config(paths, parse_overrides(overrides))
        if known.dry_run:
            cfg.resolve_batch(planned_world_size(cfg))
            print(dry_run_report(cfg))
            return 0
        prepare_environment()
        cfg.resolve_batch(int(os.environ.get("WORLD_SIZE", "1")))  # a layout these processes cannot run fails here, once
        check_run_folders(cfg)
        from kerple.training.trainer import run_training

    result = run_training(cfg, config_files=paths, trust_checkpoint=known.trust_checkpoint)
    if int(os.environ.get("RANK", "0")) == 0 and result.status != "already finished":  # the trainer said so
        print(f"training {result.status} at step {result.iteration}" + (f"; checkpoint {result.last_checkpoint}" if result.last_checkpoint else ""))
    return INTERRUPTED_STATUS if result.stop_signal == signal.SIGINT else 0


TRAIN_USAGE = "train.py CONFIG.yml [CONFIG.yml ...] [KEY=VALUE ...] [--dry-run] [--trust-checkpoint]"
DEEPY_USAGE = ("deepy.py SCRIPT [-d DIR] CONFIG.yml [CONFIG.yml ...] [KEY=VALUE ...] [--num_gpus N] [--hostfile H] "
               "[--include S] [--master_port P] [--trust-checkpoint] [SCRIPT'S FLAGS ...]")
DEEPY_DESCRIPTION = (
    "Merge and validate the YAML configs (then KEY=VALUE overrides of any key) once, write the resolved config "
    "under log_dir, and launch SCRIPT (train.py; evaluate.py or generate.py with their own flags after the "
    "configs) on every rank with it."
)
EVALUATION_SCRIPTS = frozenset({"evaluate.py", "generate.py"})
TRAIN_FLAGS = frozenset({"--dry-run"})
"""train.py's own flags that deepy.py passes on (``--trust-checkpoint`` is deepy's, passed to every rank)."""


@entry_point("deepy.py")
def deepy_main(argv: list[str]) -> int:
    """``deepy.py``: validate once, write the resolved config, launch every rank on it."""
    parser = argparse.ArgumentParser(prog="deepy.py", usage=DEEPY_USAGE, description=DEEPY_DESCRIPTION, allow_abbrev=False)
    parser.add_argument("script", metavar="SCRIPT", help="the script every rank runs: train.py (or evaluate.py, generate.py)")
    parser.add_argument(
        "-d", "--conf_dir", "--conf-dir", metavar="DIR", default=None,
        help="directory the YAML paths are relative to (as in GPT-NeoX)",
    )
    parser.add_argument("--hostfile", metavar="H", default=None, help="DeepSpeed hostfile of a multi-node run (CUDA)")
    parser.add_argument("--num_gpus", "--num-gpus", metavar="N", type=int, default=None,
                        help="processes to start (default: every visible GPU; on CPU, one per model replica)")
    parser.add_argument("--include", metavar="S", default=None, help="DeepSpeed's host:GPU selection, e.g. localhost:0,1")
    parser.add_argument("--master_port", "--master-port", metavar="P", type=int, default=None,
                        help="rendezvous port (default 29500)")
    parser.add_argument("--trust-checkpoint", action="store_true", help="passed to every rank's train.py")
    known, rest = parser.parse_known_args(argv)
    # Everything from the first unknown --flag on belongs to the script (e.g. evaluate.py's --load).
    first_flag = next((i for i, word in enumerate(rest) if word.startswith("-")), len(rest))
    rest, known.script_args = rest[:first_flag], rest[first_flag:]
    if Path(known.script).name not in EVALUATION_SCRIPTS:  # train.py: refuse here what it would refuse on every rank
        words = rest + known.script_args  # train.py's flags take no value: KEY=VALUE may follow them
        rest, known.script_args = [w for w in words if not w.startswith("-")], [w for w in words if w.startswith("-")]
        unknown = [word for word in known.script_args if word not in TRAIN_FLAGS]
        if unknown:
            hint = config_key_hint(unknown, argv)
            parser.error(f"unrecognized arguments: {' '.join(unknown)} (deepy.py's flags: -d/--conf_dir, --hostfile, "
                         f"--num_gpus, --include, --master_port, --trust-checkpoint; train.py's: --dry-run"
                         f"{'; ' + hint if hint else ''})")
    check_launch_arguments(known)
    with exit_on_interrupt("deepy.py"):  # nothing is written until the resolved config
        from kerple.config import load_config, parse_overrides, split_arguments
        from kerple.config.loader import NOTES_SHOWN

        paths, overrides = split_arguments(rest)
        if not paths:
            parser.error("give at least one YAML config file after the script")
        if known.conf_dir:
            paths = [os.path.join(known.conf_dir, path) for path in paths]
        if Path(known.script).name in EVALUATION_SCRIPTS:  # validated as the script will run: nothing trained
            overrides.append("train_iters=0")
        cfg = load_config(paths, parse_overrides(overrides))
        world = planned_world_size(cfg, known.num_gpus)
        cfg.resolve_batch(world)
        check_run_folders(cfg)
        trains = Path(known.script).name not in EVALUATION_SCRIPTS and "--dry-run" not in known.script_args
        finished = finished_training(cfg) if trains else None
        if trains and str(cfg.precision.precision) == "fp16":  # every rank would refuse it after the launch
            from kerple.parallel.groups import cuda_wanted
            from kerple.training.errors import FP16_NEEDS_CUDA

            if not cuda_wanted():
                raise UsageError(FP16_NEEDS_CUDA)
    if finished:
        print(f"deepy: {finished}", flush=True)
        return 0
    run_dir = Path(cfg.logging.log_dir or "logs")
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = run_dir / f"resolved-config-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.yml"
    cfg.save_yaml(resolved, sources=True)  # errors on the ranks name the user's files, not this one
    print(f"deepy: resolved config written to {resolved} ({world} process(es))", flush=True)
    command = launch_command(known, world, resolved, cfg)
    print("deepy: " + " ".join(command), flush=True)
    os.environ[NOTES_SHOWN] = str(resolved)  # printed above: the ranks do not repeat them
    status = run_child(command)
    if status != 0 and list(run_dir.iterdir()) == [resolved]:  # refused before it ran: leave no run behind
        resolved.unlink()
        if created:
            run_dir.rmdir()
    return status


def finished_training(cfg: Any) -> str | None:
    """What to say, without launching anything or writing a resolved config, when ``load`` holds a
    checkpoint at or past ``train_iters`` (the trainer would say the same and stop); ``None`` otherwise."""
    from kerple.checkpoint.files import find_checkpoint
    from kerple.training.summary import already_finished

    ck, train_iters = cfg.checkpointing, int(cfg.training.train_iters)
    if not ck.load or ck.finetune or train_iters <= 0:
        return None
    try:
        found = find_checkpoint(ck.load)
    except KerpleError:
        return None  # the trainer reports it
    step = found.name.removeprefix("global_step") if found is not None else ""
    if not step.isdigit() or int(step) < train_iters:
        return None
    return already_finished(found, step, train_iters)


def check_launch_arguments(known: argparse.Namespace) -> None:
    """Refuse (:class:`~kerple.errors.UsageError`), before anything is merged or launched, a script
    that is not a Python file and process counts below one."""
    script = Path(known.script)
    if script.suffix != ".py":
        raise UsageError(f"the first argument is the script to launch, got {known.script!r}; "
                         "write deepy.py train.py <ymls> (GPT-NeoX's order)")
    if not script.is_file():
        raise UsageError(f"script {known.script} not found; run deepy.py from the repository root (deepy.py train.py <ymls>)")
    for flag, value in (("--num_gpus", known.num_gpus), ("--master_port", known.master_port)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: expected a positive integer")


def in_terminal_foreground() -> bool:
    """Whether this process is in its terminal's foreground process group, where a Ctrl-C reaches
    every process of the group (the child included) at once."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, AttributeError, ValueError):
            continue
    return False


def run_child(command: list[str]) -> int:
    """Run the launcher ``command``, forwarding SIGINT and SIGTERM to it (the trainer then saves and
    stops cleanly), and return its exit status (128 + N when signal N ended it, as a shell reports).
    A SIGINT is not forwarded from a terminal's foreground: its Ctrl-C reached the child already, and
    a second one would interrupt the child's own clean-up. A signal that comes while the child is
    being started is passed on once it runs."""
    child: subprocess.Popen | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and in_terminal_foreground():
            return
        if child is None:
            pending.append(signum)
        elif child.poll() is None:
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        child = subprocess.Popen(command)
        for signum in pending:
            child.send_signal(signum)
        status = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - status if status < 0 else status


def launch_command(known: argparse.Namespace, world: int, resolved: Path, cfg: Any) -> list[str]:
    """DeepSpeed's launcher on CUDA; ``torch.distributed.run`` on CPU (gloo); plain python for 1 CPU rank."""
    import torch

    script = [known.script, str(resolved)] + (["--trust-checkpoint"] if known.trust_checkpoint else [])
    script += known.script_args
    port = str(known.master_port or 29500)
    if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu":
        command = [sys.executable, "-m", "deepspeed.launcher.runner", "--master_port", port]
        if known.hostfile:
            command += ["--hostfile", known.hostfile]
        if known.include:
            command += ["--include", known.include]
        elif not known.hostfile:
            command += ["--num_gpus", str(known.num_gpus or world)]
        return command + script
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if world == 1:
        return [sys.executable] + script
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port", port] + script
