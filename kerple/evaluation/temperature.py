"""The softmax temperature τ of a ``--softmax-temperature``-style setting at a length (thesis §5.4-5.5)."""

from __future__ import annotations

import math

from kerple.errors import KerpleError


class TemperatureError(KerpleError):
    """A temperature setting that means nothing: not a number in (0, 1] and not ``log``."""


def temperature_for(setting: str, length: int, train_length: int, option: str = "--softmax-temperature") -> float:
    """The softmax temperature of ``setting`` at ``length``: a number in (0, 1] (1 = the trained
    model, thesis §5.4), or ``log`` = ``log_L(L_tr)`` = ``ln L_tr / ln L`` beyond the train length
    and 1 within it (thesis §5.5, after Yao et al. 2021 and Su 2021)."""
    if setting == "log":
        return math.log(train_length) / math.log(length) if length > train_length > 1 else 1.0
    try:
        temperature = float(setting)
    except ValueError:
        raise TemperatureError(f"{option} {setting!r}: expected a number in (0, 1] or 'log'") from None
    if not 0.0 < temperature <= 1.0:
        raise TemperatureError(f"{option} {setting!r}: must lie in (0, 1] (1 = the trained model); "
                               "a temperature above 1 flattens attention further")
    return temperature
