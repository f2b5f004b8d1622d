"""The training loop on a DeepSpeed engine.

:class:`Trainer` owns one run: datasets, model, optimizer, the NeoX LR schedule, the DeepSpeed
engine, checkpoints and metrics. ``run_training(cfg)`` wraps it with process-group set-up and
teardown; ``train.py`` is a thin caller of that.

Order of set-up matters for exactness: weights are loaded *before* ``deepspeed.initialize`` so that
the fp32 master copies DeepSpeed makes (bf16, ZeRO) start from the checkpoint; optimizer,
scheduler, RNG and data position are restored after it.

With ``pipe_parallel_size > 1`` the loaded whole model becomes this rank's stages
(:func:`kerple.parallel.pipeline.build_pipeline`) before the optimizer is built, DeepSpeed returns
its pipeline engine, and a step is ``engine.train_batch`` over ``gradient_accumulation_steps``
micro-batches. Checkpoints keep the reference layout (each stage writes its own layer files).

ZeRO stage 3 (non-pipeline, ``model_parallel_size: 1``) partitions the parameters themselves over
the data-parallel ranks. Parameters read outside their own module's ``forward`` (the shared
positional parameters behind the distance tables, the LM-head weight) are registered as external
parameters of the model so DeepSpeed gathers them for its forward and backward (DeepSpeed 0.19 would
also gather them on first attribute access; the explicit registration is its documented route and
does not depend on that fallback); saving gathers every
parameter so the layer files hold the full weights, and the optimizer shards are written per rank
as for ZeRO 1/2.
"""

from __future__ import annotations

import math
import random
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerple.checkpoint import load_model_weights as load_checkpoint_weights
from kerple.parallel.groups import ParallelState, init_distributed, teardown
from kerple.training import checkpoint as ckpt
from kerple.training.batches import BatchFeed
from kerple.training.ds_config import deepspeed_config
from kerple.training import loss as loss_module
from kerple.training.loss import LanguageModelLoss
from kerple.training.monitor import Monitor, progress_line
from kerple.model import maybe_compile
from kerple.training.optimizer import build_optimizer
from kerple.training.run_state import architecture_args, capture_rng, check_architecture, restore_rng
from kerple.training.schedule import AnnealingLR
from kerple.training.summary import parameter_count, startup_summary


class TrainingError(RuntimeError):
    """A run that cannot start or must stop; the message says why and what to change."""


class TrainingDivergedError(TrainingError):
    """The loss became NaN or infinite; nothing was saved for that step."""


@dataclass
class TrainResult:
    """What a run did: the final iteration, per-step mean losses, validation losses, and why it stopped."""

    iteration: int
    losses: list[tuple[int, float]] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    status: str = "finished"  # "finished" | "interrupted"
    skipped_steps: int = 0
    last_checkpoint: Path | None = None


