"""Derived values and cross-key validation, run once when a :class:`~kerple.config.Config` is built.

The checks ask the registries what they support: the positional registry (:mod:`kerple.positional`)
for an embedding's kind, the model-family registry (:mod:`kerple.model.families`) for a family's
capabilities, and :func:`kerple.model.attention.unsupported_reason` for what a kernel can serve.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kerple import positional as positional_registry
from kerple.config import neox_checks
from kerple.config.errors import ConfigError
from kerple.config.messages import described, fail, positional_family
from kerple.config.neox_keys import FIELDS
from kerple.data.tokenizers import tokenizer_vocab_size
from kerple.errors import did_you_mean
from kerple.model import families
from kerple.model.attention import unsupported_reason
from kerple.positional.base import ModelShape

if TYPE_CHECKING:
    from kerple.config.config import Config

OPTIMIZER_TYPES = ("adam", "adamw")
"""Accepted ``optimizer.type`` values (case-insensitive); both run the decoupled AdamW update."""

_BF16_NAMES = ("bf16", "bfloat16")
_FP16_NAMES = ("fp16", "float16")


def model_shape(cfg: Config) -> ModelShape:
    """The :class:`~kerple.positional.ModelShape` of ``cfg``'s model, whole (no tensor-parallel slice)."""
    model = cfg.model
    return ModelShape(
        num_heads=model.num_attention_heads, head_dim=model.head_dim, hidden_size=model.hidden_size,
        max_positions=model.max_position_embeddings, num_layers=model.num_layers,
    )


def compute_dtype(cfg: Config) -> Any:
    """The ``torch`` dtype the model computes in under ``cfg``'s precision (``float32`` unless bf16 or fp16)."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision.precision, torch.float32)


def length_problem(cfg: Config, length: int) -> ConfigError | None:
    """The error for a positional embedding that cannot compute ``length`` positions in ``cfg``'s precision
    (:meth:`~kerple.positional.PositionalEmbedding.length_problem`), naming ``pos_emb`` and, in fp16, ``fp16``."""
    problem = positional_registry.length_problem(
        cfg.positional.pos_emb, cfg.positional.options(), model_shape(cfg), length, compute_dtype(cfg)
    )
    if problem is None:
        return None
    fp16 = ("precision.fp16_enabled",) if cfg.precision.precision == "fp16" else ()
    return fail(cfg, problem, "positional.pos_emb", *fp16)


def device_type() -> str:
    """``"cuda"`` when a CUDA device is visible, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def finalize(cfg: Config) -> None:
    """Fill the derived values of ``cfg`` and check every field and cross-key rule (idempotent)."""
    _field_checks(cfg)
    _parallelism(cfg)
    _model(cfg)
    _positional(cfg)
    _attention(cfg)
    _optimizer(cfg)
    _lr_schedule(cfg)
    _precision(cfg)
    _train_length(cfg)
    _data(cfg)
    _training(cfg)
    _logging(cfg)
    neox_checks.check(cfg)


def _field_checks(cfg: Config) -> None:
    """The ``check`` rule of every field that declares one (``setting(check=...)``)."""
    for ref in FIELDS:
        check = ref.metadata["check"]
        value = getattr(getattr(cfg, ref.section), ref.name)
        if check is not None and value is not None:
            problem = check(value)
            if problem:
                raise fail(cfg, f"{problem}, got {value}", ref.ident)


def _parallelism(cfg: Config) -> None:
    stage = cfg.parallelism.zero_optimization.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError(
            f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}",
            file=cfg.provenance("zero_optimization.stage")[0],
            key="zero_optimization.stage",
        )
    cfg.parallelism.zero_stage = stage


def check_parallel_layout(cfg: Config) -> None:
    """Refuse the parallel layouts the trainer cannot run (called by :meth:`Config.resolve_batch`,
    i.e. when a training run fixes its layout). A config that only describes a model, such as
    GPT-NeoX's 20B with pipeline and tensor parallelism together, still loads for evaluation and
    conversion."""
    _pipeline_combinations(cfg)
    stage = cfg.parallelism.zero_stage
    if cfg.parallelism.model_parallel_size > 1 and stage > 0:
        raise fail(
            cfg,
            f"tensor parallelism ({described(cfg, 'parallelism.model_parallel_size', cfg.parallelism.model_parallel_size)}) "
            f"is supported with ZeRO stage 0 only (the paper's 1.3B setting), not "
            f"{described(cfg, 'zero_optimization.stage', stage)}; set zero_optimization.stage: 0",
            "parallelism.model_parallel_size",
            "zero_optimization.stage",
        )


