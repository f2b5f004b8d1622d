"""Why and where a trained checkpoint extrapolates (thesis chapters 2, 4.5 and 5).

    python analyze.py receptive-field <ymls> --load DIR --length 2048 --output results/rf.json
    python analyze.py attention-stats <ymls> --load DIR --lengths 512,4096 --output results/stats.json
    python analyze.py align-temperature <ymls> --load DIR --length 4096 --mode pmax --output results/tau.json
    python analyze.py retrieval <ymls> --load DIR --task passkey --lengths 512,1024 --temperatures 1,log ...
    python analyze.py nope-variance <ymls> [--load DIR] --length 512 --output results/nope.json
    python analyze.py position-probe <ymls> --load DIR --length 512 --output results/probe.json

Configs and --load as for evaluate.py (key=value arguments override config keys). See kerple/analysis/.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("analyze.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.analysis.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
