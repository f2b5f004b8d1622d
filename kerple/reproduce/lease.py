"""``--preset lease``: one short, self-contained reproduction sized to fit one GPU lease.

A lease is a bare machine for a few minutes, of which only a report folder comes back. This preset
prepares a corpus capped in tokens and in time (:mod:`.corpus`), sizes the training steps from a
measured throughput so that training and evaluating every run fit ``--minutes``, trains and
evaluates each run in order with the chunked preset's stages, and rewrites the report in
``--output`` after every stage (:mod:`.lease_report`), so a command killed from outside still
returns what it finished.

The sizing rule (:func:`size_steps`): every run trains the same number of steps ``S`` (Table 3
compares embeddings at one token budget). Run ``i`` costs a fixed overhead ``o_i`` (its training's
start-up and compilation, its checkpoint, its evaluation, two report rewrites) plus
``S x tokens_per_step / r_i`` seconds of steps at ``r_i`` tokens/s, so with ``B`` seconds left once
the corpus is ready::

    S = floor(safety x (B - sum_i o_i) / sum_i (tokens_per_step / r_i))

``safety`` (0.9) leaves room for a throughput below the one assumed. ``r_i`` comes from
``--throughput-report`` (the GPU check's ``report.json``, step 4's best tokens/s per embedding at
this shape, or an earlier lease's ``report.json`` and what it measured), else from a probe: a short
``train.py`` of the first run, whose logged tokens/s is used for every run and whose wall time
gives that kernel's start-up. Overheads not measured are the scale's estimates below; the report
states every number it assumed and where it came from, and what each run then took.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kerple.data.prepared import PreparedData
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.plan import SCALES, Scale, Settings, config_arguments, parse_tokens

SAFETY = 0.9
LEASE_FORMAT = "kerple-reproduce-lease-1"


@dataclass(frozen=True)
class LeaseScale:
    """What a lease spends outside its training steps at one scale, and its caps. The seconds are
    estimates for a bare machine (imports, compilation on an empty cache), replaced by measured
    values where the probe or an earlier lease's report gives them. The tiny scale's were measured
    on 2 CPU cores; the full scale's are estimates until a lease has run: its ``report.json``
    (``measured``) then sizes the next lease through ``--throughput-report``."""

    corpus_tokens: int  # default --corpus-tokens
    corpus_share: float  # of --minutes, the most the corpus stage may take ...
    corpus_max_s: float  # ... and at most this long
    bpe_sample_chars: int  # the BPE is trained on this much train text
    eval_token_cap: int  # scored tokens per length
    log_interval: int
    min_steps: int  # fewer steps per run are refused as too short to mean anything
    probe_steps: int
    probe_log_interval: int
    train_start_s: dict[str, float]  # per training kernel: imports, engine, compilation, last validation, exit
    checkpoint_s: float
    eval_s: dict[str, float]  # per kernel: imports, loading, compilation per length, scoring the capped tokens
    report_s: float  # one rewrite of the report
    assumed_tokens_per_s: float  # only to refuse too few --minutes before anything is measured


LEASE_SCALES = {
    "full": LeaseScale(
        corpus_tokens=30_000_000, corpus_share=0.2, corpus_max_s=120.0, bpe_sample_chars=32 * 2**20,
        eval_token_cap=65_536, log_interval=50, min_steps=100, probe_steps=40, probe_log_interval=10,
        train_start_s={"flex": 45.0, "sdpa": 20.0, "eager": 20.0}, checkpoint_s=8.0,
        eval_s={"flex": 55.0, "sdpa": 15.0, "eager": 15.0}, report_s=1.5, assumed_tokens_per_s=150_000.0),
    "tiny": LeaseScale(
        corpus_tokens=200_000, corpus_share=0.2, corpus_max_s=60.0, bpe_sample_chars=2**20,
        eval_token_cap=2048, log_interval=10, min_steps=20, probe_steps=40, probe_log_interval=10,
        train_start_s={"flex": 9.0, "sdpa": 9.0, "eager": 9.0}, checkpoint_s=0.5,
        eval_s={"flex": 8.0, "sdpa": 8.0, "eager": 8.0}, report_s=1.0, assumed_tokens_per_s=5_000.0),
}


@dataclass
class Throughput:
    """Tokens/s per run and where they came from; start-up and evaluation seconds measured per kernel."""

    tokens_per_s: dict[str, float]
    source: str
    start_s: dict[str, float] = field(default_factory=dict)
    eval_s: dict[str, float] = field(default_factory=dict)
    fallback: str | None = None  # the probe's FlexAttention failure, if it had one


@dataclass
class LeasePlan:
    """How the steps were sized: stored in the state (a second command in the same lease keeps the
    steps) and stated in the report."""

    minutes: float
    steps: int
    tokens_per_s: dict[str, float]
    throughput_source: str
    kernels: dict[str, str]  # per run, the training kernel ...
    eval_kernels: dict[str, str]  # ... and the evaluation's (flex when it compiles at any length)
    start_s: dict[str, float]
    eval_s: dict[str, float]
    checkpoint_s: float
    report_s: float
    budget_s: float
    safety: float
    corpus_tokens: int
    eval_token_cap: int
    probe_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def overhead_s(self, name: str) -> float:
        """Run ``name``'s seconds outside its steps (:func:`run_overhead`)."""
        return run_overhead(self.start_s[name], self.eval_s[name], self.checkpoint_s, self.report_s)

    def steps_s(self, name: str, tokens_per_step: int) -> float:
        """Run ``name``'s seconds of training steps at the assumed tokens/s."""
        return self.steps * tokens_per_step / self.tokens_per_s[name]


