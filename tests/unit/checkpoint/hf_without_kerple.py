"""Load exported Hugging Face folders the way a user without kerple does (run by test_hf_remote_code.py).

    python -I hf_without_kerple.py WORK_DIR REPO_ROOT

Runs in a fresh interpreter started with ``-I`` from a folder outside the repository; any import of
``kerple`` (an editable install's finder included) is refused, and the repository must not be on
``sys.path``. For every folder ``WORK_DIR/folders/<case>`` it loads
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` in float32 and records, in
``WORK_DIR/actual.pt``: the class, the logits of ``inputs.pt``'s tokens, greedy generation with and
without the KV cache, greedy generation of a left-padded batch and its logits (position ids from the
mask, as ``generate`` gives them), and the folder written back by ``save_pretrained``.
"""

from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path


class RefuseKerple(importlib.abc.MetaPathFinder):
    """Makes ``import kerple`` fail, whichever finder (sys.path, an editable install) would find it."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name == "kerple" or name.startswith("kerple."):
            raise ImportError(f"{name}: an exported folder must load without kerple")
        return None


sys.meta_path.insert(0, RefuseKerple())


def main(work: Path, repo: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    assert all(Path(entry or ".").resolve() != repo for entry in sys.path), f"{repo} is on sys.path: {sys.path}"
    inputs = torch.load(work / "inputs.pt", weights_only=True)
    prompt, new_tokens = inputs["prompt"], int(inputs["new_tokens"])
    results = {}
    for folder in sorted((work / "folders").iterdir()):
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
        short = prompt[1:, 2:]  # the second prompt without its first two tokens, left-padded below
        padded = torch.cat([torch.zeros_like(prompt[1:, :2]), short], dim=1)
        mask = torch.cat([torch.zeros_like(prompt[1:, :2]), torch.ones_like(short)], dim=1)
        greedy = {"do_sample": False, "max_new_tokens": new_tokens, "pad_token_id": 0, "eos_token_id": None}
        batch, batch_mask = torch.cat([prompt[:1], padded]), torch.cat([torch.ones_like(prompt[:1]), mask])
        position_ids = (batch_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            results[folder.name] = {
                "class": type(model).__name__,
                "logits": model(inputs["tokens"]).logits,
                "greedy": model.generate(prompt, attention_mask=torch.ones_like(prompt), **greedy),
                "greedy_no_cache": model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=False, **greedy),
                "padded": model.generate(batch, attention_mask=batch_mask, **greedy),
                "padded_logits": model(batch, attention_mask=batch_mask, position_ids=position_ids).logits,
            }
        model.save_pretrained(work / "resaved" / folder.name)
    loaded = sorted(name for name in sys.modules if name == "kerple" or name.startswith("kerple."))
    assert not loaded, f"kerple modules were imported: {loaded}"
    torch.save(results, work / "actual.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
