"""The errors and warnings of the data layer: each message names the file or the setting at fault."""


class DataError(ValueError):
    """Bad input data that stops the run: the one-line message names the file (or dataset)."""


class DataWarning(UserWarning):
    """Input that was read with repairs (invalid UTF-8 replaced): the message names the file."""
