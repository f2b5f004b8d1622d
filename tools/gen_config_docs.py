"""Regenerate docs/config.md from the config dataclasses (run by `make docs`)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kerple.config.reference import render_reference  # noqa: E402

TARGET = ROOT / "docs" / "config.md"


def main() -> None:
    """Write the page to a temporary file beside the target, then rename it into place."""
    handle, temporary = tempfile.mkstemp(dir=TARGET.parent, prefix=".config.md.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(render_reference())
        os.replace(temporary, TARGET)
    except BaseException:
        os.unlink(temporary)
        raise
    print(f"wrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
