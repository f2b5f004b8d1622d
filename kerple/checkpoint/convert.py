"""``tools/convert_checkpoint.py``: between GPT-NeoX/KERPLE, kerple and Hugging Face layouts.

    python tools/convert_checkpoint.py SRC OUT --to kerple [--model-parallel 1] [--layout pipeline]
    python tools/convert_checkpoint.py SRC OUT --to neox --model-parallel 2 --layout sequential
    python tools/convert_checkpoint.py SRC OUT --to hf [--hf-target gpt_neox|gpt2|kerple]
    python tools/convert_checkpoint.py HF_FOLDER OUT --to kerple

``SRC`` is a checkpoint directory (``latest`` or ``--iteration``; any layout and model-parallel
size) or a Hugging Face folder. The model's config comes from ``--config a.yml ... [key=value]``
when given (and is then checked against the checkpoint, naming every mismatch), else from the
checkpoint itself (``args``, ``configs/*.yml`` and tensor shapes). Tensors are copied bit for bit.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from kerple.checkpoint.architecture import (
    architecture_args,
    check_architecture,
    checkpoint_architecture,
    model_options,
    positional_option_names,
)
from kerple.checkpoint.errors import CheckpointError
from kerple.checkpoint.runtime_options import ATTENTION_OPTIONS
from kerple.errors import UsageError, entry_point
from kerple.outputs import check_output_folder
from kerple.checkpoint.huggingface import describe_export, export_huggingface, exported_iteration, import_huggingface
from kerple.checkpoint.neox_layout import NeoxAdapter
from kerple.checkpoint.reference import read_checkpoint
from kerple.checkpoint.writer import write_checkpoint
from kerple.data.tokenizers import tokenizer_vocab_size
from kerple.model import families

# Recorded fields carried into the config of a checkpoint converted without --config (the tokenizer
# files too, so that a Hugging Face export takes them along where they still exist).
_CONFIG_KEYS = (*model_options(), "layernorm_epsilon", *positional_option_names(), *ATTENTION_OPTIONS, "seq_length",
                "tokenizer_type", "vocab_file", "merge_file", "tokenizer_file")


def config_from_checkpoint(ckpt: Any) -> dict[str, Any]:
    """Flat kerple config keys describing a checkpoint read by :func:`read_checkpoint`."""
    arch = checkpoint_architecture(ckpt)
    recorded = {**ckpt.config, **ckpt.args, **(ckpt.args.get("positional_options") or {})}
    heads = arch.get("num_attention_heads")
    if heads is None or arch.get("pos_emb") is None:
        missing = "num_attention_heads" if heads is None else "pos_emb"
        raise CheckpointError(f"{ckpt.path}: {missing} is not recorded in args or configs/; pass --config")
    values: dict[str, Any] = {
        families.family(str(recorded.get("arch") or "gpt")).layer_count_key: arch["num_layers"],
        "hidden_size": arch["hidden_size"],
        "num_attention_heads": heads,
        "vocab_size": arch["padded_vocab_size"],
        "make_vocab_size_divisible_by": 1,
        "no_weight_tying": arch["no_weight_tying"],
        "pos_emb": arch["pos_emb"],
    }
    for key in _CONFIG_KEYS:
        if recorded.get(key) is not None:
            values[key] = recorded[key]
    if "max_position_embeddings" in arch:
        values["max_position_embeddings"] = arch["max_position_embeddings"]
    elif recorded.get("max_position_embeddings"):
        values["max_position_embeddings"] = recorded["max_position_embeddings"]
    return values


def check_exportable(family: Any, target: str, source: Path) -> None:
    """Refuse (``CheckpointError``) a conversion ``--to target`` the model family cannot take."""
    if (target == "neox" and not family.neox_export) or (target == "hf" and family.hf_export is None):
        layout = "GPT-NeoX" if target == "neox" else "Hugging Face"
        raise CheckpointError(
            f"{source}: a model.arch {family.name} checkpoint ({family.summary}) has no {layout} equivalent; "
            "convert it only with --to kerple"
        )


def _reference_pos_emb(name: str) -> str:
    """The reference's spelling of a canonical registry name (``kerple_power`` -> ``kerple_power_ap_``)."""
    from kerple import positional

    for alias, target in positional.aliases().items():
        if target == name and alias.startswith("kerple_power"):
            return alias
    return name


