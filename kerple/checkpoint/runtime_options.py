"""The run-time options a checkpoint records, and how the commands that load it use them.

A run-time option says how a trained model is run, not what its weights mean: every positional
option declared with ``weights_bound=False`` (:func:`kerple.positional.runtime_option_names`),
``attention_window`` (:data:`ATTENTION_OPTIONS`), and ``finetune`` (the weights
came from another run, the step count started over). The checkpoint's ``args`` record them
(:func:`kerple.checkpoint.architecture.architecture_args`: ``positional_options``,
``attention_window``, ``finetuned_from``; a record written before a key existed leaves that option
unchecked), so a command that loads it needs no repetition of them:

* resuming training (:func:`use_recorded`, :data:`RESUME`): an option the config does not set takes
  the recorded value (the config's source then reads ``recorded in DIR``); a different value set by
  the config is refused in one line, as the run would go on under another setting than it was
  trained with;
* evaluation, generation and analysis (:data:`USE`) take the recorded value likewise, and a
  different value the command sets (zero-shot context extension of a run trained without it),
  saying both;
* a fine-tune (:data:`NEW_RUN`, ``finetune=true``) is a new run: the config's values, and a note
  where they differ from the weights' run.

:func:`runtime_summary` is the line the training banner and ``evaluate.py`` print.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerple.config.errors import DEFAULT, ConfigError

RECORDED = "recorded in"
"""The start of the source of a value taken from a checkpoint's record: ``recorded in DIR``."""


@dataclass(frozen=True)
class Recorded:
    """The run-time options one checkpoint (or Hugging Face export) records, and where it is."""

    where: str
    options: dict[str, Any]
    finetuned_from: str | None = None


ATTENTION_OPTIONS = ("attention_window",)
"""The ``attention`` settings that are run-time options: a window limits the keys a query sees, the
weights are the same (thesis §4.3.3)."""


def runtime_idents() -> dict[str, str]:
    """Every run-time option's name and its config field (``positional.<name>``, ``attention.<name>``)."""
    from kerple import positional

    return {**{name: f"positional.{name}" for name in positional.runtime_option_names()},
            **{name: f"attention.{name}" for name in ATTENTION_OPTIONS}}


def _value(cfg: Any, ident: str) -> Any:
    section, name = ident.split(".")
    return getattr(getattr(cfg, section), name)


def runtime_options(cfg: Any) -> dict[str, Any]:
    """The config's value of every run-time option."""
    return {name: _value(cfg, ident) for name, ident in runtime_idents().items()}


def runtime_args(cfg: Any) -> dict[str, Any]:
    """The ``args`` entries of the run-time options outside ``positional_options``."""
    return {name: _value(cfg, f"attention.{name}") for name in ATTENTION_OPTIONS}


def finetuned_from(cfg: Any) -> str | None:
    """``args["finetuned_from"]`` of a run: the folder whose weights a ``finetune`` run started from."""
    ck = cfg.checkpointing
    return str(Path(ck.load).resolve()) if ck.finetune and ck.load else None


def from_args(args: dict[str, Any], where: str) -> Recorded | None:
    """What a kerple ``args`` record holds; ``None`` for a record without positional options (GPT-NeoX's)."""
    recorded = args.get("positional_options")
    if not isinstance(recorded, dict):
        return None
    from kerple import positional

    options = {name: recorded.get(name) for name in positional.runtime_option_names()}
    options.update({name: args[name] for name in ATTENTION_OPTIONS if name in args})
    origin = args.get("finetuned_from")
    return Recorded(where, options, origin if isinstance(origin, str) else None)


def read_recorded(folder: str | Path, iteration: int | None = None, *, trust: bool = False) -> Recorded | None:
    """The run-time options of the checkpoint in ``folder`` (``latest`` or ``iteration``) or of a
    Hugging Face export made here; ``None`` when there is no checkpoint or it records none."""
    from kerple.checkpoint.files import find_checkpoint, mp_rank_file_name
    from kerple.checkpoint.run_state import FORMAT_KEY
    from kerple.checkpoint.safe_load import safe_torch_load

    folder = Path(folder)
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        from kerple.checkpoint.huggingface import exported_config

        config = exported_config(folder)
        return from_args({"positional_options": config, **config}, str(folder))
    tag = find_checkpoint(folder, iteration)
    if tag is None or not (tag / mp_rank_file_name(0)).is_file():
        return None
    record = safe_torch_load(tag / mp_rank_file_name(0), trust=trust, mmap=True)
    if not isinstance(record, dict) or record.get(FORMAT_KEY) is None or not isinstance(record.get("args"), dict):
        return None
    return from_args(record["args"], str(tag))


