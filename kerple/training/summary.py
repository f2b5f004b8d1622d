"""The one start-up summary block printed before the first step."""

from __future__ import annotations

from typing import Any

from kerple.config.errors import DEFAULT
from kerple.training.schedule import annealing_lr


def already_finished(checkpoint: Any, step: int | str, train_iters: int) -> str:
    """What a run resumed at or past ``train_iters`` says (the trainer, and deepy before it launches)."""
    return (f"training already finished: {checkpoint} is step {step} of {train_iters}; nothing to do "
            "(raise train_iters to train further)")


def parameter_count(model: Any) -> int:
    """Distinct parameters (the shared positional module counts once)."""
    return sum(p.numel() for p in model.parameters())


def format_count(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)


def _where_it_ends(iters: int, lr: float, style: str, decay: int, warmup: float, min_lr: float) -> str:
    """What a run of ``iters`` steps does with a schedule over ``decay`` steps: stops inside it, or,
    longer, keeps the rate at which GPT-NeoX's schedule stops changing, at step ``decay - warmup_iters``
    (docs/reference-format.md §5), which is above ``min_lr`` unless ``min_lr`` floors it."""
    if iters < decay:
        return "stops before the decay ends"
    warmup_iters = warmup * decay
    rate = annealing_lr(decay, lr=lr, warmup_iters=warmup_iters, decay_iters=decay, style=style, min_lr=min_lr)
    return f"keeps lr {rate:.3g} from step {decay - warmup_iters:g} (lr_decay_iters - warm-up) to the end"


def decay_note(cfg: Any) -> str:
    """A second schedule line when the decay length set in a file differs from ``train_iters``: the
    learning rate then stops before the end of its decay, or stays where the schedule stops changing."""
    decay, iters = cfg.lr_schedule.lr_decay_iters, cfg.training.train_iters
    if not decay or decay == iters or not iters:
        return ""
    source = cfg.provenance("lr_schedule.lr_decay_iters")[0]
    if source == DEFAULT:
        return ""
    schedule = cfg.lr_schedule
    where = _where_it_ends(iters, cfg.optimizer.lr, schedule.lr_decay_style, decay, schedule.warmup, schedule.min_lr)
    return (f"\n             lr_decay_iters={decay} ({source}) differs from train_iters={iters}: the run {where}; "
            f"set lr_decay_iters={iters} (or remove the key) to decay over this run")


def schedule_line(cfg: Any, scheduler: Any | None = None, start_iteration: int = 0) -> str:
    """The schedule the run follows: ``scheduler``'s values when given (after a resume with
    ``use_checkpoint_lr_scheduler`` they are the checkpoint's, not the config's), else the config's."""
    schedule, iters = cfg.lr_schedule, cfg.training.train_iters
    if iters == 0:
        return f"  schedule   none: train_iters 0 evaluates the model at step {start_iteration} and trains no step"
    configured = (cfg.optimizer.lr, schedule.lr_decay_style, schedule.lr_decay_iters or max(iters, 1), schedule.min_lr)
    if scheduler is None:
        lr, style, decay, min_lr = configured
        warmup = schedule.warmup
    else:
        lr, style, decay, min_lr = scheduler.lr, scheduler.style, scheduler.decay_iters, scheduler.min_lr
        warmup = scheduler.warmup_iters / max(decay, 1)
    line = (f"  schedule   {iters} steps from {start_iteration}, lr {lr:g} {style} over {decay} "
            f"(warmup {warmup:g}, min {min_lr:g}), {cfg.optimizer.type}")
    if (lr, style, decay, min_lr) == configured:
        return line + decay_note(cfg)
    line += (f"\n             the checkpoint's schedule (use_checkpoint_lr_scheduler), not the config's "
             f"lr {configured[0]:g} {configured[1]} over {configured[2]}")
    if decay != iters:
        where = _where_it_ends(iters, lr, style, decay, warmup, min_lr)
        line += (f"\n             its decay over {decay} differs from train_iters={iters}: the run {where}; "
                 f"set override_lr_scheduler: true to follow the config's")
    return line


def run_time_lines(cfg: Any, notes: list[str]) -> list[str]:
    """``run-time`` lines: each run-time option the embedding takes, its value and source; then ``notes``."""
    from kerple.checkpoint.runtime_options import runtime_summary

    lines = [line for line in (runtime_summary(cfg), *notes) if line]
    return [f"  {'run-time' if index == 0 else '':<8}   {line}" for index, line in enumerate(lines)]


def startup_summary(cfg: Any, *, parameters: int, parallel: Any, start_iteration: int, resumed_from: str | None,
                    scheduler: Any | None = None, notes: list[str] | None = None) -> str:
    """Model size, tokens per step, precision, parallel layout, data, and where outputs go; the
    schedule as ``scheduler`` holds it after a resume (:func:`schedule_line`); the run-time options
    and where they come from, with ``notes`` on how they relate to the checkpoint loaded."""
    model, training, ck, logging = cfg.model, cfg.training, cfg.checkpointing, cfg.logging
    dp = parallel.data_parallel_size
    micro, accum = int(training.micro_batch_size), int(training.gradient_accumulation_steps)
    tokens = micro * accum * dp * int(model.seq_length)
    data = cfg.data
    data_desc = (f"{data.data_path} (split {data.split})" if data.data_path
                 else f"train {data.train_data_paths} / valid {data.valid_data_paths}")
    lines = [
        "=" * 78,
        "kerple training run",
        f"  model      {format_count(parameters)} parameters ({parameters:,}): {model.num_layers} layers, "
        f"hidden {model.hidden_size}, {model.num_attention_heads} heads, vocab {model.padded_vocab_size}, "
        f"pos-emb {cfg.positional.pos_emb}, attention {cfg.attention.attention_impl}",
        f"  batch      {micro} micro x {accum} accumulation x {dp} data-parallel = "
        f"{micro * accum * dp} samples = {tokens:,} tokens/step (seq {model.seq_length})",
        f"  precision  {cfg.precision.precision}, ZeRO stage {cfg.parallelism.zero_stage}, "
        f"gradient clipping {training.gradient_clipping}",
        f"  parallel   world {parallel.world_size} = data {dp} x model {parallel.model_parallel_size} x "
        f"pipe {parallel.pipe_parallel_size} on {parallel.device.type} ({parallel.backend})",
        schedule_line(cfg, scheduler, start_iteration),
        f"  data       {data_desc}, valid seq {data.seq_length_val or model.seq_length}, "
        f"eval every {training.eval_interval} steps x {training.eval_iters} batches",
        f"  save       {ck.save or '(not saving)'} every {ck.save_interval} steps"
        + (f", keep last {ck.keep_last_n_checkpoints}" if ck.keep_last_n_checkpoints else ""),
        f"  load       {resumed_from or ck.load or '(fresh start)'}"
        + (" (finetune: its weights only; step count, optimizer and schedule start over)" if ck.finetune else ""),
        *run_time_lines(cfg, notes or []),
        f"  logs       {logging.log_dir or '(console only)'}"
        + (f", tensorboard {logging.tensorboard_dir}" if logging.tensorboard_dir else "")
        + (f", wandb project {logging.wandb_project}" if logging.use_wandb else ""),
        "=" * 78,
    ]
    return "\n".join(lines)
