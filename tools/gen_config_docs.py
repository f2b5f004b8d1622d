"""Regenerate docs/config.md from the config dataclasses (run by `make docs`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kerple.atomic import write_text_atomic  # noqa: E402
from kerple.errors import entry_point, exit_on_interrupt  # noqa: E402

TARGET = ROOT / "docs" / "config.md"


@entry_point("gen_config_docs.py")
def main(argv: list[str] | None = None) -> int:
    """Write the page to a temporary file beside the target, then rename it into place."""
    argparse.ArgumentParser(prog="gen_config_docs.py", description=__doc__).parse_args(argv)  # a stray word is refused
    with exit_on_interrupt("gen_config_docs.py"):
        from kerple.config.reference import render_reference
    write_text_atomic(TARGET, render_reference())
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
