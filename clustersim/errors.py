"""The one exception type that means "the user's input is wrong".

The CLI turns it into a single line ``FILE: KEY: message`` and exit code 2, so every check that
rejects input raises this (never a bare ValueError) and names where the bad value came from.
"""

from __future__ import annotations


class InputError(Exception):
    """A problem with user input (scenario, profile, command option) that the user can fix."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        super().__init__(message)
        self.message = message
        self.source = source
        self.key = key

    def located(self, source: str | None = None, key_prefix: str | None = None) -> "InputError":
        """The same error, attributed to a file and/or nested under a key prefix."""
        key = self.key
        if key_prefix:
            key = f"{key_prefix}.{key}" if key else key_prefix
        return InputError(self.message, source=self.source or source, key=key)

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.key) if p]
        return ": ".join(parts + [self.message])
