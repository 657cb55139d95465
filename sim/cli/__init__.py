"""`kvsim`: the command line. Validates input at the edge, runs, prints, and writes files atomically.

One module per group of commands; importing them registers their commands on `main` (`sim.cli.app`).
"""

from __future__ import annotations

from sim.cli import (  # noqa: F401 - registers the commands
    calibration, comparing, planning, real_servers, replaying, scenarios, simulate, traces, tuning,
)
from sim.cli.app import main

__all__ = ["main"]
