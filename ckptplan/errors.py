"""The one exception type users see: its message is a complete one-line diagnosis."""


class CkptplanError(Exception):
    """A problem with the user's input, stated in one line with the fix.

    The CLI prints the message and exits with status 2; no traceback is shown.
    """
