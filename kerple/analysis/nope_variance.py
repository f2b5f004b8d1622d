"""Position hidden in the variance of a NoPE model's first attention output (thesis §2.3, Fig. 2.4).

Lemma 2.3: with every weight of ``W_q, W_k, W_v, W_o`` drawn i.i.d. from ``N(0, σ²)``, unit-variance
inputs (after the layer norm) and σ small enough that attention is almost uniform (Property 2.1),
the attention output ``o_m`` at position ``m`` (1-based: ``m`` visible keys) has zero mean and
covariance ``(d² σ⁴ / m) I``, ``d`` the hidden size. :func:`random_model_variance` measures it by
drawing fresh weights and inputs for every sample; :func:`trained_model_variance` measures the
same output of a trained checkpoint on held-out text.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from kerple.progress import progress_bar


SMALL_LOGIT_VARIANCE = 0.1
"""Above this variance of the scaled logits, ``nope-variance`` says that Property 2.1 (near-uniform
attention) fails: the logits then spread the softmax weights by a third or more around uniform."""


def logit_variance(hidden_size: int, num_heads: int, sigma: float) -> float:
    """Lemma 2.2's variance of the scaled logits ``l_mn / sqrt(d/H)``: ``d² σ⁴ / H``. Property 2.1
    (attention almost uniform, which Lemma 2.3 assumes) needs it small (thesis §2.3.2, Fig. 2.5)."""
    return hidden_size**2 * sigma**4 / num_heads


def lemma_variance(hidden_size: int, sigma: float, length: int) -> list[float]:
    """Lemma 2.3's ``d² σ⁴ / m`` for ``m = 1 .. length``."""
    return [hidden_size**2 * sigma**4 / m for m in range(1, length + 1)]


def first_attention_output(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Layer 0's attention output ``[b, s, h]`` (before the residual) for ``tokens [b, s]``."""
    context = model.attention_context(tokens.shape[1], tokens.device)
    hidden = model.embedding(tokens, context.q_positions, model.positional)
    layer = model.layers[0]
    return layer.attention(layer.input_layernorm(hidden), context)


def variance_by_position(outputs: Callable[[int], torch.Tensor], samples: int, progress: bool,
                         desc: str) -> list[float]:
    """Variance over samples of each coordinate of ``o_m``, averaged over coordinates: ``[s]``.

    ``outputs(i)`` returns the ``[b, s, h]`` outputs of draw ``i``; draws continue until ``samples`` rows.
    """
    rows: list[torch.Tensor] = []
    count, draw = 0, 0
    with progress_bar(total=samples, desc=desc, disable=not progress) as bar:
        while count < samples:
            batch = outputs(draw).double()[: samples - count]
            rows.append(batch.cpu())
            count += len(batch)
            draw += 1
            bar.update(len(batch))
    stacked = torch.cat(rows)  # [n, s, h]
    return stacked.var(dim=0, unbiased=True).mean(dim=-1).tolist()


@torch.no_grad()
def random_model_variance(model: torch.nn.Module, length: int, sigma: float, samples: int = 500,
                          batch_size: int = 10, seed: int = 0, progress: bool = True) -> list[float]:
    """Fig. 2.4's simulation: every draw has fresh ``N(0, σ²)`` attention weights (zero biases),
    fresh ``N(0, 1)`` word embeddings, and distinct tokens within a sequence (a repeated token
    would repeat its value vector and raise the variance above the lemma's independent inputs)."""
    generator = torch.Generator().manual_seed(seed)
    attention = model.layers[0].attention
    device = model.lm_head_weight.device

    def draw(_index: int) -> torch.Tensor:
        for linear in (attention.query_key_value, attention.dense):
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * sigma)
            linear.bias.zero_()
        words = model.embedding.word_embeddings.weight
        words.copy_(torch.randn(words.shape, generator=generator))
        if model.vocab_size >= length:
            tokens = torch.stack([torch.randperm(model.vocab_size, generator=generator)[:length]
                                  for _ in range(batch_size)])
        else:
            tokens = torch.randint(0, model.vocab_size, (batch_size, length), generator=generator)
        return first_attention_output(model, tokens.to(device))

    return variance_by_position(draw, samples, progress, "NoPE variance (random model)")


@torch.no_grad()
def trained_model_variance(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 16,
                           progress: bool = True) -> list[float]:
    """The same variance for a trained model on held-out ``windows [N, L]``."""
    device = model.lm_head_weight.device

    def draw(index: int) -> torch.Tensor:
        return first_attention_output(model, windows[index * batch_size : (index + 1) * batch_size].to(device))

    return variance_by_position(draw, len(windows), progress, "NoPE variance (checkpoint)")


def plot_variance(curves: dict[str, list[float]], title: str) -> Any:
    """Fig. 2.4: log position against log variance."""
    from kerple.analysis.common import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5.6, 3.8))
    for label, values in curves.items():
        style = {"linestyle": "--", "color": "black"} if label.startswith("Lemma") else {}
        axis.plot(range(1, len(values) + 1), values, label=label, **style)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("position m")
    axis.set_ylabel("variance of the first attention output")
    axis.set_title(title)
    axis.legend(fontsize=8)
    return figure
