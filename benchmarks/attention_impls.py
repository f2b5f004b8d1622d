"""Forward(+backward) time of a tiny GPT-NeoX per attention implementation on the current device.

    python benchmarks/attention_impls.py [--lengths 512,2048] [--pos-emb kerple_log] [--repeats 3]

Model: 2 layers, h=128, 4 heads, vocab 512, batch 1, fp32. Each implementation is timed for a
forward under ``torch.no_grad`` (evaluation) and for forward+backward (a training step without the
optimizer) where it has a backward on the device (FlexAttention has none on CPU). ``triton`` (the fused
kernel of ``attention_impl: triton``) is timed on CUDA only (on a CPU it runs only in Triton's interpreter).
flex is compiled once per length during the warm-up. Prints the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import sys

from kerple.errors import entry_point
from kerple.flags import AT_LEAST_1, check_flags, heavy_imports, name_list, number_list

IMPLS = ("eager", "sdpa", "flex", "triton")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="attention_impls.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--pos-emb", default="kerple_log")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    args = parser.parse_args(argv)
    check_flags(args, {"--repeats": AT_LEAST_1})
    args.lengths = number_list("--lengths", args.lengths, AT_LEAST_1)
    args.impls = name_list("--impls", args.impls, IMPLS)
    return args


with heavy_imports("attention_impls.py", parse_args if __name__ == "__main__" else None):
    import torch
    import torch.nn.functional as F

    from kerple import positional
    from kerple.errors import UsageError
    from kerple.measure.device import median_seconds
    from kerple.model import GPTModel, unsupported_reason
    from kerple.runs import resolve_device


def _model(name: str, impl: str, device: torch.device) -> GPTModel:
    torch.manual_seed(0)
    pe = positional.build(name, num_heads=4, head_dim=32, hidden_size=128, max_positions=1 << 16, num_layers=2)
    return GPTModel(
        num_layers=2, hidden_size=128, num_attention_heads=4, padded_vocab_size=512, positional=pe, attention_impl=impl
    ).to(device)


def _time(step, repeats: int, device: torch.device) -> float:
    step()  # warm-up (and compilation for flex)
    return median_seconds(step, repeats, device)


def measure(name: str, impl: str, length: int, repeats: int, device: torch.device, training: bool) -> float | None:
    """Seconds of one forward (``training=False``) or forward+backward; None when unsupported."""
    family = positional.family(name)
    if unsupported_reason(impl, family.kind, device.type, training) is not None:
        return None
    if impl == "triton" and device.type != "cuda":  # Triton's CPU interpreter: correct, not timed
        return None
    model = _model(name, impl, device)
    tokens = torch.randint(0, 512, (1, length + 1), device=device)

    def train_step() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()

    def forward_step() -> None:
        with torch.no_grad():
            model(tokens[:, :-1])

    if training:
        return _time(train_step, repeats, device)
    model.eval()
    return _time(forward_step, repeats, device)


@entry_point("attention_impls.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pos_emb not in (*positional.names(), *positional.aliases()):
        raise UsageError(f"--pos-emb {args.pos_emb}: not an embedding of the registry; choose one of "
                         f"{', '.join(positional.names())}")
    device = resolve_device(args.device)
    lengths = args.lengths
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()} pos_emb={args.pos_emb}")
    print("model: 2 layers, h=128, 4 heads, vocab 512, batch 1, fp32")
    print("| impl | mode | " + " | ".join(f"{length} tok (s)" for length in lengths) + " |")
    print("|---|---|" + "---|" * len(lengths))
    for impl in args.impls:
        for mode, training in (("fwd", False), ("fwd+bwd", True)):
            cells = []
            for length in lengths:
                seconds = measure(args.pos_emb, impl, length, args.repeats, device, training)
                cells.append("unsupported" if seconds is None else f"{seconds:.3f}")
            print(f"| {impl} | {mode} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
