"""The one exception type of `kerple.data`: every message names the file (or URL) and the problem."""


class DataError(Exception):
    """A corpus, tokenizer or indexed-dataset file is missing, unreadable or malformed.

    Entry points print the message and exit with a non-zero status; nothing half-written is left.
    """
