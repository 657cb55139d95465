"""The wheel ships every module: each package folder of `sim/` and `policies/` is listed in pyproject.toml (the
flat layout lists packages explicitly, so a new folder must be added there or `pip install .` leaves it out)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

from tests.support.paths import REPO

REPO = REPO


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(REPO).parts) for top in ("sim", "policies")
               for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert folders - listed == set(), "add these packages to [tool.setuptools] packages in pyproject.toml"
    assert all((REPO / f.replace(".", "/") / "__init__.py").is_file() for f in folders)


def test_every_public_name_resolves_to_what_it_says():
    import importlib
    import inspect

    import sim

    for name in sim.__all__:
        value = getattr(sim, name)
        assert value is not None, name
        if name != "analytic":
            assert getattr(importlib.import_module(sim._EXPORTS[name]), name) is value, name
            assert not inspect.ismodule(value), name
    assert inspect.ismodule(sim.analytic) and callable(sim.plan) and callable(sim.run)


def test_the_command_line_loads_neither_scipy_nor_matplotlib_until_a_command_needs_them():
    # `kvsim --help` and every command's start-up pay for what `import sim.cli` loads (issue 27: start-up); scipy
    # (~1 s here) and matplotlib are imported where they are used.
    code = ("import sys, sim.cli; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'matplotlib', 'optuna', 'distributed'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_replay_loads_matplotlib_only_to_write_its_figure(tmp_path):
    # Issue 27 (start-up): a short replay's whole command is mostly imports; numpy and matplotlib (~0.4 s here) are
    # loaded only to draw replay.png, by a second process (sim.cli.figure_process) while the replay runs, and rich's
    # progress bars only when stderr is a terminal.
    trace = REPO / "tests" / "fixtures" / "traces" / "conversation_head400.jsonl"
    code = ("import sys\nfrom sim.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'matplotlib', 'scipy', 'optuna', "
            "'distributed'}), 'rich.progress' in sys.modules)")
    replay = ["replay", str(trace), "--limit", "20", "--workers", "2", "--jobs", "1"]
    env = {**os.environ, "TTY_COMPATIBLE": "0"}
    printed = subprocess.run([sys.executable, "-c", code, *replay], capture_output=True, text=True, check=True,
                             env=env, cwd=REPO).stdout
    assert printed.splitlines()[-1] == "[] False"
    written = subprocess.run([sys.executable, "-c", code, *replay, "--out", str(tmp_path)], capture_output=True,
                             text=True, check=True, env=env, cwd=REPO).stdout
    assert written.splitlines()[-1] == "[] False"
    assert (tmp_path / "replay.png").stat().st_size > 0