# --- the sizing rule ----------------------------------------------------------------------------

def size_steps(budget_s: float, tokens_per_s: Sequence[float], tokens_per_step: int, overhead_s: Sequence[float],
               safety: float = SAFETY) -> int:
    """Steps per run such that every run's overhead plus its steps fit ``budget_s`` (module docstring);
    0 when the overheads alone fill it."""
    if len(tokens_per_s) != len(overhead_s) or any(rate <= 0 for rate in tokens_per_s):
        raise ValueError("one positive tokens/s and one overhead per run")
    seconds_per_step = sum(tokens_per_step / rate for rate in tokens_per_s)
    return max(0, math.floor(safety * (budget_s - sum(overhead_s)) / seconds_per_step))


def seconds_needed(steps: int, tokens_per_s: Sequence[float], tokens_per_step: int, overhead_s: Sequence[float],
                   safety: float = SAFETY) -> float:
    """The budget :func:`size_steps` needs to give ``steps`` steps per run (its inverse)."""
    return sum(overhead_s) + steps * sum(tokens_per_step / rate for rate in tokens_per_s) / safety


def _auto_choice(pos_emb: str, device: str, training: bool, length: int) -> str:
    """What ``attention_impl: auto`` picks for ``pos_emb`` on ``device`` (a device name, or ``CPU``)."""
    from kerple.model.attention import choose_implementation
    from kerple.positional import family

    return choose_implementation(family(pos_emb).kind, "cpu" if device == "CPU" else "cuda", training, length)


def run_kernel(pos_emb: str, device: str, seq_length: int, requested: str) -> str:
    """The attention kernel a run trains with: ``requested``, or what ``auto`` picks on ``device``."""
    return requested if requested != "auto" else _auto_choice(pos_emb, device, True, seq_length)


def eval_kernel(pos_emb: str, device: str, lengths: Sequence[int], requested: str) -> str:
    """The kernel that prices a run's evaluation: ``requested``, or ``flex`` when ``auto`` picks it
    at any length (it compiles once per length), else what ``auto`` picks."""
    if requested != "auto":
        return requested
    chosen = {_auto_choice(pos_emb, device, False, length) for length in lengths}
    return "flex" if "flex" in chosen else sorted(chosen)[0]


def run_overhead(start_s: float, eval_s: float, checkpoint_s: float, report_s: float) -> float:
    """A run's seconds outside its steps: start-up, checkpoint, evaluation, two report rewrites."""
    return start_s + checkpoint_s + eval_s + 2 * report_s


def overhead_parts(kernels: dict[str, str], eval_kernels: dict[str, str], lease: LeaseScale,
                   throughput: Throughput | None) -> tuple[dict[str, float], dict[str, float]]:
    """Per run: training start-up (by its training kernel) and evaluation seconds (by its evaluation
    kernel), measured where known, else the estimates."""
    measured_start = throughput.start_s if throughput else {}
    measured_eval = throughput.eval_s if throughput else {}
    start, evaluate = {}, {}
    for name, kernel in kernels.items():
        start[name] = measured_start.get(kernel, lease.train_start_s.get(kernel, max(lease.train_start_s.values())))
        kernel = eval_kernels[name]
        evaluate[name] = measured_eval.get(kernel, lease.eval_s.get(kernel, max(lease.eval_s.values())))
    return start, evaluate


def run_overheads(kernels: dict[str, str], eval_kernels: dict[str, str], lease: LeaseScale,
                  throughput: Throughput | None) -> dict[str, float]:
    """Per run: start-up, checkpoint, evaluation and two report rewrites (:meth:`LeasePlan.overhead_s`)."""
    start, evaluate = overhead_parts(kernels, eval_kernels, lease, throughput)
    return {name: run_overhead(start[name], evaluate[name], lease.checkpoint_s, lease.report_s) for name in kernels}


