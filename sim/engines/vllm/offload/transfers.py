"""The worker side of the CPU tier in simulated time: when the connector's load and store jobs run and complete."""

from __future__ import annotations

from sim.engines.interface import HostLink
from sim.engines.vllm.offload.connector import ConnectorStep, OffloadingConnector


class HostTransfers:
    """Runs a connector's jobs on a `HostLink` as vLLM 0.33.0's offloading worker does (sim/timing/host-link.md;
    rules §2.3, §3.2). A step runs from its start t0 to its end t1 (its forward pass):

    * a step's loads are submitted after its forward pass is launched and wait for the compute stream
      (`kv_connector_model_runner_mixin.py` 79-96, `GW` 694): on the link they start at t1 (at t0 in a step that
      computes nothing);
    * a step's stores are deferred to the next step ("offloading starts AFTER transfers related to token
      sampling", `OW` 272-284), which submits them before its forward (`handle_preemptions`, `OW` 219-244) behind
      the forward they were computed in: they also start at t1, the next step's start; each direction is one FIFO
      queue;
    * the worker checks its copies right after launching a step's forward (`get_transfer_results`): a job is
      reported in the first step starting at or after its completion, and the scheduler sees it when that step
      ends; so a CPU hit waits at least its admitting step and the next one, and prefills in the one after;
    * jobs a step must flush (`jobs_to_flush`) are submitted at once if not yet and its forward pass waits for
      them: the step's `stall_s`; they are reported in that step;
    * an engine with only copies in flight polls (empty steps): it is woken when the next copy completes.
    """

    def __init__(self, connector: OffloadingConnector, link: HostLink) -> None:
        self.connector = connector
        self.link = link
        self._done_s: dict[int, float] = {}
        """Submitted jobs -> completion time, in submission order."""
        self._flushed: set[int] = set()
        self._step: ConnectorStep | None = None
        """The step between `start_step` and `end_step`."""
        self._step_start_s = 0.0

    def _submit(self, job_id: int, start_s: float) -> None:
        job = self.connector.job(job_id)
        link = self.connector.peer_fetch.link if self.connector.is_pull(job_id) else self.link
        self._done_s[job_id] = link.copy_done_s(to_device=not job.is_store, start_s=start_s,
                                                     num_bytes=job.num_bytes)

    def start_step(self, step: ConnectorStep, now_s: float) -> float:
        """A step with the connector's `step` starts now; returns the seconds its forward pass waits for flushed
        jobs."""
        self._step = step
        self._step_start_s = now_s
        for job in step.pull_jobs:  # G2 peer pulls: on the NIC, from the step's start (no compute to wait for)
            self._submit(job.job_id, now_s)
        if not step.jobs_to_flush:
            return 0.0
        for jid in step.jobs_to_flush:
            if jid not in self._done_s:
                self._submit(jid, now_s)
        self._flushed.update(step.jobs_to_flush)
        return max(0.0, max(self._done_s[j] for j in step.jobs_to_flush) - now_s)

    def end_step(self, now_s: float) -> list[int]:
        """The step started last ends now: hand its jobs to the link and return those reported done in it (in
        submission order)."""
        step, self._step = self._step, None
        if step is None:
            raise RuntimeError("end_step without a start_step before it")
        done = self._take(self._step_start_s, self._flushed)
        self._flushed.clear()
        for job in step.load_jobs:
            self._submit(job.job_id, now_s)
        for job in step.store_jobs:
            if job.job_id not in self._done_s:  # a flushed one went at the step's start
                self._submit(job.job_id, now_s)
        return done

    def seen_by(self, step_start_s: float) -> list[int]:
        """The jobs a step starting at `step_start_s` sees complete, taken (for steps run as a decode stretch)."""
        return self._take(step_start_s)

    def _take(self, seen_s: float, also: set[int] = frozenset()) -> list[int]:
        """Forget and return, in submission order, the jobs complete by `seen_s` and those in `also`."""
        done = [j for j, t in self._done_s.items() if t <= seen_s or j in also]
        for j in done:
            del self._done_s[j]
        return done

    def next_done_s(self) -> float | None:
        """When the next copy in flight completes."""
        return min(self._done_s.values()) if self._done_s else None
