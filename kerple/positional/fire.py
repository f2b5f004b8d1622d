"""``fire``: Functional Interpolation for Relative positional Encoding (Li et al. 2023, arXiv
2310.04418).

The bias of query position ``i`` and key position ``j <= i`` is a learned function of their distance,
normalised by the query position (*progressive interpolation*), through a log transform:

    b(i, j) = f_θ( ψ(i - j) / ψ(max(i, L)) ),     ψ(x) = log(c·x + 1),

with ``f_θ`` an MLP ``1 → W → H`` (ReLU; W = 32) and learnable ``c`` and threshold ``L``. The
normalised input lies in ``[0, 1]`` at every length, which is why FIRE is meant to extrapolate;
because it depends on ``i`` and not only on ``i - j``, the term has no distance tables.

The paper's text could not be read where this was written; the formula is checked against the
public implementations. Details the paper leaves to its code follow the GPT-NeoX one that sits beside
KERPLE (DAPE's fork, class ``FIRE``): ``ψ(x) = log(|c·x| + 1)``, the threshold is
``|L_multiplier · init_L|`` with ``init_L`` fixed and ``L_multiplier`` (initially 1) learned, ``c``
starts at 0.1, and ``1e-6`` is added to the denominator. Their names are kept (``mlp.0``, ``mlp.2``,
``c``, ``init_L``, ``L_multiplier``), but the MLP's output layer has no bias: a constant per head is
added to every score of the head's rows and cancels in the softmax (its gradient is 0). ``init_L``
is 512 by default, the default of that fork's class and of the FIRE class circulated with the
paper's citation (the fork's own configs pass 64 for train length 512). It matters: below the
threshold a row's normaliser is the constant ``ψ(L)``, so with ``L`` at or above the evaluated
lengths FIRE is a learned function of the distance alone, and with ``L`` below the train length
the normalisation by ``ψ(i)`` already acts in training (README, "Results: make demo", measures both).

Sharing: that fork builds one FIRE per layer. Here, as for every positional module of this project
(GPT-NeoX's KERPLE reference shares its kernel parameters across layers), ONE module serves all
layers: FIRE and KERPLE are compared with the same sharing, and eager/sdpa build the dense term once
per forward instead of once per layer.

The term is a closed form (:meth:`Fire.logit_term`): the MLP is unrolled over its W hidden units
inside FlexAttention's ``score_mod``, reading ``[1]`` pieces of the first layer and ``[H]`` columns
of the second, each its own tensor (a clone: every captured tensor is read once, FlexAttention's
rule, and its CPU lowering refuses captured views of one storage), so nothing of size ``L`` is read
and memory stays O(L). Eager and sdpa evaluate the same function on the grid of the forward's
(absolute) query and key positions, so a KV cache that decodes row ``i`` alone gets row ``i``'s bias.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind
from kerple.positional.logit_term import LogitTerm, ScorePosition, TermFunction, causal_distance
from kerple.positional.options import option

EPSILON = 1e-6  # added to ψ(max(i, L)), as the public implementation


@dataclass(frozen=True)
class FireOptions:
    """Options of ``fire``."""

    fire_mlp_width: int = option(
        32, "Hidden width W of FIRE's MLP 1 -> W -> heads; 32 as the FIRE paper and its public code.", minimum=1
    )
    fire_init_c: float = option(
        0.1, "Initial c of FIRE's log transform psi(x) = log(|c x| + 1); 0.1 as FIRE's public code.", minimum=1e-6
    )
    fire_init_threshold: float = option(
        512.0,
        "FIRE's fixed init_L: the threshold L is |L_multiplier * init_L| (L_multiplier learned, from 1); "
        "512 as FIRE's public code.",
        minimum=1.0,
    )


def fire_term(width: int) -> TermFunction:
    """``f_θ(ψ(i - j) / ψ(max(i, L)))`` per score (FIRE's bias) for an MLP of ``width`` hidden units,
    reading the tensors :meth:`Fire.logit_term` packs: ``c [1]``, ``L_multiplier [1]``, ``init_L [1]``,
    then the first layer's weights ``[1]`` of every hidden unit, its biases ``[1]``, and the second
    layer's columns ``[H]`` (anything after them, e.g. a softmax temperature's ``1/τ``, is not read here).

    Every tensor is read once; the hidden units are summed in a Python loop (unrolled when traced).
    """

    def bias(tensors: tuple[torch.Tensor, ...], position: ScorePosition) -> torch.Tensor:
        c, multiplier, init_l = tensors[:3]
        weights_in, biases_in = tensors[3 : 3 + width], tensors[3 + width : 3 + 2 * width]
        weights_out = tensors[3 + 2 * width : 3 + 3 * width]
        c = torch.abs(c[0])
        threshold = torch.abs(multiplier[0] * init_l[0])
        query = position.query.to(torch.float32)
        normaliser = torch.log1p(c * torch.maximum(query, threshold)) + EPSILON
        normalised = torch.log1p(c * causal_distance(position)) / normaliser
        return sum(
            weight_out[position.head] * torch.relu(normalised * weight_in[0] + bias_in[0])
            for weight_in, bias_in, weight_out in zip(weights_in, biases_in, weights_out)
        )

    return bias


class Fire(PositionalEmbedding):
    """FIRE, one module for all layers: ``mlp`` (``Linear(1, W)``, ReLU, ``Linear(W, H)`` without bias), ``c``,
    ``L_multiplier`` (parameters) and ``init_L`` (a buffer), all float32; the last three of shape ``[1]``."""

    kind = PositionKind.BIAS
    state_dict_name = "fire"
    learnable = True
    tensor_parallel = False
    tableless_term = True
    options_class = FireOptions

    def __init__(self, shape: ModelShape, options: FireOptions = FireOptions()) -> None:
        super().__init__(shape)
        width = int(options.fire_mlp_width)
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, shape.num_heads, bias=False))
        # [1] rather than 0-d as in the public code: DeepSpeed's parameter broadcast cannot view a 0-d tensor
        self.c = nn.Parameter(torch.tensor([float(options.fire_init_c)]))
        self.register_buffer("init_L", torch.tensor([float(options.fire_init_threshold)]))
        self.L_multiplier = nn.Parameter(torch.tensor([1.0]))

    def logit_term(self) -> LogitTerm:
        """The closed form :func:`fire_term` with its tensors (clones of pieces of the parameters: gradients
        reach them)."""
        first, second = self.mlp[0], self.mlp[2]
        tensors = (
            self.c.float(),
            self.L_multiplier.float(),
            self.init_L.float(),
            *(w.clone() for w in first.weight.float().reshape(-1).split(1)),  # W x [1]
            *(b.clone() for b in first.bias.float().split(1)),  # W x [1]
            *(w.clone() for w in second.weight.float().unbind(1)),  # W x [H]
        )
        return LogitTerm(tensors, bias=fire_term(self.mlp[0].out_features))

    def export_terms(self) -> dict[str, dict[str, Any]]:
        """The ``fire`` bias form (a form of the query position too) reading the stored tensors."""
        names = {"c": "c", "L_multiplier": "L_multiplier", "init_L": "init_L", "first_weight": "mlp.0.weight",
                 "first_bias": "mlp.0.bias", "second_weight": "mlp.2.weight"}
        return {"bias": {"form": "fire", **{key: {"tensor": name} for key, name in names.items()}}}
