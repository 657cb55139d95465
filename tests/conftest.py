"""What every test shares: the opt-in oracle markers.

The tests are a package (`tests/`, one subpackage per package of kvsim), so pytest puts the checkout's root on the
path and helpers are imported as `tests.support.*`. Tests marked `vllm_oracle` or `sglang_oracle` drive the real
engines' own code from a side venv (KVSIM_VLLM_PYTHON, KVSIM_SGLANG_PYTHON); they run only when a `-m` expression
names them (`-m vllm_oracle`), so that `-m "not slow"` and a plain run leave them out.
"""

from __future__ import annotations

ORACLE_MARKERS = ("vllm_oracle", "sglang_oracle")


def pytest_collection_modifyitems(config, items):
    if any(marker in (config.getoption("markexpr") or "") for marker in ORACLE_MARKERS):
        return
    kept, oracles = [], []
    for item in items:
        (oracles if any(item.get_closest_marker(m) for m in ORACLE_MARKERS) else kept).append(item)
    if oracles:
        config.hook.pytest_deselected(items=oracles)
        items[:] = kept
