"""Generate text from a trained checkpoint with a KV cache.

    python generate.py configs/models/162M.yml configs/pe/kerple_log.yml --load checkpoints/run \
        --prompt "Once upon a time" --max-new-tokens 64 [--temperature 0.8 --top-k 50 --top-p 0.9]
        [--cache-window 2048] [--seed 1] [--trust-checkpoint]

``--load`` takes this project's checkpoints, GPT-NeoX/KERPLE checkpoint directories and Hugging
Face exports of tools/convert_checkpoint.py. See kerple/inference/generate.py.
"""

import sys

from kerple.inference.generate import main

if __name__ == "__main__":
    sys.exit(main())
