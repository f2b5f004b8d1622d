"""`make analysis-demo`: why the demo's models extrapolate, with analyze.py.

Run from the repository root (kerple installed, as `make install` does, or PYTHONPATH=.); the job
itself: kerple/jobs/analysis_demo.py.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("analysis_demo.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.jobs.analysis_demo import main

if __name__ == "__main__":
    sys.exit(main())