def corpus_seconds(lease: LeaseScale, minutes: float) -> float:
    """The most the corpus stage may take: its share of the lease, at most ``corpus_max_s``."""
    return min(lease.corpus_share * minutes * 60.0, lease.corpus_max_s)


def least_minutes(fixed_s: float, lease: LeaseScale) -> float:
    """The fewest minutes (in quarter minutes) that hold ``fixed_s`` besides the corpus stage's share."""
    seconds = fixed_s / (1.0 - lease.corpus_share)
    if lease.corpus_share * seconds > lease.corpus_max_s:
        seconds = fixed_s + lease.corpus_max_s
    return math.ceil(seconds / 15.0) / 4.0


def check_minutes(minutes: float, scale: Scale, lease: LeaseScale, kernels: dict[str, str],
                  eval_kernels: dict[str, str], throughput: Throughput | None) -> None:
    """Refuse, before any work, ``--minutes`` below what the corpus, the probe and every run need for
    ``min_steps`` steps (at the assumed tokens/s when nothing is measured yet)."""
    rates = throughput.tokens_per_s if throughput else {name: lease.assumed_tokens_per_s for name in kernels}
    overheads = run_overheads(kernels, eval_kernels, lease, throughput)
    first = next(iter(kernels))
    probe = 0.0 if throughput else (lease.train_start_s.get(kernels[first], max(lease.train_start_s.values()))
                                    + lease.probe_steps * scale.tokens_per_step / rates[first])
    rest = probe + scale.report_s + seconds_needed(lease.min_steps, [rates[name] for name in kernels],
                                                   scale.tokens_per_step, list(overheads.values()))
    if minutes * 60.0 >= corpus_seconds(lease, minutes) + rest:
        return
    per_run = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in overheads.items())
    raise ReproduceError(
        f"--minutes {minutes:g} is below what the lease needs for {len(kernels)} run(s): corpus up to "
        f"{corpus_seconds(lease, minutes):.0f} s, {'' if throughput else f'a throughput probe {probe:.0f} s, '}"
        f"start-up, checkpoint and evaluation per run ({per_run}) and {lease.min_steps} steps each; give --minutes "
        f"{least_minutes(rest, lease):g} or more, or fewer --pos-emb"
        + ("" if throughput else ", or --throughput-report to skip the probe"))


# --- where the throughput comes from ---------------------------------------------------------------

