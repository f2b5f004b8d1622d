"""Regenerate docs/config.md from the config dataclasses (run by `make docs`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kerple.atomic import write_text_atomic  # noqa: E402
from kerple.config.reference import render_reference  # noqa: E402

TARGET = ROOT / "docs" / "config.md"


def main() -> None:
    """Write the page to a temporary file beside the target, then rename it into place."""
    argparse.ArgumentParser(description=__doc__).parse_args()  # no options: a stray word is refused
    write_text_atomic(TARGET, render_reference())
    print(f"wrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
