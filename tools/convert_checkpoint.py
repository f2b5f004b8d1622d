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

from kerple.checkpoint.convert import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
