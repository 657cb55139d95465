"""What every CSV kvsim reads shares: UTF-8 text, and fields that are finite numbers or whole numbers in a range.

The one owner of these rules for the run CSV (`sim.servers.run_csv`) and the measured CSV (`sim.studies.reference`);
each raises ValueError with a message that the reader prefixes with the file, line and column.
"""

from __future__ import annotations

import math
from pathlib import Path


def read_text(path: Path) -> str:
    """The file's text, or ValueError naming it when it is not UTF-8 text (a binary or mis-encoded file)."""
    data = path.read_bytes()
    if b"\x00" in data:
        raise ValueError(f"{path}: not a UTF-8 text file (it holds NUL bytes)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file (byte {err.start})") from None


def finite_float(text: str | None, *, least: float | None = None) -> float:
    """A finite number (not nan or inf), at least `least` when given."""
    if text is None or not text.strip():
        raise ValueError("missing value")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r}: give a finite number")
    if least is not None and value < least:
        raise ValueError(f"{text} must be >= {least:g}")
    return value


def whole_number(text: str | None, *, least: int | None = None) -> int:
    """A whole number, at least `least` when given."""
    if text is None or not text.strip():
        raise ValueError("missing value")
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if least is not None and value < least:
        raise ValueError(f"{text} must be >= {least}")
    return value
