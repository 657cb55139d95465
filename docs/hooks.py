"""MkDocs hook: the API page is generated from `sim._EXPORTS` at build time, so it follows the modules as they move.

`sim/__init__.py` exports lazily (PEP 562: name -> module in `_EXPORTS`), which static analysis cannot follow; this
hook reads the mapping from `sim` itself and writes one `::: module.name` entry per public name (the module itself
for a name that is a module, as `analytic`), grouped by module, for mkdocstrings to render.
"""

from __future__ import annotations

import inspect
import sys
from collections import defaultdict
from pathlib import Path

from mkdocs.structure.files import File

API_PAGE = "api.md"
INTRO = """# API

What notebooks and scripts may import: `sim.__all__`, listed here from `sim._EXPORTS` (name -> module) when the
site is built, plus the trace replay `sim.replay.replay`. Everything else is internal and may move.

```python
import sim

scenario, _path = sim.load_scenario()           # the built-in scenario
summary = sim.summarize(sim.run(scenario))      # one run; writes nothing
print(summary.request_hit_rate, summary.ttft_ms["p99"])
```
"""


def api_markdown() -> str:
    """The API page: one section per module, one `::: module.name` entry per exported name (a module: itself)."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    import sim

    by_module: dict[str, list[str]] = defaultdict(list)
    for name, module in sim._EXPORTS.items():
        by_module[module].append(name)
    parts = [INTRO]
    for module in sorted(by_module):
        parts.append(f"## `{module}`\n")
        for name in sorted(by_module[module]):
            is_module = inspect.ismodule(getattr(sim, name))
            target = module if is_module else f"{module}.{name}"
            parts.append(f"::: {target}\n    options:\n      members: {'true' if is_module else 'false'}\n")
    parts.append("## `sim.replay.replay`\n")
    parts.append("::: sim.replay.replay\n")
    return "\n".join(parts)


def on_files(files, config):
    files.append(File.generated(config, API_PAGE, content=api_markdown()))
    return files
