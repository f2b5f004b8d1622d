"""The lease preset's command: corpus, throughput, sizing, then train and evaluate every run.

Every stage is a child process (:mod:`kerple.jobs.process`), as in the chunked preset; the report in
``--output`` is rewritten when the command starts and after every stage (:mod:`.lease_report`).
A second command with the same options in the same lease (on the same machine) reuses the corpus,
the sized steps and every finished run, as the chunked preset does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from kerple.data.prepared import PreparedData
from kerple.jobs.process import StopRequest, child_environment, run_child
from kerple.jobs.progress import MetricsFollower, Progress
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.lease import (SAFETY, LeaseOptions, LeasePlan, Throughput, check_minutes, corpus_seconds,
                                    eval_kernel, overhead_parts, probe_arguments, probe_rate, probe_settings,
                                    read_throughput_report, run_kernel, size_steps)
from kerple.reproduce.lease_report import check_output, write_lease_report
from kerple.reproduce.plan import REPO, run_folder
from kerple.reproduce.stages import (Context, StageFailed, checkpoint_step, choose_eval_tokens, corpus_prefix,
                                     echo_lines, evaluate, evaluated, flex_failure, stage_failure, train)
from kerple.reproduce.state import State

PROG = "gpu_reproduce.py"
CORPUS_GRACE_S = 15.0  # the corpus child stops itself at its deadline; this ends one that hangs


def ensure_lease_corpus(ctx: Context, options: LeaseOptions) -> PreparedData | None:
    """The capped corpus (:mod:`.corpus`), prepared within its share of the lease; ``None`` if stopped."""
    from kerple.data.indexed_dataset import dataset_exists

    prefix = corpus_prefix(ctx.settings)
    info = Path(f"{prefix}.info.json")
    if info.is_file() and dataset_exists(prefix):
        return _reused_corpus(info, options)
    seconds = min(corpus_seconds(options.lease, options.minutes), ctx.time_left())
    command = [ctx.python, "-m", "kerple.reproduce.corpus", "--prefix", prefix, "--vocab", str(options.scale.vocab),
               "--split", options.scale.split, "--max-tokens", str(options.corpus_tokens),
               "--seconds", f"{seconds:.1f}", "--bpe-sample-chars", str(options.lease.bpe_sample_chars)]
    for root in options.roots:
        command += ["--root", root]
    ctx.out(f"corpus: the .py files on this machine, at most {options.corpus_tokens:,} tokens and {seconds:.0f} s")
    env = {**ctx.env, "TOKENIZERS_PARALLELISM": "true"}  # one tokenizer call spreads over every core
    outcome = run_child(command, log_path=ctx.log("corpus"), stop=ctx.stop,
                        deadline=time.monotonic() + seconds + CORPUS_GRACE_S, grace=CORPUS_GRACE_S,
                        on_line=echo_lines(ctx, "corpus"), env=env)
    if outcome.stopped == "signal":
        return None
    if not outcome.ok or not info.is_file():
        raise stage_failure("the corpus stage", outcome, ctx.log("corpus"))
    ctx.state.corpus_seconds = outcome.seconds
    return PreparedData.from_info(info)


def _reused_corpus(info: Path, options: LeaseOptions) -> PreparedData:
    corpus = PreparedData.from_info(info)
    cap = corpus.source.get("cap", {}).get("max_tokens")
    if cap != options.corpus_tokens:
        held = f"a corpus capped at {cap:,} tokens" if cap else "a whole corpus (the chunked preset's)"
        raise ReproduceError(f"--corpus-tokens {options.corpus_tokens:,}: {options.work} holds {held}; pass "
                             f"{f'--corpus-tokens {cap}' if cap else 'another --work'} or another --work")
    return corpus


def probe(ctx: Context, corpus: PreparedData, options: LeaseOptions) -> Throughput | None:
    """Tokens/s of the first run from a short ``train.py`` (no checkpoint), for every run, and that
    kernel's start-up; FlexAttention failing to compile moves it (and that run) to sdpa."""
    settings, lease, name = ctx.settings, options.lease, options.pos_embs[0]
    fallback, impl = None, settings.attention_impl
    while True:
        ctx.out(f"probe: {lease.probe_steps} steps of {name} to measure tokens/s (attention_impl {impl})")
        follower = MetricsFollower(run_folder(probe_settings(settings, lease), name) / "logs" / "metrics.jsonl")
        arguments = probe_arguments(settings, corpus, name, impl, lease)
        outcome = run_child([ctx.python, REPO / "train.py", *arguments], log_path=ctx.log("probe"), stop=ctx.stop,
                            deadline=ctx.stage_deadline, grace=settings.scale.stop_margin_s,
                            on_line=echo_lines(ctx, "probe"), on_tick=follower.poll, env=ctx.env)
        rate = probe_rate(follower.records, lease.probe_log_interval)
        if outcome.stopped:
            return None
        if outcome.ok and rate:
            kernel = run_kernel(name, ctx.state.device or "CPU", settings.scale.seq_length, impl)
            start = max(outcome.seconds - lease.probe_steps * settings.scale.tokens_per_step / rate, 0.0)
            source = (f"a {lease.probe_steps}-step probe of {name} on this machine (median of its logged tok/s after "
                      f"step {2 * lease.probe_log_interval}; {outcome.seconds:.0f} s in all), used for every run")
            return Throughput({n: rate for n in options.pos_embs}, source, {kernel: round(start, 1)}, {}, fallback)
        reason = flex_failure(outcome.tail)
        if not outcome.ok and reason and impl in ("auto", "flex"):
            fallback, impl = reason, "sdpa"
            continue
        raise stage_failure("the throughput probe", outcome, ctx.log("probe"))


