"""RoPE context extension (``rope_scaling``), computed by ``transformers``' own initialisers.

A rotary model trained at length L reads longer inputs better when its frequencies are rescaled.
The methods, by ``rope_type`` (the spelling of ``transformers``' ``rope_parameters``):

* ``linear``: Position Interpolation (Chen et al. 2023, arXiv 2306.15595, §2.3: positions are
  divided by the factor s, ``f'(x, m) = f(x, m/s)``, equivalently every frequency by s).
* ``dynamic``: dynamic NTK-aware scaling (the YaRN paper, Peng et al. 2023, arXiv 2309.00071, §3,
  "NTK-aware" and "Dynamic NTK" interpolation): the base becomes ``b·(s·l/L − (s − 1))^(d/(d−2))``
  at the current length ``l > L``, and is unchanged up to L.
* ``yarn``: YaRN (the same paper, §3: "NTK-by-parts" interpolation and the attention scaling of
  YaRN itself): frequencies with wavelengths longer than the context are interpolated, short ones
  kept, a ramp between (``beta_fast``, ``beta_slow``); and the attention logits are multiplied by
  ``1/t = (0.1·ln s + 1)²``.
* ``llama3``: Llama 3.1's frequency-dependent scaling (Meta's reference code; ``low_freq_factor``,
  ``high_freq_factor``): the same three bands as YaRN's, split by wavelength against the original length.
* ``longrope``: LongRoPE (Ding et al. 2024, arXiv 2402.13753): a searched rescale factor per
  frequency, ``short_factor`` up to ``original_max_position_embeddings`` and ``long_factor`` beyond,
  and the logits multiplied by ``1 + ln s / ln L``.
* ``proportional``: ``transformers``' proportional RoPE (frequencies over the whole head, the
  unrotated part given frequency 0), then divided by ``factor``.
* ``default``: none (the same as no ``rope_scaling``).

The frequencies and the attention factor come from ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``
applied to a stock ``GPTNeoXConfig`` of the same rotary settings (:func:`transformers_config`), so a
kerple model and the ``GPTNeoXForCausalLM`` it exports to agree by construction. The length-dependent
types (``dynamic``, ``longrope``: those ``transformers``' ``dynamic_rope_update`` updates) are
evaluated at every forward at ``l = 1 + the largest position``, as that update does; where
``transformers`` keeps the largest length seen until a forward shorter than the original length
(its cache), kerple recomputes from each forward's own length, so the two agree whenever the
lengths of successive forwards do not shrink (one forward, decoding, evaluation by increasing length).

The attention factor multiplies the rotated channels' cosines and sines, as ``transformers`` does:
the queries' and keys' rotated parts each by the factor, so the logits by its square (with
``rotary_pct: 1`` exactly YaRN's temperature ``1/t`` on the scores). It acts before every
kernel (eager, sdpa, flex) and the KV cache, like the rotation.

``transformers`` is imported only when a model sets ``rope_scaling``.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import logging
import re
import typing
from dataclasses import dataclass
from typing import Any, Iterator

import torch

NO_SCALING = "default"
KERPLE_KEYS = {"rope_theta": "rotary_emb_base", "partial_rotary_factor": "rotary_pct"}
"""``rope_parameters`` keys that kerple's own options set; ``rope_scaling`` may not repeat them."""
_ROPE_LOGGER = "transformers.modeling_rope_utils"


def rope_types() -> tuple[str, ...]:
    """Every ``rope_type`` the installed ``transformers`` offers: ``default`` and its ``ROPE_INIT_FUNCTIONS``."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return (NO_SCALING, *ROPE_INIT_FUNCTIONS)


def length_dependent(rope_type: str) -> bool:
    """Whether the frequencies change with the forward's length (``transformers``' ``dynamic_rope_update``
    updates ``"dynamic"`` types and ``longrope``)."""
    return "dynamic" in rope_type or rope_type == "longrope"


def transformers_config(
    rope_scaling: dict[str, Any], *, head_dim: int, rotary_pct: float, base: float, max_positions: int
) -> Any:
    """The stock ``GPTNeoXConfig`` whose rotary embedding is kerple's: one head of ``head_dim``,
    ``rotary_pct``, ``base``, ``max_position_embeddings = max_positions`` and ``rope_scaling``."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        hidden_size=head_dim, num_attention_heads=1, max_position_embeddings=max_positions, rotary_pct=rotary_pct,
        rotary_emb_base=base, rope_scaling=copy.deepcopy(rope_scaling),
    )


