"""The :class:`Config` object: thirteen typed sections plus where each value came from."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from kerple.atomic import atomic_path
from kerple.config import messages, validate
from kerple.config.errors import DEFAULT, SOURCES_COMMENT, ConfigError
from kerple.config.neox_keys import DERIVED_KEYS, FIELDS, FREE_BLOCKS, KEY_INDEX, field_default, key_of, normalize_key
from kerple.config.sections import (
    AttentionConfig,
    CheckpointingConfig,
    DataConfig,
    DeepSpeedConfig,
    LoggingConfig,
    LRScheduleConfig,
    ModelConfig,
    NeoXOnlyConfig,
    OptimizerConfig,
    ParallelismConfig,
    PositionalConfig,
    PrecisionConfig,
    TrainingConfig,
)


@dataclass
class Config:
    """A validated run configuration (see ``docs/config.md`` for every key).

    Built by :func:`kerple.config.load_config`; constructing one directly also derives and
    validates (``Config()`` is the all-defaults config). ``sources`` maps a field identity
    (``"model.hidden_size"``, or ``"zero_optimization.<key>"``) to ``(file, key as written)``
    for the fields that some file or override set.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    positional: PositionalConfig = field(default_factory=PositionalConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr_schedule: LRScheduleConfig = field(default_factory=LRScheduleConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    neox: NeoXOnlyConfig = field(default_factory=NeoXOnlyConfig)
    sources: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate.finalize(self)

    def provenance(self, ident: str) -> tuple[str, str]:
        """``(file, key as written)`` for a field identity; ``("<default>", key)`` when unset."""
        return self.sources.get(ident, (DEFAULT, key_of(ident)))

    def source(self, key: str) -> str:
        """The file (or ``"<command line>"``/``"<default>"``) that set ``key`` (any spelling)."""
        path = ".".join(normalize_key(part) for part in key.split("."))
        ref = KEY_INDEX.get(path) or DERIVED_KEYS.get(path)
        if ref is not None:
            return self.provenance(ref.ident)[0]
        if path.startswith(tuple(f"{block}." for block in FREE_BLOCKS)):
            return self.provenance(path)[0]
        raise KeyError(f"unknown config key {key!r}")

    def resolve_batch(self, world_size: int) -> Config:
        """Fill and check the batch triple for ``world_size`` processes; returns ``self``.

        ``data_parallel_size = world_size / (max(pipe_parallel_size, 1) * model_parallel_size)``
        and ``train_batch_size = micro_batch_size * gradient_accumulation_steps *
        data_parallel_size``. Any two of the triple determine the third; ``train_batch_size`` or
        ``micro_batch_size`` alone implies ``gradient_accumulation_steps = 1``. Also sets
        ``parallelism.world_size`` and ``parallelism.data_parallel_size``. First refuses a
        parallel layout the trainer cannot run (:func:`kerple.config.validate.check_parallel_layout`).
        """
        validate.check_parallel_layout(self)
        parallel, training = self.parallelism, self.training
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        per_replica_ranks = max(parallel.pipe_parallel_size, 1) * parallel.model_parallel_size
        if world_size % per_replica_ranks:
            raise messages.fail(
                self,
                f"{world_size} process(es) cannot be split into replicas of max(pipe_parallel_size, 1) x "
                f"model_parallel_size = {per_replica_ranks} processes; launch a multiple of {per_replica_ranks} "
                f"(deepy.py train.py ... --num_gpus {per_replica_ranks}) or lower these sizes",
                "parallelism.pipe_parallel_size",
                "parallelism.model_parallel_size",
            )
        dp = world_size // per_replica_ranks
        micro, accumulation, total = self._batch_triple(dp, world_size)
        training.micro_batch_size, training.gradient_accumulation_steps, training.train_batch_size = (
            micro,
            accumulation,
            total,
        )
        parallel.world_size, parallel.data_parallel_size = world_size, dp
        return self

    def _batch_triple(self, dp: int, world_size: int) -> tuple[int, int, int]:
        """``(micro_batch_size, gradient_accumulation_steps, train_batch_size)`` completed from the
        ones the config sets, for ``dp`` data-parallel replicas; :class:`ConfigError` when they
        do not fit or do not determine the batch."""
        training = self.training
        micro, accumulation, total = training.micro_batch_size, training.gradient_accumulation_steps, training.train_batch_size
        batch_keys = ("training.train_batch_size", "training.micro_batch_size", "training.gradient_accumulation_steps")

        def inconsistent(detail: str) -> ConfigError:
            given = [ident for ident, value in zip(batch_keys, (total, micro, accumulation)) if value is not None]
            return messages.fail(
                self,
                f"batch sizes do not fit: train_batch_size = micro_batch_size x gradient_accumulation_steps x "
                f"data_parallel_size, with data_parallel_size = {dp} ({world_size} processes); {detail}",
                *given,
            )

        if micro is not None and accumulation is not None:
            if total is not None and total != micro * accumulation * dp:
                raise inconsistent(f"{micro} x {accumulation} x {dp} = {micro * accumulation * dp}, not {total}")
            return micro, accumulation, micro * accumulation * dp
        if total is not None and (micro is not None or accumulation is not None):
            known = micro if micro is not None else accumulation
            if total % (known * dp):
                raise inconsistent(f"{total} is not divisible by {known} x {dp}")
            missing = total // (known * dp)
            return (micro, missing, total) if micro is not None else (missing, accumulation, total)
        if total is not None:
            if total % dp:
                raise inconsistent(f"{total} is not divisible by {dp}")
            return total // dp, 1, total
        if micro is not None:
            return micro, 1, micro * dp
        culprit = "training.gradient_accumulation_steps" if accumulation is not None else "training.micro_batch_size"
        raise messages.fail(
            self,
            "set train_micro_batch_size_per_gpu (micro_batch_size) or train_batch_size; "
            "gradient_accumulation_steps alone does not determine the batch",
            culprit,
        )

    def check_eval_length(self, length: int) -> None:
        """Raise :class:`ConfigError` if the model cannot be evaluated on ``length`` tokens.

        A learned absolute embedding has no rows beyond ``max_position_embeddings``; an embedding may refuse
        positions its factors cannot reach in the run's precision (xPos: :func:`validate.length_problem`).
        """
        if length < 1:
            raise ConfigError(f"evaluation length must be positive, got {length}", key="seq_length_val")
        limit = self.model.max_position_embeddings
        if validate.is_learned_absolute(messages.positional_family(self)) and length > limit:
            raise messages.fail(
                self,
                f"cannot evaluate {length} tokens: {messages.described(self, 'positional.pos_emb', self.positional.pos_emb)} "
                f"is a learned table with {messages.described(self, 'model.max_position_embeddings', limit)} rows; "
                "use an embedding that extrapolates or a length within the table",
                "model.max_position_embeddings",
                "positional.pos_emb",
            )
        too_long = validate.length_problem(self, length)
        if too_long is not None:
            raise too_long

    def to_dict(self) -> dict[str, Any]:
        """Every settable key with its resolved value, keyed as ``docs/config.md`` lists them.

        Flat underscore keys, except the DeepSpeed blocks (``optimizer``, ``fp16``, ``bf16``,
        ``zero_optimization``, ...), which keep their nested form. Derived values are left out
        (they are recomputed on load), and so are keys without effect in kerple that still hold
        their default; a YAML dump of the result loads back to an equal config.
        """
        out: dict[str, Any] = {}
        for ref in FIELDS:
            if ref.metadata["derived"]:
                continue
            value = copy.deepcopy(getattr(getattr(self, ref.section), ref.name))
            if not ref.metadata["effect"] and value == field_default(ref):
                continue
            *parents, leaf = ref.primary.split(".")
            target = out
            for parent in parents:
                target = target.setdefault(parent, {})
            target[leaf] = value
        return out

    def derived(self) -> dict[str, Any]:
        """The derived values by key (``padded_vocab_size``, ``head_dim``, ``zero_stage``, ...)."""
        return {key: getattr(getattr(self, ref.section), ref.name) for key, ref in DERIVED_KEYS.items()}

    def save_yaml(self, path: str | os.PathLike, *, sources: bool = False) -> None:
        """Write :meth:`to_dict` as YAML to ``path`` atomically (temporary file, then rename). With
        ``sources``, a first comment line records where each value came from (the file and the key as
        written there), so that errors of a command reading this file name the user's files
        (``deepy.py``'s resolved config: :data:`kerple.config.loader.SOURCES_COMMENT`)."""
        with atomic_path(path) as temporary:
            with open(temporary, "w", encoding="utf-8") as stream:
                if sources:
                    stream.write(SOURCES_COMMENT + json.dumps(self.sources, separators=(",", ":")) + "\n")
                yaml.safe_dump(self.to_dict(), stream, sort_keys=False, default_flow_style=False)

