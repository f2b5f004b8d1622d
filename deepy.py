"""Merge and validate the YAML configs once, then launch train.py on every rank.

    python deepy.py train.py configs/models/162M.yml configs/pe/kerple_log.yml configs/data/github.yml
    python deepy.py train.py -d configs models/tiny.yml pe/alibi.yml data/stdlib.yml   # GPT-NeoX's -d form
    python deepy.py train.py <ymls> [key=value ...] [--hostfile H] [--num_gpus N] [--include S]

The resolved config is written to <log_dir>/resolved-config-*.yml and that one file is passed to
every rank. CUDA: DeepSpeed's launcher; CPU: torch.distributed.run with gloo. See
kerple/training/cli.py.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("deepy.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.training.cli import deepy_main

if __name__ == "__main__":
    sys.exit(deepy_main(sys.argv[1:]))
