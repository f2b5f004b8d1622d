"""`make gpu-check` (kerple/jobs/gpu_check/runner.py); run from the repository root with kerple installed or PYTHONPATH=."""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("gpu_check.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.jobs.gpu_check.runner import main

if __name__ == "__main__":
    sys.exit(main())
