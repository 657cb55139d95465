"""How the CLI runs a study's points: on the chosen executor, journaled into `--out DIR/runs.jsonl` as they finish
(`--resume` skips those already there), and stoppable by SIGINT or SIGTERM.

On a signal the command stops: the executor cancels what has not started and terminates its worker processes (runs
in flight are lost), the finished runs are in the journal, and the command exits 130 (SIGINT) or 143 (SIGTERM) with
one line saying how many runs are saved and how to resume.
"""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple
from pathlib import Path
from typing import Any

import click

from sim.cli.app import UsageExit, err_console, open_executor_or_exit, progress_bar
from sim.results.journal import JOURNAL_NAME, JournalError, RunJournal
from sim.results.records import TtftSamples
from sim.scenario import Scenario


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like SIGINT's KeyboardInterrupt so that the same clean-up runs."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextmanager
def stoppable(saved: Callable[[], str]) -> Iterator[None]:
    """Turns SIGINT and SIGTERM inside the block into a one-line message (`saved()` says what is kept and how to
    resume) and exit status 130 or 143."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except KeyboardInterrupt as err:
        terminated = isinstance(err, Terminated)
        # NOTE: a second signal during the clean-up would print a traceback: ignore them from here on.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        err_console.print(f"stopped by {'SIGTERM' if terminated else 'SIGINT'}: {saved()}", highlight=False, soft_wrap=True)
        raise click.exceptions.Exit(143 if terminated else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def fingerprint(base: Scenario, inputs: str = "") -> str:
    """What a journal must have been written for to be resumed: the base scenario (every field) and the study's
    other inputs (a trace's path and reading options)."""
    return hashlib.sha256((base.model_dump_json() + "\n" + inputs).encode()).hexdigest()


def open_journal(out: Path | None, study: str, base: Scenario, resume: bool, inputs: str = "",
                 path: Path | None = None) -> RunJournal | None:
    """The journal `out/runs.jsonl`, or the file `path` if given (a study whose --out is a file journals beside it)."""
    if out is None and path is None:
        if resume:
            raise UsageExit("--resume needs --out DIR (the directory whose runs.jsonl to continue)")
        return None
    try:
        return RunJournal(path if path is not None else out / JOURNAL_NAME, study=study, fingerprint=fingerprint(base, inputs), resume=resume)
    except JournalError as err:
        raise UsageExit(str(err)) from None


def run_journaled(study: str, base: Scenario, points: Sequence, *, run: Callable, to_json: Callable[[Any], Any],
                  from_json: Callable[[Any, Any], Any], out: Path | None, resume: bool, executor_kind: str,
                  jobs: int | None, dask_scheduler: str | None, command: str, inputs: str = "") -> list:
    """`run(executor, todo_points, progress, on_result)` over the points not yet in the journal, each result
    journaled (`to_json`) as it finishes; the results of every point in order, journaled ones rebuilt with
    `from_json(point, run)`. `command` is the line to resume with; `inputs` what besides `base` the results depend
    on (part of the journal's fingerprint)."""
    keys = [astuple(p) for p in points]
    results: list = [None] * len(points)
    with journaled_search(study, base, out=out, resume=resume, command=command, inputs=inputs,
                          listed=keys) as journal:
        todo = [i for i, k in enumerate(keys) if journal is None or k not in journal]

        def on_result(j: int, result: Any) -> None:
            if journal is not None:
                journal.append(keys[todo[j]], to_json(result))

        with progress_bar(study, len(points)) as step:
            step(len(points) - len(todo))
            if todo:
                if jobs is None and executor_kind == "local":
                    from sim.studies.executor import available_cores

                    jobs = min(available_cores(), len(todo))
                with open_executor_or_exit(executor_kind, jobs, dask_scheduler) as executor:
                    fresh = run(executor, [points[i] for i in todo], step, on_result)
                for i, result in zip(todo, fresh):
                    results[i] = result
        for i in range(len(points)):
            if results[i] is None:
                results[i] = from_json(points[i], journal.get(keys[i]))
    return results


@contextmanager
def journaled_search(study: str, base: Scenario, *, out: Path | None, resume: bool, command: str, inputs: str,
                     at_most: int | None = None, listed: Sequence[tuple] | None = None,
                     path: Path | None = None) -> Iterator[RunJournal | None]:
    """The journal of a study, opened (None without --out) and closed around the block, which SIGINT and SIGTERM stop
    with a one-line message saying how many runs are saved and how to resume. A search (`tune`, `plan`,
    `calibrate`) finds its runs as it goes and gets the journal as its run store; `run_journaled` lists them in
    advance. The message counts the `listed` runs saved (a listed study: the journal of a resumed sweep may also hold
    other points'), else every run saved against `at_most` (a search's budget of simulations) or no bound (none
    known in advance: `calibrate`); `path` is the journal file if not `out/runs.jsonl`."""
    journal = open_journal(out, study, base, resume, inputs, path)

    def saved() -> str:
        if journal is None:
            return "no runs saved (without --out nothing is journaled)"
        if listed is not None:
            count, bound = journal.saved(listed), f" of {len(listed)}"
        else:
            count, bound = journal.count_saved(), "" if at_most is None else f" of at most {at_most}"
        return f"{count}{bound} runs saved in {journal.path}; resume with: {command} --resume"

    try:
        with stoppable(saved):
            yield journal
    finally:
        if journal is not None:
            journal.close()


# --- what a sweep point's outcome is in the journal ------------------------------------------------------------------

def outcome_to_json(outcome) -> dict:
    return {"row": outcome.row, "ttft_hit_ms": list(outcome.ttft.hit_ms), "ttft_miss_ms": list(outcome.ttft.miss_ms)}


def outcome_from_json(point, run: dict):
    from sim.studies.sweep import PointOutcome

    return PointOutcome(point, run["row"], TtftSamples(tuple(run["ttft_hit_ms"]), tuple(run["ttft_miss_ms"])))


def run_sweep_points(study: str, base: Scenario, points: list, **kwargs) -> list:
    """Sweep points (`sim.studies.sweep.SweepPoint`) through `run_journaled`: their outcomes, in order."""
    from sim.studies.sweep import run_points

    return run_journaled(study, base, points, run=lambda ex, todo, step, on: run_points(ex, base, todo, step, on),
                         to_json=outcome_to_json, from_json=outcome_from_json, **kwargs)


def resume_command(ctx: click.Context) -> str:
    """The command line as given, less any --resume: what to run again to resume."""
    import shlex
    import sys

    names = []  # the command's path below `kvsim`: ["sweep"], ["plan", "router"]
    node = ctx
    while node.parent is not None:
        names.insert(0, node.info_name)
        node = node.parent
    argv = sys.argv
    start = next((i for i in range(len(argv)) if argv[i:i + len(names)] == names), None)
    if start is None:  # NOTE: called in-process (tests, notebooks): argv is not this command's
        return f"{ctx.command_path} (the same options)"
    args = [a for a in argv[start:] if a != "--resume"]
    return " ".join(["kvsim", *(shlex.quote(a) for a in args)])
