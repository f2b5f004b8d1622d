"""GPT-NeoX keys that kerple reads without acting on them, and GPT-NeoX features it refuses.

Every key that GPT-NeoX's argument classes define (the KERPLE fork of 2022 and GPT-NeoX today;
``tests/unit/config/neox_defaults.yml`` lists them) loads in kerple. The keys kerple acts on are
fields of the other sections; the rest are declared here, in one table, by kind:

* ``kernel``: chooses a kernel, fusion or device placement without changing the math;
* ``run``: launching, cluster, logging, profiling, uploading, text generation, evaluation tasks;
* ``internal``: filled in by GPT-NeoX itself at run time (or unused by its GPT training);
* ``option``: a setting of a GPT-NeoX feature that kerple refuses; inert while that feature is off;
* ``feature``: switches on a model or training feature kerple lacks: the default (feature off)
  loads, any other value is refused when the config loads, with one line naming the feature.

All of them become fields of :class:`NeoXOnlyConfig` (``cfg.neox``), marked "no effect", so they
are type-checked, merged and saved like every other key, and the config's compatibility note
(:func:`kerple.config.validate.compatibility_notes`) lists those a file set, with what kerple does
instead. A few features need more than "not the default" to be refused (``num_kv_heads`` equal to
the head count is ordinary attention); :mod:`kerple.config.neox_checks` handles those.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from kerple.config.fields import setting

KERNEL = "kernel"
RUN = "run"
INTERNAL = "internal"
OPTION = "option"
FEATURE = "feature"

_INTERNAL_NOTE = "set by GPT-NeoX at run time; kerple derives its own"
_LAUNCHER_NOTE = "GPT-NeoX launcher option; kerple's deepy.py uses DeepSpeed's launcher with --hostfile/--include"


@dataclass(frozen=True)
class NeoXKey:
    """One GPT-NeoX key: its type, GPT-NeoX's default, its kind and a note.

    The note says what kerple does instead (``kernel``, ``run``, ``internal``), which feature the
    option belongs to (``option``), or names the refused feature (``feature``).
    """

    name: str
    hint: Any
    default: Any
    kind: str
    note: str


def _keys(kind: str, hint: Any, default: Any, note: str, *names: str) -> list[NeoXKey]:
    return [NeoXKey(name, hint, default, kind, note) for name in names]


_TABLE: list[NeoXKey] = [
    # kernels, fusions and placement: same math
    NeoXKey("pipe_partition_method", str, "type:transformer|mlp", KERNEL,
            "GPT-NeoX's rule for assigning layers to pipeline stages; kerple places the layers itself (same model)"),
    NeoXKey("fp16_lm_cross_entropy", bool, False, KERNEL,
            "GPT-NeoX computes the LM loss in fp16; kerple computes it in fp32"),
    NeoXKey("use_cpu_initialization", bool, False, KERNEL,
            "GPT-NeoX draws the initial weights on the CPU; kerple draws them on the training device (same "
            "distributions)"),
    NeoXKey("sequence_parallel", bool, False, KERNEL,
            "Megatron sequence parallelism splits norms and dropout across tensor-parallel ranks (same math); kerple "
            "keeps those activations whole"),
    *_keys(KERNEL, bool, False,
           "fused CUDA kernel of GPT-NeoX; kerple runs the same math in PyTorch",
           "layernorm_fusion", "rmsnorm_fusion", "rope_fusion"),
    NeoXKey("fused_kernels_build_path", str | None, None, KERNEL,
            "where GPT-NeoX builds its CUDA kernels; kerple builds none"),
    NeoXKey("rotary_save_freqs_buffer", bool, False, KERNEL,
            "GPT-NeoX can store the rotary frequencies in checkpoints; kerple recomputes them from rotary_emb_base"),
    NeoXKey("onnx_safe", bool, False, KERNEL, "GPT-NeoX ONNX-export workaround; kerple does not export ONNX"),
    # set by GPT-NeoX itself
    *_keys(INTERNAL, bool, False, _INTERNAL_NOTE, "is_pipe_parallel", "lazy_mpu_init", "deepscale"),
    *_keys(INTERNAL, int | None, None, _INTERNAL_NOTE, "local_rank", "rank", "iteration", "gas"),
    *_keys(INTERNAL, bool | int | None, None, _INTERNAL_NOTE, "do_train", "do_valid", "do_test", "dynamic_loss_scale"),
    *_keys(INTERNAL, str | None, None, _INTERNAL_NOTE, "user_script", "deepscale_config"),
    NeoXKey("config_files", dict | None, None, INTERNAL,
            "GPT-NeoX keeps the YAML texts here; kerple writes the resolved config into each checkpoint"),
    NeoXKey("optimizer_type", str, "adam", INTERNAL,
            "GPT-NeoX copies optimizer.type here; kerple reads optimizer.type"),
    *_keys(INTERNAL, bool | int | None, None,
           "GPT-NeoX copies these from zero_optimization; kerple passes zero_optimization to DeepSpeed",
           "zero_reduce_scatter", "zero_contiguous_gradients", "zero_reduce_bucket_size", "zero_allgather_bucket_size"),
    NeoXKey("global_num_gpus", int | None, None, INTERNAL,
            "GPT-NeoX's GPU count for the batch arithmetic; kerple counts the processes the launcher starts"),
    *_keys(INTERNAL, float | None, None,
           "Megatron leftover that GPT-NeoX does not pass to DeepSpeed; loss scaling comes from the fp16 block",
           "loss_scale"),
    *_keys(INTERNAL, float, 1000.0,
           "Megatron leftover that GPT-NeoX does not pass to DeepSpeed; loss scaling comes from the fp16 block",
           "loss_scale_window"),
    *_keys(INTERNAL, int, 2,
           "Megatron leftover that GPT-NeoX does not pass to DeepSpeed; loss scaling comes from the fp16 block",
           "hysteresis"),
    *_keys(INTERNAL, float, 1.0,
           "Megatron leftover that GPT-NeoX does not pass to DeepSpeed; loss scaling comes from the fp16 block",
           "min_scale"),
    NeoXKey("short_seq_prob", float, 0.1, INTERNAL, "unused by GPT-NeoX's GPT training"),
    NeoXKey("comet_experiment", Any, None, INTERNAL, _INTERNAL_NOTE),
    # launching and clusters
    NeoXKey("master_port", int, 29500, RUN, "pass it to kerple as deepy.py --master_port"),
    NeoXKey("master_addr", str | None, None, RUN, "kerple's deepy.py lets the launcher find the first node"),
    *_keys(RUN, bool, False, _LAUNCHER_NOTE,
           "force_multi", "no_ssh_check", "deepspeed_slurm", "detect_nvlink_pairs"),
    *_keys(RUN, str | None, None, _LAUNCHER_NOTE,
           "comment", "account", "slurm_comment", "autotuning_run"),
    *_keys(RUN, bool, False,
           "ADLR cluster auto-resume; kerple resumes when the same command runs again", "adlr_autoresume"),
    *_keys(RUN, int, 1000,
           "ADLR cluster auto-resume; kerple resumes when the same command runs again", "adlr_autoresume_interval"),
    # logging, profiling and uploads
    *_keys(RUN, bool, False,
           "extra GPT-NeoX metric; kerple logs loss, learning rate, gradient norm, skipped steps and kernel parameters",
           "log_grad_pct_zeros", "log_param_norm", "log_optimizer_states", "log_gradient_noise_scale",
           "gradient_noise_scale_cpu_offload", "wandb_init_all_ranks", "profile_backward"),
    NeoXKey("log_grad_norm", bool, False, RUN, "kerple always logs the gradient norm"),
    NeoXKey("gradient_noise_scale_n_batches", int, 5, RUN,
            "extra GPT-NeoX metric; kerple does not estimate the gradient noise scale"),
    NeoXKey("wandb_run_name", str | None, None, RUN, "kerple lets W&B name the run"),
    NeoXKey("use_comet", bool | None, None, RUN, "Comet logging; kerple logs to TensorBoard and W&B"),
    *_keys(RUN, str | None, None,
           "Comet logging; kerple logs to TensorBoard and W&B",
           "comet_workspace", "comet_project", "comet_experiment_name"),
    NeoXKey("comet_tags", list | None, None, RUN, "Comet logging; kerple logs to TensorBoard and W&B"),
    NeoXKey("comet_others", dict | None, None, RUN, "Comet logging; kerple logs to TensorBoard and W&B"),
    NeoXKey("peak_theoretical_tflops", float | None, None, RUN,
            "GPT-NeoX's MFU denominator; kerple reports tokens per second"),
    *_keys(RUN, bool, False,
           "GPT-NeoX profilers; use benchmarks/ or torch.profiler around kerple", "profile", "memory_profiling"),
    NeoXKey("memory_profiling_path", str | None, None, RUN,
            "GPT-NeoX profilers; use benchmarks/ or torch.profiler around kerple"),
    NeoXKey("profile_step_start", int, 10, RUN, "GPT-NeoX profilers; use benchmarks/ or torch.profiler around kerple"),
    NeoXKey("profile_step_stop", int, 12, RUN, "GPT-NeoX profilers; use benchmarks/ or torch.profiler around kerple"),
    NeoXKey("s3_path", str | None, None, RUN, "GPT-NeoX uploads checkpoints to S3; kerple writes them to 'save' only"),
    NeoXKey("s3_chunk_size", int, 104857600, RUN,
            "GPT-NeoX uploads checkpoints to S3; kerple writes them to 'save' only"),
    NeoXKey("checkpoint_scale", Literal["linear", "log"], "linear", RUN,
            "GPT-NeoX can save at powers of checkpoint_factor; kerple saves every save_interval steps"),
    NeoXKey("extra_save_iters", list | None, None, RUN,
            "GPT-NeoX saves at these extra steps; kerple saves every save_interval steps and at the end"),
    NeoXKey("serve_model_weights", bool, False, RUN,
            "GPT-NeoX serves weights to an online data server; kerple does not"),
    NeoXKey("weight_server_port", int | list[int], 6000, RUN,
            "GPT-NeoX online data server; kerple does not serve weights"),
    NeoXKey("online_dataserver_ips", str | list[str], "localhost", RUN,
            "GPT-NeoX online data server; kerple reads data files"),
    NeoXKey("online_dataserver_ports", int | list[int], 10000, RUN,
            "GPT-NeoX online data server; kerple reads data files"),
    *_keys(RUN, bool, False, "muP tooling; kerple has no muP", "coord_check", "save_base_shapes"),
    NeoXKey("base_shapes_file", str | None, None, RUN, "muP tooling; kerple has no muP"),
    # text generation and evaluation harness: kerple's generate.py and evaluate.py take flags
    NeoXKey("text_gen_type", str | None, None, RUN,
            "GPT-NeoX generate.py setting; kerple's generate.py takes --prompt"),
    NeoXKey("temperature", float, 0.0, RUN, "GPT-NeoX generate.py setting; kerple's generate.py takes --temperature"),
    NeoXKey("top_p", float, 0.0, RUN, "GPT-NeoX generate.py setting; kerple's generate.py takes --top-p"),
    NeoXKey("top_k", int, 0, RUN, "GPT-NeoX generate.py setting; kerple's generate.py takes --top-k"),
    NeoXKey("maximum_tokens", int, 64, RUN,
            "GPT-NeoX generate.py setting; kerple's generate.py takes --max-new-tokens"),
    *_keys(RUN, bool, False,
           "GPT-NeoX generate.py setting; see python generate.py --help", "return_logits", "recompute"),
    NeoXKey("sample_input_file", str | None, None, RUN, "GPT-NeoX generate.py setting; see python generate.py --help"),
    NeoXKey("sample_output_file", str, "samples.txt", RUN,
            "GPT-NeoX generate.py setting; see python generate.py --help"),
    NeoXKey("num_samples", int, 1, RUN, "GPT-NeoX generate.py setting; see python generate.py --help"),
    NeoXKey("prompt_end", str, "\n", RUN, "GPT-NeoX generate.py setting; see python generate.py --help"),
    NeoXKey("precompute_model_name", str | None, None, RUN,
            "GPT-NeoX precomputes reference logits for DPO/KTO; kerple has no such training"),
    NeoXKey("eval_results_prefix", str, "", RUN, "lm-evaluation-harness output; kerple's evaluate.py writes --output"),
    NeoXKey("eval_tasks", list | None, None, RUN,
            "lm-evaluation-harness tasks; kerple's evaluate.py scores perplexity by length"),
    NeoXKey("char_level_ppl", bool, False, RUN,
            "GPT-NeoX character-level perplexity; kerple's evaluate.py reports token-level perplexity"),
    # settings of features kerple refuses: inert while the feature is off
    NeoXKey("param_sharing_style", str, "grouped", OPTION, "layer sharing (num_unique_layers)"),
    NeoXKey("gmlp_attn_dim", int, 64, OPTION, "gMLP layers (attention_config)"),
    NeoXKey("weighted_sampler_alpha", float, 0.3, OPTION,
            "dataset weighting by document count (weight_by_num_documents)"),
    *_keys(OPTION, bool, False,
           "Mamba layers (attention_config)", "mamba_selective_scan_fusion", "mamba_causal_conv_fusion",
           "mamba_inner_func_fusion", "mamba_use_bias_in_linears"),
    *_keys(OPTION, bool, True,
           "Mamba layers (attention_config)", "mamba_selective_fp32_params", "mamba_use_bias_in_conv"),
    *_keys(OPTION, int | None, None, "RWKV layers (attention_config)", "dim_att", "head_size", "ffn_dim"),
    NeoXKey("use_flashattn_swiglu", bool, False, OPTION, "SwiGLU activation"),
    NeoXKey("te_fp8_format", Literal["e4m3", "hybrid"], "hybrid", OPTION, "Transformer Engine fp8"),
    NeoXKey("te_fp8_wgrad", bool, True, OPTION, "Transformer Engine fp8"),
    NeoXKey("te_fp8_amax_history_len", int, 1, OPTION, "Transformer Engine fp8"),
    NeoXKey("te_fp8_amax_compute_algo", str, "most_recent", OPTION, "Transformer Engine fp8"),
    NeoXKey("te_fp8_margin", int, 0, OPTION, "Transformer Engine fp8"),
    *_keys(OPTION, list | None, None, "preference and reward training (train_impl)", *(
        f"{split}_reward_data_paths" for split in ("train", "valid", "test")), *(
        f"{sign}_{split}{label}_data_paths" for sign in ("pos", "neg") for split in ("train", "valid", "test")
        for label in ("", "_label"))),
    *_keys(OPTION, bool, True, "preference and reward training (train_impl)", "dpo_fp32", "kto_fp32", "fp32_reinforce"),
    *_keys(OPTION, bool, False,
           "preference and reward training (train_impl)", "dpo_reference_free", "reinforce_leave_one_out"),
    *_keys(OPTION, float, 0.1, "preference and reward training (train_impl)", "dpo_beta", "kto_beta", "kl_div_beta"),
    *_keys(OPTION, float, 1.0,
           "preference and reward training (train_impl)", "kto_desirable_weight", "kto_undesirable_weight"),
    NeoXKey("kl_impl", Literal["abs", "mse", "kl", "full"], "mse", OPTION,
            "preference and reward training (train_impl)"),
    NeoXKey("allow_chopped", bool, True, OPTION, "sample packing (pack_impl)"),
    *_keys(OPTION, float, 1.0,
           "muP (use_mup)", "mup_init_scale", "mup_attn_temp", "mup_output_temp", "mup_embedding_mult",
           "mup_rp_embedding_mult"),
    NeoXKey("mup_width_scale", int, 2, OPTION, "muP (use_mup)"),
    NeoXKey("moe_expert_interval", int, 1, OPTION, "mixture of experts (moe_num_experts)"),
    NeoXKey("moe_top_k", int, 1, OPTION, "mixture of experts (moe_num_experts)"),
    NeoXKey("moe_router_type", Literal["sinkhorn", "topk"], "sinkhorn", OPTION, "mixture of experts (moe_num_experts)"),
    NeoXKey("moe_lbl_in_fp32", bool, False, OPTION, "mixture of experts (moe_num_experts)"),
    NeoXKey("moe_jitter_eps", float | None, None, OPTION, "mixture of experts (moe_num_experts)"),
    # features that change the model or the training and that kerple lacks
    NeoXKey("opt_pos_emb_offset", int, 0, FEATURE, "OPT's offset of learned positions"),
    NeoXKey("use_bnb_optimizer", bool, False, FEATURE, "bitsandbytes 8-bit Adam"),
    NeoXKey("weight_by_num_documents", bool, False, FEATURE, "dataset weighting by document count"),
    NeoXKey("exit_interval", int | None, None, FEATURE,
            "stopping at exit_interval (set train_iters, or stop with SIGTERM: it saves a checkpoint)"),
    NeoXKey("use_qk_layernorm", bool, False, FEATURE, "LayerNorm on queries and keys"),
    *_keys(FEATURE, bool, True,
           "layers without biases", "use_bias_in_norms", "use_bias_in_attn_linear", "use_bias_in_mlp"),
    *_keys(FEATURE, bool, False,
           "Transformer Engine layers", "te_columnparallel", "te_rowparallel", "te_layernorm_mlp", "te_mha", "te_fp8_mha"),
    *_keys(FEATURE, list | None, None,
           "label data (per-token training targets)", "train_label_data_paths", "valid_label_data_paths",
           "test_label_data_paths"),
    NeoXKey("pack_impl", Literal["packed", "pack_until_overflow", "unpacked"], "packed", FEATURE,
            "sample packing other than GPT-NeoX's default 'packed'"),
    NeoXKey("dataset_impl", Literal["gpt2", "pairwise", "online"], "gpt2", FEATURE,
            "datasets other than GPT-NeoX's default 'gpt2'"),
    NeoXKey("train_impl", Literal["normal", "dpo", "rm", "kto", "reinforce"], "normal", FEATURE,
            "preference and reward training (DPO, RM, KTO, REINFORCE)"),
    NeoXKey("z_loss", float, 0.0, FEATURE, "the z-loss term"),
    NeoXKey("train_epochs", int | None, None, FEATURE, "epoch-based run length (set train_iters)"),
    NeoXKey("use_mup", bool, False, FEATURE, "muP parametrisation"),
    NeoXKey("moe_num_experts", int, 1, FEATURE, "mixture of experts"),
    NeoXKey("sliding_window_width", int | None, None, FEATURE,
            "Mistral's sliding window (kerple's own window is attention_window, thesis 4.3.3)"),
    # refused by kerple.config.neox_checks when the value changes the model
    NeoXKey("num_unique_layers", int | None, None, OPTION, "layer sharing: refused unless null or num_layers"),
    NeoXKey("num_kv_heads", int | None, None, OPTION,
            "grouped-query attention: refused unless null or num_attention_heads"),
    NeoXKey("intermediate_size", int | None, None, OPTION, "MLP width: refused unless null or 4 x hidden_size"),
    NeoXKey("expansion_factor", float | None, None, OPTION,
            "MLP width as a multiple of hidden_size: refused unless null or 4"),
    NeoXKey("mlp_multiple_of", int, 1, OPTION, "MLP width rounding: refused when it changes 4 x hidden_size"),
    NeoXKey("gpt_j_tied", bool, False, OPTION,
            "one shared LayerNorm in the parallel residual: refused with gpt_j_residual true"),
    NeoXKey("soft_prompt_tuning", dict | None, None, OPTION, "soft-prompt tuning: refused when enabled"),
]


def _field(key: NeoXKey) -> Any:
    if key.kind == FEATURE:
        help_text = f"{key.note}; not in kerple: any value other than the default is refused."
        return setting(key.default, help_text, effect=False, refuse=key.note)
    prefix = {OPTION: "setting of a GPT-NeoX feature: ", KERNEL: "", RUN: "", INTERNAL: ""}[key.kind]
    return setting(key.default, f"{prefix}{key.note}.", effect=False)


NeoXOnlyConfig = dataclasses.make_dataclass(
    "NeoXOnlyConfig",
    [(key.name, key.hint, _field(key)) for key in _TABLE],
    namespace={
           "__doc__": (
            "GPT-NeoX keys that kerple reads without acting on them (kernels, launching, logging, "
            "generation, settings of features kerple lacks), and the GPT-NeoX features kerple refuses "
            "(any value but the default). A config that sets one is noted when it loads."
        ),
           "__module__": __name__,
    },
)
