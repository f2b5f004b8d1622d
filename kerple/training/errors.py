"""The training package's errors (the CLI prints them and exits 2)."""


class TrainingError(RuntimeError):
    """A run that cannot start or must stop; the message says why and what to change."""


class TrainingDivergedError(TrainingError):
    """The loss became NaN or infinite; nothing was saved for that step."""
