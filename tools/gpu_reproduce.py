"""`make gpu-reproduce`: the KERPLE paper's Table 3 at 162M on one GPU, in re-runnable chunks or in one lease.

    python tools/gpu_reproduce.py                      # one chunk of at most 9 minutes; run again to continue
    python tools/gpu_reproduce.py --tokens 100M --minutes 0
    python tools/gpu_reproduce.py --scale tiny         # the same orchestration on a CPU
    PYTHONPATH=. python3 tools/gpu_reproduce.py --preset lease --output $OUT/reproduce --minutes 8.75   # one lease

Where the project is not installed (a GPU image's python3), run it from the repository root with
``PYTHONPATH=.`` as above. What it runs, and why in child processes: kerple/reproduce/, kerple/jobs/.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("gpu_reproduce.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.reproduce.cli import main

if __name__ == "__main__":
    sys.exit(main())
