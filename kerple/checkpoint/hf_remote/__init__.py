"""The two files every ``kerple``-target Hugging Face export carries (docs/interop.md).

``configuration_kerple.py`` and ``modeling_kerple.py`` are copied unchanged into the exported
folder and run there under ``transformers`` with no kerple installed; kerple itself never imports
them. :func:`kerple.checkpoint.hf_kerple.write_remote_code` copies them.
"""

from pathlib import Path

REMOTE_CODE_DIR = Path(__file__).resolve().parent
REMOTE_FILES: tuple[str, ...] = ("configuration_kerple.py", "modeling_kerple.py")
