"""Reading the user's input files (imports, seed packs) with one-line errors.

Every command that reads a file the user named answers the same way when it is missing, a
directory, unreadable or not UTF-8, so the CLI can print the message and exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from forge.errors import UserError, ValidationError

__all__ = ["read_text"]


def read_text(path: str | Path, *, what: str = "a JSONL file") -> str:
    """The UTF-8 text of ``path`` (``"-"`` reads standard input); ``what`` names the expected input."""
    path = str(path)
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)
            data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        else:
            data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; give {what}") from None
    except OSError as exc:
        raise UserError(f"{name}: cannot read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{name}: not UTF-8 text (bad byte at offset {exc.start})") from None
