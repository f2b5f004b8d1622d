"""``tools/gpu_reproduce.py`` (``make gpu-reproduce``): the Table-3 reproduction, in chunks or in one lease.

    python tools/gpu_reproduce.py                          # 162M, 600M tokens per run, up to 9 minutes
    python tools/gpu_reproduce.py --tokens 100M --minutes 25
    python tools/gpu_reproduce.py --scale tiny             # the same steps on a CPU, in seconds
    python tools/gpu_reproduce.py --report-only            # rewrite the report from what is on disk
    python tools/gpu_reproduce.py --preset lease --output $OUT/reproduce --minutes 9

``--preset chunks`` (the default): each run of the command does what fits in ``--minutes``
(corpus, then per embedding: train, then evaluate), asks the trainer to stop in time to write its
checkpoint, writes the report (its docs page and the marked section of docs/reproducing.md) and exits 0; the same command again
continues where it stopped. ``--minutes 0`` goes on until everything is done. ``--preset lease``:
one short reproduction sized to ``--minutes``, its report in ``--output`` only (:mod:`.lease`).
SIGINT/SIGTERM stop either the same way (a second one kills the running child). Exit status: 0, also
when more remains to do; 1 when a training or evaluation failed (its log is named); 2 on bad options.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kerple.data.prepared import PreparedData
from kerple.errors import entry_point
from kerple.jobs.process import StopRequest, child_environment
from kerple.jobs.progress import Progress
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.lease import lease_options
from kerple.reproduce.lease_run import report_only, run_lease
from kerple.reproduce.plan import DEFAULT_POS_EMBS, REPO, SCALES, Settings, check_pos_embs, parse_tokens
from kerple.reproduce.report import Outputs, check_readme, setup_lines, write_report
from kerple.reproduce.stages import (Context, StageFailed, checkpoint_step, choose_eval_tokens, corpus_prefix,
                                     detect_device, ensure_corpus, evaluate, evaluated, train)
from kerple.reproduce.state import State

PROG = "gpu_reproduce.py"
PRESETS = ("chunks", "lease")
DEFAULT_MINUTES, TINY_LEASE_MINUTES = 9.0, 2.0
EPOCHS_WORTH_IT = 4  # repeated data adds little past about four epochs (Muennighoff et al., 2023)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="full",
                        help="full: 162M on a CUDA GPU; tiny: a 2-layer model on a CPU (checks the orchestration)")
    parser.add_argument("--tokens", help="training tokens per run, e.g. 600M (default: 600M full, 7,680 tiny)")
    parser.add_argument("--pos-emb", default=",".join(DEFAULT_POS_EMBS), help="embeddings, trained in this order")
    parser.add_argument("--minutes", type=float,
                        help="this chunk's (or the lease's) wall time; 0: until done (default 9, for 10-minute "
                             "sessions; the tiny lease: 2)")
    parser.add_argument("--work", type=Path, help="data, checkpoints, results (default runs/reproduce-<scale>)")
    parser.add_argument("--root", action="append", default=[], metavar="DIR",
                        help="read the .py files under DIR instead of this interpreter's (repeatable)")
    parser.add_argument("--attention-impl", choices=("auto", "flex", "sdpa", "eager"), default="auto",
                        help="auto: the model's choice per device and length (docs/training.md); the lease preset falls back to sdpa "
                             "when FlexAttention fails to compile in its probe")
    parser.add_argument("--docs", type=Path, help="report page (default docs/reproduce-162m.md at full scale)")
    parser.add_argument("--readme", type=Path,
                        help="a page with a marked section to fill (default docs/reproducing.md at full scale)")
    parser.add_argument("--no-readme", action="store_true", help="leave that page alone")
    parser.add_argument("--report-only", action="store_true", help="write the report from what is on disk and exit")
    parser.add_argument("--preset", default="chunks",
                        help="chunks: toward --tokens in re-runnable chunks (default); lease: one short reproduction "
                             "sized to --minutes, its report in --output only")
    lease = parser.add_argument_group("--preset lease")
    lease.add_argument("--output", type=Path, help="the report's folder (4 files; e.g. $OUT/reproduce)")
    lease.add_argument("--corpus-tokens", metavar="N",
                       help="cap on the corpus, e.g. 30M (default: 30M full, 200k tiny); also stops at its time share")
    lease.add_argument("--throughput-report", type=Path, metavar="PATH",
                       help="tokens/s from the GPU check's report.json (step 4) or an earlier lease's report.json, "
                            "instead of a probe")
    return parser.parse_args(argv)


def check_preset(args: argparse.Namespace) -> None:
    """Refuse an unknown preset, and the lease's options without it."""
    if args.preset not in PRESETS:
        raise ReproduceError(f"--preset {args.preset!r}: choose chunks (toward --tokens in re-runnable chunks) or "
                             "lease (one short reproduction in --minutes, its report in --output)")
    if args.preset == "chunks":
        given = [flag for flag, value in (("--output", args.output), ("--corpus-tokens", args.corpus_tokens),
                                          ("--throughput-report", args.throughput_report)) if value]
        if given:
            raise ReproduceError(f"{given[0]} is for --preset lease; add --preset lease, or drop {given[0]}")


