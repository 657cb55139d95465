"""A figure drawn by a second process, which loads matplotlib while the command computes.

Loading matplotlib and numpy takes 0.3-0.4 s of CPU here: more than a short replay's whole simulation. A command that
will write a figure calls `painter()` before its work: a child Python process imports `sim.results.figures` and
matplotlib at once, on the other core, then waits. `painter.png(name, *args, **kwargs)` sends it the name of a
`sim.results.figures` function and its arguments (pickled) and returns the PNG bytes the child drew: the same function
on the same data, so the same bytes as drawing here. When anything goes wrong with the child (no second interpreter,
an import error, arguments that do not pickle), the figure is drawn in this process instead, as before, and its error
(if it has one) is raised here. The command's click context ends a child that was not used.

No child is started when matplotlib is already loaded (a notebook, a test session: drawing here costs little more).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import click

_CHILD = """
import json, pickle, sys
sys.path[:] = json.loads(sys.argv[1])
from sim.cluster.collector import command_collections
with command_collections():  # a command's process: its collector's pace (~0.1 s of CPU in matplotlib's import)
    import matplotlib.artist
    # NOTE: matplotlib writes a property table into the docstring of every Artist class's `set` as it defines them, a
    # fifth of its import here; this process only draws, so it skips them (docstrings only: the same pixels and bytes).
    matplotlib.artist.kwdoc = lambda artist: ""
    from sim.results import figures
    figures._pyplot()
    name, args, kwargs = pickle.load(sys.stdin.buffer)
    sys.stdout.buffer.write(getattr(figures, name)(*args, **kwargs))
    # NOTE: the PNG is all this process owes: it ends once it has flushed its pipes, without tearing down matplotlib,
    # numpy and the figure (~0.1 s of CPU, a sixth of this process); it wrote no file that a teardown would close.
    sys.stdout.flush()
    sys.stderr.flush()
    import os
    os._exit(0)
"""
"""The child: the parent's module path, matplotlib loaded, then one figure drawn from stdin to stdout."""


class Painter:
    """Draws `sim.results.figures` figures in a child process started at construction (or here, without one)."""

    def __init__(self, start: bool) -> None:
        self._child: subprocess.Popen | None = None
        self.drew_in_child = False
        """Whether the last figure came from the child (else it was drawn here)."""
        if start:
            try:
                self._child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(sys.path)],
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            except OSError:
                self._child = None

    def png(self, name: str, *args, **kwargs) -> bytes:
        """The PNG bytes of `sim.results.figures.<name>(*args, **kwargs)`."""
        child, self._child = self._child, None
        if child is not None:
            try:
                out, err = child.communicate(pickle.dumps((name, args, kwargs)))
            except (OSError, pickle.PicklingError, TypeError, AttributeError):
                child.kill()
                child.wait()
            else:
                if child.returncode == 0 and out.startswith(b"\x89PNG\r\n\x1a\n"):
                    # NOTE: what matplotlib said while drawing (a missing glyph), as if it had drawn here.
                    sys.stderr.write(err.decode(errors="replace"))
                    self.drew_in_child = True
                    return out
        self.drew_in_child = False
        from sim.results import figures

        return getattr(figures, name)(*args, **kwargs)

    def close(self) -> None:
        """End the child if it was not used."""
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()


def painter(will_draw: bool) -> Painter:
    """A `Painter` for the current command, whose child (when `will_draw` and matplotlib is not loaded yet) is ended
    with the command's click context, however the command ends."""
    result = Painter(start=will_draw and "matplotlib" not in sys.modules)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(result.close)
    return result