def read_throughput_report(path: Path, pos_embs: Sequence[str]) -> Throughput:
    """Tokens/s per run from the GPU check's ``report.json`` (step 4, best per embedding at the 162M
    shape, 32 x 512) or from an earlier lease's ``report.json`` (what it measured); an embedding the
    file lacks gets the slowest rate in it. A missing or malformed file is a ``ReproduceError``."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) else f"not JSON ({error})"
        raise ReproduceError(f"--throughput-report {path}: {reason}; give the report.json of `make gpu-check` "
                             "(step 4) or of an earlier lease") from None
    measured = doc.get("measured") if isinstance(doc, dict) and doc.get("format") == LEASE_FORMAT else None
    rates = measured.get("tokens_per_s") if isinstance(measured, dict) else _gpu_check_rates(doc)
    if not isinstance(rates, dict) or not rates or not all(
            isinstance(value, (int, float)) and value > 0 for value in rates.values()):
        raise ReproduceError(f"--throughput-report {path}: no positive tokens/s per embedding (expected "
                             "steps.4.metrics.best_tokens_per_s of the GPU check, or an earlier lease's "
                             "measured.tokens_per_s); run step 4 of `make gpu-check` or drop the flag to probe")
    slowest = min(rates.values())
    chosen = {name: float(rates.get(name, slowest)) for name in pos_embs}
    missing = [name for name in pos_embs if name not in rates]
    what = "an earlier lease's measured tokens/s" if measured else "the GPU check's step 4 (best setting per embedding)"
    source = f"{path} ({what}" + (f"; {', '.join(missing)} not in it: its slowest rate" if missing else "") + ")"
    return Throughput(chosen, source, *_measured_seconds(measured))


def _gpu_check_rates(doc: Any) -> Any:
    try:
        return doc["steps"]["4"]["metrics"]["best_tokens_per_s"]
    except (KeyError, TypeError):
        return None


def _measured_seconds(measured: Any) -> tuple[dict[str, float], dict[str, float]]:
    """(start-up, evaluation) seconds per kernel that an earlier lease measured, where it did."""
    if not isinstance(measured, dict):
        return {}, {}
    pairs = []
    for key in ("train_start_s", "eval_s"):
        values = measured.get(key)
        pairs.append({kernel: float(value) for kernel, value in values.items()
                      if isinstance(value, (int, float)) and value > 0} if isinstance(values, dict) else {})
    return pairs[0], pairs[1]


def with_overrides(arguments: list[str], overrides: dict[str, Any]) -> list[str]:
    """``arguments`` with the ``key=value`` items of ``overrides`` replaced (or added)."""
    kept = [item for item in arguments if item.partition("=")[0] not in overrides]
    return kept + [f"{key}={value}" for key, value in overrides.items()]


def probe_settings(settings: Settings, lease: LeaseScale) -> Settings:
    """The probe's settings: the first run's, ``probe_steps`` steps, its own work folder."""
    return replace(settings, work=settings.work / "probe", tokens=lease.probe_steps * settings.scale.tokens_per_step,
                   scale=replace(settings.scale, log_interval=lease.probe_log_interval))


def probe_arguments(settings: Settings, corpus: PreparedData, pos_emb: str, impl: str, lease: LeaseScale) -> list[str]:
    """``train.py``'s arguments for the probe: the first run's config, ``probe_steps`` steps, no checkpoint."""
    probe = probe_settings(settings, lease)
    return with_overrides(config_arguments(probe, corpus, pos_emb, impl), {"save": "", "load": ""})


def probe_rate(records: Sequence[dict[str, Any]], log_interval: int) -> float | None:
    """The median of the recorded tokens/s (``metrics.jsonl``) of the windows after the first (which holds
    the compilation)."""
    rates = [float(record["train/tokens_per_s"]) for record in records
             if record["step"] >= 2 * log_interval and math.isfinite(record.get("train/tokens_per_s", math.nan))]
    return statistics.median(rates) if rates else None


@dataclass(frozen=True)
class LeaseOptions:
    """The command line of a lease, checked."""

    lease: LeaseScale
    scale: Scale
    pos_embs: tuple[str, ...]
    work: Path
    output: Path
    minutes: float
    corpus_tokens: int
    roots: tuple[str, ...] = ()
    attention_impl: str = "auto"
    throughput_report: Path | None = None

    def settings(self, steps: int) -> Settings:
        """The reproduction's settings once its steps per run are known."""
        return Settings(self.scale, steps * self.scale.tokens_per_step, self.pos_embs, self.work, self.roots,
                        attention_impl=self.attention_impl, corpus_tokens=self.corpus_tokens)


def lease_options(args: argparse.Namespace, pos_embs: tuple[str, ...], roots: tuple[str, ...]) -> LeaseOptions:
    """The lease's options from the command line (``ReproduceError`` naming the flag and the fix)."""
    given = [flag for flag, value in (("--tokens", args.tokens), ("--docs", args.docs), ("--readme", args.readme),
                                      ("--no-readme", args.no_readme)) if value]
    if given:
        raise ReproduceError(f"{given[0]} is for the chunked preset; --preset lease sizes the tokens from --minutes "
                             "and writes its report into --output only: drop it")
    if args.output is None:
        raise ReproduceError("--preset lease needs --output DIR, the folder that comes back from the lease "
                             "(e.g. --output $OUT/reproduce)")
    if args.minutes <= 0:
        raise ReproduceError(f"--minutes {args.minutes:g}: the lease sizes its runs to the minutes it has; give "
                             "them (e.g. --minutes 9)")
    lease = LEASE_SCALES[args.scale]
    corpus_tokens = parse_tokens(args.corpus_tokens, "--corpus-tokens") if args.corpus_tokens else lease.corpus_tokens
    name = "162m" if args.scale == "full" else args.scale
    work = (args.work or Path("/tmp") / f"kerple-reproduce-lease-{name}").resolve()
    return LeaseOptions(lease, lease_scale(SCALES[args.scale], lease), pos_embs, work, args.output.resolve(),
                        args.minutes, corpus_tokens, roots, args.attention_impl, args.throughput_report)


def lease_scale(scale: Scale, lease: LeaseScale) -> Scale:
    """The scale as a lease runs it: its per-length cap, a checkpoint at the end only (and on a stop),
    a stop margin for one 162M checkpoint, and no floor on a training chunk (the lease decides)."""
    return replace(scale, eval_token_cap=lease.eval_token_cap, log_interval=lease.log_interval,
                   save_interval=10**9, stop_margin_s=min(scale.stop_margin_s, 20.0), min_train_s=0.0,
                   report_s=min(scale.report_s, 10.0))
