"""The worker side of the CPU tier in simulated time: when the connector's load and store jobs run and complete."""

from __future__ import annotations

from sim.engines.interface import HostLink
from sim.engines.vllm.offload.connector import ConnectorStep, OffloadingConnector


class HostTransfers:
    """Runs a connector's jobs on a `HostLink`, as vLLM's offloading worker does (`OW`, `GW`; rules §2.3, §3.2):

    * a step's loads are submitted at its start, before the forward pass, which they overlap (`start_kv_transfers`);
    * its stores are submitted at the next step's start, i.e. when it ends ("offloading starts AFTER transfers
      related to token sampling", `OW` 272-284);
    * jobs the step must flush (`jobs_to_flush`) are submitted at once if not yet, and the forward pass waits for
      them: the step's `stall_s`;
    * after each forward pass the worker reports every job complete by then (`get_finished`); an engine with
      nothing else to do is woken when the next job completes (`next_done_s`), as vLLM's busy loop would see it.
    """

    def __init__(self, connector: OffloadingConnector, link: HostLink) -> None:
        self.connector = connector
        self.link = link
        self._done_s: dict[int, float] = {}
        """Submitted jobs -> completion time."""
        self._flushed: set[int] = set()

    def _submit(self, job_id: int, start_s: float) -> None:
        job = self.connector.job(job_id)
        self._done_s[job_id] = self.link.copy_done_s(to_device=not job.is_store, start_s=start_s,
                                                     num_bytes=job.num_bytes)

    def start_step(self, step: ConnectorStep, now_s: float) -> float:
        """Submit the step's loads (and flushed stores); returns the seconds its forward pass waits."""
        for job in step.load_jobs:
            self._submit(job.job_id, now_s)
        if not step.jobs_to_flush:
            return 0.0
        for jid in step.jobs_to_flush:
            if jid not in self._done_s:
                self._submit(jid, now_s)
        self._flushed.update(step.jobs_to_flush)
        return max(0.0, max(self._done_s[j] for j in step.jobs_to_flush) - now_s)

    def end_step(self, step: ConnectorStep, now_s: float) -> list[int]:
        """The jobs complete by now (flushed ones always), in submission order; then submits the step's stores."""
        done = [j for j, t in self._done_s.items() if t <= now_s or j in self._flushed]
        for j in done:
            del self._done_s[j]
        self._flushed.difference_update(done)
        for job in step.store_jobs:
            if job.job_id not in self._done_s:
                self._submit(job.job_id, now_s)
        return done

    def poll(self, now_s: float) -> list[int]:
        """Jobs complete by now, for a step that ran nothing."""
        done = [j for j, t in self._done_s.items() if t <= now_s]
        for j in done:
            del self._done_s[j]
        return done

    def next_done_s(self) -> float | None:
        return min(self._done_s.values()) if self._done_s else None
