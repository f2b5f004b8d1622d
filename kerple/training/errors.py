"""The errors of a training run: why it cannot start or had to stop, and what to change."""

from __future__ import annotations

from kerple.errors import KerpleError


FP16_NEEDS_CUDA = ("fp16 training needs a CUDA GPU: DeepSpeed 0.19 rejects fp16 on the CPU accelerator. "
                   "On CPU use bf16 ('bf16: {enabled: true}') or fp32 (remove the fp16 block).")


class TrainingError(KerpleError):
    """A run that cannot start or must stop; the message says why and what to change."""


class TrainingDivergedError(TrainingError):
    """The loss became NaN or infinite; nothing was saved for that step."""
