"""Convert checkpoints: GPT-NeoX/KERPLE <-> kerple layouts, model-parallel re-sharding, Hugging Face.

    python tools/convert_checkpoint.py checkpoints/run out/ --to kerple --model-parallel 1
    python tools/convert_checkpoint.py checkpoints/run out/ --to neox --model-parallel 2 --layout sequential
    python tools/convert_checkpoint.py checkpoints/run hf/ --to hf --config configs/models/162M.yml ...
    python tools/convert_checkpoint.py hf/ back/ --to kerple

See kerple/checkpoint/convert.py and docs/interop.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kerple.errors import exit_on_interrupt  # noqa: E402

with exit_on_interrupt("convert_checkpoint.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.checkpoint.convert import main

if __name__ == "__main__":
    sys.exit(main())
