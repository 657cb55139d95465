"""`kvsim traces fetch` against a local HTTP server (this machine cannot reach GitHub): files written only when their
SHA-256 matches, kept when already there, refused when something else holds the name; errors name the URL.

The server serves the trace heads of tests/fixtures/traces under the full traces' names; the tests that expect a
download to succeed give the command the heads' checksums in place of the full files' (which the last test checks
against the fixtures' README and the command's listing).
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

import sim.cli.traces as traces_cli
from sim.cli import main
from sim.workloads.public_traces import (
    DEFAULT_TRACES_DIR, MOONCAKE_COMMIT, MOONCAKE_TRACES, MOONCAKE_TRACES_URL, PublicTrace,
)
from tests.support.paths import REPO, TRACES

HEADS = {"conversation_trace.jsonl": "conversation_head400.jsonl", "synthetic_trace.jsonl": "synthetic_head300.jsonl"}


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local server of the heads under the traces' names: (base URL, the paths it was asked for)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "served"
    root.mkdir()
    for name, head in HEADS.items():
        shutil.copy(TRACES / head, root / name)
    asked: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            asked.append(self.path)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", asked
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def heads_expected(monkeypatch):
    """The command expects the heads' checksums (what the server sends) in place of the full traces'."""
    def entry(t: PublicTrace) -> PublicTrace:
        data = (TRACES / HEADS[t.file_name]).read_bytes()
        lines = sum(1 for line in data.splitlines() if line.strip())
        return PublicTrace(t.file_name, lines, len(data), hashlib.sha256(data).hexdigest(), t.what)

    monkeypatch.setattr(traces_cli, "MOONCAKE_TRACES", tuple(entry(t) for t in MOONCAKE_TRACES))


def fetch(*args: str):
    return CliRunner().invoke(main, ["traces", "fetch", *args], catch_exceptions=False)


def test_fetch_writes_both_files_checked_then_keeps_them(server, heads_expected, tmp_path):
    url, asked = server
    out = tmp_path / "traces"
    res = fetch("--out", str(out), "--url", url)
    assert res.exit_code == 0, res.output
    for name, head in HEADS.items():
        assert (out / name).read_bytes() == (TRACES / head).read_bytes()
        assert f"wrote {out / name}" in res.output
    assert sorted(asked) == ["/conversation_trace.jsonl", "/synthetic_trace.jsonl"]
    assert sorted(p.name for p in out.iterdir()) == sorted(HEADS)  # no temporary file left
    again = fetch("--out", str(out), "--url", url + "/")
    assert again.exit_code == 0 and again.output.count("already there (SHA-256 matches)") == 2
    assert len(asked) == 2  # nothing downloaded the second time


def test_a_download_that_does_not_match_is_not_written(server, tmp_path):
    url, _ = server  # the heads, against the full traces' checksums
    out = tmp_path / "traces"
    res = CliRunner().invoke(main, ["traces", "fetch", "--out", str(out), "--url", url])
    assert res.exit_code == 1
    conversation = MOONCAKE_TRACES[0]
    assert f"{url}/conversation_trace.jsonl: SHA-256 " in res.output
    assert f"expected {conversation.sha256} ({conversation.num_bytes:,} bytes); not written" in res.output
    assert list(out.iterdir()) == []


def test_another_file_under_a_traces_name_is_not_overwritten(server, heads_expected, tmp_path):
    url, asked = server
    out = tmp_path / "traces"
    out.mkdir()
    (out / "conversation_trace.jsonl").write_text("mine\n")
    res = CliRunner().invoke(main, ["traces", "fetch", "--out", str(out), "--url", url])
    assert res.exit_code == 1 and "exists and is not Mooncake's conversation_trace.jsonl" in res.output
    assert (out / "conversation_trace.jsonl").read_text() == "mine\n" and asked == []


def test_an_unreachable_file_is_one_line_naming_its_url(server, tmp_path):
    url, _ = server
    res = CliRunner().invoke(main, ["traces", "fetch", "--out", str(tmp_path / "t"), "--url", url + "/nowhere"])
    assert res.exit_code == 1
    assert res.output.startswith(f"Error: cannot download {url}/nowhere/conversation_trace.jsonl: HTTP 404")
    assert len(res.output.strip().splitlines()) == 1


def test_the_listing_gives_the_pinned_urls_and_the_checksums_the_fixtures_readme_records():
    res = CliRunner().invoke(main, ["traces"], catch_exceptions=False)
    assert res.exit_code == 0
    assert MOONCAKE_TRACES_URL == ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
                                   "3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces")
    readme = (TRACES / "README.md").read_text(encoding="utf-8")
    assert MOONCAKE_COMMIT[:8] in readme
    for t in MOONCAKE_TRACES:
        assert f"{MOONCAKE_TRACES_URL}/{t.file_name}" in res.output and f"sha256 {t.sha256}" in res.output
        assert t.sha256 in readme and f"{t.num_requests:,}" in readme


@pytest.mark.full_traces
def test_fetched_traces_match_their_checksums_and_begin_with_the_heads():
    # Opt-in (-m full_traces), after `kvsim traces fetch`: the full traces are not in the repository.
    for t in MOONCAKE_TRACES:
        data = (REPO / DEFAULT_TRACES_DIR / t.file_name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == t.sha256
        head = (TRACES / HEADS[t.file_name]).read_bytes()
        assert data.startswith(head)
