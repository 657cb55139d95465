"""The run journal of a study's output directory, `DIR/runs.jsonl`: every finished run, appended as it finishes.

Format (JSON Lines, one object a line, UTF-8):

    {"kvsim_journal": 1, "study": "sweep", "fingerprint": "<sha256 of the base scenario>"}      <- header
    {"key": [3, 7, 4, "random", null, 0, 42], "run": {...}}                                      <- a finished run

`key` is the run's identity (a sweep point's fields, seed included); `run` is what the study needs to rebuild its
outcome (a sweep: the summary row and the TTFT samples). Each line is written whole, flushed and fsync'd before
the next run is recorded, so a crash or an interrupt loses at most the runs in flight, and a torn last line (a crash
in mid-write) is dropped on resume. JSON keeps floats exact (shortest round-trip repr; NaN as `NaN`), so a resumed
study's outputs are byte for byte those of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

JOURNAL_NAME = "runs.jsonl"
JOURNAL_VERSION = 1


class JournalError(ValueError):
    """A journal that cannot be resumed (another study's, or unreadable): the message is one line."""


def _key(key: Sequence[Any]) -> str:
    return json.dumps(list(key))


class RunJournal:
    """An open journal; `done` maps the JSON text of each recorded key to its run (the resumed ones and those
    appended since). Appends go to the end, one fsync'd line each. A context manager that closes the file."""

    def __init__(self, path: Path, *, study: str, fingerprint: str, resume: bool) -> None:
        self.path = path
        self.done: dict[str, Any] = {}
        header = {"kvsim_journal": JOURNAL_VERSION, "study": study, "fingerprint": fingerprint}
        lines = [json.dumps(header)]
        if resume and path.exists():
            lines += self._read_runs(header)
        # NOTE: rewritten whole (through a temporary file) so that a torn last line is gone before anything is appended.
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._file = open(path, "a", encoding="utf-8")

    def _read_runs(self, header: dict) -> list[str]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise JournalError(f"{self.path}: cannot read the journal to resume ({err})") from None
        raw = text.split("\n")
        try:
            found = json.loads(raw[0])
        except json.JSONDecodeError:
            found = None
        if not isinstance(found, dict) or found.get("kvsim_journal") != JOURNAL_VERSION:
            raise JournalError(f"{self.path} is not a kvsim journal; drop --resume or choose another --out")
        if (found.get("study"), found.get("fingerprint")) != (header["study"], header["fingerprint"]):
            raise JournalError(f"{self.path} records another study ({found.get('study')} of a different scenario "
                               "or options); drop --resume to start afresh or choose another --out")
        kept = []
        for number, line in enumerate(raw[1:], start=2):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                key, run = _key(entry["key"]), entry["run"]
            except (json.JSONDecodeError, KeyError, TypeError):
                if number == len(raw) or (number == len(raw) - 1 and not raw[-1]):
                    break  # NOTE: a torn last line: the run it recorded was in flight
                raise JournalError(f"{self.path}: line {number} is not a journal entry") from None
            self.done[key] = run
            kept.append(line)
        return kept

    def __contains__(self, key: Sequence[Any]) -> bool:
        return _key(key) in self.done

    def get(self, key: Sequence[Any]) -> Any:
        return self.done[_key(key)]

    def append(self, key: Sequence[Any], run: Any) -> None:
        """Record a finished run: one line, flushed and fsync'd before this returns."""
        self._file.write(json.dumps({"key": list(key), "run": run}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.done[_key(key)] = run

    def saved(self, keys: Sequence[Sequence[Any]]) -> int:
        """How many of `keys` the file on disk records. NOTE: read back rather than counted in `done`: a signal can
        land between a line's write and its count (any thread may take it, so masking it here would not help)."""
        return len({_key(k) for k in keys} & self._keys_on_disk())

    def count_saved(self) -> int:
        """How many runs the file on disk records (for studies whose runs are not known in advance: a search)."""
        return len(self._keys_on_disk())

    def _keys_on_disk(self) -> set[str]:
        found = set()
        for line in self.path.read_text(encoding="utf-8").split("\n")[1:]:
            try:
                found.add(_key(json.loads(line)["key"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        return found

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RunJournal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
