"""How well each layer's hidden states encode the absolute position (thesis §2.2, Fig. 2.2).

A probe (linear least squares, or the thesis' two-layer network with a ReLU between, §2.8.1) is
fitted on the hidden states of some held-out windows to predict the position ``0 .. L-1`` and
scored by the mean absolute error on other windows. Layer 0 is the embedding output; layer ``r``
the output of the ``r``-th transformer layer.

Two choices differ from the thesis' Fig. 2.2 on purpose: the probe regresses the position (mean
squared error) rather than classifying it, since the score is a distance in tokens; and it reads a
trained checkpoint on held-out text (as Haviv et al. 2022 do), where the thesis also probes a
random frozen model fed random vectors. Full-batch Adam, 1000 steps, learning rate 1e-3 (the
thesis: 5000 steps, batch 32).
"""

from __future__ import annotations

from typing import Any

import torch

from kerple.progress import progress_bar

PROBES = ("linear", "mlp")


@torch.no_grad()
def hidden_states_by_layer(model: torch.nn.Module, windows: torch.Tensor) -> list[torch.Tensor]:
    """``[N, L, h]`` hidden states after the embedding and after each layer (R + 1 tensors)."""
    captured: list[list[torch.Tensor]] = [[] for _ in range(len(model.layers) + 1)]
    hooks = [model.embedding.register_forward_hook(lambda _m, _i, out: captured[0].append(out.float().cpu()))]
    for index, layer in enumerate(model.layers, start=1):
        hooks.append(layer.register_forward_hook(lambda _m, _i, out, i=index: captured[i].append(out.float().cpu())))
    try:
        for start in range(0, len(windows), 8):
            model(windows[start : start + 8].to(model.lm_head_weight.device))
    finally:
        for hook in hooks:
            hook.remove()
    return [torch.cat(parts) for parts in captured]


def fit_probe(features: torch.Tensor, targets: torch.Tensor, kind: str, steps: int = 1000,
              seed: int = 0) -> torch.nn.Module:
    """A probe ``[n, h] -> [n]``: least squares (``linear``) or a two-layer ReLU network trained with Adam (§2.8.1)."""
    torch.manual_seed(seed)
    mean, std = features.mean(0), features.std(0) + 1e-6
    if kind == "linear":
        design = torch.cat([(features - mean) / std, torch.ones(len(features), 1)], dim=1)
        solution = torch.linalg.lstsq(design.double(), targets.double()[:, None]).solution.float()
        probe = torch.nn.Linear(features.shape[1], 1)
        probe.weight.data, probe.bias.data = solution[:-1].T.clone(), solution[-1].clone()
    else:
        probe = torch.nn.Sequential(torch.nn.Linear(features.shape[1], 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
        optimizer = torch.optim.Adam(probe.parameters(), lr=1e-3)
        scale = float(targets.max()) or 1.0
        inputs = (features - mean) / std
        for _ in range(steps):  # full-batch: the probes' training sets are small
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(probe(inputs).squeeze(-1), targets / scale)
            loss.backward()
            optimizer.step()
        probe = _Rescaled(probe, scale)
    return _Standardized(probe, mean, std)


class _Standardized(torch.nn.Module):
    def __init__(self, probe: torch.nn.Module, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.probe, self.mean, self.std = probe, mean, std

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.probe((features - self.mean) / self.std).squeeze(-1)


class _Rescaled(torch.nn.Module):
    def __init__(self, probe: torch.nn.Module, scale: float) -> None:
        super().__init__()
        self.probe, self.scale = probe, scale

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.probe(features) * self.scale


def fitting_windows(count: int, train_fraction: float = 0.5) -> int:
    """How many of ``count`` windows fit the probe (at least one; at least one is left to score it)."""
    return max(1, min(count - 1, int(round(count * train_fraction))))


def probe_errors(states: list[torch.Tensor], kind: str = "linear", train_fraction: float = 0.5,
                 progress: bool = True) -> list[float]:
    """Test MAE of the position probe for each layer's ``[N, L, h]`` states (first windows fit, the rest score)."""
    count, length = states[0].shape[:2]
    split = fitting_windows(count, train_fraction)
    positions = torch.arange(length, dtype=torch.float32)
    errors = []
    for layer_states in progress_bar(states, desc=f"position probe ({kind})", disable=not progress):
        train = layer_states[:split].reshape(-1, layer_states.shape[-1])
        probe = fit_probe(train, positions.repeat(split), kind)
        with torch.no_grad():
            predicted = probe(layer_states[split:].reshape(-1, layer_states.shape[-1]))
        errors.append(float((predicted - positions.repeat(count - split)).abs().mean()))
    return errors


def constant_guess_error(length: int) -> float:
    """MAE of the best constant guess, the median ``(L - 1) / 2``, over positions ``0 .. L-1``: the
    score of a probe that learned nothing (``L/4`` for even ``L``; 128 at 512, as in Fig. 2.2)."""
    middle = (length - 1) / 2
    return sum(abs(position - middle) for position in range(length)) / length


def plot_probe(runs: dict[str, list[float]], length: int, title: str) -> Any:
    """Fig. 2.2: probe MAE per layer, one line per run; the best constant guess for reference."""
    from kerple.analysis.common import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5.6, 3.6))
    for label, errors in runs.items():
        axis.plot(range(len(errors)), errors, marker="o", label=label)
    axis.axhline(constant_guess_error(length), color="grey", linestyle=":",
                 label=f"constant guess (L-1)/2, L = {length}")
    axis.set_xticks(range(max(len(errors) for errors in runs.values())))
    axis.set_xlabel("layer (0 = embeddings)")
    axis.set_ylabel("position MAE (tokens)")
    axis.set_title(title)
    axis.legend(fontsize=8)
    return figure
