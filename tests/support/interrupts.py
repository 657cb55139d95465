"""Interrupting a study's CLI once its journal holds some runs (the resume tests of sweep, tune and calibrate)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.support.paths import REPO


def interrupt_once_journaled(cmd: Sequence[str], journal: Path, *, lines: int, signum: int,
                             while_waiting: Callable[[int], None] = lambda pid: None) -> tuple[int, str]:
    """Start `cmd` (in the repository), wait until `journal` has at least `lines` lines (its header included), send
    `signum`, and return the exit status and stderr. Fails if the command finished before it could be interrupted.
    `while_waiting(pid)` is called at every poll (e.g. to collect the worker processes)."""
    proc = subprocess.Popen(list(cmd), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        while_waiting(proc.pid)
        if journal.exists() and len(journal.read_text().splitlines()) >= lines:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"{cmd[3]} finished before it could be interrupted"
    while_waiting(proc.pid)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr
