"""The one exception of bad input: its message is one line naming the problem and the fix (exit status 2)."""


class InputError(ValueError):
    pass
