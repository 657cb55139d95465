"""What every test shares: the opt-in markers.

The tests are a package (`tests/`, one subpackage per package of kvsim), so pytest puts the checkout's root on the
path and helpers are imported as `tests.support.*`. Tests marked `vllm_oracle` or `sglang_oracle` drive the real
engines' own code from a side venv (KVSIM_VLLM_PYTHON, KVSIM_SGLANG_PYTHON); they run only when a `-m` expression
names them (`-m vllm_oracle`), so that `-m "not slow"` and a plain run leave them out; so do the `full_traces` checks,
which read the public traces `kvsim traces fetch` downloads into traces/ (not in the repository).
"""

from __future__ import annotations

OPT_IN_MARKERS = ("vllm_oracle", "sglang_oracle", "lmcache_oracle", "full_traces")


def pytest_collection_modifyitems(config, items):
    if any(marker in (config.getoption("markexpr") or "") for marker in OPT_IN_MARKERS):
        return
    kept, opted = [], []
    for item in items:
        (opted if any(item.get_closest_marker(m) for m in OPT_IN_MARKERS) else kept).append(item)
    if opted:
        config.hook.pytest_deselected(items=opted)
        items[:] = kept