def _pipeline_combinations(cfg: Config) -> None:
    """What DeepSpeed's pipeline engine and this project's stage split support."""
    stages = cfg.parallelism.pipe_parallel_size
    if stages <= 1:
        return
    pipe = described(cfg, "parallelism.pipe_parallel_size", stages)
    if cfg.parallelism.model_parallel_size > 1:
        raise fail(
            cfg,
            f"tensor and pipeline parallelism together ({pipe}, "
            f"{described(cfg, 'parallelism.model_parallel_size', cfg.parallelism.model_parallel_size)}) "
            "are not supported; use one of them",
            "parallelism.pipe_parallel_size",
            "parallelism.model_parallel_size",
        )
    if cfg.parallelism.zero_stage > 1:
        raise fail(
            cfg,
            f"DeepSpeed's pipeline engine ({pipe}) supports ZeRO stage 0 or 1 only, not "
            f"{described(cfg, 'zero_optimization.stage', cfg.parallelism.zero_stage)}; "
            "set zero_optimization.stage: 0 or 1",
            "parallelism.pipe_parallel_size",
            "zero_optimization.stage",
        )
    if not cfg.model.no_weight_tying:
        raise fail(
            cfg,
            f"pipeline parallelism ({pipe}) needs an untied LM head: a tied head would share the word "
            "embeddings across the first and last stage; set no_weight_tying: true",
            "parallelism.pipe_parallel_size",
            "model.no_weight_tying",
        )
    if cfg.model.num_layers < stages:
        raise fail(
            cfg,
            f"{described(cfg, 'model.num_layers', cfg.model.num_layers)} is smaller than {pipe}: every "
            "pipeline stage needs at least one transformer layer",
            "model.num_layers",
            "parallelism.pipe_parallel_size",
        )


def _model(cfg: Config) -> None:
    model = cfg.model
    if model.hidden_size % model.num_attention_heads:
        raise fail(
            cfg,
            f"{described(cfg, 'model.hidden_size', model.hidden_size)} is not divisible by "
            f"{described(cfg, 'model.num_attention_heads', model.num_attention_heads)}; "
            "choose a head count that divides the width",
            "model.hidden_size",
            "model.num_attention_heads",
        )
    model.head_dim = model.hidden_size // model.num_attention_heads
    tensor_parallel = cfg.parallelism.model_parallel_size
    if model.num_attention_heads % tensor_parallel:
        raise fail(
            cfg,
            f"{described(cfg, 'parallelism.model_parallel_size', tensor_parallel)} must divide "
            f"{described(cfg, 'model.num_attention_heads', model.num_attention_heads)}: each tensor-parallel rank "
            "holds a whole number of heads; choose a model_parallel_size that divides the head count",
            "parallelism.model_parallel_size",
            "model.num_attention_heads",
        )
    if model.max_position_embeddings is None:
        model.max_position_embeddings = model.seq_length
    if cfg.provenance("model.vocab_size")[0] == "<default>":  # GPT-NeoX sizes its model by the tokenizer
        data = cfg.data
        tokenizer = tokenizer_vocab_size(data.tokenizer_type, data.vocab_file, data.merge_file, data.tokenizer_file)
        model.vocab_size = tokenizer or model.vocab_size
    multiple = model.make_vocab_size_divisible_by * cfg.parallelism.model_parallel_size
    model.padded_vocab_size = math.ceil(model.vocab_size / multiple) * multiple
    _family(cfg)


def _family(cfg: Config) -> None:
    """What the model family (``model.arch``) supports: its positional embedding, parallel layouts,
    attention kernels and window (:class:`kerple.model.family.ModelFamily`)."""
    family = families.family_of(cfg)
    arch = described(cfg, "model.arch", family.name)
    if not family.positional_embedding and cfg.positional.pos_emb != "none":
        raise fail(
            cfg,
            f"{arch} carries its own position information and takes no positional embedding; set pos_emb: none, "
            f"not {cfg.positional.pos_emb!r}",
            "positional.pos_emb",
        )
    for ident, supported in (("parallelism.model_parallel_size", family.tensor_parallel),
                             ("parallelism.pipe_parallel_size", family.pipeline_parallel)):
        size = getattr(cfg.parallelism, ident.split(".")[1])
        if size > 1 and not supported:
            raise fail(cfg, f"{arch} cannot be split over ranks this way; set {ident.split('.')[1]}: 1, not {size}", ident)
    impl = cfg.attention.attention_impl
    if impl not in family.attention_impls:
        raise fail(
            cfg,
            f"{arch} runs attention_impl {', '.join(family.attention_impls)}, not {impl!r}",
            "attention.attention_impl",
        )
    if cfg.attention.attention_window is not None and not family.attention_window:
        raise fail(cfg, f"{arch} takes no attention_window (its attention pattern is its own); remove it",
                   "attention.attention_window")


