"""The one exception type that means "the user's input is wrong".

The CLI turns it into a single line ``FILE: KEY: message`` and exit code 2, so every check that
rejects input raises this (never a bare ValueError) and names where the bad value came from.
"""

from __future__ import annotations

import re


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
        """``FILE: KEY: message``, the key said once: a source that lists the key among its ``--set``
        options (``preset:x with --set KEY, OTHER``) drops the list, whose other options are not at
        fault, and a message that opens with the key's own name and its value (``overlap_steps 20
        exceeds ...``) keeps only the value."""
        source, message = self.source, self.message
        if self.key:
            if source and " with --set " in source:
                base, _, keys = source.partition(" with --set ")
                if self.key in keys.split(", "):
                    source = f"{base} with --set"
            elif source and source.endswith(f" {self.key}"):
                source = source[: -len(self.key) - 1]
            leaf = re.escape(self.key.rsplit(".", 1)[-1])
            message = re.sub(rf"^{leaf} (?=-?[0-9.]+\b|'[^']*'|\"[^\"]*\")", "", message)
        parts = [escaped(p) for p in (source, self.key) if p]
        return ": ".join(parts + [message])


def escaped(text: str) -> str:
    """``text`` with each character a terminal would act on or hide (NUL, a newline, ESC, a
    right-to-left override) written as a Python repr writes it (``\\x00``, ``\\n``, ``\\u202e``): a
    file or key named by the user is quoted in an error as one line that shows what it holds. Keys
    and file names reach every message through InputError.__str__, which escapes them here."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def shortened(message: str, limit: int = 160) -> str:
    """``message`` in at most ``limit`` characters for a summary line: long parenthesised lists left out
    ("(...)"), then cut after a whole clause or word (never inside a number: "optimizer state 17."
    read as 17 bytes), with "..." where cut."""
    if len(message) <= limit:
        return message
    # long parenthesised lists (a memory breakdown) go first: the reason after them is what matters
    import re

    message = re.sub(r"\(([^()]{30,})\)", "(...)", message)
    if len(message) <= limit:
        return message
    head = message[: limit - 3]
    for mark in ("; ", ", ", " ("):
        cut = head.rfind(mark)
        if cut >= limit // 2:
            return head[:cut] + " ..."
    cut = head.rfind(" ")
    return (head[:cut] if cut > 0 else head) + " ..."
