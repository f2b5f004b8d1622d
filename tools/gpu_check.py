"""`make gpu-check`: prove the trainer on a CUDA GPU in one command and write gpu-report/.

    python tools/gpu_check.py                    # every step on the CUDA GPU (refused without one)
    python tools/gpu_check.py --steps 3,4        # some steps, merged into the existing report
    python tools/gpu_check.py --device cpu --output /tmp/report   # the harness's own CPU run
    python tools/gpu_check.py --profile --output out/profile       # where a 162M step's time goes (150 s)

The steps, their sizes and time budgets, and the report: benchmarks/gpu_check/.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kerple.errors import exit_on_interrupt  # noqa: E402

with exit_on_interrupt("gpu_check.py"):  # Ctrl-C while the modules load: one line, status 130
    from benchmarks.gpu_check.runner import main

if __name__ == "__main__":
    sys.exit(main())
