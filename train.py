"""Train a GPT-NeoX-style model in this process.

    python train.py configs/models/tiny.yml configs/pe/kerple_log.yml configs/data/stdlib.yml
    python train.py configs/models/162M.yml configs/pe/kerple_log.yml --dry-run
    python train.py <ymls> train_iters=100 lr=3e-4        # key=value overrides

Without a launcher it runs as a single rank (RANK/WORLD_SIZE/... are filled in; DS_ACCELERATOR=cpu
when there is no CUDA). For several ranks use deepy.py. See kerple/training/cli.py.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("train.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.training.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main(sys.argv[1:]))
