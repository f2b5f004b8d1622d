"""`make demo-extension` (kerple/jobs/demo_extension.py); run from the repository root with kerple installed or PYTHONPATH=."""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("demo_extension.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.jobs.demo_extension import main

if __name__ == "__main__":
    sys.exit(main())
