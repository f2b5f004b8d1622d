"""Weight initializations of GPT-NeoX by name (``init_method`` / ``output_layer_init_method``).

docs/reference-format.md §4: the 162M model uses ``normal`` N(0, 0.02) for every weight and ``scaled_normal``
N(0, 0.02 / sqrt(2·num_layers)) for the two output projections (``attention.dense``,
``mlp.dense_4h_to_h``); biases are zero and LayerNorms are ones/zeros. The other names follow
GPT-NeoX's ``init_functions``:

* ``small_init``: N(0, sqrt(2 / (5·h))) (Nguyen & Salazar 2019);
* ``wang_init``: N(0, 2 / num_layers / sqrt(h)) (Wang 2021, GPT-J);
* ``xavier_uniform`` / ``xavier_normal``: ``torch.nn.init`` with gain 1.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

InitFn = Callable[[torch.Tensor], torch.Tensor]

INIT_METHODS: tuple[str, ...] = ("normal", "scaled_normal", "small_init", "wang_init", "xavier_uniform", "xavier_normal")


def init_function(name: str, *, std: float, num_layers: int, hidden_size: int) -> InitFn:
    """The in-place initializer called ``name``; raises ``ValueError`` for an unknown name."""
    if name == "normal":
        return lambda tensor: nn.init.normal_(tensor, mean=0.0, std=std)
    if name == "scaled_normal":
        scaled = std / math.sqrt(2.0 * num_layers)
        return lambda tensor: nn.init.normal_(tensor, mean=0.0, std=scaled)
    if name == "small_init":
        small = math.sqrt(2.0 / (5.0 * hidden_size))
        return lambda tensor: nn.init.normal_(tensor, mean=0.0, std=small)
    if name == "wang_init":
        wang = 2.0 / num_layers / math.sqrt(hidden_size)
        return lambda tensor: nn.init.normal_(tensor, mean=0.0, std=wang)
    if name == "xavier_uniform":
        return nn.init.xavier_uniform_
    if name == "xavier_normal":
        return nn.init.xavier_normal_
    raise ValueError(f"unknown init method {name!r}; choose one of {', '.join(INIT_METHODS)}")