@dataclass
class LoadedRun:
    """A checkpoint whose weights were loaded: its record, and what of the run can be resumed.

    ``meta``: the ``mp_rank_MM_model_states.pt`` record of this rank (this project's format), or
    only ``{"iteration": N}`` for a reference checkpoint. ``optimizer_resumable``: this project's
    format saved with this run's model- and pipeline-parallel sizes (optimizer shards fit this rank).
    """

    directory: Path
    meta: dict[str, Any]
    own_format: bool
    optimizer_resumable: bool


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
        self._stop_signal: int | None = None

        self._seed(int(cfg.training.seed))
        self.train_feed, self.valid_feed = self._build_data()
        self.model = self._build_model()
        resumed = self._load_weights()
        self.parameters_total = parameter_count(self.model)
        if self.pipelined:
            self.model = self._build_pipeline(self.model)
        else:
            maybe_compile(self.model, cfg)  # per-layer torch.compile when `compile: true`
        self.optimizer = build_optimizer(self.model, cfg.optimizer, fused=self.parallel.device.type == "cuda")
        decay_iters = cfg.lr_schedule.lr_decay_iters or max(self.train_iters, 1)
        self.scheduler = AnnealingLR(
            self.optimizer,
            lr=cfg.optimizer.lr,
            warmup=cfg.lr_schedule.warmup,
            decay_iters=decay_iters,
            style=cfg.lr_schedule.lr_decay_style,
            min_lr=cfg.lr_schedule.min_lr,
        )
        self.engine = self._initialize_engine()
        if resumed is not None:
            self._restore_training_state(resumed)
        self.monitor = Monitor(
            enabled=parallel.is_main,
            log_dir=cfg.logging.log_dir,
            tensorboard_dir=cfg.logging.tensorboard_dir if cfg.logging.use_tensorboard is not False else None,
            use_wandb=bool(cfg.logging.use_wandb),
            wandb_project=cfg.logging.wandb_project,
            run_config=cfg.to_dict() if hasattr(cfg, "to_dict") else None,
        )
        self.monitor.print(
            startup_summary(
                cfg,
                parameters=self.parameters_total,
                parallel=parallel,
                start_iteration=self.iteration,
                resumed_from=str(resumed.directory) if resumed is not None else None,
            )
        )

    # --- set-up -------------------------------------------------------------------------------
    @property
    def pipelined(self) -> bool:
        return max(int(self.cfg.parallelism.pipe_parallel_size), 1) > 1

    def _check_supported(self) -> None:
        cfg, device = self.cfg, self.parallel.device
        if self.precision == "fp16" and device.type == "cpu":
            raise TrainingError(
                "fp16 training needs a CUDA GPU: DeepSpeed 0.19 rejects fp16 on the CPU accelerator. "
                "On CPU use bf16 ('bf16: {enabled: true}') or fp32 (remove the fp16 block)."
            )
        if self.pipelined:
            pipe = int(cfg.parallelism.pipe_parallel_size)
            if int(cfg.parallelism.model_parallel_size) > 1:
                raise TrainingError(
                    "tensor and pipeline parallelism together (model_parallel_size > 1 with pipe_parallel_size > 1) "
                    "are not supported; use one of them."
                )
            if int(cfg.parallelism.zero_stage) > 1:
                raise TrainingError(
                    "DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only (stage 3 only without pipeline "
                    "parallelism); set zero_optimization.stage: 0 or 1."
                )
            if not cfg.model.no_weight_tying:
                raise TrainingError(
                    "pipeline parallelism needs an untied LM head (no_weight_tying: true): the tied head would "
                    "share the word embeddings across the first and last stage."
                )
            if int(cfg.model.num_layers) < pipe:
                raise TrainingError(
                    f"num_layers ({cfg.model.num_layers}) is smaller than pipe_parallel_size ({pipe}); every "
                    "pipeline stage needs at least one transformer layer."
                )
        if int(cfg.parallelism.model_parallel_size) > 1 and int(cfg.parallelism.zero_stage) > 0:
            raise TrainingError(
                "tensor parallelism (model_parallel_size > 1) is supported with ZeRO stage 0 only (the paper's "
                "1.3B setting); set zero_optimization.stage: 0."
            )

    @property
    def zero3(self) -> bool:
        return int(self.cfg.parallelism.zero_stage) == 3

    def _gathered(self, parameters: list[torch.nn.Parameter]) -> Any:
        """Under ZeRO-3, a collective context in which ``parameters`` hold their full values (read
        only); otherwise a no-op. Every rank must enter it."""
        if not self.zero3:
            return nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(parameters, modifier_rank=None)

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)

    def _build_data(self) -> tuple[BatchFeed, BatchFeed | None]:
        from kerple.data.gpt2_dataset import build_datasets_from_config, neox_num_samples

        cfg, parallel = self.cfg, self.parallel
        global_batch = self.micro * self.accumulation * parallel.data_parallel_size
        num_samples = neox_num_samples(
            self.train_iters, global_batch, int(cfg.training.eval_interval), int(cfg.training.eval_iters)
        )
        # rank 0 builds (and caches) the index maps first; the others then read the cache
        if parallel.is_main:
            datasets = build_datasets_from_config(cfg, num_samples)
        parallel.barrier()
        if not parallel.is_main:
            datasets = build_datasets_from_config(cfg, num_samples)
        if datasets.train is None and self.train_iters > 0:
            raise TrainingError(f"the training split of {cfg.data.data_path} is empty; check 'split' and 'data_path'")
        eod = self._eod_token() if cfg.data.eod_mask_loss else None
        feeds = [
            None
            if dataset is None
            else BatchFeed(
                dataset, self.micro, self.accumulation, parallel.data_parallel_size,
                parallel.data_parallel_rank, parallel.device, eod,
            )
            for dataset in (datasets.train, datasets.valid)
        ]
        if feeds[0] is not None:
            feeds[0].check_length(num_samples[0], "training")
        return feeds[0], feeds[1]

    def _eod_token(self) -> int:
        from kerple.data.tokenizers import build_tokenizer

        data = self.cfg.data
        return build_tokenizer(data.tokenizer_type, data.vocab_file, data.merge_file, data.tokenizer_file).eod

    def _build_model(self) -> torch.nn.Module:
        from kerple.model import build_model

        model = build_model(self.cfg)
        if self.parallel.model_parallel_size > 1:
            from kerple.parallel.tensor_parallel import parallelize

            model = parallelize(model, self.cfg, self.parallel)  # built whole, then this rank's slice kept
        return model

    def _load_weights(self) -> LoadedRun | None:
        """Load weights from ``checkpointing.load`` (if it holds a checkpoint); say what can be resumed.

        Weights of any checkpoint are read by :mod:`kerple.checkpoint` (merged over the saved
        model-parallel ranks and re-split to this run's); the architecture is checked against the
        config. Optimizer, RNG and data position are resumed only from this project's own format
        saved with the same model-parallel size; a GPT-NeoX / KERPLE reference checkpoint (or one
        with another model-parallel size) gives weights and the iteration, with a fresh optimizer.
        """
        load = self.cfg.checkpointing.load
        if not load:
            return None
        resolved = ckpt.resolve_checkpoint(load)
        if resolved is None:
            self.parallel.barrier()
            return None
        directory, _ = resolved
        parallel, trust = self.parallel, self.trust_checkpoint
        meta = ckpt.safe_load(directory / ckpt.mp_rank_file_name(0), trust=trust)
        meta = meta if isinstance(meta, dict) else {}
        own_format = "kerple_checkpoint_format" in meta
        same_split = (
            own_format
            and int(meta.get("mp_world_size", 1)) == parallel.model_parallel_size
            and int(meta.get("pipe_world_size", 1)) == parallel.pipe_parallel_size
        )
        if own_format:
            check_architecture(meta.get("args"), architecture_args(self.cfg), directory, ignore=("model_parallel_size",))
        iteration = load_checkpoint_weights(
            self.model,
            directory,
            cfg=None if own_format else self.cfg,
            trust=trust,
            model_parallel_size=parallel.model_parallel_size,
            model_parallel_rank=parallel.model_parallel_rank,
        )
        if same_split and (parallel.model_parallel_rank != 0 or parallel.pipe_parallel_rank != 0):
            record = ckpt.mp_rank_file_name(parallel.model_parallel_rank, parallel.pipe_parallel_rank)
            meta = ckpt.safe_load(directory / record, trust=trust)
        if not own_format:
            meta = {"iteration": iteration}
        return LoadedRun(directory, meta, own_format=own_format, optimizer_resumable=same_split)

    def _build_pipeline(self, model: torch.nn.Module) -> torch.nn.Module:
        """This rank's pipeline stages of the whole (loaded) ``model`` (:mod:`kerple.parallel.pipeline`)."""
        from kerple.parallel.pipeline import build_pipeline

        return build_pipeline(model, self.parallel.pipe_parallel_size, loss_module.cross_entropy)

    def _initialize_engine(self) -> Any:
        import deepspeed

        ds_config = deepspeed_config(self.cfg, data_parallel_size=self.parallel.data_parallel_size)
        self.model.to(self.parallel.device)
        if self.pipelined:  # DeepSpeed returns its PipelineEngine and takes the groups from the module
            engine, _, _, _ = deepspeed.initialize(
                model=self.model,
                optimizer=self.optimizer,
                lr_scheduler=self.scheduler,
                config=ds_config,
                dist_init_required=False,
            )
            return engine
        if self.zero3:
            self._register_external_parameters()
        loss_fn = loss_module.cross_entropy
        if self.parallel.model_parallel_size > 1:
            from kerple.parallel.tensor_parallel import vocab_parallel_loss

            loss_fn = vocab_parallel_loss  # the LM head's logits are split by vocabulary
        engine, _, _, _ = deepspeed.initialize(
            model=LanguageModelLoss(self.model, loss_fn),
            optimizer=self.optimizer,
            lr_scheduler=self.scheduler,
            config=ds_config,
            mpu=self.parallel if self.parallel.model_parallel_size > 1 else None,
            dist_init_required=False,
        )
        return engine

    def _register_external_parameters(self) -> None:
        """ZeRO-3 gathers a module's own parameters around its ``forward``; the model's forward also
        reads the shared positional parameters (distance tables) and the LM-head weight directly, so
        they are registered with ``deepspeed.zero.register_external_parameter`` on the model."""
        import deepspeed

        model = self.model
        external = list(model.positional.parameters()) + [model.lm_head_weight]
        for parameter in {id(p): p for p in external}.values():
            deepspeed.zero.register_external_parameter(model, parameter)

    def _restore_training_state(self, loaded: LoadedRun) -> None:
        ck, meta, directory = self.cfg.checkpointing, loaded.meta, loaded.directory
        if ck.finetune:  # weights only: step count, optimizer, schedule and data start afresh
            return
        global_batch = self.micro * self.accumulation * self.parallel.data_parallel_size
        self.iteration = int(meta.get("iteration", 0))
        self.consumed_train_samples = int(meta.get("consumed_train_samples", self.iteration * global_batch))
        self.skipped_steps = int(meta.get("skipped_steps", 0))
        optimizer = self.engine.optimizer
        if not ck.no_load_optim and loaded.optimizer_resumable:
            if meta.get("optimizer_sharded"):
                mp_rank, pipe_rank = self.parallel.model_parallel_rank, self.parallel.pipe_parallel_rank
                files = [
                    directory / ckpt.optimizer_shard_file_name(dp, mp_rank, pipe_rank)
                    for dp in range(self.parallel.data_parallel_size)
                ]
                saved_dp = int(meta.get("dp_world_size", len(files)))
                if saved_dp != self.parallel.data_parallel_size:
                    raise ckpt.CheckpointError(
                        f"{directory} holds optimizer shards of {saved_dp} data-parallel ranks but this run has "
                        f"{self.parallel.data_parallel_size}; resume with the same number of processes or set no_load_optim"
                    )
                shards = [ckpt.safe_load(f, trust=self.trust_checkpoint)["optimizer_state_dict"] for f in files]
                if hasattr(optimizer, "checkpoint_event_prologue"):  # ZeRO-3, as the engine's own loader does
                    optimizer.checkpoint_event_prologue()
                optimizer.load_state_dict(shards, load_optimizer_states=True, load_from_fp32_weights=True)
                if hasattr(optimizer, "checkpoint_event_epilogue"):
                    optimizer.checkpoint_event_epilogue()
            elif meta.get("optimizer") is not None:
                optimizer.load_state_dict(meta["optimizer"])
        elif not loaded.optimizer_resumable and self.parallel.is_main:
            kind = "the reference format"
            if loaded.own_format:
                kind = "a model- or pipeline-parallel size other than this run's"
            print(f"note: {directory} is in {kind}; weights and iteration loaded, optimizer state starts fresh", flush=True)
        if meta.get("lr_scheduler") is not None and not ck.no_load_optim:
            self.scheduler.load_state_dict(meta["lr_scheduler"])
        else:
            self.scheduler.step(self.iteration)
        if not ck.no_load_rng and loaded.own_format:
            restore_rng(meta)
        self.engine.global_steps = self.iteration
        self.engine.global_samples = self.consumed_train_samples
        self.engine.skipped_steps = self.skipped_steps

    # --- one step -----------------------------------------------------------------------------
    def train_step(self) -> float:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches; returns the mean loss.

        Raises :class:`TrainingDivergedError` (on every rank) when the loss is not finite outside
        fp16 (where DeepSpeed's loss scaler skips the step instead and the skip is counted).
        """
        assert self.train_feed is not None
        self.engine.train()
        skipped_before = self.engine.skipped_steps
        if self.pipelined:
            # the first and the last stage each read the micro-batches (tokens, labels); the loss
            # comes back averaged over micro-batches and data-parallel ranks, on every stage
            batches = (self.train_feed.micro_batch(self.consumed_train_samples, m) for m in range(self.accumulation))
            mean_loss = float(self.engine.train_batch(batches).item())
        else:
            losses = []
            for micro_step in range(self.accumulation):
                tokens, labels = self.train_feed.micro_batch(self.consumed_train_samples, micro_step)
                loss = self.engine(tokens, labels)
                self.engine.backward(loss)
                self.engine.step()
                losses.append(loss.detach().float().item())
            mean_loss = self.parallel.mean_over_data_parallel(sum(losses) / len(losses))
        self.iteration += 1
        self.consumed_train_samples += self.train_feed.global_batch
        self.skipped_steps += self.engine.skipped_steps - skipped_before
        if self.parallel.any_rank(not math.isfinite(mean_loss)) and self.precision != "fp16":
            raise TrainingDivergedError(
                f"loss is {mean_loss} at step {self.iteration} ({self.precision}); stopping without saving. "
                "Lower the learning rate, raise warmup, or check the data; the last good checkpoint is "
                f"in {self.cfg.checkpointing.save or '(saving disabled)'}."
            )
        return mean_loss

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
        client_state: dict[str, Any] = {
            "iteration": self.iteration,
            "args": architecture_args(self.cfg),
            "lr_scheduler": self.scheduler.state_dict(),
            "global_steps": self.iteration,
            "global_samples": self.consumed_train_samples,
            "consumed_train_samples": self.consumed_train_samples,
            "data_position": {"consumed_train_samples": self.consumed_train_samples, "seed": int(self.cfg.training.seed)},
            "skipped_steps": self.skipped_steps,
            "ds_version": ckpt.deepspeed_version(),
        }
        if not ck.no_save_rng:
            client_state.update(capture_rng())
        optimizer = None if ck.no_save_optim else self.engine.optimizer
        model_state = None
        if self.zero3:  # gather the partitioned parameters (collective) and copy them whole
            with self._gathered(list(self.model.parameters())):
                if self.parallel.data_parallel_rank == 0:
                    model_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        return ckpt.save_checkpoint(
            ck.save,
            iteration=self.iteration,
            module=self.model,
            model_state=model_state,
            optimizer=optimizer,
            client_state=client_state,
            parallel=self.parallel,
            write_configs=self._write_configs,
            keep_last_n=ck.keep_last_n_checkpoints,
        )

    def _write_configs(self, directory: Path) -> None:
        for source in self.config_files:
            path = Path(source)
            if path.is_file():
                (directory / path.name).write_text(path.read_text())
        if hasattr(self.cfg, "save_yaml"):
            self.cfg.save_yaml(directory / "resolved.yml")

    # --- the loop -----------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Train to ``train_iters``; evaluate every ``eval_interval``; save every ``save_interval``
        and at the end; on SIGTERM/SIGINT finish the current step, save and return."""
        cfg = self.cfg
        result = TrainResult(iteration=self.iteration)
        log_interval = int(cfg.logging.log_interval)
        eval_interval = int(cfg.training.eval_interval)
        save_interval = int(cfg.checkpointing.save_interval)
        tokens_per_step = self.micro * self.accumulation * self.parallel.data_parallel_size * int(cfg.model.seq_length)
        previous = self._install_signal_handlers()
        last_saved = None
        try:
            window_start, window_steps, elapsed_total, steps_total = time.perf_counter(), 0, 0.0, 0
            while self.iteration < self.train_iters:
                lr = self.optimizer.param_groups[0]["lr"]
                step_start = time.perf_counter()
                loss = self.train_step()
                step_time = time.perf_counter() - step_start
                elapsed_total, steps_total = elapsed_total + step_time, steps_total + 1
                window_steps += 1
                result.losses.append((self.iteration, loss))
                if self.iteration % log_interval == 0 or self.iteration == self.train_iters:
                    window = (time.perf_counter() - window_start) / window_steps
                    self._log_progress(loss, lr, tokens_per_step, window, elapsed_total / steps_total)
                    window_start, window_steps = time.perf_counter(), 0
                if eval_interval and self.iteration % eval_interval == 0:
                    self._run_eval(result)
                stop = self.parallel.any_rank(self._stop_signal is not None)
                if stop or (self.iteration % save_interval == 0):
                    last_saved = self.save() or last_saved
                if stop:
                    self.monitor.print(f"received signal; saved at step {self.iteration} and stopping cleanly")
                    result.status = "interrupted"
                    break
            if result.status == "finished":
                if self.train_iters > 0 and (not eval_interval or self.iteration % eval_interval != 0):
                    self._run_eval(result)
                elif self.train_iters == 0:
                    self._run_eval(result)
                if self.train_iters > 0 and (last_saved is None or last_saved.name != ckpt.tag_for(self.iteration)):
                    last_saved = self.save() or last_saved
        finally:
            self._restore_signal_handlers(previous)
        result.iteration = self.iteration
        result.skipped_steps = self.skipped_steps
        result.last_checkpoint = last_saved
        return result

    def _run_eval(self, result: TrainResult) -> None:
        value = self.evaluate()
        if value is None:
            return
        result.eval_losses.append((self.iteration, value))
        ppl = math.exp(min(value, 50.0))
        self.monitor.print(f"validation at step {self.iteration}: lm_loss {value:.6f} | ppl {ppl:.3f}")
        self.monitor.record(self.iteration, {"lm_loss": value, "lm_loss_ppl": ppl}, "validation")

    def _log_progress(self, loss: float, lr: float, tokens_per_step: int, step_time: float, mean_time: float) -> None:
        positional = {}
        if hasattr(self.model, "positional"):
            with self._gathered(list(self.model.positional.parameters())):
                positional = self.model.positional.metrics()
        grad_norm = self.engine.get_global_grad_norm() if hasattr(self.engine, "get_global_grad_norm") else None
        grad_norm = float(grad_norm) if grad_norm is not None else None
        tokens_per_s = tokens_per_step / step_time if step_time > 0 else float("nan")
        eta = mean_time * (self.train_iters - self.iteration)
        self.monitor.print(
            progress_line(
                step=self.iteration, total=self.train_iters, loss=loss, lr=lr, tokens_per_s=tokens_per_s,
                step_time=step_time, eta=eta, skipped=self.skipped_steps, grad_norm=grad_norm,
                positional=positional,
            )
        )
        metrics = {"lm_loss": loss, "learning_rate": lr, "tokens_per_s": tokens_per_s, "step_time_s": step_time,
                   "skipped_steps": float(self.skipped_steps),
                   "consumed_samples": float(self.consumed_train_samples)}
        if grad_norm is not None:
            metrics["grad_norm"] = grad_norm
        metrics.update({f"positional/{k}": v for k, v in positional.items()})
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
        if hasattr(cfg, "resolve_batch"):
            cfg.resolve_batch(parallel.world_size)
        trainer = Trainer(cfg, parallel, config_files=config_files, trust_checkpoint=trust_checkpoint)
        return trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
        del trainer
        teardown(parallel)
