"""`make gpu-check`: prove the trainer on a CUDA GPU in one command and write gpu-report/.

    python tools/gpu_check.py                    # every step on the CUDA GPU (refused without one)
    python tools/gpu_check.py --steps 3,4        # some steps, merged into the existing report
    python tools/gpu_check.py --device cpu --output /tmp/report   # the harness's own CPU run
    python tools/gpu_check.py --profile --output out/profile       # where a 162M step's time goes (150 s)

Where the project is not installed (a GPU image's python3), from the repository root:
``PYTHONPATH=. python3 tools/gpu_check.py ...``. The steps, their sizes and time budgets, and the
report: kerple/jobs/gpu_check/.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("gpu_check.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.jobs.gpu_check.runner import main

if __name__ == "__main__":
    sys.exit(main())
