"""HiCache's copies in simulated time: when the tree's backups (device -> host) and load-backs (host -> device) run
on the device's host link, and how long a batch waits for its loads.

SGLang 0.5.23 (docs/engines/hicache-0.5.23-rules.md §2, §4):
* backups issued while a batch's result is processed are merged into one device-to-host copy at its end
  (`flush_pending_backups`); the copy stream first waits for the forward work already queued (`write_fence_stream`):
  under overlap scheduling the next batch, launched before this result was processed, so the copy starts when that
  batch's forward ends (kvsim: when its result is processed); with nothing queued, at once. Backups issued while
  scheduling (a chunked request's stash, write_back's backup on eviction) start at once;
* a batch's load-backs are merged into one host-to-device copy when the batch is launched
  (`ready_to_load_host_cache`), behind the forward queued before it: it starts when the batch starts on the device;
* each layer's attention waits for that layer's load. kvsim does not split the forward pass by layer: the batch's
  forward starts when its load completes (`stall_s`), an upper bound on the wait (SGLang overlaps the load of
  layer i+1 with the compute of layer i);
* acks are reaped at the start of the next scheduling pass after a copy completes (`HiRadixCache.check_events`).
"""

from __future__ import annotations

from sim.engines.interface import HostLink, StepPlan


class HiCacheTransfers:
    """Times one SGLang worker's HiCache copies on `link` (see the module docstring)."""

    def __init__(self, tree, scheduler, link: HostLink, *, kv_bytes_per_token: int) -> None:
        self.tree = tree
        self.scheduler = scheduler
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self._deferred: list = []
        """Backups waiting for the forward queued before them (overlap): they start when its result is processed."""

    @property
    def busy(self) -> bool:
        """Copies issued and not yet acknowledged (or not yet started)."""
        tree = self.tree
        return bool(self._deferred or tree.pending_writes or tree.pending_loads or tree.new_writes)

    def _submit(self, copies: list, *, to_device: bool, start_s: float) -> float:
        """One merged copy of `copies`; returns when it completes."""
        num_bytes = sum(c.tokens for c in copies) * self.kv_bytes_per_token
        done = self.link.copy_done_s(to_device=to_device, start_s=start_s, num_bytes=num_bytes)
        for c in copies:
            c.done_s = done
        return done

    def after_schedule(self, step, now_s: float) -> StepPlan:
        """The scheduler formed its batches: backups it issued start now; the batch the device runs next starts its
        load-backs now and its forward waits for them."""
        writes = self.tree.take_new_writes()
        if writes:
            self._submit(writes, to_device=False, start_s=now_s)
        if step is None:
            return StepPlan()
        if step.host_loads:
            done = self._submit(step.host_loads, to_device=True, start_s=now_s)
            step.stall_s = max(0.0, done - now_s)
        return step

    def before_result(self, now_s: float) -> None:
        """A batch's forward ended: backups deferred behind it start."""
        if self._deferred:
            self._submit(self._deferred, to_device=False, start_s=now_s)
            self._deferred = []

    def after_result(self, now_s: float) -> None:
        """The result was processed: its backups are flushed, behind the batch already launched if any."""
        writes = self.tree.take_new_writes()
        if not writes:
            return
        if self.scheduler.limits.overlap and self.scheduler.has_launched_batch:
            self._deferred.extend(writes)
        else:
            self._submit(writes, to_device=False, start_s=now_s)
