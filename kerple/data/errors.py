"""The one exception type of `kerple.data`: every message names the file (or URL) and the problem."""

from kerple.errors import KerpleError


class DataError(KerpleError):
    """A corpus, tokenizer or indexed-dataset file is missing, unreadable or malformed.

    Entry points print the message and exit with status 2; nothing half-written is left.
    """
