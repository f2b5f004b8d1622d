"""Training throughput of every positional embedding on the current device, in one run.

    python benchmarks/train_throughput.py                    # tiny config on CPU, 162M on a GPU
    python benchmarks/train_throughput.py --pe none kerple_log alibi --steps 10
    python benchmarks/train_throughput.py --model configs/models/162M.yml --extra configs/setups/local_gpu.yml

Each embedding trains ``--warmup`` untimed steps then ``--steps`` timed ones on a synthetic corpus
(uniform random tokens: speed does not depend on the text). Prints tokens/s, ms/step and the
ratio of tokens/s to ``none``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_random_corpus(prefix: Path, vocab: int, tokens: int, seed: int = 0) -> None:
    from kerple.data.indexed_dataset import IndexedDatasetWriter

    rng = np.random.RandomState(seed)
    dtype = np.uint16 if vocab < 65500 else np.int32
    with IndexedDatasetWriter(prefix, dtype=dtype) as writer:
        for _ in range(max(tokens // 2048, 8)):
            writer.add_document(rng.randint(0, vocab, size=2048))
        writer.finalize()


def main(argv: list[str] | None = None) -> int:
    import torch

    from kerple import positional
    from kerple.config import load_config
    from kerple.parallel.groups import init_distributed, teardown
    from kerple.training.trainer import Trainer

    gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / ("configs/models/162M.yml" if gpu else "configs/models/tiny.yml")))
    parser.add_argument("--extra", nargs="*", default=[str(REPO / ("configs/setups/local_gpu.yml" if gpu else "configs/setups/cpu.yml"))])
    parser.add_argument("--pe", nargs="+", default=positional.names())
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args(argv)
    names = ["none"] + [n for n in args.pe if n != "none"]

    parallel = init_distributed(1, 1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = load_config([args.model, *args.extra], dict(o.split("=", 1) for o in args.overrides))
        base.resolve_batch(1)
        steps = args.warmup + args.steps
        need = steps * int(base.training.train_batch_size) * (int(base.model.seq_length) + 1) * 2
        write_random_corpus(Path(tmp) / "corpus", int(base.model.vocab_size), need)
        for name in names:
            cfg = load_config(
                [args.model, *args.extra],
                {**dict(o.split("=", 1) for o in args.overrides), "pos_emb": name, "data_path": f"{tmp}/corpus",
                 "split": "100,0,0", "train_iters": steps, "lr_decay_iters": steps, "save": None, "load": None,
                 "log_dir": None, "tensorboard_dir": None, "use_wandb": False, "eval_iters": 0},
            ).resolve_batch(1)
            with contextlib.redirect_stdout(io.StringIO()):
                trainer = Trainer(cfg, parallel)
            times = []
            for step in range(steps):
                if gpu:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                trainer.train_step()
                if gpu:
                    torch.cuda.synchronize()
                if step >= args.warmup:
                    times.append(time.perf_counter() - start)
            trainer.close()
            tokens = int(cfg.training.train_batch_size) * int(cfg.model.seq_length)
            step_time = statistics.median(times)
            rows.append((name, tokens / step_time, step_time * 1000))
            print(f"  measured {name}: {tokens / step_time:,.0f} tok/s", file=sys.stderr, flush=True)
    teardown(parallel)

    device = torch.cuda.get_device_name() if gpu else "CPU"
    print(f"\ntraining throughput on {device} ({Path(args.model).name}, {tokens} tokens/step, median of {args.steps} steps)")
    print(f"{'embedding':<24}{'tokens/s':>12}{'ms/step':>10}{'vs none':>9}")
    reference = rows[0][1]
    for name, rate, ms in rows:
        print(f"{name:<24}{rate:>12,.0f}{ms:>10.1f}{rate / reference:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
