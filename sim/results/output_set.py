"""A study's final files, written into its output directory as one consistent set, and the check that the
directory is writable before a study starts.

The set is written in four steps:

1. every file into a fresh `DIR/.staging-XXXX/` (each flushed and fsync'd);
2. `DIR/manifest.json` removed (from here until step 4 the directory claims no consistent set);
3. each staged file renamed into `DIR` (a rename within one file system is atomic per file);
4. `DIR/manifest.json` written atomically: the files of the set with their size and SHA-256, the run count and the
   command; then the staging directory removed.

So `DIR` holds a consistent set exactly when `manifest.json` exists and its files match it: an interrupt during the
write phase leaves no manifest (or, before step 2, the previous set untouched), never a new summary.csv beside old
figures under a manifest that vouches for them. Staging directories left by an interrupted write are removed by the
next write.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sim.results.report import write_atomic

MANIFEST_NAME = "manifest.json"
STAGING_PREFIX = ".staging-"


class OutDirError(ValueError):
    """An output directory that cannot be written: the message is one line."""


def check_writable(out: Path, label: str | None = None) -> None:
    """Create `out` (and its parents) and a probe file in it, or raise OutDirError naming it by `label` (default:
    `--out DIR`)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutDirError(f"{label or f'--out {out}'}: not a writable directory ({err.strerror or err})") from None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # NOTE: some file systems refuse to fsync a directory; the renames are still atomic
    finally:
        os.close(fd)


def write_output_set(out: Path, files: Mapping[str, bytes], *, runs: int, command: str) -> list[Path]:
    """`files` (name -> bytes) into `out` as one set with its manifest (the module docstring's four steps); the
    paths written, the manifest last."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(old, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=STAGING_PREFIX))
    try:
        for name, data in files.items():
            with open(staging / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        manifest = out / MANIFEST_NAME
        manifest.unlink(missing_ok=True)
        _fsync_dir(out)
        for name in files:
            os.replace(staging / name, out / name)
        _fsync_dir(out)
        entries = {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
        write_atomic(manifest, (json.dumps({"kvsim_manifest": 1, "command": command, "runs": runs, "files": entries},
                                           indent=2) + "\n").encode())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out / name for name in files] + [out / MANIFEST_NAME]


def manifest_matches(out: Path) -> bool:
    """Whether `out` holds a consistent set: its manifest exists and every file it lists has that size and hash."""
    try:
        manifest = json.loads((out / MANIFEST_NAME).read_text(encoding="utf-8"))
        return all(hashlib.sha256((out / name).read_bytes()).hexdigest() == entry["sha256"]
                   for name, entry in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False