def show(value: Any) -> str:
    """A value as one line of YAML flow style (as a user writes it on the command line)."""
    import yaml

    if value is None:
        return "none"
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6)
    return text.removesuffix("\n...\n").strip()  # a scalar document ends with "..."


RESUME, USE, NEW_RUN = "resume", "use", "new run"
"""How a command uses a checkpoint: resumes its run, uses the model (evaluation, generation,
analysis), or starts a new run from its weights (``finetune``)."""


def use_recorded(cfg: Any, recorded: Recorded | None, *, mode: str) -> list[str]:
    """Settle ``cfg``'s run-time options with a checkpoint's ``recorded`` ones, as ``mode`` says: to
    resume or use a model, an option the config does not set takes the recorded value; a different
    value the config sets is refused for a resume (:class:`ConfigError` naming the file and key) and
    kept otherwise; a new run keeps the config's values. Returns a line for each option whose value
    differs from the record (an adopted value's source says where it came from: :func:`runtime_summary`)."""
    if recorded is None:
        return []
    notes = []
    idents = runtime_idents()
    for name, value in recorded.options.items():
        ident = idents[name]
        configured = _value(cfg, ident)
        if _meaning(name, configured) == _meaning(name, value):
            continue
        source, written = cfg.provenance(ident)
        if source == DEFAULT and mode != NEW_RUN:
            _adopt(cfg, name, value, recorded.where)
        elif mode == RESUME:
            raise ConfigError(
                f"{recorded.where} was trained with {name} {show(value)}, not {show(configured)}: remove the key to "
                f"go on with the checkpoint's, or train its weights on with {show(configured)} as a new run "
                "(finetune=true and an empty save folder)", file=source, key=written)
        else:
            notes.append(f"{name} {show(configured)} here: {recorded.where} was trained with {show(value)}")
    return notes


def _meaning(name: str, value: Any) -> Any:
    """``value`` of the run-time option ``name``, with a spelled-out absence as ``None``
    (:func:`kerple.positional.unset_value`)."""
    from kerple import positional

    return positional.unset_value(name, value) if name in positional.runtime_option_names() else value


def _adopt(cfg: Any, name: str, value: Any, where: str) -> None:
    """Set a run-time option to a recorded ``value``, checked as the config checks it (a positional
    one against the model's shape; the record's attention window is one this architecture had)."""
    from kerple import positional

    ident = runtime_idents()[name]
    section, field = ident.split(".")
    if section == "positional":
        from kerple.config.validate import model_shape

        problem = positional.options_problem(cfg.positional.pos_emb, {**cfg.positional.options(), name: value},
                                             model_shape(cfg))
        if problem is not None:
            raise ConfigError(f"the value {show(value)} that {where} records does not fit this config: {problem[1]}; "
                              "set the key", file=where, key=problem[0])
    setattr(getattr(cfg, section), field, value)
    cfg.sources[ident] = (f"{RECORDED} {where}", name)


def runtime_summary(cfg: Any) -> str:
    """``<option> <value> (where from)``, for each run-time option the config's ``pos_emb`` takes and
    each other one that is set."""
    from kerple import positional

    declared = positional.family(cfg.positional.pos_emb).options_class
    names = set(getattr(declared, "__dataclass_fields__", {}))
    parts = []
    for (name, value), ident in zip(runtime_options(cfg).items(), runtime_idents().values()):
        if name in names or (not ident.startswith("positional.") and value is not None):
            source = cfg.provenance(ident)[0]
            parts.append(f"{name} {show(value)}" + ("" if source == DEFAULT else f" ({source})"))
    return "; ".join(parts)