def rope_parameters(rope_scaling: dict[str, Any] | None, *, rotary_pct: float, base: float) -> dict[str, Any]:
    """``config.json["rope_parameters"]`` of a stock GPTNeoX export: the base settings plus ``rope_scaling``."""
    return {"rope_type": NO_SCALING, "rope_theta": base, "partial_rotary_factor": rotary_pct, **(rope_scaling or {})}


class _Captured(logging.Handler):
    """Keeps the messages of the records it is handed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _captured_warnings() -> Iterator[list[str]]:
    """The warnings ``transformers``' RoPE validation logs, kept from the console and returned
    (its once-only notes are advisory and left out)."""
    logger = logging.getLogger(_ROPE_LOGGER)
    handler = _Captured()
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        with _without_once_only_notes(logger):
            yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@contextlib.contextmanager
def _without_once_only_notes(logger: logging.Logger) -> Iterator[None]:
    """``logger.warning_once`` silenced: transformers' once-per-process notes compare the factor with
    ``max_position_embeddings``, which it reads as the extended length and kerple as the model's own."""
    had = "warning_once" in vars(logger)
    previous = vars(logger).get("warning_once")
    logger.warning_once = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if had:
            logger.warning_once = previous  # type: ignore[attr-defined]
        else:
            del logger.warning_once  # type: ignore[attr-defined]


_TYPE_NAMES = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}


def _value_problem(key: str, value: Any) -> str | None:
    """Whether ``value`` has the type ``transformers``' ``RopeParameters`` declares for ``key``."""
    from transformers.modeling_rope_utils import RopeParameters

    hints = typing.get_type_hints(RopeParameters)
    if key not in hints:
        return None
    allowed = [arg for arg in typing.get_args(hints[key]) if arg is not type(None)] or [hints[key]]
    for hint in allowed:
        origin = typing.get_origin(hint)
        if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if hint in (int, bool, str) and type(value) is hint:
            return None
        if origin is list and isinstance(value, list) and all(
            isinstance(item, (int, float)) and not isinstance(item, bool) for item in value
        ):
            return None
    names = " or ".join(_TYPE_NAMES.get(h, "a list of numbers") for h in allowed)
    return f"rope_scaling.{key} must be {names}, got {value!r}"


def _transformers_problem(messages: list[str]) -> str | None:
    """The first of ``transformers``' validation warnings that concerns ``rope_scaling`` itself, reworded."""
    for message in messages:
        if "max_position_embeddings=" in message:
            # transformers reads max_position_embeddings as the extended length; kerple's is the model's own
            continue
        unknown = re.search(r"Unrecognized keys .*'rope_type'='(\w+)': \{(.*)\}", message)
        if unknown:
            keys = ", ".join(re.findall(r"'([^']*)'", unknown.group(2)))
            return f"rope_scaling with rope_type {unknown.group(1)!r} takes no {keys} (transformers' validator)"
        return re.sub(r"`rope_parameters`'s (\w+) field", r"rope_scaling.\1", message)
    return None


def _unknown_keys_problem(keys: list[str]) -> str:
    from transformers.modeling_rope_utils import RopeParameters

    known = [key for key in RopeParameters.__annotations__ if key not in KERPLE_KEYS]
    guesses = [difflib.get_close_matches(key, known, n=1) for key in keys]
    hint = "".join(f"; did you mean {guess[0]!r} for {key!r}?" for key, guess in zip(keys, guesses) if guess)
    return f"unknown key(s) {', '.join(map(repr, keys))} in rope_scaling{hint}"


