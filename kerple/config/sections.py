"""The typed config sections.

Each field is one YAML key (its name, unless ``keys`` in :func:`~kerple.config.fields.setting`
says otherwise; dashes and underscores are alike). Every key that a GPT-NeoX config may leave out
defaults to GPT-NeoX's value (the KERPLE fork's argument definitions; the table with its sources is
``tests/unit/config/neox_defaults.yml``, and a test holds these defaults to it). Keys that GPT-NeoX
requires (the model shape, the run length) default to the paper's 162M setup
(docs/reference-format.md §4). Precision defaults to fp32, as in GPT-NeoX without an ``fp16``
block. Fields marked ``derived`` are filled after loading and cannot be set from a file. The
``positional`` section's options are not declared here but beside their families
(:mod:`kerple.positional.options`), from which :func:`positional_section` builds it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from kerple import positional
from kerple.model import families
from kerple.model.regular import PADDINGS
from kerple.config.deepspeed_keys import (
    COMMS_LOGGER_KEYS,
    MONITOR_KEYS,
    REMOVED_BLOCKS,
    WANDB_KEYS,
    ZERO_KEYS,
)
from kerple.config.fields import setting
from kerple.config.neox_only import NeoXOnlyConfig

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

_GATED = ("geglu", "swiglu", "reglu", "bilinear", "glu")
_NEW_INITS = {"single_residual_scaled_normal": "GPT-NeoX's single_residual_scaled_normal initialisation (since 2024)"}


@dataclass
class ModelConfig:
    """Transformer shape, normalisation, initialisation and dropout (GPT-NeoX architecture)."""

    num_layers: int = setting(12, "Number of transformer layers.", minimum=1)
    arch: str = setting(
        "gpt",
        "The model family, one of the registry kerple.model.families: "
        + "; ".join(f"{name}: {families.family(name).summary}" for name in families.names())
        + ". A family without a positional embedding needs pos_emb: none.",
        check=families.unknown_family,
    )
    regular_chunk_size: int = setting(2, "RegularGPT chunk size C of Eq. 6.1 (arch: regulargpt).", minimum=2)
    regular_thickness: int = setting(
        1, "RegularGPT thickness K: shared blocks, layer l*K+k reuses block k (arch: regulargpt; num_layers is unused).", minimum=1
    )
    regular_padding: Literal[PADDINGS] = setting(  # type: ignore[valid-type]
        "pad",
        "RegularGPT padding (thesis §6.2.1, footnote 1; arch: regulargpt). pad: the input is read as if "
        "preceded by PAD tokens, a learned PAD embedding filling every key before position 0; none: such "
        "keys are left out, as in checkpoints written before padding (a missing key then looks like a "
        "duplicated one, and Parity Check fails).",
    )
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
        "Size of the tokenizer's vocabulary before padding (50257 for GPT-2 BPE). This project's key; "
        "unset, it is the tokenizer's, as in the reference (512 for CharLevelTokenizer, else read from "
        "the tokenizer's files, 50257 while they do not exist).",
        minimum=1,
    )
    make_vocab_size_divisible_by: int = setting(
        128, "Pad the vocabulary to a multiple of this times model_parallel_size.", minimum=1
    )
    padded_vocab_size: int = setting(
        0, "vocab_size rounded up to a multiple of make_vocab_size_divisible_by x model_parallel_size.", derived=True
    )
    head_dim: int = setting(0, "hidden_size / num_attention_heads.", derived=True)
    norm: Literal["layernorm", "rmsnorm", "scalenorm"] = setting(
        "layernorm",
        "Normalisation layer type.",
        refuse_values={
            "te_rmsnorm": "Transformer Engine's RMSNorm",
            "te_layernorm": "Transformer Engine's LayerNorm",
            "non_parametric_layernorm": "LayerNorm without learned scale and shift",
        },
    )
    layernorm_epsilon: float = setting(1e-5, "LayerNorm epsilon.", minimum=0.0)
    rms_norm_epsilon: float = setting(1e-8, "RMSNorm epsilon (norm: rmsnorm).", minimum=0.0)
    scalenorm_epsilon: float = setting(1e-8, "ScaleNorm epsilon (norm: scalenorm).", minimum=0.0)
    gpt_j_residual: bool = setting(
        False, "Parallel residual x + attn(ln1(x)) + mlp(ln2(x)) instead of the sequential pre-LN residual."
    )
    activation: Literal["gelu", "relu", "softsign", "swish", "mish"] = setting(
        "gelu",
        "MLP activation (exact GELU by default); GPT-NeoX's 'silu' is stored as 'swish', the same function.",
        value_aliases={"silu": "swish"},
        refuse_values={name: f"GPT-NeoX's gated activation {name} (a wider, gated MLP)" for name in _GATED},
    )
    no_weight_tying: bool = setting(
        False, "Untie the LM head from the word embeddings (the KERPLE paper's models set true; GPT-NeoX ties by default)."
    )
    init_method: INIT_METHODS = setting(
        "normal", "Initialisation of the weights other than the output projections.", refuse_values=_NEW_INITS
    )
    output_layer_init_method: INIT_METHODS = setting(
        "scaled_normal",
        "Initialisation of attention.dense and mlp.dense_4h_to_h; scaled_normal is N(0, std / sqrt(2 num_layers)).",
        refuse_values=_NEW_INITS,
    )
    init_method_std: float = setting(0.02, "Standard deviation of the normal initialisations.", minimum=0.0)
    hidden_dropout: float = setting(
        0.1, "Dropout after the attention and MLP blocks (the KERPLE paper's models set 0).", minimum=0.0, maximum=1.0
    )
    attention_dropout: float = setting(
        0.1, "Dropout on the attention probabilities (the KERPLE paper's models set 0).", minimum=0.0, maximum=1.0
    )
    output_layer_parallelism: Literal["row", "column"] = setting(
        "row", "GPT-NeoX's tensor-parallel layout of the LM head; kerple lays it out itself (same output).", effect=False
    )
    scaled_upper_triang_masked_softmax_fusion: bool = setting(
        False, "GPT-NeoX fused CUDA softmax kernel (same math); kerple's kernel is chosen by attention_impl.", effect=False
    )
    scaled_masked_softmax_fusion: bool = setting(
        False, "GPT-NeoX fused CUDA softmax kernel (same math); kerple's kernel is chosen by attention_impl.", effect=False
    )
    bias_gelu_fusion: bool = setting(
        False, "GPT-NeoX fused bias+GELU kernel (same math); kerple runs the PyTorch ops.", effect=False
    )
    bias_dropout_fusion: bool = setting(
        False, "GPT-NeoX fused bias+dropout kernel (same math); kerple runs the PyTorch ops.", effect=False
    )
    apply_query_key_layer_scaling: bool = setting(
        False,
        "GPT-NeoX divides layer i's scores by max(1, i) and multiplies them back inside the softmax, so a "
        "positional bias added in between is multiplied by max(1, i) (i counts layers from 0). kerple accepts "
        "true only for embeddings without a score bias (learned, sinusoidal, rotary, none), where it changes "
        "nothing but rounding, and refuses it for bias and weight kernels.",
        effect=False,
    )
    attention_softmax_in_fp32: bool = setting(
        False, "GPT-NeoX option; kerple's eager softmax always runs in fp32.", effect=False
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

    attention_impl: Literal["eager", "sdpa", "flex", "triton", "auto"] = setting(
        "eager",
        "eager: reference math (fp32 softmax); sdpa: torch scaled_dot_product_attention with a "
        "materialised bias; flex: FlexAttention score_mod (no L x L tensor); triton: one fused Triton "
        "kernel with the distance tables in its logits and their gradient in its backward (CUDA; opt-in, "
        "not yet timed on a GPU); auto: the fastest of eager, sdpa and flex that serves the embedding on "
        "the current device, mode and length, chosen at every forward "
        "(kerple.model.attention.choose_implementation).",
    )
    attention_window: int | None = setting(
        None, "If set to w, each query attends only to the last w keys (thesis 4.3.3).", minimum=1
    )
    attention_config: list | None = setting(
        None,
        "GPT-NeoX per-layer attention types, e.g. [[[global], 12]] or [[[flash], all]]; global and flash (a "
        "kernel for the same math) run as kerple's attention_impl; other types (local, sparse, gMLP, Mamba, "
        "RWKV, ...) are refused.",
        effect=False,
    )
    sparsity_config: dict = setting(
        {}, "GPT-NeoX sparse-attention settings (DeepSpeed sparse attention); kerple refuses any but {}.",
        refuse="sparse attention (sparsity_config)",
    )


@dataclass
class OptimizerConfig:
    """The optimizer, from the DeepSpeed block ``optimizer: {type, params: {...}}``."""

    type: str = setting(
        "Adam", "Optimizer: Adam or AdamW (case-insensitive); both run the decoupled AdamW update.", keys=("optimizer.type",)
    )
    lr: float = setting(0.001, "Peak learning rate.", keys=("optimizer.params.lr", "lr"), minimum=0.0)
    betas: list[float] = setting([0.9, 0.999], "Adam betas (two numbers).", keys=("optimizer.params.betas",), minimum=0.0)
    eps: float = setting(1e-8, "Adam epsilon.", keys=("optimizer.params.eps",), minimum=0.0)
    weight_decay: float = setting(
        0.01,
        "Decoupled weight decay (not applied to biases and norms).",
        keys=("optimizer.params.weight_decay", "weight_decay"),
        minimum=0.0,
    )
    legacy_fusion: bool = setting(
        False,
        "DeepSpeed's legacy fused-optimizer switch; kerple builds its AdamW itself.",
        keys=("optimizer.legacy_fusion",),
        effect=False,
    )


@dataclass
class LRScheduleConfig:
    """GPT-NeoX ``AnnealingLR``: linear warm-up, then decay (docs/reference-format.md §5)."""

    lr_decay_style: Literal["constant", "linear", "cosine", "exponential"] = setting("linear", "Decay after warm-up.")
    lr_decay_iters: int | None = setting(
        None, "Length of the schedule in steps; null means lr_decay_fraction x train_iters, or train_iters.", minimum=1
    )
    lr_decay_fraction: float | None = setting(
        None,
        "GPT-NeoX (since 2024): lr_decay_iters = floor(train_iters x lr_decay_fraction) when lr_decay_iters is null.",
        minimum=0.0,
    )
    warmup: float = setting(0.01, "Warm-up length as a fraction of lr_decay_iters.", minimum=0.0, maximum=1.0)
    min_lr: float = setting(0.0, "Floor of the learning rate.", minimum=0.0)
    use_checkpoint_lr_scheduler: bool = setting(
        False,
        "On resume, take lr, min_lr, warm-up, schedule length and decay style from the checkpoint. With this and "
        "override_lr_scheduler both false (GPT-NeoX's defaults), a resume whose configured values differ from "
        "the checkpoint's is an error; the step count always comes from the checkpoint.",
    )
    override_lr_scheduler: bool = setting(
        False, "On resume, keep the configured schedule values instead of the checkpoint's (exclusive with the above)."
    )


@dataclass
class PrecisionConfig:
    """Training precision, from the DeepSpeed ``fp16``/``bf16`` blocks (or the ``precision`` key).

    The blocks take every key DeepSpeed 0.19.8 accepts in them, and kerple passes each on to
    DeepSpeed as written, plus GPT-NeoX's own ``fp16.type`` and ``fp16.fp16``.
    """

    precision: Literal["fp32", "bf16", "fp16", "bfloat16", "float16"] | None = setting(
        None,
        "Resolved to fp32, bf16 or fp16 from the fp16/bf16 blocks. Setting it alone enables that "
        "precision; setting it against an enabled block is an error.",
    )
    fp16_enabled: bool = setting(False, "Enable fp16 (unless fp16.type is bfloat16).", keys=("fp16.enabled",))
    fp16_type: Literal["bfloat16", "bf16", "fp16", "float16"] | None = setting(
        None,
        "KERPLE fork (GPT-NeoX 2022) field: type bfloat16 means bf16 whether or not fp16.enabled is true, as the "
        "fork derives its precision; not passed to DeepSpeed.",
        keys=("fp16.type",),
    )
    fp16_flag: bool | None = setting(
        None, "Written as fp16: {fp16: true} in GPT-NeoX's configs; DeepSpeed ignored it then and refuses it now, so "
        "kerple does not pass it on (fp16.enabled decides).", keys=("fp16.fp16",), effect=False
    )
    auto_cast: bool = setting(False, "DeepSpeed: cast floating-point inputs to fp16.", keys=("fp16.auto_cast",))
    loss_scale: float = setting(0.0, "Static fp16 loss scale; 0 means dynamic.", keys=("fp16.loss_scale",), minimum=0.0)
    initial_scale_power: int = setting(
        16, "Dynamic loss scaling starts at 2**initial_scale_power.", keys=("fp16.initial_scale_power",), minimum=0
    )
    loss_scale_window: int = setting(
        1000, "Steps without overflow before the dynamic loss scale grows.", keys=("fp16.loss_scale_window",), minimum=1
    )
    hysteresis: int = setting(2, "Overflows tolerated before the loss scale shrinks.", keys=("fp16.hysteresis",), minimum=1)
    consecutive_hysteresis: bool = setting(
        False, "DeepSpeed: refill the hysteresis after a step without overflow.", keys=("fp16.consecutive_hysteresis",)
    )
    min_loss_scale: float = setting(1.0, "Lower bound of the dynamic loss scale.", keys=("fp16.min_loss_scale",), minimum=0.0)
    fp16_master_weights_and_grads: bool = setting(
        False,
        "DeepSpeed: fp16 master weights (DeepSpeedCPUAdam with ZeRO only).",
        keys=("fp16.fp16_master_weights_and_grads",),
    )
    bf16_enabled: bool = setting(False, "Enable bf16 (DeepSpeed bf16 block).", keys=("bf16.enabled",))
    immediate_grad_update: bool = setting(
        False, "DeepSpeed bf16: apply gradient updates immediately.", keys=("bf16.immediate_grad_update",)
    )
    check_grad_overflow: bool = setting(
        False,
        "DeepSpeed bf16 (ZeRO 1-3, pipeline): skip a step whose gradients overflow; off because bf16 has no "
        "loss scale to lower (a non-finite loss stops the run), DeepSpeed's default is true.",
        keys=("bf16.check_grad_overflow",),
    )
    bf16_master_weights_and_grads: bool = setting(
        False,
        "DeepSpeed bf16: keep ZeRO master weights and gradients in bf16.",
        keys=("bf16.bf16_master_weights_and_grads",),
    )
    bf16_optimizer_states: bool = setting(
        False, "DeepSpeed bf16: keep optimizer states in bf16 (with bf16_master_weights_and_grads).",
        keys=("bf16.bf16_optimizer_states",),
    )
    fp32_allreduce: bool = setting(
        False,
        "GPT-NeoX: all-reduce gradients in fp32; kerple lets DeepSpeed choose (set communication_data_type: fp32 "
        "for the same effect).",
        effect=False,
    )


@dataclass
class ParallelismConfig:
    """Model/pipeline parallel sizes, ZeRO, and launcher settings."""

    pipe_parallel_size: int = setting(
        0, "Pipeline stages (0 and 1 both mean a single stage); divides the world in data_parallel_size.", minimum=0
    )
    model_parallel_size: int = setting(1, "Tensor-parallel size.", minimum=1)
    zero_optimization: dict = setting(
        {},
        "DeepSpeed ZeRO block, passed on as written (every key DeepSpeed 0.19.8 accepts); its 'stage' gives "
        "zero_stage. Merged key by key across files.",
        block=True,
        block_keys=ZERO_KEYS,
    )
    zero_stage: int = setting(0, "zero_optimization.stage (0 when absent).", derived=True)
    world_size: int | None = setting(None, "Number of processes, set by Config.resolve_batch.", derived=True)
    data_parallel_size: int | None = setting(
        None, "world_size / (max(pipe_parallel_size, 1) x model_parallel_size), set by Config.resolve_batch.", derived=True
    )
    distributed_backend: Literal["nccl", "gloo", "mpi"] = setting("nccl", "torch.distributed backend (GPU runs).")
    num_gpus: int | None = setting(None, "GPUs per node the launcher starts; null means every visible GPU.", minimum=1)
    zero_allow_untested_optimizer: bool = setting(
        False,
        "DeepSpeed check for client optimizers; kerple always sets it (its AdamW is a client optimizer).",
        effect=False,
    )
    launcher: Literal["pdsh", "openmpi", "mvapich", "slurm"] = setting(
        "pdsh",
        "GPT-NeoX multi-node launcher; kerple's deepy.py uses DeepSpeed's launcher on CUDA and "
        "torch.distributed.run on CPU.",
        effect=False,
    )
    hostfile: str | None = setting(None, "GPT-NeoX hostfile; pass it to kerple as deepy.py --hostfile.", effect=False)
    include: str | None = setting(
        None, "GPT-NeoX host/GPU selection; pass it to kerple as deepy.py --include.", effect=False
    )
    exclude: str | None = setting(
        None, "GPT-NeoX host/GPU exclusion; kerple's deepy.py takes --include instead.", effect=False
    )
    num_nodes: int = setting(-1, "GPT-NeoX node count; kerple's deepy.py uses the nodes of --hostfile.", effect=False)
    deepspeed_mpi: bool = setting(
        False, "GPT-NeoX: discover ranks through MPI; kerple reads them from the launcher's environment.", effect=False
    )


@dataclass
class DataConfig:
    """Data files, split and tokenizer."""

    data_path: str | None = setting(None, "Prefix of the .bin/.idx dataset, split by 'split'.")
    train_data_paths: list[str] | None = setting(None, "Separate training dataset prefixes (instead of data_path + split).")
    valid_data_paths: list[str] | None = setting(None, "Separate validation dataset prefixes.")
    test_data_paths: list[str] | None = setting(None, "Separate test dataset prefixes.")
    train_data_weights: list[float] | None = setting(
        None, "Blending weights of train_data_paths, one per path (null: equal); GPT-NeoX's rule, docs/data.md.",
        minimum=0.0,
    )
    valid_data_weights: list[float] | None = setting(
        None, "Blending weights of valid_data_paths, one per path (null: equal).", minimum=0.0
    )
    test_data_weights: list[float] | None = setting(
        None, "Blending weights of test_data_paths, one per path (null: equal).", minimum=0.0
    )
    split: str = setting("969, 30, 1", "Train/valid/test proportions of data_path's documents, e.g. '949,50,1'.")
    seq_length_val: int | None = setting(
        None, "Validation/test sequence length (KERPLE fork; extrapolation evaluation); null means seq_length.", minimum=1
    )
    tokenizer_type: Literal["GPT2BPETokenizer", "HFTokenizer", "SPMTokenizer", "CharLevelTokenizer"] = setting(
        "GPT2BPETokenizer",
        "Tokenizer family.",
        refuse_values={
            "HFGPT2Tokenizer": "GPT-NeoX's Hugging Face GPT-2 loader (use GPT2BPETokenizer with vocab_file and "
            "merge_file: the same tokens)",
            "TiktokenTokenizer": "a tiktoken tokenizer",
        },
    )
    vocab_file: str | None = setting(None, "GPT-2 vocab.json (or the HF tokenizer.json / SentencePiece model).")
    merge_file: str | None = setting(None, "GPT-2 merges.txt.")
    tokenizer_file: str | None = setting(None, "HF tokenizer.json (this project's key; vocab_file also works).")
    num_workers: int = setting(2, "DataLoader worker processes.", minimum=0)
    eod_mask_loss: bool = setting(False, "Do not train on predicting the token after an end-of-document token.")
    data_impl: Literal["infer", "mmap", "cached"] = setting(
        "infer", "GPT-NeoX dataset reader choice; kerple always reads the mmap format.", effect=False
    )
    mmap_warmup: bool = setting(False, "GPT-NeoX: touch every page of the mmap at start; kerple does not.", effect=False)
    use_shared_fs: bool = setting(
        True, "GPT-NeoX: whether ranks share a filesystem for the index cache; kerple does not use it.", effect=False
    )


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
    train_iters: int = setting(50000, "Optimizer steps to train; 0 means evaluation only. At most 1e8 (2,000 "
                               "times the paper's 50,000).", minimum=0, maximum=100_000_000)
    seed: int = setting(1234, "Random seed (initialisation, data order, dropout).")
    gradient_clipping: float = setting(
        0.0,
        "Clip the global gradient norm to this value; 0 disables (the KERPLE paper's models set 1.0).",
        keys=("gradient_clipping", "clip_grad"),
        minimum=0.0,
    )
    eval_interval: int = setting(1000, "Steps between validation runs.", minimum=1)
    eval_iters: int = setting(100, "Validation batches per validation run.", minimum=0)
    checkpoint_activations: bool = setting(
        False, "Recompute each group of checkpoint_num_layers transformer layers in the backward pass (saves memory, same numbers)."
    )
    checkpoint_num_layers: int = setting(1, "Transformer layers per activation-checkpoint group.", minimum=1)
    compile: bool = setting(False, "Wrap the model in torch.compile.")
    partition_activations: bool = setting(
        False, "GPT-NeoX: split checkpointed activations across model-parallel ranks; kerple keeps them whole.", effect=False
    )
    synchronize_each_layer: bool = setting(
        False, "GPT-NeoX: CUDA synchronise after each checkpointed layer; kerple does not.", effect=False
    )
    contiguous_checkpointing: bool = setting(
        False, "GPT-NeoX activation-checkpoint memory layout; kerple uses torch.utils.checkpoint.", effect=False
    )
    checkpoint_in_cpu: bool = setting(
        False, "GPT-NeoX: keep checkpointed activations in CPU memory; kerple keeps them on the device.", effect=False
    )
    deepspeed_activation_checkpointing: bool = setting(
        True, "GPT-NeoX: use DeepSpeed's activation checkpointing; kerple uses torch.utils.checkpoint.", effect=False
    )


@dataclass
class LoggingConfig:
    """Console, TensorBoard and Weights & Biases logging."""

    log_interval: int = setting(100, "Steps between progress lines and logged metrics.", minimum=1)
    use_wandb: bool = setting(False, "Log to Weights & Biases.")
    wandb_project: str = setting("neox", "W&B project.")
    wandb_group: str | None = setting(None, "W&B run group.")
    wandb_team: str | None = setting(None, "W&B entity.")
    wandb_host: str = setting("https://api.wandb.ai", "W&B server.")
    use_tensorboard: bool | None = setting(None, "Write TensorBoard events; null means on when tensorboard_dir is set.")
    tensorboard_dir: str | None = setting(None, "TensorBoard event directory.")
    log_dir: str | None = setting(None, "Directory for text logs.")
    steps_per_print: int = setting(
        10, "DeepSpeed's own progress print interval; kerple prints its own lines every log_interval steps.",
        minimum=1, effect=False,
    )
    wall_clock_breakdown: bool = setting(
        False, "DeepSpeed per-phase timers; kerple prints its own time per step.", effect=False
    )
    git_hash: str | None = setting(None, "Recorded by the GPT-NeoX launcher; kerple does not use it.", effect=False)


@dataclass
class CheckpointingConfig:
    """Where checkpoints are written and read, and what a load restores."""

    save: str | None = setting(None, "Directory to write checkpoints to; null disables saving.")
    load: str | None = setting(None, "Directory to resume or fine-tune from (its 'latest' tag).")
    save_interval: int = setting(
        1000, "Steps between checkpoints (GPT-NeoX has no default and requires it with 'save').", minimum=1
    )
    checkpoint_factor: int | float | None = setting(
        None,
        "GPT-NeoX's later name of the save interval: with checkpoint_scale linear (the default) a whole number "
        "sets save_interval.",
        minimum=1,
    )
    keep_last_n_checkpoints: int | None = setting(None, "Delete older checkpoints beyond this many; null keeps all.", minimum=1)
    finetune: bool = setting(False, "Load weights only and restart the step count, optimizer and schedule.")
    no_load_optim: bool = setting(False, "Do not restore the optimizer state.")
    no_load_rng: bool = setting(False, "Do not restore random-number-generator states.")
    no_save_optim: bool = setting(False, "Do not write the optimizer state.")
    no_save_rng: bool = setting(False, "Do not write random-number-generator states.")
    checkpoint_validation_with_forward_pass: bool = setting(
        False, "GPT-NeoX: run a forward pass to validate a saved checkpoint; kerple does not run that check.", effect=False
    )


@dataclass
class DeepSpeedConfig:
    """Further DeepSpeed blocks and keys of GPT-NeoX's configs, passed on to DeepSpeed as written.

    Blocks merge key by key across files. Blocks that DeepSpeed 0.19.8 no longer accepts (``amp``,
    ``elasticity``, ``curriculum_learning``, ``compression_training``, ``sparse_attention``,
    ``sparse_gradients``) load while switched off and are never passed on.
    """

    scheduler: dict = setting(
        {},
        "DeepSpeed LR-scheduler block, passed on; DeepSpeed 0.19.8 runs kerple's AnnealingLR (the client "
        "scheduler) instead of it, as lr_decay_style and the other lr_schedule keys say.",
        block=True,
    )
    prescale_gradients: bool = setting(False, "DeepSpeed: scale gradients before the all-reduce.")
    gradient_predivide_factor: float = setting(
        1.0, "DeepSpeed: divide gradients by this factor before the all-reduce.", minimum=0.0
    )
    communication_data_type: Literal["fp16", "bf16", "fp32"] | None = setting(
        None, "DeepSpeed: data type of the gradient all-reduce; null lets DeepSpeed choose."
    )
    dump_state: bool = setting(False, "DeepSpeed: print its state after initialisation.")
    flops_profiler: dict = setting({}, "DeepSpeed FLOPS-profiler block, passed on.", block=True)
    autotuning: dict = setting({}, "DeepSpeed autotuning block, passed on (read by DeepSpeed's autotuner).", block=True)
    activation_checkpointing: dict = setting(
        {},
        "DeepSpeed activation-checkpointing block, passed on; kerple's checkpoint_activations uses "
        "torch.utils.checkpoint and does not read it.",
        block=True,
    )
    data_efficiency: dict = setting(
        {},
        "DeepSpeed data-efficiency block, passed on while not enabled; enabled (curriculum sampling, token "
        "dropping) is refused: kerple's data order is GPT-NeoX's.",
        block=True,
    )
    tensorboard: dict = setting(
        {}, "DeepSpeed's own TensorBoard monitor, passed on (kerple's is tensorboard_dir).", block=True,
        block_keys=MONITOR_KEYS,
    )
    wandb: dict = setting(
        {}, "DeepSpeed's own W&B monitor, passed on (kerple's is use_wandb).", block=True, block_keys=WANDB_KEYS
    )
    csv_monitor: dict = setting({}, "DeepSpeed's CSV monitor, passed on.", block=True, block_keys=MONITOR_KEYS)
    comms_logger: dict = setting({}, "DeepSpeed communication logger, passed on.", block=True, block_keys=COMMS_LOGGER_KEYS)
    checkpoint: dict = setting(
        {}, "DeepSpeed checkpoint block, passed on; kerple writes its own checkpoints and does not read it.", block=True
    )
    data_types: dict = setting({}, "DeepSpeed data types (e.g. grad_accum_dtype: fp32), passed on.", block=True)
    deepspeed_extra_args: dict = setting(
        {},
        "Further top-level DeepSpeed keys, merged into the DeepSpeed config as written; keys that kerple derives "
        "itself (batch sizes, clipping, precision, ZeRO, optimizer) are refused here.",
        block=True,
    )
    amp: dict = setting({}, f"GPT-NeoX block for {REMOVED_BLOCKS['amp']}; refused when enabled.", effect=False, block=True)
    elasticity: dict = setting(
        {}, f"GPT-NeoX block for {REMOVED_BLOCKS['elasticity']}; refused when enabled.", effect=False, block=True
    )
    curriculum_learning: dict = setting(
        {}, f"GPT-NeoX block for {REMOVED_BLOCKS['curriculum_learning']}; refused when enabled.", effect=False, block=True
    )
    compression_training: dict = setting(
        {}, f"GPT-NeoX block for {REMOVED_BLOCKS['compression_training']}; refused unless empty.", effect=False, block=True
    )
    sparse_attention: dict = setting(
        {}, f"GPT-NeoX block for {REMOVED_BLOCKS['sparse_attention']}; read only by sparse attention types, which "
        "kerple refuses.", effect=False, block=True,
    )
    sparse_gradients: bool = setting(
        False,
        "DeepSpeed sparse embedding-gradient compression (removed from DeepSpeed 0.19.8); kerple reduces gradients "
        "dense (same result).",
        effect=False,
    )
    curriculum_seqlen: int = setting(0, "Set by GPT-NeoX at run time; kerple derives its own.", effect=False)
    deepspeed: bool = setting(True, "GPT-NeoX: always true; kerple always trains with DeepSpeed.", effect=False)


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
    "deepspeed": DeepSpeedConfig,
    "neox": NeoXOnlyConfig,
}
"""Section attribute name on :class:`~kerple.config.Config` -> its dataclass, in page order."""
