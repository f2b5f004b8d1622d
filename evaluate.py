"""Evaluate a trained checkpoint at several lengths (KERPLE paper §5.2 Table 3, §5.5; thesis §4.3.4).

    python evaluate.py configs/models/162M.yml configs/pe/kerple_log.yml configs/data/github.yml \
        --load checkpoints/kerple_log --eval-lengths 512,1024,2048,4096,8192,16384 \
        --protocol nonoverlap --output results/kerple_log.json
    python evaluate.py <ymls> --load DIR --eval-lengths 4096 --per-position --attention-window 512 ...
    python evaluate.py <ymls> --load DIR --eval-lengths 512,2048 --protocol sliding --stride 256 ...
    python evaluate.py <ymls> --load DIR --eval-lengths 512,1024,2048 --protocol last_token ...

key=value arguments override config keys as for train.py. See kerple/evaluation/cli.py.
"""

import sys

from kerple.evaluation.arguments import check_command_line
from kerple.flags import heavy_imports

if __name__ == "__main__":
    with heavy_imports("evaluate.py", check_command_line):  # a refused flag waits for no import
        from kerple.evaluation.cli import main
    sys.exit(main(sys.argv[1:]))
