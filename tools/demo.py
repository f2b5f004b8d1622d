"""`make demo`: the KERPLE paper's extrapolation story in minutes on a CPU, with embedded data.

Run from the repository root (kerple installed, as `make install` does, or PYTHONPATH=.); the job
itself: kerple/jobs/demo.py.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("demo.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.jobs.demo import main

if __name__ == "__main__":
    sys.exit(main())
