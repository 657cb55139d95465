"""`kvsim traces`: list the public Mooncake traces, fetch them (checked against their SHA-256) into a folder, and warp
one's timestamps onto a rate curve."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path

import click

from sim.cli import render
from sim.cli.app import ARRIVAL_CURVE_FORM, arrival_curve_option, checked_out_dir, console, main
from sim.results.report import write_atomic
from sim.workloads.public_traces import DEFAULT_TRACES_DIR, MOONCAKE_COMMIT, MOONCAKE_TRACES, MOONCAKE_TRACES_URL

_TIMEOUT_S = 60.0


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(url: str) -> bytes:
    """The bytes at `url`, or a one-line error naming it and why."""
    # NOTE: an opener of its own, so that the proxies of the environment are read now, not when urllib first ran.
    opener = urllib.request.build_opener()
    try:
        with opener.open(url, timeout=_TIMEOUT_S) as response:
            return response.read()
    except urllib.error.HTTPError as err:
        reason = f"HTTP {err.code} {err.reason}"
    except urllib.error.URLError as err:
        reason = str(err.reason)
    except (OSError, TimeoutError) as err:
        reason = str(err) or type(err).__name__
    raise click.ClickException(f"cannot download {url}: {reason} (behind a proxy, set https_proxy; or download the "
                               f"files yourself: `kvsim traces` lists their URLs and SHA-256)")


@main.group(invoke_without_command=True, short_help="List the public Mooncake traces; fetch them.")
@click.pass_context
def traces(ctx: click.Context) -> None:
    """List the public Mooncake traces that `kvsim replay` and `kvsim compare --trace` read: each file's requests,
    size, URL (github.com/kvcache-ai/Mooncake, FAST25-release/traces/, Apache-2.0, at a pinned commit) and SHA-256,
    and whether traces/ holds it.

    The repository keeps only their first lines (tests/fixtures/traces/); `kvsim traces fetch` downloads them into
    traces/, then e.g. `kvsim replay traces/conversation_trace.jsonl --workers 8 --kv-tokens 3000000`.
    """
    if ctx.invoked_subcommand is not None:
        return
    for t in MOONCAKE_TRACES:
        here = Path(DEFAULT_TRACES_DIR) / t.file_name
        render.entry(t.file_name, f"{t.num_requests:,} requests, {t.num_bytes:,} bytes; {t.what}"
                     f"{f'; in {here}' if here.is_file() else ''}")
        click.echo(f"    {MOONCAKE_TRACES_URL}/{t.file_name}")  # NOTE: whole, however wide: it is copied
        click.echo(f"    sha256 {t.sha256}")
    console.print(f"`kvsim traces fetch` downloads them into {DEFAULT_TRACES_DIR}/ (--out DIR for another folder) and "
                  "checks their SHA-256.", highlight=False, markup=False)


@traces.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=DEFAULT_TRACES_DIR, show_default=True,
              help="Folder to put the traces in (created if missing; the benchmarks look in traces/ at the repository "
                   "root, or where TRACES= or --traces says).")
@click.option("--url", "base_url", default=MOONCAKE_TRACES_URL, metavar="BASE",
              help="Fetch BASE/<file name> instead (a mirror, or a folder served elsewhere); the SHA-256 must still "
                   f"match. Default: Mooncake's FAST25-release/traces at commit {MOONCAKE_COMMIT[:8]}.")
def fetch(out_dir: str, base_url: str) -> None:
    """Download the two public Mooncake traces (conversation_trace.jsonl, synthetic_trace.jsonl; 4.2 MB together)
    into --out DIR, checking each against its SHA-256 before writing it.

    A file already there with the right SHA-256 is kept (nothing downloaded); one with another content is an error
    (kvsim does not overwrite it). Nothing is written for a file whose download does not match.
    """
    out = checked_out_dir(out_dir)
    for t in MOONCAKE_TRACES:
        dest = out / t.file_name
        if dest.exists():
            got = _sha256(dest.read_bytes())
            if got != t.sha256:
                raise click.ClickException(f"{dest} exists and is not Mooncake's {t.file_name} (SHA-256 {got}, "
                                           f"expected {t.sha256}); move it away and fetch again")
            click.echo(f"{dest}: already there (SHA-256 matches)")
            continue
        url = f"{base_url.rstrip('/')}/{t.file_name}"
        data = _download(url)
        got = _sha256(data)
        if got != t.sha256:
            raise click.ClickException(f"{url}: SHA-256 {got} ({len(data):,} bytes), expected {t.sha256} "
                                       f"({t.num_bytes:,} bytes); not written")
        write_atomic(dest, data)
        click.echo(f"wrote {dest} ({t.num_requests:,} requests, {len(data):,} bytes, SHA-256 checked)")


@traces.command()
@click.argument("trace_file", type=click.Path(dir_okay=False), metavar="TRACE")
@click.option("--arrival-curve", "arrival_curve", callback=arrival_curve_option, required=True, metavar="SPEC",
              help="The rate curve to warp the timestamps onto: " + ARRIVAL_CURVE_FORM + ".")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, metavar="FILE",
              help="The warped trace to write (Mooncake JSONL).")
def warp(trace_file: str, arrival_curve, out_path: str) -> None:
    """Write a Mooncake trace whose timestamps are warped onto a rate curve: each t goes to Λ⁻¹(r̄·t), r̄ the
    trace's mean rate (requests / last timestamp), in whole ms, every other field as it was. It is the load
    `kvsim replay TRACE --arrival-curve SPEC` sends (within half a millisecond), as a file another simulator (Dynamo's
    mocker) replays too (docs/concepts/load-curves.md).
    """
    from sim.workloads.arrival_curve import warped_mooncake
    from sim.workloads.traces import TraceError

    try:
        warped = warped_mooncake(trace_file, arrival_curve.curve())
    except TraceError as err:
        raise click.ClickException(str(err)) from None
    write_atomic(Path(out_path), warped.jsonl)
    console.print(f"wrote {out_path}: {warped.num_requests:,} requests over {warped.last_arrival_s:,.6g} s at "
                  f"{warped.mean_rps:.4g}/s warped onto {arrival_curve.text()}, now over "
                  f"{warped.warped_last_arrival_s:,.6g} s", highlight=False)
