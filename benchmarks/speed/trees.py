"""What the benchmarks that time whole `kvsim` commands in several checkouts share (`startup_speed.py`,
`command_parts.py`): their `--runs`, `--tree` and `--traces` options, a checkout's environment, and the check that a
checkout's `sim` is the one its commands import."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a command run in `tree` (its `sim` first on the path)."""
    # NOTE: TTY_COMPATIBLE=0: the output is piped here, as a script's would be; it keeps rich from probing.
    return {**os.environ, "PYTHONPATH": str(tree), "TTY_COMPATIBLE": "0"}


def check_tree(tree: Path) -> None:
    """`sim` must be imported from `tree` (not from an installed copy elsewhere); run with cwd=tree, since
    `python -c` and `python -m` put the working directory first on the path, before PYTHONPATH."""
    found = subprocess.run([sys.executable, "-c", "import sim; print(sim.__file__)"], env=tree_env(tree), cwd=tree,
                           capture_output=True, text=True).stdout.strip()
    if Path(found).resolve() != (tree / "sim" / "__init__.py").resolve():
        raise SystemExit(f"--tree {tree}: `import sim` loads {found or 'nothing'}, not this tree's")


def add_tree_options(parser: argparse.ArgumentParser, *, runs: int, runs_help: str) -> None:
    """`--runs` (default `runs`), `--tree DIR` (repeatable) and `--traces DIR`."""
    parser.add_argument("--runs", type=int, default=runs, help=runs_help)
    parser.add_argument("--tree", type=Path, action="append", default=None,
                        help="a checkout of kvsim to time (repeatable; default: this one)")
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("TRACES", REPO / "traces")),
                        help="folder with conversation_trace.jsonl (default: $TRACES, else traces/ at the repository "
                             "root)")


def trace_and_trees(args: argparse.Namespace) -> tuple[Path, list[Path]]:
    """The conversation trace and the checked checkouts of `add_tree_options`'s parsed options, or a one-line exit."""
    if args.runs < 1:
        raise SystemExit(f"--runs must be >= 1, got {args.runs}")
    trace = (args.traces / "conversation_trace.jsonl").resolve()
    if not trace.exists():
        raise SystemExit(f"--traces: {trace} not found; `kvsim traces fetch` downloads the Mooncake traces")
    trees = [t.resolve() for t in (args.tree or [REPO])]
    for tree in trees:
        check_tree(tree)
    return trace, trees
