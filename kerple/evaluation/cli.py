"""``evaluate.py``: perplexity of a trained checkpoint at several lengths (KERPLE §5.2, §5.5).

    python evaluate.py configs/models/162M.yml configs/pe/kerple_log.yml configs/data/github.yml \\
        --load checkpoints/kerple_log --eval-lengths 512,1024,2048,4096,8192,16384 \\
        --protocol nonoverlap --output results/kerple_log.json

``key=value`` arguments override config keys as for ``train.py``. The reference evaluated by
re-running its trainer with ``train-iters: 0`` and ``seq-length-val: L`` (docs/reference-format.md §5); here
every length is evaluated in one process over one token stream (see :mod:`.runner`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerple import positional
from kerple.atomic import write_json_atomic as _write_json_atomic
from kerple.cli import parse_command_line
from kerple.config import split_arguments
from kerple.errors import INTERRUPTED_STATUS, entry_point
from kerple.evaluation.arguments import DEFAULT_NUM_TOKENS, build_parser, check_arguments
from kerple.outputs import check_output_file
from kerple.evaluation import protocols
from kerple.evaluation.errors import EvaluationError
from kerple.evaluation.temperature import temperature_for
from kerple.evaluation.runner import (
    LengthResult,
    LOGIT_CHUNK_BYTES,
    available_bytes,
    cache_window_loss_fn,
    dataset_name,
    document_names,
    estimate_forward_bytes,
    evaluate_plan,
    fit_batch_size,
    format_table,
    load_split_documents,
    model_loss_fn,
    scored_token_count,
    split_prefix,
    unscored_token,
    window_tokens,
)
from kerple.progress import progress_bar
from kerple.runs import RunConfig, load_run, parse_lengths, resolve_device, run_config

RESULTS_FORMAT = "kerple-eval-1"
DOCUMENTS_SHOWN = 10


def scored_token_budget(args: argparse.Namespace, lengths: list[int], stream_len: int) -> int | None:
    """Tokens scored per length: ``--num-tokens`` (``all``: ``None``, the whole split); the default
    budget grows to one window of the longest length and shrinks to the split."""
    if args.protocol == "last_token" or args.num_windows is not None or args.num_tokens == "all":
        return None
    if args.num_tokens is None:
        return min(max(DEFAULT_NUM_TOKENS, max(lengths)), stream_len - 1)
    return int(args.num_tokens)


def window_cost(model: torch.nn.Module, cfg: Any, length: int) -> float:
    """Forward FLOPs of one window of ``length`` tokens: 2 per parameter per token plus the attention
    scores, 2 x layers x length x hidden per token (Kaplan et al., 2020, Table 1)."""
    parameters = sum(p.numel() for p in model.parameters())
    return float(length) * (2.0 * parameters + 2.0 * cfg.model.num_layers * length * cfg.model.hidden_size)


def seconds_per_cost(
    loss_fn: Any, stream: np.ndarray, plan: protocols.WindowPlan, batch: int, cost: float, device: torch.device
) -> float:
    """Seconds per FLOP of :func:`window_cost`, timed on the first batch of ``plan`` (best of two)."""
    count = min(batch, plan.num_windows)
    index = np.arange(count)
    tokens, labels = window_tokens(torch.as_tensor(stream, dtype=torch.long), plan, index)
    best = math.inf
    with torch.no_grad():
        for _ in range(2):
            begin = time.perf_counter()
            loss_fn(tokens.to(device), labels.to(device), int(plan.score_from[index].min()))
            best = min(best, time.perf_counter() - begin)
    return best / (count * cost)


def format_plan(
    args: argparse.Namespace, plans: list[protocols.WindowPlan], batches: list[int], impls: list[str],
    costs: list[float], rate: float, stream: np.ndarray, unscored_after: int | None,
) -> str:
    """The lengths to score, their windows, batch and attention kernel, and the estimated time."""
    total = sum(p.num_windows * c for p, c in zip(plans, costs)) * rate
    duration = f"{total / 60:.1f} min" if total >= 60 else f"{total:.0f} s"
    lines = [f"plan: {args.protocol} on the {args.split} split ({len(stream)} tokens), "
             f"about {duration} in all (timed on one batch)",
             f"{'length':>8} {'windows':>8} {'scored':>10} {'batch':>6} {'kernel':>6} {'est.':>8}"]
    for plan, batch, impl, cost in zip(plans, batches, impls, costs):
        lines.append(f"{plan.length:>8} {plan.num_windows:>8} {scored_token_count(plan, stream, unscored_after):>10} "
                     f"{batch:>6} {impl:>6} "
                     f"{plan.num_windows * cost * rate:>7.0f}s")
    return "\n".join(lines)


def format_documents(result: LengthResult, shown: int = DOCUMENTS_SHOWN) -> str:
    """The largest documents' perplexity at one length (all of them are in the results file)."""
    rows = result.per_document or []
    lines = [f"  L={result.length}: {len(rows)} documents; the {min(shown, len(rows))} with most scored tokens:"]
    lines += [f"    {r.get('name') or 'document ' + str(r['document']):<32}  {r['tokens']:>9} tokens  ppl {r['ppl']:.3f}"
              for r in rows[:shown]]
    return "\n".join(lines)