def pos_embs_and_roots(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``--pos-emb`` checked against configs/pe/, and the ``--root`` folders as absolute paths."""
    names = check_pos_embs([name.strip() for name in args.pos_emb.split(",") if name.strip()])
    return names, tuple(str(Path(root).resolve()) for root in args.root)


def settings_from(args: argparse.Namespace) -> tuple[Settings, Outputs]:
    """The reproduction's settings and report outputs from the command line (``ReproduceError`` if bad)."""
    scale = SCALES[args.scale]
    if not 0 <= args.minutes < float("inf"):
        raise ReproduceError(f"--minutes {args.minutes:g}: give a positive number of minutes, or 0 for no limit")
    tokens = parse_tokens(args.tokens) if args.tokens else scale.default_tokens
    names, roots = pos_embs_and_roots(args)
    work = (args.work or REPO / "runs" / f"reproduce-{'162m' if scale.name == 'full' else scale.name}").resolve()
    settings = Settings(scale, tokens, names, work, roots, attention_impl=args.attention_impl)
    full = scale.name == "full"
    default_page = REPO / "docs" / "reproduce-162m.md" if full else work / "report" / "reproduce-tiny.md"
    page = (args.docs or default_page).resolve()
    readme = None if args.no_readme else (args.readme or (REPO / "docs" / "reproducing.md" if full else None))
    plot = page.parent / "images" / f"reproduce_{'162m' if full else scale.name}_ppl_vs_length.png"
    return settings, Outputs(page, plot, readme.resolve() if readme else None)


def initial_progress(settings: Settings, state: State, deadline: float | None) -> Progress:
    """Steps and evaluations already done, and a first step time from the earlier chunks."""
    progress = Progress(settings.steps, settings.pos_embs, deadline=deadline,
                        every_s=30.0 if settings.scale.name == "full" else 0.0)
    for name in settings.pos_embs:
        progress.done[name] = checkpoint_step(settings.work / "runs" / name / "checkpoints")
    steps = sum(c.end_step - c.start_step for r in state.runs.values() for c in r.chunks if c.kind == "train")
    seconds = sum(r.seconds("train") for r in state.runs.values())
    progress.seconds_per_step = seconds / steps if steps else None
    return progress


def existing_corpus(settings: Settings) -> PreparedData | None:
    info = Path(f"{corpus_prefix(settings)}.info.json")
    return PreparedData.from_info(info) if info.is_file() else None


def run_stages(ctx: Context) -> tuple[PreparedData | None, str | None]:
    """Corpus, then train and evaluate each run in order, until done or the chunk ends; returns the
    corpus and the failure message, if a stage failed."""
    settings, state = ctx.settings, ctx.state
    try:
        corpus = ensure_corpus(ctx)
        if corpus is None:
            return None, None
        if state.eval_tokens is None:
            state.eval_tokens = choose_eval_tokens(settings, corpus)
            state.save()
        ctx.out("\n".join(setup_lines(settings, state, corpus)))
        epochs = settings.steps * settings.scale.tokens_per_step / max(corpus.tokens("train"), 1)
        if epochs > EPOCHS_WORTH_IT:
            ctx.out(f"note: the budget is {epochs:.1f} epochs of the train split; past about {EPOCHS_WORTH_IT} "
                    "repeated data adds little, so a smaller --tokens gives nearly the same models sooner")
        for name in settings.pos_embs:
            if not train(ctx, corpus, name) or not evaluate(ctx, corpus, name):
                break
        return corpus, None
    except StageFailed as error:
        return existing_corpus(settings), str(error)


def finish(ctx: Context, corpus: PreparedData | None, outputs: Outputs, failure: str | None) -> int:
    """Write the report, say what is done and what is next; the exit status."""
    settings = ctx.settings
    for path in write_report(settings, ctx.state, corpus, outputs):
        ctx.out(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    if failure:
        print(f"{PROG}: error: {failure}", file=sys.stderr)
        return 1
    done = evaluated(settings)
    if len(done) == len(settings.pos_embs):
        ctx.out(f"done: {', '.join(done)} trained and evaluated; the table is in {outputs.page}")
        return 0
    why = "on request" if ctx.stop.requested else "at the end of this chunk"
    ctx.out(ctx.progress.line())
    ctx.out(f"stopped {why} with {len(done)} of {len(settings.pos_embs)} runs evaluated; "
            "run the same command again to continue")
    return 0


@entry_point(PROG)
def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    check_preset(args)
    if args.minutes is None:
        args.minutes = TINY_LEASE_MINUTES if (args.preset, args.scale) == ("lease", "tiny") else DEFAULT_MINUTES
    if args.preset == "lease":
        options = lease_options(args, *pos_embs_and_roots(args))
        return report_only(options) if args.report_only else run_lease(options, detect_device, started)
    settings, outputs = settings_from(args)
    check_readme(outputs.readme)
    state = State.load(settings.work / "state.json", settings.fingerprint())
    if args.report_only:
        for path in write_report(settings, state, existing_corpus(settings), outputs):
            print(f"wrote {path}")
        return 0
    state.device = detect_device(settings)
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    stop = StopRequest()
    ctx = Context(settings, state, stop, initial_progress(settings, state, deadline), deadline,
                  child_environment(state.device != "CPU"), out=lambda line: print(line, flush=True))
    print(f"gpu-reproduce: {settings.scale.name} scale on {state.device}: {', '.join(settings.pos_embs)}; "
          f"{settings.steps:,} steps of {settings.scale.tokens_per_step:,} tokens per run; "
          f"{f'this chunk stops within {args.minutes:g} min' if deadline else 'no time limit'}; work {settings.work}",
          flush=True)
    stop.install()
    try:
        corpus, failure = run_stages(ctx)
        return finish(ctx, corpus, outputs, failure)
    finally:
        stop.restore()
