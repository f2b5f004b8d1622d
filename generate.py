"""Generate text from a trained checkpoint with a KV cache.

    python generate.py configs/models/162M.yml configs/pe/kerple_log.yml --load checkpoints/run \
        --prompt "Once upon a time" --max-new-tokens 64 [--temperature 0.8 --top-k 50 --top-p 0.9]
        [--cache-window 2048] [--seed 1] [--trust-checkpoint]

``--load`` takes this project's checkpoints, GPT-NeoX/KERPLE checkpoint directories and Hugging
Face exports of tools/convert_checkpoint.py. See kerple/inference/generate.py.
"""

import sys

from kerple.flags import heavy_imports
from kerple.generate_arguments import check_command_line

if __name__ == "__main__":
    with heavy_imports("generate.py", check_command_line):  # a refused flag waits for no import
        from kerple.inference.generate import main
    sys.exit(main())