def write_json_atomic(doc: dict[str, Any], path: str | Path) -> Path:
    """Write ``doc`` as JSON beside ``path``, fsync it, then rename it into place (:mod:`kerple.atomic`)."""
    return _write_json_atomic(path, doc)


def _autocast(cfg: Any, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16/fp16 autocast on CUDA when the run trained in that precision; fp32 otherwise."""
    precision = cfg.precision.precision
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        return torch.autocast("cuda", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    return contextlib.nullcontext()


def evaluation_config(args: argparse.Namespace) -> RunConfig:
    """The run's config for evaluation, with the command line's attention settings."""
    flags = {"attention_impl": args.attention_impl, "attention_window": args.attention_window}
    return run_config(args.configs, args.load, args.iteration, overrides=flags)


def fit_batches(
    model: torch.nn.Module, cfg: Any, plans: list[protocols.WindowPlan], device: torch.device, tokens_per_batch: int
) -> tuple[list[int], list[str]]:
    """Windows per forward and attention implementation of every plan; refuses (``EvaluationError``)
    before any length is scored when one does not fit in the free memory."""
    free = available_bytes(device)
    batch_sizes, impls = [], []
    for plan in plans:
        # `auto` resolves per length and device, exactly as the model will at forward time.
        impl = model.resolve_attention_impl(device.type, False, plan.input_length)
        impls.append(impl)

        def estimate(batch: int, n: int = plan.input_length) -> int:
            return estimate_forward_bytes(
                batch=batch,
                length=n,
                hidden=cfg.model.hidden_size,
                heads=cfg.model.num_attention_heads,
                vocab=cfg.model.padded_vocab_size,
                attention_impl=impl,
                logit_chunk=max(1, LOGIT_CHUNK_BYTES // (4 * cfg.model.padded_vocab_size * batch)),
            )

        wanted = max(1, min(plan.num_windows, tokens_per_batch // plan.input_length))
        batch_sizes.append(fit_batch_size(wanted, estimate, free, length=plan.length, attention_impl=impl))
    return batch_sizes, impls


def results_document(
    args: argparse.Namespace,
    cfg: Any,
    *,
    run: dict[str, Any],
    impl_per_length: dict[int, str],
    stream_tokens: int,
    device: torch.device,
    results: list[LengthResult],
    seconds: float,
) -> dict[str, Any]:
    """The ``results.json`` document (format :data:`RESULTS_FORMAT`); ``run`` holds the
    checkpoint's ``iteration`` and ``load`` folder and the ``configs`` and ``overrides`` used."""
    return {
        "format": RESULTS_FORMAT,
        "run": {
            "pos_emb": cfg.positional.pos_emb,
            **{name: getattr(cfg.positional, name) for name in positional.runtime_option_names()},
            "dataset": dataset_name(cfg),
            "seed": cfg.training.seed,
            "train_seq_length": cfg.model.seq_length,
            **run,
        },
        "protocol": {
            "name": args.protocol,
            "split": args.split,
            "stride": args.stride,
            "num_tokens": args.num_tokens,
            "num_windows": args.num_windows,
            "attention_impl": cfg.attention.attention_impl,
            "attention_impl_per_length": impl_per_length,
            "cache_window": args.cache_window,
            "softmax_temperature": args.softmax_temperature,
            "softmax_temperature_per_length": {
                length: temperature_for(args.softmax_temperature, length, cfg.model.seq_length)
                for length in impl_per_length
            },
            "attention_window": cfg.attention.attention_window,
            "eod_mask_loss": cfg.data.eod_mask_loss,
            "stream_tokens": stream_tokens,
        },
        "environment": {
            "device": str(device),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "seconds": seconds,
        },
        "results": [r.to_json() for r in results],
    }


def check_temperatures(cfg: Any, setting: str, lengths: list[int]) -> None:
    """Refuse, before loading anything, a temperature setting that means nothing, or one other
    than 1 for a model family that takes no softmax temperature."""
    from kerple.model import family_of

    temperatures = {temperature_for(setting, length, cfg.model.seq_length) for length in lengths}
    family = family_of(cfg)
    if temperatures != {1.0} and not family.softmax_temperature:
        raise EvaluationError(f"--softmax-temperature {setting}: model.arch {family.name} takes no softmax "
                              "temperature (it runs at 1); drop the option")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load config and checkpoint, evaluate every length, write the results document after every
    length (``complete`` false until the last) and return it."""
    started = time.perf_counter()
    check_arguments(args)
    check_output_file(args.output, "--output", inputs=split_arguments(args.configs)[0],
                      folders=[args.load] if args.load else [])
    resolved = evaluation_config(args)
    cfg = resolved.cfg
    lengths = parse_lengths(args.eval_lengths, "--eval-lengths")
    cfg.check_eval_length(max(lengths))
    check_temperatures(cfg, args.softmax_temperature, lengths)
    device = resolve_device(args.device)
    loaded = load_run(cfg, args.load, args.iteration, trust=args.trust_checkpoint, device=device)
    model, load_dir, iteration = loaded.model, loaded.folder, loaded.iteration
    documents = load_split_documents(cfg, args.split)
    stream = np.concatenate(documents)
    document_of = np.repeat(np.arange(len(documents)), [len(d) for d in documents]) if args.per_document else None
    names = document_names(cfg, args.split, len(documents)) if args.per_document else None
    args.num_tokens = scored_token_budget(args, lengths, len(stream))  # as recorded in the results
    try:
        plans = protocols.build_plans(args.protocol, len(stream), lengths, stride=args.stride,
                                      num_tokens=args.num_tokens, num_windows=args.num_windows)
    except protocols.ProtocolError as error:
        raise protocols.ProtocolError(f"the {args.split} split of {split_prefix(cfg, args.split)}: {error}") from None
    batch_sizes, impls = fit_batches(model, cfg, plans, device, args.tokens_per_batch)
    unscored_after = unscored_token(cfg)

    loss_fn = model_loss_fn(model) if args.cache_window is None else cache_window_loss_fn(model, args.cache_window)
    costs = [window_cost(model, cfg, plan.input_length) for plan in plans]
    with _autocast(cfg, device):
        rate = seconds_per_cost(loss_fn, stream, plans[0], batch_sizes[0], costs[0], device)
        print(format_plan(args, plans, batch_sizes, impls, costs, rate, stream, unscored_after), file=sys.stderr)
        results: list[LengthResult] = []
        overall = progress_bar(total=sum(p.num_windows * c for p, c in zip(plans, costs)) * rate, desc="evaluation",
                       unit="s", disable=args.no_progress, bar_format="{l_bar}{bar}| {elapsed}<{remaining}")
        for plan, batch, cost in zip(plans, batch_sizes, costs):
            model.set_temperature(temperature_for(args.softmax_temperature, plan.length, cfg.model.seq_length))
            result = evaluate_plan(
                loss_fn, stream, plan, batch_size=batch, per_position=args.per_position, device=device,
                progress=not args.no_progress, document_of=document_of, unscored_after=unscored_after,
                on_windows=lambda k, c=cost: overall.update(min(k * c * rate, overall.total - overall.n)),  # no float overshoot
            )
            if result.per_document is not None and names is not None:
                for row in result.per_document:
                    row["name"] = names[row["document"]]
            results.append(result)
            overall.write(f"L={plan.length}: loss {result.loss:.4f}  ppl {result.ppl:.3f}", file=sys.stderr)
            if result.per_document is not None:
                overall.write(format_documents(result), file=sys.stderr)
            doc = results_document(
                args, cfg,
                run={"iteration": iteration, "load": str(load_dir), "configs": resolved.yamls,
                     "overrides": dict(resolved.overrides)},
                impl_per_length=dict(zip((p.length for p in plans), impls)), stream_tokens=int(len(stream)),
                device=device, results=results, seconds=time.perf_counter() - started,
            )
            doc["complete"] = len(results) == len(plans)
            write_json_atomic(doc, args.output)
            args.finished_lengths = [result.length for result in results]  # what an interruption keeps
        overall.close()
    print(format_table(results))
    print(f"wrote {args.output}")
    return doc


@entry_point("evaluate.py")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``evaluate.py``; returns 2 on bad configs or impossible evaluations, 130 when
    interrupted (Ctrl-C), saying which lengths the results file keeps."""
    args = parse_command_line(build_parser(), argv)
    try:
        run(args)
    except KeyboardInterrupt:
        finished = getattr(args, "finished_lengths", [])
        kept = (f"{args.output} holds the lengths it finished ({', '.join(map(str, finished))}; complete: false)"
                if finished else f"no length finished; {args.output} was not written")
        print(f"evaluate.py: interrupted; {kept}", file=sys.stderr)
        return INTERRUPTED_STATUS
    return 0

