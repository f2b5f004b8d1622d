"""The typed config sections.

Each field is one YAML key (its name, unless ``keys`` in :func:`~kerple.config.fields.setting`
says otherwise; dashes and underscores are alike). Defaults are the paper's 162M setup
(docs/reference-format.md §4) where the reference has no default, the reference's default otherwise; precision
defaults to fp32 so that a config without an ``fp16``/``bf16`` block runs on a CPU.
Fields marked ``derived`` are filled after loading and cannot be set from a file. The
``positional`` section's options are not declared here but beside their families
(:mod:`kerple.positional.options`), from which :func:`positional_section` builds it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from kerple import positional
from kerple.config.fields import setting

INIT_METHODS = Literal[
    "normal",
    "scaled_normal",
    "orthogonal",
    "scaled_orthogonal",
    "xavier_uniform",
    "xavier_normal",
    "wang_init",
    "small_init",
]


@dataclass
class ModelConfig:
    """Transformer shape, normalisation, initialisation and dropout (GPT-NeoX architecture)."""

    num_layers: int = setting(12, "Number of transformer layers.", minimum=1)
    hidden_size: int = setting(768, "Model width h; must be divisible by num_attention_heads.", minimum=1)
    num_attention_heads: int = setting(12, "Number of attention heads H.", minimum=1)
    seq_length: int = setting(512, "Training sequence length (tokens per sample).", minimum=1)
    max_position_embeddings: int | None = setting(
        None,
        "Rows of the learned absolute position table (pos_emb learned); null means seq_length. "
        "A learned embedding cannot be evaluated beyond it.",
        minimum=1,
    )
    vocab_size: int = setting(
        50257,
        "Size of the tokenizer's vocabulary before padding (50257 for GPT-2 BPE). This project's key: "
        "the reference takes it from the tokenizer.",
        minimum=1,
    )
    make_vocab_size_divisible_by: int = setting(
        128, "Pad the vocabulary to a multiple of this times model_parallel_size.", minimum=1
    )
    padded_vocab_size: int = setting(
        0, "vocab_size rounded up to a multiple of make_vocab_size_divisible_by x model_parallel_size.", derived=True
    )
    head_dim: int = setting(0, "hidden_size / num_attention_heads.", derived=True)
    norm: Literal["layernorm", "rmsnorm", "scalenorm"] = setting("layernorm", "Normalisation layer type.")
    layernorm_epsilon: float = setting(1e-5, "LayerNorm epsilon.", minimum=0.0)
    rms_norm_epsilon: float = setting(1e-8, "RMSNorm epsilon (norm: rmsnorm).", minimum=0.0)
    scalenorm_epsilon: float = setting(1e-8, "ScaleNorm epsilon (norm: scalenorm).", minimum=0.0)
    gpt_j_residual: bool = setting(
        False, "Parallel residual x + attn(ln1(x)) + mlp(ln2(x)) instead of the sequential pre-LN residual."
    )
    activation: Literal["gelu", "geglu", "relu", "softsign", "swish", "mish"] = setting(
        "gelu", "MLP activation (exact GELU by default)."
    )
    no_weight_tying: bool = setting(
        True, "Untie the LM head from the word embeddings (the paper's setting; the reference default is tied)."
    )
    init_method: INIT_METHODS = setting("normal", "Initialisation of the weights other than the output projections.")
    output_layer_init_method: INIT_METHODS = setting(
        "scaled_normal",
        "Initialisation of attention.dense and mlp.dense_4h_to_h; scaled_normal is N(0, std / sqrt(2 num_layers)).",
    )
    init_method_std: float = setting(0.02, "Standard deviation of the normal initialisations.", minimum=0.0)
    hidden_dropout: float = setting(0.0, "Dropout after the attention and MLP blocks.", minimum=0.0, maximum=1.0)
    attention_dropout: float = setting(0.0, "Dropout on the attention probabilities.", minimum=0.0, maximum=1.0)
    output_layer_parallelism: Literal["row", "column"] = setting(
        "row", "Tensor-parallel layout of the LM head in the reference.", effect=False
    )
    scaled_upper_triang_masked_softmax_fusion: bool = setting(
        False, "Reference fused CUDA softmax kernel; the attention implementation is chosen by attention_impl.", effect=False
    )
    scaled_masked_softmax_fusion: bool = setting(False, "Reference fused CUDA softmax kernel.", effect=False)
    bias_gelu_fusion: bool = setting(False, "Reference fused bias+GELU kernel (same math).", effect=False)
    bias_dropout_fusion: bool = setting(False, "Reference fused bias+dropout kernel (same math).", effect=False)
    apply_query_key_layer_scaling: bool = setting(
        False, "Reference fp16 overflow guard (mathematically the identity).", effect=False
    )
    attention_softmax_in_fp32: bool = setting(
        False, "Reference option; the eager softmax here always runs in fp32.", effect=False
    )


def _positional_options(self: Any) -> dict[str, Any]:
    """Every option except ``pos_emb``, as keyword arguments for ``kerple.positional.build``."""
    return {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "pos_emb"}


def positional_section(specs: tuple[positional.OptionSpec, ...]) -> type:
    """The ``positional`` section: ``pos_emb`` plus one field per declared option (its name is the
    YAML key; type, default, bounds, check and help as declared), and ``options()``."""
    pos_emb = setting(
        "learned",
        "Positional embedding name from the kerple.positional registry; reference spellings "
        "(t5, kerple_power_ap_, ...) are accepted and stored as the canonical name.",
    )
    fields: list[tuple[str, Any, Any]] = [("pos_emb", str, pos_emb)]
    for spec in specs:
        declared = setting(spec.default, spec.help, minimum=spec.minimum, maximum=spec.maximum, check=spec.check)
        fields.append((spec.name, spec.hint, declared))
    doc = "The positional embedding and its options (passed to ``kerple.positional.build``)."
    section = dataclasses.make_dataclass(
        "PositionalConfig", fields, namespace={"__doc__": doc, "options": _positional_options}
    )
    section.__module__ = __name__
    return section


PositionalConfig = positional_section(positional.option_specs())


@dataclass
class AttentionConfig:
    """Which attention implementation computes the scores, and the optional window."""

    attention_impl: Literal["eager", "sdpa", "flex", "auto"] = setting(
        "eager",
        "eager: reference math (fp32 softmax); sdpa: torch scaled_dot_product_attention with a "
        "materialised bias; flex: FlexAttention score_mod (no L x L tensor); auto: the fastest of "
        "these that serves the embedding on the current device, mode and length, chosen at every "
        "forward (kerple.model.attention.choose_implementation).",
    )
    attention_window: int | None = setting(
        None, "If set to w, each query attends only to the last w keys (thesis 4.3.3).", minimum=1
    )
    attention_config: list | None = setting(
        None,
        "Reference per-layer attention types, e.g. [[[global], 12]]; only 'global' is supported.",
        effect=False,
    )
    sparsity_config: dict = setting({}, "Reference sparse-attention settings (sparse attention is not supported).", effect=False)


@dataclass
class OptimizerConfig:
    """The optimizer, from the DeepSpeed block ``optimizer: {type, params: {...}}``."""

    type: str = setting(
        "Adam", "Optimizer: Adam or AdamW (case-insensitive); both run the decoupled AdamW update.", keys=("optimizer.type",)
    )
    lr: float = setting(6e-4, "Peak learning rate.", keys=("optimizer.params.lr", "lr"), minimum=0.0)
    betas: list[float] = setting([0.9, 0.999], "Adam betas (two numbers).", keys=("optimizer.params.betas",), minimum=0.0)
    eps: float = setting(1e-8, "Adam epsilon.", keys=("optimizer.params.eps",), minimum=0.0)
    weight_decay: float = setting(
        0.0,
        "Decoupled weight decay (not applied to biases and norms).",
        keys=("optimizer.params.weight_decay", "weight_decay"),
        minimum=0.0,
    )


@dataclass
class LRScheduleConfig:
    """GPT-NeoX ``AnnealingLR``: linear warm-up, then decay (docs/reference-format.md §5)."""

    lr_decay_style: Literal["constant", "linear", "cosine"] = setting("cosine", "Decay after warm-up.")
    lr_decay_iters: int | None = setting(None, "Length of the schedule in steps; null means train_iters.", minimum=1)
    warmup: float = setting(0.01, "Warm-up length as a fraction of lr_decay_iters.", minimum=0.0, maximum=1.0)
    min_lr: float = setting(0.0, "Floor of the learning rate.", minimum=0.0)


@dataclass
class PrecisionConfig:
    """Training precision, from the DeepSpeed ``fp16``/``bf16`` blocks (or the ``precision`` key)."""

    precision: Literal["fp32", "bf16", "fp16", "bfloat16", "float16"] | None = setting(
        None,
        "Resolved to fp32, bf16 or fp16 from the fp16/bf16 blocks. Setting it alone enables that "
        "precision; setting it against an enabled block is an error.",
    )
    fp16_enabled: bool = setting(False, "Enable fp16 (or bf16 with the legacy fp16.type: bfloat16).", keys=("fp16.enabled",))
    fp16_type: Literal["bfloat16", "bf16", "fp16", "float16"] | None = setting(
        None, "Legacy reference field: fp16: {enabled: true, type: bfloat16} means bf16.", keys=("fp16.type",)
    )
    loss_scale: float = setting(0.0, "Static fp16 loss scale; 0 means dynamic.", keys=("fp16.loss_scale",), minimum=0.0)
    initial_scale_power: int = setting(
        16, "Dynamic loss scaling starts at 2**initial_scale_power.", keys=("fp16.initial_scale_power",), minimum=0
    )
    loss_scale_window: int = setting(
        1000, "Steps without overflow before the dynamic loss scale grows.", keys=("fp16.loss_scale_window",), minimum=1
    )
    hysteresis: int = setting(2, "Overflows tolerated before the loss scale shrinks.", keys=("fp16.hysteresis",), minimum=1)
    min_loss_scale: float = setting(1.0, "Lower bound of the dynamic loss scale.", keys=("fp16.min_loss_scale",), minimum=0.0)
    bf16_enabled: bool = setting(False, "Enable bf16 (DeepSpeed bf16 block).", keys=("bf16.enabled",))
    fp32_allreduce: bool = setting(False, "Reference: all-reduce gradients in fp32.", effect=False)


@dataclass
class ParallelismConfig:
    """Model/pipeline parallel sizes, ZeRO, and launcher settings."""

    pipe_parallel_size: int = setting(
        0, "Pipeline stages (0 and 1 both mean a single stage); divides the world in data_parallel_size.", minimum=0
    )
    model_parallel_size: int = setting(1, "Tensor-parallel size.", minimum=1)
    zero_optimization: dict = setting(
        {}, "DeepSpeed ZeRO block, kept whole; its 'stage' gives zero_stage. Merged key by key across files."
    )
    zero_stage: int = setting(0, "zero_optimization.stage (0 when absent).", derived=True)
    world_size: int | None = setting(None, "Number of processes, set by Config.resolve_batch.", derived=True)
    data_parallel_size: int | None = setting(
        None, "world_size / (max(pipe_parallel_size, 1) x model_parallel_size), set by Config.resolve_batch.", derived=True
    )
    distributed_backend: Literal["nccl", "gloo", "mpi"] = setting("nccl", "torch.distributed backend (GPU runs).")
    num_gpus: int | None = setting(None, "GPUs per node the launcher starts; null means every visible GPU.", minimum=1)
    zero_allow_untested_optimizer: bool = setting(False, "DeepSpeed check for client optimizers.", effect=False)
    launcher: Literal["pdsh", "openmpi", "mvapich", "slurm"] = setting("pdsh", "Reference multi-node launcher.", effect=False)
    hostfile: str | None = setting(None, "Reference multi-node hostfile.", effect=False)
    include: str | None = setting(None, "Reference launcher host/GPU selection (deepspeed --include).", effect=False)
    exclude: str | None = setting(None, "Reference launcher host/GPU exclusion (deepspeed --exclude).", effect=False)
    num_nodes: int = setting(-1, "Reference launcher node count.", effect=False)
    deepspeed_mpi: bool = setting(False, "Reference: discover ranks through MPI.", effect=False)


@dataclass
class DataConfig:
    """Data files, split and tokenizer."""

    data_path: str | None = setting(None, "Prefix of the .bin/.idx dataset, split by 'split'.")
    train_data_paths: list[str] | None = setting(None, "Separate training dataset prefixes (instead of data_path + split).")
    valid_data_paths: list[str] | None = setting(None, "Separate validation dataset prefixes.")
    test_data_paths: list[str] | None = setting(None, "Separate test dataset prefixes.")
    split: str = setting("949,50,1", "Train/valid/test proportions of data_path's documents, e.g. '949,50,1'.")
    seq_length_val: int | None = setting(
        None, "Validation/test sequence length (KERPLE fork; extrapolation evaluation); null means seq_length.", minimum=1
    )
    tokenizer_type: Literal["GPT2BPETokenizer", "HFTokenizer", "SPMTokenizer", "CharLevelTokenizer"] = setting(
        "GPT2BPETokenizer", "Tokenizer family."
    )
    vocab_file: str | None = setting(None, "GPT-2 vocab.json (or the HF tokenizer.json / SentencePiece model).")
    merge_file: str | None = setting(None, "GPT-2 merges.txt.")
    tokenizer_file: str | None = setting(None, "HF tokenizer.json (this project's key; vocab_file also works).")
    num_workers: int = setting(2, "DataLoader worker processes.", minimum=0)
    eod_mask_loss: bool = setting(False, "Do not train on predicting the token after an end-of-document token.")
    data_impl: Literal["mmap", "infer"] = setting("mmap", "Reference dataset reader; only the mmap format is read.", effect=False)
    mmap_warmup: bool = setting(False, "Reference: touch every page of the mmap at start.", effect=False)
    use_shared_fs: bool = setting(True, "Reference: whether ranks share a filesystem for the index cache.", effect=False)


@dataclass
class TrainingConfig:
    """Batch triple, length of training, clipping, evaluation cadence and activation checkpointing."""

    micro_batch_size: int | None = setting(
        None,
        "Samples per GPU per forward/backward (DeepSpeed train_micro_batch_size_per_gpu).",
        keys=("micro_batch_size", "train_micro_batch_size_per_gpu", "batch_size"),
        minimum=1,
    )
    gradient_accumulation_steps: int | None = setting(None, "Micro-batches accumulated per optimizer step.", minimum=1)
    train_batch_size: int | None = setting(
        None, "Global batch: micro_batch_size x gradient_accumulation_steps x data_parallel_size.", minimum=1
    )
    train_iters: int = setting(50000, "Optimizer steps to train; 0 means evaluation only.", minimum=0)
    seed: int = setting(1234, "Random seed (initialisation, data order, dropout).")
    gradient_clipping: float = setting(
        1.0, "Clip the global gradient norm to this value; 0 disables.", keys=("gradient_clipping", "clip_grad"), minimum=0.0
    )
    eval_interval: int = setting(1000, "Steps between validation runs.", minimum=1)
    eval_iters: int = setting(10, "Validation batches per validation run.", minimum=0)
    checkpoint_activations: bool = setting(
        False, "Recompute each group of checkpoint_num_layers transformer layers in the backward pass (saves memory, same numbers)."
    )
    checkpoint_num_layers: int = setting(1, "Transformer layers per activation-checkpoint group.", minimum=1)
    compile: bool = setting(False, "Wrap the model in torch.compile.")
    partition_activations: bool = setting(False, "Reference: split checkpointed activations across model-parallel ranks.", effect=False)
    synchronize_each_layer: bool = setting(False, "Reference: CUDA synchronise after each checkpointed layer.", effect=False)
    contiguous_checkpointing: bool = setting(False, "Reference activation-checkpoint memory layout.", effect=False)
    checkpoint_in_cpu: bool = setting(False, "Reference: keep checkpointed activations in CPU memory.", effect=False)
    deepspeed_activation_checkpointing: bool = setting(True, "Reference: use DeepSpeed's checkpointing.", effect=False)


@dataclass
class LoggingConfig:
    """Console, TensorBoard and Weights & Biases logging."""

    log_interval: int = setting(100, "Steps between progress lines and logged metrics.", minimum=1)
    use_wandb: bool = setting(False, "Log to Weights & Biases.")
    wandb_project: str = setting("kerple", "W&B project.")
    wandb_group: str | None = setting(None, "W&B run group.")
    wandb_team: str | None = setting(None, "W&B entity.")
    wandb_host: str = setting("https://api.wandb.ai", "W&B server.")
    use_tensorboard: bool | None = setting(None, "Write TensorBoard events; null means on when tensorboard_dir is set.")
    tensorboard_dir: str | None = setting(None, "TensorBoard event directory.")
    log_dir: str | None = setting(None, "Directory for text logs.")
    steps_per_print: int = setting(10, "DeepSpeed's own progress print interval.", minimum=1, effect=False)
    wall_clock_breakdown: bool = setting(False, "DeepSpeed per-phase timers.", effect=False)
    git_hash: str | None = setting(None, "Recorded by the reference launcher.", effect=False)


@dataclass
class CheckpointingConfig:
    """Where checkpoints are written and read, and what a load restores."""

    save: str | None = setting(None, "Directory to write checkpoints to; null disables saving.")
    load: str | None = setting(None, "Directory to resume or fine-tune from (its 'latest' tag).")
    save_interval: int = setting(1000, "Steps between checkpoints.", minimum=1)
    keep_last_n_checkpoints: int | None = setting(None, "Delete older checkpoints beyond this many; null keeps all.", minimum=1)
    finetune: bool = setting(False, "Load weights only and restart the step count, optimizer and schedule.")
    no_load_optim: bool = setting(False, "Do not restore the optimizer state.")
    no_load_rng: bool = setting(False, "Do not restore random-number-generator states.")
    no_save_optim: bool = setting(False, "Do not write the optimizer state.")
    no_save_rng: bool = setting(False, "Do not write random-number-generator states.")
    checkpoint_validation_with_forward_pass: bool = setting(
        False, "Reference: run a forward pass to validate a saved checkpoint.", effect=False
    )


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "positional": PositionalConfig,
    "attention": AttentionConfig,
    "optimizer": OptimizerConfig,
    "lr_schedule": LRScheduleConfig,
    "precision": PrecisionConfig,
    "parallelism": ParallelismConfig,
    "data": DataConfig,
    "training": TrainingConfig,
    "logging": LoggingConfig,
    "checkpointing": CheckpointingConfig,
}
"""Section attribute name on :class:`~kerple.config.Config` -> its dataclass, in page order."""