def run_kernels(options: LeaseOptions, device: str) -> tuple[dict[str, str], dict[str, str]]:
    """The attention kernel each run trains with on ``device``, and the one that prices its evaluation."""
    scale, impl = options.scale, options.attention_impl
    return ({name: run_kernel(name, device, scale.seq_length, impl) for name in options.pos_embs},
            {name: eval_kernel(name, device, scale.lengths, impl) for name in options.pos_embs})


def size_plan(ctx: Context, options: LeaseOptions, throughput: Throughput, probe_s: float | None) -> LeasePlan:
    """The steps per run that fit the time left (``ReproduceError`` naming ``--minutes`` when too few)."""
    lease, (kernels, eval_kernels) = options.lease, run_kernels(options, ctx.state.device or "CPU")
    if throughput.fallback:  # FlexAttention failed to compile in the probe: that run trains and evaluates with sdpa
        kernels[options.pos_embs[0]] = eval_kernels[options.pos_embs[0]] = "sdpa"
    start, evaluate = overhead_parts(kernels, eval_kernels, lease, throughput)
    budget = round(ctx.time_left(), 1)
    plan = LeasePlan(options.minutes, 0, throughput.tokens_per_s, throughput.source, kernels, eval_kernels, start,
                     evaluate, lease.checkpoint_s, lease.report_s, budget, SAFETY, options.corpus_tokens,
                     lease.eval_token_cap, None if probe_s is None else round(probe_s, 1))
    overheads = [plan.overhead_s(name) for name in kernels]
    plan.steps = size_steps(budget, [throughput.tokens_per_s[name] for name in kernels],
                            options.scale.tokens_per_step, overheads)
    if plan.steps < lease.min_steps:
        raise ReproduceError(
            f"--minutes {options.minutes:g}: {budget:.0f} s were left once the corpus"
            f"{' and the probe' if probe_s else ''} were done, and the runs' start-up, checkpoints and evaluation "
            f"take {sum(overheads):.0f} s of them: {plan.steps} steps per run at "
            f"{min(throughput.tokens_per_s.values()):,.0f} tokens/s, fewer than {lease.min_steps}; give more "
            "--minutes or fewer --pos-emb")
    return plan


@dataclass
class Reporter:
    """Rewrites the report in ``output`` from what is on disk (the corpus, once known, kept)."""

    ctx: Context
    output: Path
    corpus: PreparedData | None = None

    def write(self, corpus: PreparedData | None = None) -> None:
        self.corpus = corpus or self.corpus
        write_lease_report(self.ctx.settings, self.ctx.state, self.corpus, self.output)


def run_all(ctx: Context, corpus: PreparedData, plan: LeasePlan, write: Callable[[], None]) -> None:
    """Train and evaluate every run in order; a run whose training cannot finish in the time left is
    skipped (its partial training could not be evaluated) and the report says why."""
    settings = ctx.settings
    for name in settings.pos_embs:
        trained = checkpoint_step(run_folder(settings, name) / "checkpoints") >= settings.steps
        needed = plan.start_s[name] + plan.checkpoint_s + plan.steps_s(name, settings.scale.tokens_per_step)
        left = ctx.time_left()
        if not trained and left < needed:
            plan.notes.append(f"{name} not run: its training needs about {needed:.0f} s and {max(left, 0):.0f} s "
                              "were left")
            ctx.out(plan.notes[-1])
            _save_plan(ctx, plan)
            continue
        finished = train(ctx, corpus, name)
        write()
        if not finished:
            return
        evaluated = evaluate(ctx, corpus, name)
        write()
        if not evaluated:
            return


def _save_plan(ctx: Context, plan: LeasePlan) -> None:
    ctx.state.lease = asdict(plan)
    ctx.state.save()


def start_state(options: LeaseOptions) -> tuple[State, LeasePlan | None]:
    """The work folder's state: an earlier command's in this lease (its plan and steps kept), or a
    new one (steps unknown until the plan); refuses a folder started with other options."""
    path = options.work / "state.json"
    saved = State.saved_fingerprint(path)
    if saved is None:
        return State(path, options.settings(1).fingerprint()), None
    state = State.load(path, options.settings(int(saved.get("steps") or 1)).fingerprint())
    if state.lease is None:
        raise ReproduceError(f"--work {options.work}: holds a reproduction of the chunked preset; pass another --work")
    return state, LeasePlan(**state.lease)


