"""`kvsim`: the command line. Validates input at the edge, runs, prints, and writes files atomically.

One module per group of commands; importing one registers its commands on `main` (`sim.cli.root`), which imports
each command's module when the command is used (`kvsim --help` imports none).
"""

from __future__ import annotations

from sim.cli.root import main

__all__ = ["main"]
