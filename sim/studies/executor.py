"""Where a study's simulations run: processes on this machine (`LocalExecutor`) or a Dask cluster (`DaskExecutor`).

Every study (sweep, compare, tune, plan, calibrate) hands its independent simulations to an `Executor` through one
call, `map(fn, items, progress, on_result)`: results come back in the order of `items` whatever the order they
finish in, so a seed gives the same numbers (and the same summary.csv bytes) on any executor and any number of
workers. `on_result(index, result)` sees each result as it finishes, which is what lets a sweep journal its runs
as they complete.

Dask (`dask[distributed]`) is the cluster backend because it is the standard Python cluster scheduler: `dask
scheduler` on one machine and `dask worker tcp://HOST:8786` on the others make a cluster that kvsim joins with
`--executor dask --dask-scheduler tcp://HOST:8786`; without an address kvsim starts (and closes) a `LocalCluster`
of `jobs` single-threaded worker processes. `fn` must be a module-level function and `items` picklable (scenarios
are pydantic models, which pickle).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol

EXECUTORS = ("local", "dask")
"""The values of `--executor`."""


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells, else all of the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Executor(Protocol):
    """Runs independent calls of a module-level function; a context manager that releases its workers on exit
    (on an exception too: an interrupted study leaves no worker process behind)."""

    jobs: int
    """How many calls run at once."""

    def map(self, fn: Callable, items: Sequence, progress: Callable[[], None] | None = None,
            on_result: Callable[[int, Any], None] | None = None) -> list:
        """`fn(item)` for every item, results in the order of `items`; `on_result(i, result)` then `progress()` as
        each call finishes (in the order they finish)."""
        ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc) -> None: ...


def _deliver(results: list, i: int, result: Any, progress, on_result) -> None:
    results[i] = result
    if on_result:
        on_result(i, result)
    if progress:
        progress()


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def _stop_signals_held():
    """SIGINT and SIGTERM held back (not lost: delivered when the block ends) while the pool forks its workers: a
    signal that lands inside `fork()` is otherwise swallowed by the interpreter ("Exception ignored in
    _releaseLock") and the command runs on as if nothing happened."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _worker_signals() -> None:
    """In each worker process: SIGINT ignored (a terminal's Ctrl-C reaches the whole process group; the parent
    decides), SIGTERM back to the default (die at once, whatever handler the parent had installed when it forked)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # forked while the parent held them back


class LocalExecutor:
    """`jobs` worker processes on this machine (default: every available core), kept between calls of `map`; with
    one job, calls run in this process. An exception or interrupt (KeyboardInterrupt, SIGTERM raised as one) inside
    `map` cancels the pending calls and terminates the worker processes before it propagates."""

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = max(1, jobs or available_cores())
        self._pool = (ProcessPoolExecutor(max_workers=self.jobs, initializer=_worker_signals) if self.jobs > 1
                      else None)

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.terminate()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def terminate(self) -> None:
        """Cancel what has not started and kill the worker processes (their in-flight calls are lost)."""
        if self._pool is None:
            return
        # NOTE: shutdown(cancel_futures=True) alone waits for running calls; the processes are killed explicitly,
        # read before shutdown forgets them.
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        manager = getattr(self._pool, "_executor_manager_thread", None)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            if p.is_alive():
                p.terminate()
        for p in processes:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        # NOTE: the pool's manager thread notices the dead workers and closes its wake-up pipe; waiting for it here
        # keeps the interpreter's exit hook from writing to that pipe while it closes (a stray OSError traceback).
        if manager is not None:
            manager.join(timeout=5)
        self._pool = None

    def map(self, fn: Callable, items: Sequence, progress: Callable[[], None] | None = None,
            on_result: Callable[[int, Any], None] | None = None) -> list:
        results: list = [None] * len(items)
        if self._pool is None or len(items) <= 1:
            for i, item in enumerate(items):
                _deliver(results, i, fn(item), progress, on_result)
            return results
        try:
            with _stop_signals_held():  # NOTE: submit forks the workers it still lacks
                pending: dict[Future, int] = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                # NOTE: several may finish together: deliver them in item order, so one-job and many-job runs call
                # on_result alike when they can.
                for future in sorted(done, key=pending.__getitem__):
                    _deliver(results, pending.pop(future), future.result(), progress, on_result)
        except BaseException:
            self.terminate()
            raise
        return results


class DaskExecutor:
    """Calls on a Dask cluster: the scheduler at `address` (`tcp://HOST:8786`), or without one a `LocalCluster` of
    `jobs` single-threaded worker processes that this executor starts and closes. Dask's logging below warnings and
    its dashboard are off."""

    def __init__(self, address: str | None = None, jobs: int | None = None) -> None:
        import logging

        import dask
        from distributed import Client, LocalCluster

        for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.worker",
                     "distributed.core", "distributed.http.proxy"):
            logging.getLogger(name).setLevel(logging.ERROR)
        dask.config.set({"distributed.admin.system-monitor.gil.enabled": False})
        self._cluster = None
        if address is None:
            self.jobs = max(1, jobs or available_cores())
            # NOTE: the scheduler's HTTP server starts even without a dashboard; ":0" lets it take a free port
            # rather than warn when another cluster already holds 8787.
            self._cluster = LocalCluster(n_workers=self.jobs, threads_per_worker=1, processes=True,
                                         dashboard_address=":0", silence_logs=logging.ERROR)
            self._client = Client(self._cluster)
        else:
            self._client = Client(address, timeout=30)
            self.jobs = max(1, sum(self._client.nthreads().values()))

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None

    def map(self, fn: Callable, items: Sequence, progress: Callable[[], None] | None = None,
            on_result: Callable[[int, Any], None] | None = None) -> list:
        from distributed import as_completed

        results: list = [None] * len(items)
        if not items:
            return results
        # NOTE: a task per run costs a scheduler round trip (~2x the wall time of 0.1 s runs on one machine); runs
        # go in chunks of consecutive items instead, about CHUNKS_PER_WORKER per worker, each chunk's results
        # delivered (and journaled) in item order as it finishes.
        size = max(1, len(items) // (self.jobs * CHUNKS_PER_WORKER))
        starts = range(0, len(items), size)
        futures = self._client.map(_run_chunk, [(fn, list(items[i:i + size])) for i in starts], pure=False)
        first = {f.key: i for i, f in zip(starts, futures)}
        try:
            for future in as_completed(futures):
                for k, result in enumerate(future.result()):
                    _deliver(results, first[future.key] + k, result, progress, on_result)
        except BaseException:
            self._client.cancel(futures)
            raise
        return results


CHUNKS_PER_WORKER = 8
"""Chunks of runs per Dask worker in one `map`: enough to balance uneven runs, few enough to amortise the round
trips."""


def _run_chunk(args: tuple[Callable, list]) -> list:
    fn, chunk = args
    return [fn(item) for item in chunk]


def open_executor(kind: str = "local", *, jobs: int | None = None, address: str | None = None) -> Executor:
    """The executor `--executor KIND` names (`EXECUTORS`); `address` (a Dask scheduler) goes with dask only."""
    if kind == "local":
        if address is not None:
            raise ValueError("--dask-scheduler goes with --executor dask")
        return LocalExecutor(jobs)
    if kind == "dask":
        return DaskExecutor(address, jobs)
    raise ValueError(f"executor: unknown {kind!r}; allowed: {', '.join(EXECUTORS)}")


def using(executor: Executor | None, jobs: int | None = None):
    """A context giving `executor` (left open: its owner closes it) or, without one, a `LocalExecutor(jobs)` closed
    on exit: how a study takes an optional executor."""
    from contextlib import nullcontext

    return nullcontext(executor) if executor is not None else LocalExecutor(jobs)
