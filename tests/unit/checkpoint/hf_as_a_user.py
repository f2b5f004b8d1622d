"""What a ``transformers`` user does with an exported ``KerpleForCausalLM`` folder (run by
test_hf_fine_tuning.py in a fresh interpreter, as hf_without_kerple.py is).

    python -I hf_as_a_user.py WORK_DIR

For every folder ``WORK_DIR/folders/<case>`` it records in ``WORK_DIR/results.json``: the largest logit
difference between ``attn_implementation="sdpa"`` and ``"eager"``; what ``output_hidden_states``,
``output_attentions`` and ``return_dict=False`` return; the largest gradient difference with and
without ``gradient_checkpointing_enable()`` (the positional parameters included); whether the
tokenizer pads a batch; and the warnings transformers logs for an input longer than the training
length, tokenized and generated from.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def gradients(model, tokens) -> dict:  # noqa: ANN001
    model.zero_grad(set_to_none=True)
    model(tokens, labels=tokens, use_cache=False).loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


def main(work: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recorder = Recorder()
    logging.getLogger("transformers").addHandler(recorder)
    tokens = torch.randint(0, 200, (2, 20), generator=torch.Generator().manual_seed(2))
    results = {}
    for folder in sorted((work / "folders").iterdir()):
        load = {"trust_remote_code": True, "dtype": torch.float32}
        eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", **load).eval()
        sdpa = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa", **load).eval()
        default = AutoModelForCausalLM.from_pretrained(folder, **load).eval()
        with torch.no_grad():
            logits = eager(tokens).logits
            out = eager(tokens, output_hidden_states=True, output_attentions=True)
            sdpa_out = sdpa(tokens, output_hidden_states=True, output_attentions=True)
            as_tuple = eager(tokens, return_dict=False)
        layers = eager.config.num_hidden_layers
        case = {
            "default_implementation": default.config._attn_implementation,
            "sdpa_difference": (sdpa(tokens).logits - logits).abs().max().item(),
            "hidden_states": None if out.hidden_states is None else len(out.hidden_states),
            "last_hidden_is_final": bool(out.hidden_states) and torch.equal(
                out.hidden_states[-1], eager.gpt_neox(tokens).last_hidden_state),
            "attentions": None if out.attentions is None else [list(a.shape) for a in out.attentions],
            "attention_rows_sum_to_one": bool(out.attentions) and all(
                torch.allclose(a.sum(-1), torch.ones(())) for a in out.attentions),
            "sdpa_attentions": None if sdpa_out.attentions is None else len(sdpa_out.attentions),
            "tuple": type(as_tuple).__name__,
            "tuple_logits_equal": isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], logits),
            "layers": layers,
        }
        eager.train()
        plain = gradients(eager, tokens)
        eager.gradient_checkpointing_enable()
        checkpointed = gradients(eager, tokens)
        case["checkpointing_gradient_difference"] = max(
            (plain[name] - checkpointed[name]).abs().max().item() for name in plain)
        case["gradients"] = sorted(plain) == sorted(checkpointed)
        case["positional_gradients"] = sorted(name for name in plain if ".positional." in name)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        padded = tokenizer(["def f(x):", "def kernel(x): return x + 1"], padding=True, return_tensors="pt")
        case["padded_shape"] = list(padded["input_ids"].shape)
        case["model_max_length"] = tokenizer.model_max_length
        recorder.messages.clear()
        long_ids = tokenizer("x = 1\n" * 200, return_tensors="pt").input_ids[:, : 3 * eager.config.training_length]
        eager.eval()
        with torch.no_grad():
            eager.generate(long_ids, attention_mask=torch.ones_like(long_ids), max_new_tokens=3, do_sample=False)
        case["input_tokens"] = long_ids.shape[1]
        case["warnings"] = list(recorder.messages)
        results[folder.name] = case
    (work / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