def prepare(ctx: Context, options: LeaseOptions, plan: LeasePlan | None, throughput: Throughput | None,
            write: Callable[..., None]) -> tuple[PreparedData | None, LeasePlan | None]:
    """The corpus and the plan: the earlier command's, or sized here from ``throughput`` (from
    ``--throughput-report``) or else from a probe."""
    corpus = ensure_lease_corpus(ctx, options)
    write(corpus)
    if corpus is None or plan is not None:
        return corpus, plan
    probe_s = None
    if throughput is None:
        started = time.monotonic()
        throughput = probe(ctx, corpus, options)
        probe_s = time.monotonic() - started
    if throughput is None:
        return corpus, None
    plan = size_plan(ctx, options, throughput, probe_s)
    adopt_plan(ctx, options, corpus, plan, throughput.fallback)
    return corpus, plan


def adopt_plan(ctx: Context, options: LeaseOptions, corpus: PreparedData, plan: LeasePlan, fallback: str | None) -> None:
    """Settings, state and progress with the sized steps; the plan saved and printed."""
    settings = options.settings(plan.steps)
    ctx.settings = settings
    ctx.state = State(ctx.state.path, settings.fingerprint(), ctx.state.corpus_seconds,
                      choose_eval_tokens(settings, corpus), ctx.state.device)
    if fallback:
        ctx.state.run(options.pos_embs[0]).fallback = fallback
    ctx.progress = Progress(settings.steps, settings.pos_embs, deadline=ctx.deadline, every_s=ctx.progress.every_s)
    _save_plan(ctx, plan)
    rates = ", ".join(f"{name} {rate:,.0f}" for name, rate in plan.tokens_per_s.items())
    ctx.out(f"plan: {plan.steps:,} steps per run ({plan.steps * settings.scale.tokens_per_step:,} tokens) at "
            f"{rates} tokens/s, from {plan.throughput_source}")


def run_lease(options: LeaseOptions, detect_device: Callable[..., str], started: float) -> int:
    """The whole lease (module docstring), ending ``--minutes`` after ``started`` (a ``time.monotonic()``
    value taken when the command started); the exit status of ``gpu_reproduce.py``."""
    check_output(options.output, options.work)
    state, plan = start_state(options)
    state.device = detect_device(options.settings(1))
    throughput = None
    if plan is None:
        if options.throughput_report is not None:
            throughput = read_throughput_report(options.throughput_report, options.pos_embs)
        check_minutes(options.minutes, options.scale, options.lease, *run_kernels(options, state.device), throughput)
    ctx = lease_context(options, state, plan, started + options.minutes * 60.0)
    reporter = Reporter(ctx, options.output)
    ctx.out(f"gpu-reproduce: lease, {options.scale.name} scale on {state.device}: {', '.join(options.pos_embs)}; "
            f"{options.minutes:g} min; report in {options.output}; work {options.work}")
    reporter.write()
    ctx.stop.install()
    try:
        corpus, plan = prepare(ctx, options, plan, throughput, reporter.write)
        if corpus is not None and plan is not None:
            run_all(ctx, corpus, plan, reporter.write)
        return finish(ctx, reporter, None)
    except StageFailed as error:
        return finish(ctx, reporter, str(error))
    except ReproduceError:
        reporter.write()
        raise
    finally:
        ctx.stop.restore()


def lease_context(options: LeaseOptions, state: State, plan: LeasePlan | None, deadline: float) -> Context:
    """What every stage of the lease needs (steps of the earlier command's plan, or 1 until sized)."""
    settings = options.settings(plan.steps if plan else 1)
    progress = Progress(settings.steps, settings.pos_embs, deadline=deadline,
                        every_s=30.0 if settings.scale.needs_cuda else 0.0)
    return Context(settings, state, StopRequest(), progress, deadline, child_environment(state.device != "CPU"),
                   out=lambda line: print(line, flush=True))


def finish(ctx: Context, reporter: Reporter, failure: str | None) -> int:
    """Write the report, say what was done; the exit status (1 when a stage failed)."""
    reporter.write()
    ctx.out(f"wrote the report to {reporter.output}")
    if failure:
        print(f"{PROG}: error: {failure} (its last lines are in {reporter.output / 'logs.txt'})", file=sys.stderr)
        return 1
    names = ctx.settings.pos_embs
    done = evaluated(ctx.settings)
    why = "on request" if ctx.stop.requested else "with the lease's time spent"
    ctx.out(f"done: {', '.join(done)} trained and evaluated" if len(done) == len(names) else
            f"stopped {why}: {len(done)} of {len(names)} runs evaluated")
    return 0


def report_only(options: LeaseOptions) -> int:
    """``--report-only``: write the report into ``--output`` from the work folder, run nothing."""
    check_output(options.output, options.work)
    state, plan = start_state(options)
    settings = options.settings(plan.steps if plan else 1)
    info = Path(f"{corpus_prefix(settings)}.info.json")
    corpus = PreparedData.from_info(info) if info.is_file() else None
    for path in write_lease_report(settings, state, corpus, options.output):
        print(f"wrote {path}")
    return 0
