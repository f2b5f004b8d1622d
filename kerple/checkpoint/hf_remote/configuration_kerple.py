"""``KerpleConfig``: the configuration of ``KerpleForCausalLM`` (``modeling_kerple.py`` beside it).

kerple's exporter (``tools/convert_checkpoint.py SRC OUT --to hf``) copies this file unchanged into
every folder whose model no stock ``transformers`` class computes; it needs only ``transformers``.
The fields are GPT-NeoX's (docs/interop.md) plus the norm, the attention window and ``positional``:
where the positional embedding acts and with which per-head parameters (see ``modeling_kerple.py``).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class KerpleConfig(PretrainedConfig):
    """A GPT-NeoX decoder (pre-LN, fused per-head QKV, 4h MLP, biases everywhere) with any norm and
    activation of kerple and a positional embedding described by ``positional``.

    ``positional`` maps a place (``input``, ``query_key``, ``bias``, ``weight``) to a term
    ``{"form": name, <parameter>: value}``; ``positional["tensors"]`` lists the stored tensors
    (``{"name": {"shape": [...], "trainable": bool}}``) that parameters may name.
    ``attention_window`` W lets query ``i`` see keys ``j`` with ``0 <= i - j < W`` only.
    ``max_position_embeddings`` is the rows of a learned position table, the one embedding with a
    longest input; ``None`` for the others, whose point is reading inputs longer than
    ``training_length`` (so transformers does not warn that such inputs exceed the model).
    """

    model_type = "kerple"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size: int = 50304,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int | None = None,
        hidden_act: str = "gelu",
        norm: str = "layernorm",
        layer_norm_eps: float = 1e-5,
        use_parallel_residual: bool = False,
        max_position_embeddings: int | None = None,
        training_length: int | None = None,
        attention_window: int | None = None,
        positional: dict[str, Any] | None = None,
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.hidden_act = hidden_act
        self.norm = norm
        self.layer_norm_eps = layer_norm_eps
        self.use_parallel_residual = use_parallel_residual
        self.max_position_embeddings = max_position_embeddings
        self.training_length = training_length
        self.attention_window = attention_window
        self.positional = positional or {}
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
