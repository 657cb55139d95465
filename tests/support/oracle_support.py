"""What the differential tests against real engines share: an oracle script run under the engine's own venv, the
digest that ties a golden file to the stream it answers, and the golden files themselves.

Each engine's stream module (`oracle_streams.py` for vLLM, `sglang_tree_streams.py`, `sglang_engine_streams.py`)
builds its streams and kvsim's answer; an `Oracle` gets the real engine's answer, live (its interpreter named by an
environment variable) or from the golden file recorded with it. A `StreamSuite` bundles a streams module's oracle,
streams, replay and comparison, so that its test module checks a stream golden or live in one call (the SGLang
streams modules' `SUITE`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


def stream_digest(stream: dict) -> str:
    """A short digest of a stream: a golden file answers exactly the stream with this digest."""
    return hashlib.sha256(json.dumps(stream, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Oracle:
    script: Path
    """The oracle, run as `python script` with the stream as JSON on stdin; its JSON answer on stdout."""
    env_var: str
    """The environment variable naming the interpreter of the engine's venv."""
    golden_dir: Path
    version_key: str
    """The key under which the oracle reports the engine's version (kept beside the answer in golden files)."""
    setup: str
    """Where the venv is described (for the message when the variable is not set)."""
    answer_keys: tuple[str, ...] | None = None
    """The parts of an answer a golden file keeps (None: all)."""
    timeout_s: int = 1800

    def python(self) -> str | None:
        return os.environ.get(self.env_var)

    def run(self, stream: dict, python: str) -> dict:
        proc = subprocess.run([python, str(self.script)], input=json.dumps(stream), capture_output=True, text=True,
                              timeout=self.timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.script.name} exited {proc.returncode}: {proc.stderr[-3000:]}")
        return json.loads(proc.stdout)

    def golden_path(self, name: str) -> Path:
        return self.golden_dir / f"{name}.json"

    def golden(self, name: str) -> dict:
        return json.loads(self.golden_path(name).read_text())

    def write_golden(self, name: str, stream: dict, python: str) -> dict:
        answer = self.run(stream, python)
        version = answer.pop(self.version_key)
        if self.answer_keys is not None:
            answer = {k: answer[k] for k in self.answer_keys}
        golden = {"stream": name, "stream_digest": stream_digest(stream), self.version_key: version, "answer": answer}
        self.golden_dir.mkdir(parents=True, exist_ok=True)
        self.golden_path(name).write_text(json.dumps(golden, separators=(",", ":")) + "\n")
        return golden

    def regenerate(self, names: Iterable[str], build: Callable[[str], dict]) -> None:
        """Record every stream's answer from the live engine (the streams modules' `__main__`)."""
        python = self.python()
        if not python:
            raise SystemExit(f"set {self.env_var} to the engine venv's python (see {self.setup})")
        for name in names:
            g = self.write_golden(name, build(name), python)
            print(f"{self.golden_path(name)}: {self.version_key} {g[self.version_key]}")


def check_golden(oracle: Oracle, name: str, stream: dict, replay: Callable[[dict], dict],
                 differences: Callable[[dict, dict], list[str]], version: str) -> None:
    """kvsim's answer to `stream` must equal the one recorded from the engine (the golden file `name`)."""
    golden = oracle.golden(name)
    assert golden["stream_digest"] == stream_digest(stream), "stream generator changed: regenerate the golden file"
    assert golden[oracle.version_key] == version
    diffs = differences(golden["answer"], replay(stream))
    assert not diffs, "\n".join(diffs)


def check_live(oracle: Oracle, stream: dict, replay: Callable[[dict], dict],
               differences: Callable[[dict, dict], list[str]], version: str) -> None:
    """kvsim's answer to `stream` must equal the engine's, run now (skipped without the engine's venv)."""
    import pytest

    python = oracle.python()
    if not python:
        pytest.skip(f"{oracle.env_var} is not set (see {oracle.setup})")
    answer = oracle.run(stream, python)
    assert answer[oracle.version_key] == version
    diffs = differences(answer, replay(stream))
    assert not diffs, "\n".join(diffs)


@dataclass(frozen=True)
class StreamSuite:
    """One oracle's named streams with kvsim's replay and the comparison of answers: what a differential test module
    checks, against the golden files (CI) and against the live engine (opt-in)."""

    oracle: Oracle
    version: str
    """The engine version every answer must come from."""
    streams: Mapping[str, dict]
    """The streams' configurations by name (`build_stream(name)` makes the stream)."""
    build_stream: Callable[[str], dict]
    replay: Callable[[dict], dict]
    """kvsim's answer to a stream."""
    differences: Callable[[dict, dict], list[str]]
    """What differs between the engine's answer and kvsim's (empty: the same)."""

    @property
    def names(self) -> list[str]:
        return sorted(self.streams)

    def check_golden(self, name: str) -> None:
        check_golden(self.oracle, name, self.build_stream(name), self.replay, self.differences, self.version)

    def check_live(self, name: str) -> None:
        check_live(self.oracle, self.build_stream(name), self.replay, self.differences, self.version)
