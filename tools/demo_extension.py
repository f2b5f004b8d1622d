"""`make demo-extension`: PI and YaRN fine-tuned at a longer length beside KERPLE-log, ALiBi and rotary.

Run from the repository root (kerple installed, as `make install` does, or PYTHONPATH=.); the job
itself: kerple/jobs/demo_extension.py.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("demo_extension.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.jobs.demo_extension import main

if __name__ == "__main__":
    sys.exit(main())