def _neox_yaml(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
            "no_weight_tying", "gpt_j_residual", "norm", "activation", "rotary_pct", "make_vocab_size_divisible_by",
            "tokenizer_type", "vocab_file", "merge_file")
    out = {key: config[key] for key in keys if config.get(key) is not None}
    out["pos_emb"] = _reference_pos_emb(str(config.get("pos_emb", "learned")))
    return out


def neox_vocab_divisor(cfg: Any, model_parallel: int, recorded: int | None) -> int:
    """The ``make_vocab_size_divisible_by`` under which GPT-NeoX pads the tokenizer's vocabulary to the
    checkpoint's ``padded_vocab_size`` rows over ``model_parallel`` ranks (docs/reference-format.md §4):
    the source's ``recorded`` value where it does so, else rows / ranks, which pads any vocabulary up to
    the rows to exactly the rows (GPT-NeoX has no key for the rows themselves)."""
    rows, data = int(cfg.model.padded_vocab_size), cfg.data
    vocab = tokenizer_vocab_size(data.tokenizer_type, data.vocab_file, data.merge_file, data.tokenizer_file)
    if recorded and vocab and math.ceil(vocab / (recorded * model_parallel)) * recorded * model_parallel == rows:
        return int(recorded)
    return rows // model_parallel


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convert_checkpoint.py", description="\n\n".join(__doc__.split("\n\n")[:2]).replace("``", ""), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", help="checkpoint directory or Hugging Face folder")
    parser.add_argument("output", help="output directory: new, or holding only earlier checkpoints (--to hf: new or empty)")
    parser.add_argument("--to", choices=("kerple", "neox", "hf"), required=True,
                        help="kerple or neox: a checkpoint folder (GPT-NeoX's layout); hf: a transformers folder")
    parser.add_argument("--config", nargs="*", default=[], help="YAML files and key=value overrides of the model")
    parser.add_argument("--iteration", type=int, help="the source's step to convert (default: its 'latest')")
    parser.add_argument("--model-parallel", type=int, default=1, help="model-parallel size of the output (kerple/neox)")
    parser.add_argument("--layout", choices=("pipeline", "sequential"), default="pipeline",
                        help="layer_XX files (pipeline, as the KERPLE checkpoints) or the weights in each mp_rank file (sequential)")
    parser.add_argument("--output-layer-parallelism", choices=("column", "row"), default="column",
                        help="how the untied LM head is split over model-parallel ranks (neox output)")
    parser.add_argument("--hf-target", choices=("gpt_neox", "gpt2", "kerple"), help="default: chosen from pos_emb")
    parser.add_argument("--tokenizer-files", nargs="*", help="default: vocab_file/merge_file/tokenizer_file of the config")
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow pickles that may run code (trusted files only)")
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, before any file is read, an output that cannot be written or that is the source,
    and counts below their minimum (:class:`~kerple.errors.UsageError` naming the argument)."""
    if not Path(args.source).is_dir():
        raise UsageError(f"source {args.source} is not a folder; name a checkpoint folder or a Hugging Face export")
    check_output_folder(args.output, "output")
    if Path(args.output).exists() and Path(args.output).samefile(args.source):
        raise UsageError(f"output {args.output} is the source folder; write the conversion to another folder")
    for flag, value, least in (("--model-parallel", args.model_parallel, 1), ("--iteration", args.iteration, 0)):
        if value is not None and value < least:
            raise UsageError(f"{flag} {value}: expected an integer of at least {least}")


def check_no_later_checkpoint(output: Path, iteration: int) -> None:
    """Refuse to write step ``iteration`` into a folder whose ``latest`` names a later step: the write
    points ``latest`` at the new step, so a run resuming from the folder would rewind."""
    from kerple.checkpoint.files import find_checkpoint

    try:
        found = find_checkpoint(output)
    except CheckpointError:
        return  # no readable 'latest' to move back
    step = found.name.removeprefix("global_step") if found is not None else ""
    if step.isdigit() and int(step) > iteration:
        raise UsageError(f"output {output} holds a later checkpoint ({found.name}); writing step {iteration} there would "
                         "point its 'latest' back and a run resuming from it would rewind: choose a new output folder")


def conversion_config(words: list[str], source_config: dict[str, Any]) -> Any:
    """The config of a conversion: ``--config``'s YAML files and overrides when it names a file; else the
    source's own config (:func:`config_from_checkpoint`, a Hugging Face folder's) with its overrides on top
    (``--config`` may set a run-time option the run was not trained with)."""
    from kerple.config import load_config, parse_overrides, split_arguments
    from kerple.config.neox_keys import normalize_key

    yamls, override_words = split_arguments(words)
    overrides = parse_overrides(override_words)
    if yamls:
        return load_config(yamls, overrides)
    spelled = {key if "." in key else normalize_key(key): value for key, value in overrides.items()}
    return load_config([], {**source_config, **spelled})


def convert(args: argparse.Namespace) -> Path:
    """Run one conversion; returns the written directory."""
    source = Path(args.source)
    check_arguments(args)
    if (source / "model.safetensors").is_file():
        model_state, source_config = import_huggingface(source)
        exported = exported_iteration(source)  # the step of the run it was exported from; 0 from elsewhere
        iteration, ckpt = args.iteration if args.iteration is not None else exported or 0, None
        adapter = NeoxAdapter.for_embedding(int(source_config["num_layers"]), str(source_config["pos_emb"]))
        state = adapter.to_reference(model_state)
    else:
        ckpt = read_checkpoint(source, args.iteration, trust=args.trust_checkpoint)
        state, iteration, model_state = ckpt.state_dict, ckpt.iteration, ckpt.model_state()
        source_config = config_from_checkpoint(ckpt)
    cfg = conversion_config(args.config, source_config)
    if ckpt is not None and args.config:
        check_architecture(checkpoint_architecture(ckpt), cfg, ckpt.path, model_parallel_size=ckpt.model_parallel_size)
    check_exportable(families.family_of(cfg), args.to, source)
    flat = cfg.to_dict()
    flat["padded_vocab_size"] = cfg.model.padded_vocab_size
    out = Path(args.output)
    if args.to == "hf":
        files = args.tokenizer_files
        if files is None:
            data = cfg.data
            files = [f for f in (data.vocab_file, data.merge_file, data.tokenizer_file) if f and Path(f).is_file()]
        eos = 50256 if cfg.data.tokenizer_type == "GPT2BPETokenizer" and cfg.model.padded_vocab_size > 50256 else None
        written = export_huggingface(model_state, flat, out, target=args.hf_target, tokenizer_files=files, eos_token_id=eos,
                                     iteration=iteration)
        print(f"export: {describe_export(flat, args.hf_target)}", file=sys.stderr)
        return written
    check_no_later_checkpoint(out, iteration)
    flavor = "neox" if args.to == "neox" else "kerple"
    recorded_args = architecture_args(cfg)
    if flavor == "neox":
        neox = _neox_yaml(flat)
        source_divisor = ckpt.args.get("make_vocab_size_divisible_by") if ckpt is not None else None
        neox["make_vocab_size_divisible_by"] = neox_vocab_divisor(cfg, args.model_parallel, source_divisor)
        recorded_args["make_vocab_size_divisible_by"] = neox["make_vocab_size_divisible_by"]
        text = yaml.safe_dump({key.replace("_", "-"): value for key, value in neox.items()}, sort_keys=False)
    else:
        text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    return write_checkpoint(
        out,
        state,
        iteration=iteration,
        args=recorded_args,
        layout=args.layout,
        model_parallel_size=args.model_parallel,
        flavor=flavor,
        config_files={"config.yml": text},
        output_layer_parallelism=args.output_layer_parallelism,
    )


@entry_point("convert_checkpoint.py")
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: prints the output path; a project error is one line and exit status 2."""
    written = convert(build_parser().parse_args(argv))
    print(f"wrote {written}")
    return 0