def is_learned_absolute(family: Any) -> bool:
    """A learned table added at the input: it has no rows beyond max_position_embeddings."""
    return family.kind == "input" and family.learnable


def _positional(cfg: Config) -> None:
    name = cfg.positional.pos_emb
    try:
        cfg.positional.pos_emb = positional_registry.canonical(name)
    except KeyError:
        known = list(positional_registry.names())
        raise fail(
            cfg,
            f"unknown positional embedding {name!r}; {did_you_mean(name, known)}known: {', '.join(known)}",
            "positional.pos_emb",
        ) from None
    if cfg.parallelism.model_parallel_size > 1 and not positional_family(cfg).tensor_parallel:
        raise fail(
            cfg,
            f"{described(cfg, 'positional.pos_emb', cfg.positional.pos_emb)} cannot be split over tensor-parallel "
            "ranks (its term reads tensors shared by all heads, whose gradient a rank would see from its own heads "
            "only); "
            f"set model_parallel_size: 1, not {cfg.parallelism.model_parallel_size}",
            "positional.pos_emb",
            "parallelism.model_parallel_size",
        )
    if is_learned_absolute(positional_family(cfg)) and cfg.model.seq_length > cfg.model.max_position_embeddings:
        raise fail(
            cfg,
            f"{described(cfg, 'model.seq_length', cfg.model.seq_length)} exceeds "
            f"{described(cfg, 'model.max_position_embeddings', cfg.model.max_position_embeddings)}, "
            f"the size of the learned position table ({described(cfg, 'positional.pos_emb', name)})",
            "model.seq_length",
            "model.max_position_embeddings",
        )
    problem = positional_registry.options_problem(cfg.positional.pos_emb, cfg.positional.options(), model_shape(cfg))
    if problem is not None:
        option, message = problem
        raise fail(cfg, message, f"positional.{option}")


def _attention(cfg: Config) -> None:
    neox_checks.attention_layers(cfg)
    if cfg.attention.attention_impl == "auto" or not families.family_of(cfg).positional_embedding:
        return  # auto: resolved per forward; a family without an embedding was checked by _family
    family = positional_family(cfg)
    training = cfg.training.train_iters != 0
    reason = unsupported_reason(cfg.attention.attention_impl, family.kind, device_type(), training)
    if reason:
        mode = "training" if training else "evaluation"
        raise fail(
            cfg,
            f"{described(cfg, 'attention.attention_impl', cfg.attention.attention_impl)} cannot serve "
            f"{described(cfg, 'positional.pos_emb', cfg.positional.pos_emb)} for {mode} on {device_type()}: "
            f"{reason}",
            "attention.attention_impl",
            "positional.pos_emb",
        )
    _kernel_limits(cfg, family, training)


def _kernel_limits(cfg: Config, family: Any, training: bool) -> None:
    """What the fused kernels leave out, refused here rather than at the first forward: attention dropout
    (flex, triton) in training, and a term without distance tables under the kernel that reads only tables."""
    impl = cfg.attention.attention_impl
    if impl == "triton" and family.tableless_term:
        raise fail(
            cfg,
            f"{described(cfg, 'attention.attention_impl', impl)} reads the logit term from distance tables, and "
            f"{described(cfg, 'positional.pos_emb', cfg.positional.pos_emb)} has none (a closed form of the "
            "positions); use attention_impl: flex, sdpa or auto",
            "attention.attention_impl",
            "positional.pos_emb",
        )
    if impl in ("flex", "triton") and training and cfg.model.attention_dropout > 0:
        raise fail(
            cfg,
            f"{described(cfg, 'attention.attention_impl', impl)} does not implement attention dropout, and "
            f"{described(cfg, 'model.attention_dropout', cfg.model.attention_dropout)} asks for it in training; "
            "set attention_dropout: 0 (as the KERPLE paper's models do) or attention_impl: auto",
            "attention.attention_impl",
            "model.attention_dropout",
        )


def _optimizer(cfg: Config) -> None:
    optimizer = cfg.optimizer
    if optimizer.type.lower() not in OPTIMIZER_TYPES:
        raise fail(cfg, f"{optimizer.type!r} is not supported; use one of {', '.join(OPTIMIZER_TYPES)}", "optimizer.type")
    if len(optimizer.betas) != 2 or not all(0.0 <= beta < 1.0 for beta in optimizer.betas):
        raise fail(cfg, f"expected two numbers in [0, 1), got {optimizer.betas!r}", "optimizer.betas")


