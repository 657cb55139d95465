"""The documentation: the site builds without a warning, and every `kvsim` command it shows is one the CLI accepts.

* `mkdocs build --strict` (mkdocs.yml sets `validation:` so that a broken link or anchor is a warning) into a
  temporary directory: any warning fails, and the API page is generated from `sim._EXPORTS` on the way.
* Every `kvsim ...` line in a shell code block of README.md and docs/ is resolved to its (sub)command and parsed with
  the real click command (`make_context`): option names, choices, types and ranges are checked; nothing runs. Input
  files the commands name (`my.yaml`, `run.csv`, ...) are created empty in a temporary working directory first, so
  that a path that must exist parses.
* The README is a front page (at most ~200 lines) whose two commands are the ones `.ci/run` and users run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
INPUT_FILE = re.compile(r"^[\w./*{}-]+\.(ya?ml|csv|jsonl?)$")
MAIN_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/kvsim sweep --prefixes 2,7,12,24 "
                "--workers 3,6 --concurrency 4,8,16 --repeats 3 --out results")
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[test,docs]' && .venv/bin/python -m pytest"


def shell_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of every shell code block of a Markdown file; `\\` continuations joined."""
    out: list[tuple[int, str]] = []
    fence = language = None
    pending, start = "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, language = m.group(2), m.group(3).lower()
            continue
        if m and m.group(2).startswith(fence) and not m.group(3):
            fence = None
            continue
        if language not in SHELL_LANGUAGES:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def kvsim_commands(line: str) -> list[list[str]]:
    """The argument lists of the `kvsim` invocations in one shell line (between &&, |, ;, before redirections)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    commands, current = [], []
    skip_next = False
    for token in tokens + [";"]:
        if skip_next:
            skip_next = False
            continue
        if token in {">", ">>", "<", "2>", "&>"}:
            skip_next = True
            continue
        if set(token) <= set("&|;()"):
            commands.append(current)
            current = []
            continue
        current.append(token)
    found = []
    for words in commands:
        for i, word in enumerate(words):
            if word.rsplit("/", 1)[-1] == "kvsim":
                found.append(words[i + 1:])
                break
    return found


def shown_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOC_FILES:
        for number, line in shell_lines(path):
            for args in kvsim_commands(line):
                found.append((f"{path.relative_to(REPO)}:{number}", args))
    return found


COMMANDS = shown_commands()


def parse(args: list[str]) -> None:
    """Resolve `kvsim ARGS` to its (sub)command and parse the rest with it, as click would before running it."""
    from sim.cli import main

    command: click.Command = main
    name, parent = "kvsim", None
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        context = click.Context(command, info_name=name, parent=parent)
        sub = command.get_command(context, args[0])
        if sub is None:
            raise click.UsageError(f"no such command {args[0]!r} in {name!r}", context)
        parent, name, command, args = context, args[0], sub, args[1:]
    try:
        with command.make_context(name, list(args), parent=parent):
            pass
    except click.exceptions.Exit:  # --help, --version: parsed
        pass


def test_the_documentation_shows_kvsim_commands():
    assert len(COMMANDS) > 40, "the command extraction found too few commands: check shell_lines / kvsim_commands"


@pytest.mark.parametrize("where,args", COMMANDS, ids=[f"{w} {' '.join(a[:2])}" for w, a in COMMANDS])
def test_every_command_shown_parses(where, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for token in args:
        if INPUT_FILE.match(token) and not token.startswith("/"):
            (tmp_path / token).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / token).touch()
    try:
        parse(args)
    except click.ClickException as err:
        pytest.fail(f"{where}: kvsim {shlex.join(args)}\n  {err.format_message()}")


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if "WARNING" in line]
    assert done.returncode == 0 and not warnings, "\n".join(warnings) or done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def test_the_readme_is_a_front_page_with_the_two_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert MAIN_COMMAND in readme.splitlines() and TEST_COMMAND in readme.splitlines()
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