def rope_scaling_problem(
    rope_scaling: Any, *, head_dim: int, rotary_pct: float, base: float, max_positions: int
) -> str | None:
    """What is wrong with ``rope_scaling`` for a rotary model of this shape, naming the key; ``None`` if nothing.

    The ``rope_type`` must be one :func:`rope_types` lists, each value of the type ``transformers``
    declares for its key, and ``transformers``' validator must accept the keys and values (its
    missing and unknown keys and its value rules: factor >= 1, list lengths, ...).
    """
    if not isinstance(rope_scaling, dict):
        return f"rope_scaling must be a mapping such as {{rope_type: yarn, factor: 4}}, got {rope_scaling!r}"
    rope_type = rope_scaling.get("rope_type")
    if rope_type not in rope_types():
        got = "no rope_type" if rope_type is None else f"rope_type {rope_type!r}"
        return f"rope_scaling needs rope_type: one of {', '.join(rope_types())}; got {got}"
    for key, option in KERPLE_KEYS.items():
        if key in rope_scaling:
            return f"rope_scaling.{key} is kerple's {option}; set that option instead"
    from transformers.modeling_rope_utils import RopeParameters

    unknown = [str(key) for key in rope_scaling if key not in RopeParameters.__annotations__]
    if unknown:
        return _unknown_keys_problem(unknown)
    for key, value in rope_scaling.items():
        problem = _value_problem(str(key), value)
        if problem:
            return problem
    with _captured_warnings() as messages:
        try:
            config = transformers_config(
                rope_scaling, head_dim=head_dim, rotary_pct=rotary_pct, base=base, max_positions=max_positions
            )
        except KeyError as error:
            missing = re.findall(r"'([^']*)'", str(error).split(":", 1)[-1])
            return f"rope_scaling with rope_type {rope_type!r} needs {', '.join(missing) or error}"
    problem = _transformers_problem(messages)
    if problem is None and rope_type != NO_SCALING:
        frequencies, _ = _init_function(rope_type)(config, None)
        if not torch.isfinite(frequencies).all() or not (frequencies >= 0).all():
            problem = f"rope_scaling gives rotary frequencies that are not finite and >= 0: {frequencies.tolist()}"
    return problem


def _init_function(rope_type: str) -> Any:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[rope_type]


@dataclass
class RopeFrequencies:
    """The scaled rotary frequencies of one model and its attention factor, at any length.

    ``at(length, device)`` returns ``(inv_freq [r/2] float32, attention_factor)`` from ``transformers``'
    initialiser for this ``rope_type``: once for the fixed types, at every new length for the
    length-dependent ones (the last result is kept, as every layer of a forward asks for it).
    """

    rope_type: str
    config: Any  # transformers.GPTNeoXConfig
    _last: tuple[tuple[int, torch.device], torch.Tensor, float] | None = None

    @property
    def length_dependent(self) -> bool:
        """Whether :meth:`at` depends on the length (``dynamic``, ``longrope``)."""
        return length_dependent(self.rope_type)

    @classmethod
    def build(
        cls, rope_scaling: dict[str, Any], *, head_dim: int, rotary_pct: float, base: float, max_positions: int
    ) -> RopeFrequencies:
        """Check ``rope_scaling`` (``ValueError`` naming the key) and build its frequencies."""
        problem = rope_scaling_problem(
            rope_scaling, head_dim=head_dim, rotary_pct=rotary_pct, base=base, max_positions=max_positions
        )
        if problem:
            raise ValueError(problem)
        with _captured_warnings():
            config = transformers_config(
                rope_scaling, head_dim=head_dim, rotary_pct=rotary_pct, base=base, max_positions=max_positions
            )
        return cls(rope_type=str(rope_scaling["rope_type"]), config=config)

    def at(self, length: int, device: torch.device | None = None) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` on ``device`` for a forward whose largest position is ``length - 1``."""
        key = (length if self.length_dependent else 0, torch.device(device or "cpu"))
        if self._last is None or self._last[0] != key:
            # the length as transformers' dynamic_rope_update passes it: an int64 tensor, max(position_ids) + 1
            seq_len = torch.tensor(key[0], device=key[1]) if key[0] else None
            inv_freq, factor = _init_function(self.rope_type)(self.config, key[1], seq_len=seq_len)
            self._last = (key, inv_freq.float().to(key[1]), float(factor))
        return self._last[1], self._last[2]