def _lr_schedule(cfg: Config) -> None:
    schedule = cfg.lr_schedule
    if schedule.lr_decay_iters is None and cfg.training.train_iters > 0:
        fraction = schedule.lr_decay_fraction
        iters = cfg.training.train_iters if fraction is None else math.floor(cfg.training.train_iters * fraction)
        schedule.lr_decay_iters = max(iters, 1)
    if schedule.use_checkpoint_lr_scheduler and schedule.override_lr_scheduler:
        raise fail(
            cfg,
            "both set: the schedule cannot come from the checkpoint and from the config; keep one",
            "lr_schedule.use_checkpoint_lr_scheduler",
            "lr_schedule.override_lr_scheduler",
        )
    if schedule.min_lr > cfg.optimizer.lr:
        raise fail(
            cfg,
            f"{described(cfg, 'lr_schedule.min_lr', schedule.min_lr)} is above "
            f"{described(cfg, 'optimizer.lr', cfg.optimizer.lr)}",
            "lr_schedule.min_lr",
            "optimizer.lr",
        )


def _precision(cfg: Config) -> None:
    """fp32, bf16 or fp16 from the blocks.

    As the KERPLE fork derives it, ``fp16.type: bfloat16`` means bf16 whether ``fp16.enabled`` is
    true or false; otherwise ``fp16.enabled`` means fp16 and ``bf16.enabled`` bf16.
    """
    precision = cfg.precision
    from_blocks = "fp32"
    if precision.fp16_type in _BF16_NAMES:
        from_blocks = "bf16"
    elif precision.fp16_enabled:
        from_blocks = "fp16"
    if precision.bf16_enabled:
        if precision.fp16_enabled and from_blocks != "bf16":
            raise fail(
                cfg,
                "fp16 and bf16 are both enabled; disable one",
                "precision.fp16_enabled",
                "precision.bf16_enabled",
            )
        from_blocks = "bf16"
    requested = precision.precision
    if requested is not None:
        requested = "bf16" if requested in _BF16_NAMES else "fp16" if requested in _FP16_NAMES else "fp32"
    if requested is None or requested == from_blocks:
        precision.precision = from_blocks
        return
    if from_blocks != "fp32":
        if precision.bf16_enabled:
            change, ident = "bf16.enabled: false", "precision.bf16_enabled"
        elif from_blocks == "bf16":
            change, ident = "fp16.type: null", "precision.fp16_type"
        else:
            change, ident = "fp16.enabled: false", "precision.fp16_enabled"
        raise fail(
            cfg,
            f"precision {requested!r} contradicts the enabled block ({from_blocks}); set {change} or drop the precision key",
            "precision.precision",
            ident,
        )
    # Blocks all disabled and a precision key asks for more: enable the matching block.
    precision.precision = requested
    if requested == "bf16":
        precision.bf16_enabled = True
    else:
        precision.fp16_enabled = True
        precision.fp16_type = None


def _train_length(cfg: Config) -> None:
    """The positional embedding can compute ``seq_length`` positions in the resolved precision."""
    too_long = length_problem(cfg, cfg.model.seq_length)
    if too_long is not None:
        raise too_long


def _data(cfg: Config) -> None:
    parts = cfg.data.split.replace("/", ",").split(",")
    try:
        weights = [float(part) for part in parts]
    except ValueError:
        weights = []
    if not 1 <= len(weights) <= 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise fail(
            cfg,
            f"expected up to three non-negative numbers such as '949,50,1', got {cfg.data.split!r}",
            "data.split",
        )
    if cfg.data.seq_length_val is not None:
        cfg.check_eval_length(cfg.data.seq_length_val)
    for split in ("train", "valid", "test"):
        paths, weights = getattr(cfg.data, f"{split}_data_paths"), getattr(cfg.data, f"{split}_data_weights")
        if paths and weights is not None and (len(weights) != len(paths) or not sum(weights) > 0):
            raise fail(cfg, f"{split}_data_weights {weights}: one non-negative weight per {split}_data_paths entry "
                       f"({len(paths)}), with a positive sum; or null for equal weights",
                       f"data.{split}_data_weights")


def _training(cfg: Config) -> None:
    """Partial checks of the batch triple; the full resolution needs the world size."""
    training = cfg.training
    micro, accumulation, total = training.micro_batch_size, training.gradient_accumulation_steps, training.train_batch_size
    per_replica = (micro or 1) * (accumulation or 1)
    if total is not None and (micro or accumulation) and total % per_replica:
        given = [
            ident
            for ident, value in (
                ("training.train_batch_size", total),
                ("training.micro_batch_size", micro),
                ("training.gradient_accumulation_steps", accumulation),
            )
            if value is not None
        ]
        raise fail(
            cfg,
            f"train_batch_size {total} is not a multiple of micro_batch_size x gradient_accumulation_steps "
            f"= {per_replica}",
            *given,
        )


def _logging(cfg: Config) -> None:
    if cfg.logging.use_tensorboard is None:
        cfg.logging.use_tensorboard = cfg.logging.tensorboard_dir is not None

