"""The training loop on a DeepSpeed engine.

:class:`Trainer` owns one run: datasets, model, optimizer, the NeoX LR schedule, the DeepSpeed
engine, checkpoints and metrics. ``run_training(cfg)`` wraps it with process-group set-up and
teardown; ``train.py`` is a thin caller of that.

Resuming (:mod:`kerple.training.resume`): weights are loaded *before* ``deepspeed.initialize`` so
that the fp32 master copies DeepSpeed makes (bf16, ZeRO) start from the checkpoint; optimizer,
scheduler, RNG and data position are restored after it. Checkpoints are written and read by
:mod:`kerple.checkpoint`.

This rank's model and engine for tensor, pipeline and ZeRO-3 layouts are built by
:mod:`kerple.training.engine`. With ``pipe_parallel_size > 1`` a step is ``engine.train_batch`` over
``gradient_accumulation_steps`` micro-batches and each stage writes its own layer files. Under ZeRO-3
saving gathers every parameter so the layer files hold the full weights, and the optimizer shards are
written per rank as for ZeRO 1/2.

Host work per step: the loss stays on the device (a 0-dim tensor per step) and is read at log and
save steps only, where the run pays a synchronization anyway; a non-finite loss is found there and
stops the run, naming its step, before any checkpoint of the broken model is written. On the
single-replica layout (ZeRO 0, no pipeline, fp32 or bf16: :mod:`kerple.training.ds_config`) the
optimizer is :class:`~kerple.training.master_adamw.MasterAdamW` (fp32 masters, clipping and the
fused AdamW update in a few foreach kernels, no host synchronization), and with one data-parallel
replica DeepSpeed's gradient all-reduce (a flatten and a copy per parameter, for nothing to
average) is skipped.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from kerple.checkpoint import RunState, architecture_args, capture_rng, save_checkpoint, tag_for
from kerple.checkpoint.architecture import with_origin
from kerple.checkpoint.run_state import deepspeed_version
from kerple.model import maybe_compile
from kerple.model.decoder import compile_flex_kernels
from kerple.parallel.groups import ParallelState, init_distributed, teardown
from kerple.parallel.vote import LaggedVote
from kerple.training.batches import build_feeds
from kerple.training.ds_config import optimizer_steps_itself
from kerple.training.engine import build_rank_model, build_stages, gathered, initialize_engine
from kerple.training.errors import FP16_NEEDS_CUDA, TrainingDivergedError, TrainingError
from kerple.training.gradient_check import check_positional_gradients
from kerple.training.interval import LossInterval
from kerple.training.lock import SaveLock
from kerple.training.memory import check_training_memory
from kerple.training.monitor import Monitor, loss_scale, progress_line
from kerple.training.optimizer import build_master_adamw, build_optimizer
from kerple.training.resume import load_weights, prepare_resume, restore_run_state
from kerple.training.schedule import AnnealingLR
from kerple.training.summary import already_finished, parameter_count, startup_summary


__all__ = ["TrainResult", "Trainer", "TrainingDivergedError", "TrainingError", "run_training"]


@dataclass
class TrainResult:
    """What a run did: the final iteration, per-step mean losses, validation losses, and why it stopped."""

    iteration: int
    losses: list[tuple[int, float]] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    status: str = "finished"  # "finished" | "interrupted" | "already finished"
    skipped_steps: int = 0
    last_checkpoint: Path | None = None
    stop_signal: int | None = None  # the signal this rank received when interrupted (SIGINT or SIGTERM)


class Trainer:
    """One training run. Build it, call :meth:`train`, then :meth:`close`."""

    def __init__(
        self,
        cfg: Any,
        parallel: ParallelState,
        *,
        config_files: list[str] | None = None,
        trust_checkpoint: bool = False,
    ) -> None:
        self.cfg = cfg
        self.parallel = parallel
        self.config_files = list(config_files or [])
        self.trust_checkpoint = trust_checkpoint
        self.precision = str(cfg.precision.precision)
        self._check_supported()
        self.micro = int(cfg.training.micro_batch_size)
        self.accumulation = int(cfg.training.gradient_accumulation_steps)
        self.train_iters = int(cfg.training.train_iters)
        self.iteration = 0
        self.consumed_train_samples = 0
        self.skipped_steps = 0
        self._gradients_checked = False
        self._stop_signal: int | None = None
        vote_device = parallel.device if parallel.backend == "nccl" else torch.device("cpu")
        self._stop_vote = LaggedVote(parallel.world_size, vote_device)  # no per-step wait across ranks

        check_training_memory(cfg, parallel)  # a micro-batch that cannot fit is refused, not killed at step 1
        self._seed(int(cfg.training.seed))
        self.train_feed, self.valid_feed = build_feeds(cfg, parallel)
        runtime = prepare_resume(cfg, trust=trust_checkpoint)  # the run-time options the model is built with
        self.finetuned_from = runtime.finetuned_from
        self.model = build_rank_model(cfg, parallel)
        resumed = load_weights(self.model, cfg, parallel, trust=trust_checkpoint)
        self.resumed_from = None if resumed is None else resumed.directory
        self.last_checkpoint: Path | None = self.resumed_from  # what a diverged run can go back to
        self.parameters_total = parameter_count(self.model)
        if self.pipelined:
            self.model = build_stages(self.model, parallel)
        else:
            maybe_compile(self.model, cfg)  # per-layer torch.compile when `compile: true`
        self.model.to(parallel.device)  # MasterAdamW makes the fp32 masters where the model trains
        own_step = optimizer_steps_itself(cfg)  # MasterAdamW holds the masters and clips; else DeepSpeed's wrappers
        self.optimizer = (build_master_adamw(self.model, cfg, parallel) if own_step
                          else build_optimizer(self.model, cfg.optimizer))
        self.scheduler = self._build_scheduler()
        self.engine = initialize_engine(self.model, self.optimizer, self.scheduler, cfg, parallel)
        # one replica: DeepSpeed's all-reduce would flatten and copy every gradient to average nothing
        self.reduce_gradients = not own_step or parallel.data_parallel_size > 1
        self.pending_losses: list[tuple[int, torch.Tensor]] = []  # losses not yet read on the host
        if cfg.training.compile and not self.pipelined and parallel.device.type == "cuda":  # retry out-of-resource now
            tokens = torch.zeros(self.micro, int(cfg.model.seq_length), dtype=torch.long, device=parallel.device)
            compile_flex_kernels(self.model, tokens)
        if resumed is not None:
            self.iteration, self.consumed_train_samples, self.skipped_steps = restore_run_state(
                resumed, engine=self.engine, scheduler=self.scheduler, cfg=cfg, parallel=parallel,
                global_batch=self.micro * self.accumulation * parallel.data_parallel_size, trust=trust_checkpoint,
            )
        finished = 0 < self.train_iters <= self.iteration  # train() says so and returns: nothing to log
        self.monitor = Monitor(
            enabled=parallel.is_main,
            log_dir=None if finished else cfg.logging.log_dir,
            tensorboard_dir=(cfg.logging.tensorboard_dir if cfg.logging.use_tensorboard is not False and not finished
                             else None),
            use_wandb=bool(cfg.logging.use_wandb) and not finished,
            wandb_project=cfg.logging.wandb_project,
            run_config=cfg.to_dict(),
        )
        self.monitor.print(
            startup_summary(
                cfg,
                parameters=self.parameters_total,
                parallel=parallel,
                start_iteration=self.iteration,
                resumed_from=str(resumed.directory) if resumed is not None else None,
                scheduler=self.scheduler,
                notes=runtime.notes,
            )
        )

    # --- set-up -------------------------------------------------------------------------------
    def _build_scheduler(self) -> AnnealingLR:
        schedule = self.cfg.lr_schedule
        return AnnealingLR(
            self.optimizer,
            lr=self.cfg.optimizer.lr,
            warmup=schedule.warmup,
            decay_iters=schedule.lr_decay_iters or max(self.train_iters, 1),
            style=schedule.lr_decay_style,
            min_lr=schedule.min_lr,
            use_checkpoint_lr_scheduler=schedule.use_checkpoint_lr_scheduler,
            override_lr_scheduler=schedule.override_lr_scheduler,
        )

    @property
    def pipelined(self) -> bool:
        return max(int(self.cfg.parallelism.pipe_parallel_size), 1) > 1

    def _check_supported(self) -> None:
        """Refuse what depends on the device; the parallel layouts are checked when the config loads."""
        if self.precision == "fp16" and self.parallel.device.type == "cpu":
            raise TrainingError(FP16_NEEDS_CUDA)

    @property
    def zero3(self) -> bool:
        return int(self.cfg.parallelism.zero_stage) == 3

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)

    # --- one step -----------------------------------------------------------------------------
    def train_step(self) -> torch.Tensor:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches; returns the mean loss
        (over micro-batches and data-parallel ranks) as a 0-dim fp32 tensor on the device.

        Nothing here waits for the device: :meth:`read_losses` checks the losses at log and save steps.
        """
        assert self.train_feed is not None
        # train() walks every module, a host cost per step; DeepSpeed's train()/eval() set only the module's flag
        if not self.engine.module.training:
            self.engine.train()
        skipped_before = self.engine.skipped_steps
        if self.pipelined:
            # the first and the last stage each read the micro-batches (tokens, labels); the loss
            # comes back averaged over micro-batches and data-parallel ranks, on every stage
            batches = (self.train_feed.micro_batch(self.consumed_train_samples, m) for m in range(self.accumulation))
            mean_loss = self.engine.train_batch(batches).detach().float()
        else:
            total = self._accumulate()
            mean_loss = self._mean_over_data_parallel(total / self.accumulation if self.accumulation > 1 else total)
        self.iteration += 1
        self.consumed_train_samples += self.train_feed.global_batch
        self.skipped_steps += self.engine.skipped_steps - skipped_before
        return mean_loss

    def _accumulate(self) -> torch.Tensor:
        """Forward, backward and ``engine.step`` per micro-batch (DeepSpeed steps the optimizer on the
        last). Returns the summed loss."""
        losses = []
        for micro_step in range(self.accumulation):
            tokens, labels = self.train_feed.micro_batch(self.consumed_train_samples, micro_step)
            loss = self.engine(tokens, labels)
            with contextlib.nullcontext() if self.reduce_gradients else self.engine.no_sync():
                self.engine.backward(loss)
            if not self._gradients_checked:  # once: a kernel that drops the embedding's gradient stops the run
                self._gradients_checked = True
                if int(self.cfg.parallelism.zero_stage) == 0:  # ZeRO 1-3 move the gradients out of .grad
                    check_positional_gradients(self.model, self.cfg, self.parallel.device)
            self.engine.step()
            losses.append(loss.detach())
        return losses[0] if len(losses) == 1 else torch.stack(losses).sum()

    def _mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` averaged over the data-parallel replicas, on the device."""
        if self.parallel.data_parallel_size == 1:
            return value
        dist.all_reduce(value, group=self.parallel.data_parallel_group)
        return value / self.parallel.data_parallel_size

    def read_losses(self) -> list[tuple[int, float]]:
        """The losses of the steps since the last read, as ``(step, loss)`` (one synchronization).

        Raises :class:`TrainingDivergedError` (on every rank) when one is not finite outside fp16
        (where DeepSpeed's loss scaler skips the step instead and the skip is counted), naming the
        first such step; the caller reads before saving, so no checkpoint holds the broken model.
        """
        if not self.pending_losses:
            return []
        steps = [step for step, _ in self.pending_losses]
        values = torch.stack([loss for _, loss in self.pending_losses]).cpu().tolist()
        self.pending_losses.clear()
        first_bad = next(((step, value) for step, value in zip(steps, values) if not math.isfinite(value)), None)
        if self.parallel.any_rank(first_bad is not None) and self.precision != "fp16":
            step, value = first_bad or (steps[-1], float("nan"))
            raise TrainingDivergedError(
                f"loss is {value} at step {step} ({self.precision}); stopping without saving. "
                f"Lower the learning rate, raise warmup, or check the data; {self._last_good_checkpoint()}."
            )
        return list(zip(steps, values))

    def _last_good_checkpoint(self) -> str:
        """Where a diverged run can go back to, said as it is (a ``save`` folder may hold nothing yet)."""
        if self.last_checkpoint is not None:
            return f"the last good checkpoint is {self.last_checkpoint}"
        if not self.cfg.checkpointing.save:
            return "no checkpoint was written (save is not set)"
        return (f"no checkpoint was written yet (save_interval {self.cfg.checkpointing.save_interval}); "
                "the run starts over from step 0")

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean validation loss over ``eval_iters`` batches at ``seq_length_val`` (None without a valid set).

        Every evaluation reads the same first samples of the validation set, so values are
        comparable across steps and a resumed run evaluates exactly like an uninterrupted one.
        """
        eval_iters = int(self.cfg.training.eval_iters)
        if self.valid_feed is None or eval_iters == 0:
            return None
        self.engine.eval()
        losses = []
        global_batch = self.valid_feed.global_batch
        if self.pipelined:
            self.engine.reset_activation_shape()  # seq_length_val may differ from seq_length
        for batch in range(eval_iters):
            losses.extend(self._validation_losses(batch * global_batch))
        if self.pipelined:
            self.engine.reset_activation_shape()
        self.engine.train()
        return self.parallel.mean_over_data_parallel(sum(losses) / len(losses))

    def _validation_losses(self, consumed: int) -> list[float]:
        """Losses of the validation batch starting at sample ``consumed``: one per micro-batch, or
        their mean from the pipeline engine (every stage receives it)."""
        assert self.valid_feed is not None
        micro_batches = [self.valid_feed.micro_batch(consumed, m) for m in range(self.accumulation)]
        if self.pipelined:
            return [float(self.engine.eval_batch(iter(micro_batches), num_micro_batches=self.accumulation).item())]
        return [self.engine.module(tokens, labels).float().item() for tokens, labels in micro_batches]

    # --- checkpoints --------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write ``global_step<iteration>`` under ``checkpointing.save`` (collective)."""
        ck = self.cfg.checkpointing
        if not ck.save:
            return None
        run_state = RunState(
            iteration=self.iteration,
            args=with_origin(architecture_args(self.cfg), self.finetuned_from),
            consumed_train_samples=self.consumed_train_samples,
            skipped_steps=self.skipped_steps,
            seed=int(self.cfg.training.seed),
            lr_scheduler=self.scheduler.state_dict(),
            rng={} if ck.no_save_rng else capture_rng(),
            ds_version=deepspeed_version(),
        )
        model_state = None
        if self.zero3:  # gather the partitioned parameters (collective) and copy them whole
            with gathered(list(self.model.parameters()), zero3=True):
                if self.parallel.data_parallel_rank == 0:
                    model_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        saved = save_checkpoint(
            ck.save,
            module=self.model,
            run_state=run_state,
            optimizer=None if ck.no_save_optim else self.engine.optimizer,
            parallel=self.parallel,
            model_state=model_state,
            write_configs=self._write_configs,
            keep_last_n=ck.keep_last_n_checkpoints,
        )
        self.last_checkpoint = saved or self.last_checkpoint
        return saved

    def _write_configs(self, directory: Path) -> None:
        for source in self.config_files:
            path = Path(source)
            if path.is_file():
                (directory / path.name).write_text(path.read_text())
        self.cfg.save_yaml(directory / "resolved.yml")

    # --- the loop -----------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Train to ``train_iters``; evaluate every ``eval_interval``; save every ``save_interval``
        and at the end; on SIGTERM/SIGINT finish the current step, save and return. A run resumed
        at or past ``train_iters`` returns at once (status ``already finished``). The first rank
        holds ``save``'s lock (:mod:`kerple.training.lock`) meanwhile."""
        if 0 < self.train_iters <= self.iteration:
            self.monitor.print(already_finished(self.resumed_from, self.iteration, self.train_iters))
            return TrainResult(iteration=self.iteration, status="already finished",
                               skipped_steps=self.skipped_steps, last_checkpoint=self.resumed_from)
        save = self.cfg.checkpointing.save
        with SaveLock(save) if save and self.parallel.is_main else contextlib.nullcontext():
            return self._train()

    def _train(self) -> TrainResult:
        cfg = self.cfg
        result = TrainResult(iteration=self.iteration)
        log_interval = int(cfg.logging.log_interval)
        eval_interval = int(cfg.training.eval_interval)
        save_interval = int(cfg.checkpointing.save_interval)
        tokens_per_step = self.micro * self.accumulation * self.parallel.data_parallel_size * int(cfg.model.seq_length)
        previous = self._install_signal_handlers()
        last_saved = None
        interval = LossInterval()  # the console's loss: the interval's mean (kerple.training.interval)
        try:
            window_start, window_steps, elapsed_total, steps_total = time.perf_counter(), 0, 0.0, 0
            while self.iteration < self.train_iters:
                lr = self.optimizer.param_groups[0]["lr"]
                step_start = time.perf_counter()
                self._take_step(interval)
                on_interval = self.iteration % log_interval == 0 or self.iteration == self.train_iters
                stop = self._stop_vote(self._stop_signal is not None)
                saving = stop or self.iteration % save_interval == 0
                if on_interval or saving or steps_total == 0:  # the host waits for the device only here
                    read = self.read_losses()
                    result.losses += read
                    interval.add(read)
                step_time = time.perf_counter() - step_start
                elapsed_total, steps_total = elapsed_total + step_time, steps_total + 1
                window_steps += 1
                if on_interval or steps_total == 1:  # a first line at once: the user sees the run is alive
                    window = (time.perf_counter() - window_start) / window_steps
                    self._log_progress(interval, result.losses[-1][1], lr, tokens_per_step, window,
                                       elapsed_total / steps_total, on_interval)
                    if on_interval:  # the first line's step stays in its interval, as GPT-NeoX times and averages it
                        window_start, window_steps = time.perf_counter(), 0
                        interval.reset()
                if eval_interval and self.iteration % eval_interval == 0:
                    self._run_eval(result)
                if saving:
                    last_saved = self.save() or last_saved
                if stop:
                    self.monitor.print(f"received signal; saved at step {self.iteration} and stopping cleanly")
                    result.status, result.stop_signal = "interrupted", self._stop_signal
                    break
            if result.status == "finished":
                if self.train_iters > 0 and (not eval_interval or self.iteration % eval_interval != 0):
                    self._run_eval(result)
                elif self.train_iters == 0:
                    self._run_eval(result)
                if self.train_iters > 0 and (last_saved is None or last_saved.name != tag_for(self.iteration)):
                    last_saved = self.save() or last_saved
        finally:
            self._restore_signal_handlers(previous)
        result.iteration = self.iteration
        result.skipped_steps = self.skipped_steps
        result.last_checkpoint = last_saved
        return result

    def _take_step(self, interval: LossInterval) -> None:
        """One :meth:`train_step`; its loss waits on the device for :meth:`read_losses`, and a step the fp16
        loss scaler skipped (a count DeepSpeed keeps on the host: no wait) is marked in ``interval``."""
        skipped_before = self.skipped_steps
        loss = self.train_step()
        self.pending_losses.append((self.iteration, loss))
        if self.skipped_steps > skipped_before:
            interval.mark_skipped(self.iteration)

    def _run_eval(self, result: TrainResult) -> None:
        value = self.evaluate()
        if value is None:
            return
        result.eval_losses.append((self.iteration, value))
        ppl = math.exp(min(value, 50.0))
        self.monitor.print(f"validation at step {self.iteration}: lm_loss {value:.6f} | ppl {ppl:.3f}")
        self.monitor.record(self.iteration, {"lm_loss": value, "lm_loss_ppl": ppl}, "validation")

    def _log_progress(self, interval: LossInterval, step_loss: float, lr: float, tokens_per_step: int,
                      step_time: float, mean_time: float, record: bool = True) -> None:
        """The console line; with ``record``, also the metrics (every ``log_interval`` steps, as GPT-NeoX).

        The line's loss is ``interval``'s mean, as GPT-NeoX prints it; a record keeps both that mean
        (``lm_loss_interval_mean``, over ``interval_steps`` steps less the skipped ones) and its own
        step's loss (``lm_loss``, as GPT-NeoX's TensorBoard ``train/lm_loss`` at that step).
        """
        with gathered(self.model.positional_parameters(), self.zero3):
            positional = self.model.positional_metrics()
        grad_norm = self.engine.get_global_grad_norm()
        grad_norm = float(grad_norm) if grad_norm is not None else None
        scale = loss_scale(self.engine) if self.precision == "fp16" else None
        tokens_per_s = tokens_per_step / step_time if step_time > 0 else float("nan")
        eta = mean_time * (self.train_iters - self.iteration)
        mean_loss = interval.mean()
        self.monitor.print(
            progress_line(
                step=self.iteration, total=self.train_iters, loss=mean_loss, lr=lr, tokens_per_s=tokens_per_s,
                step_time=step_time, eta=eta, skipped=self.skipped_steps, grad_norm=grad_norm,
                positional=positional, interval_skipped=interval.skipped, interval_nan=interval.nan_skipped,
                loss_scale=scale,
            )
        )
        metrics = {"lm_loss": step_loss, "learning_rate": lr, "tokens_per_s": tokens_per_s, "step_time_s": step_time,
                   "skipped_steps": float(self.skipped_steps),
                   "consumed_samples": float(self.consumed_train_samples),
                   "interval_steps": float(interval.steps), "interval_skipped_steps": float(interval.skipped),
                   "interval_nan_steps": float(interval.nan_skipped)}
        if mean_loss is not None:
            metrics["lm_loss_interval_mean"] = mean_loss
        if grad_norm is not None:
            metrics["grad_norm"] = grad_norm
        if scale is not None:
            metrics["loss_scale"] = scale
        metrics.update({f"positional/{k}": v for k, v in positional.items()})
        if record:
            self.monitor.record(self.iteration, metrics, "train")

    # --- signals ------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}

        def request_stop(signum: int, _frame: Any) -> None:
            self._stop_signal = signum

        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[signum] = signal.signal(signum, request_stop)
            except ValueError:  # not the main thread
                pass
        return previous

    def _restore_signal_handlers(self, previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def close(self) -> None:
        """Release the engine and the loggers (call before tearing down the process group)."""
        self.monitor.close()
        self.engine = None
        self.optimizer = None


def run_training(cfg: Any, *, config_files: list[str] | None = None, trust_checkpoint: bool = False) -> TrainResult:
    """Initialise the process groups, train ``cfg`` to the end, and tear everything down.

    ``trust_checkpoint`` (``--trust-checkpoint``) lets ``load`` read pickles that need globals
    outside the safe allowlist (they can run code: only for files from a trusted source).
    """
    parallel = init_distributed(cfg.parallelism.model_parallel_size, cfg.parallelism.pipe_parallel_size)
    trainer = None
    try:
        cfg.resolve_batch(parallel.world_size)
        trainer = Trainer(cfg, parallel, config_files=config_files, trust_checkpoint=trust_checkpoint)
        return trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
        del trainer
        teardown(parallel)
