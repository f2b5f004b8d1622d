"""Training speed per positional embedding, the layout of KERPLE paper Table 4 (sec/step).

    python tools/benchmark_speed.py configs/models/162M.yml configs/setups/local_gpu.yml \
        --pos-emb kerple_log,kerple_power,alibi,rpe,rotary,sinusoidal,none

Every embedding is timed in the same process on the current device: the config's model and micro
batch at its seq_length, a forward + backward through ``chunked_loss`` and an Adam step on random
tokens, ``--warmup`` untimed steps then the mean of ``--steps`` timed ones. The last row is the
ratio to ``none`` (no position information) when it is in the list. The data pipeline and DeepSpeed
engine are not included: this measures what the embedding costs the model (see
benchmarks/train_throughput.py for whole-trainer throughput).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from kerple.config import ConfigError, load_config, parse_overrides
from kerple.model import build_model


def seconds_per_step(cfg, device: torch.device, steps: int, warmup: int) -> float:
    """Mean wall seconds of one optimizer step of ``cfg``'s model on random tokens."""
    torch.manual_seed(cfg.training.seed)
    model = build_model(cfg).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch, length = cfg.training.micro_batch_size or 1, cfg.model.seq_length
    tokens = torch.randint(0, cfg.model.vocab_size, (batch, length + 1), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision.precision == "bf16" and device.type == "cuda")
    for step in range(warmup + steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
        with autocast:
            loss = model.chunked_loss(tokens[:, :-1], tokens[:, 1:]).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - started) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="YAML files, then key=value overrides")
    parser.add_argument("--pos-emb", default="kerple_log,kerple_power,alibi,rpe,rotary,sinusoidal,none")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", help="default: cuda when available")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    yamls = [c for c in args.configs if "=" not in c]
    names = [name.strip() for name in args.pos_emb.split(",") if name.strip()]
    timings: dict[str, float] = {}
    try:
        overrides = parse_overrides([c for c in args.configs if "=" in c])
        for name in names:
            cfg = load_config(yamls, {**overrides, "pos_emb": name})
            timings[name] = seconds_per_step(cfg, device, args.steps, args.warmup)
            print(f"{name}: {timings[name]:.4f} s/step", file=sys.stderr)
    except ConfigError as error:
        print(f"benchmark_speed.py: error: {error}", file=sys.stderr)
        return 2
    width = max(12, *(len(n) + 2 for n in names))
    print(f"device {device}, micro batch {cfg.training.micro_batch_size}, seq {cfg.model.seq_length}, "
          f"{cfg.model.num_layers} layers x {cfg.model.hidden_size}, attention {cfg.attention.attention_impl}")
    print(" " * 14 + "".join(f"{n:>{width}}" for n in names))
    print(f"{'sec/step':<14}" + "".join(f"{timings[n]:>{width}.4f}" for n in names))
    if "none" in timings:
        print(f"{'ratio to none':<14}" + "".join(f"{timings[n] / timings['none']:>{width}.3f}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
