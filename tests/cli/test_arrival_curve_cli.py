"""`--arrival-curve` on `kvsim run` (with `--duration-s`), on `kvsim replay` (the trace warp, with `--time-scale`) and
`kvsim traces warp`: a constant curve is today's Poisson summary byte for byte, a replay's warped send times are the
trace's own through Λ⁻¹(r̄·t), the warped file replays as the warp does, and every bad spec is a one-line error."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml
from click.testing import CliRunner

from sim.cli import main
from sim.workloads.arrival_curve import parse_arrival_curve, trace_mean_rps, warp_trace
from sim.workloads.traces import read_mooncake
from tests.support.paths import REPO

TINY = REPO / "scenarios" / "tiny-cpu.yaml"
TRACE = REPO / "tests" / "fixtures" / "traces" / "synthetic_head300.jsonl"
SESSIONS = REPO / "tests" / "fixtures" / "traces" / "bailian_synthetic.jsonl"


def _ok(args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def _csv(path):
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_run_with_a_constant_curve_writes_the_poisson_summary(tmp_path):
    data = yaml.safe_load(TINY.read_text())
    data["workload"]["arrival_rate_rps"] = 3.0
    (tmp_path / "rate.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    _ok(["run", tmp_path / "rate.yaml", "--out", tmp_path / "rate"])
    _ok(["run", TINY, "--arrival-curve", "constant:rate_rps=3", "--out", tmp_path / "curve"])
    for name in ("summary.csv", "requests.csv"):
        assert (tmp_path / "rate" / name).read_bytes() == (tmp_path / "curve" / name).read_bytes()


def test_run_a_diurnal_span(tmp_path):
    # Two 60-s periods of 2 req/s ±90 %: about 240 measured requests (207 drawn), densest around the peaks (30, 90 s).
    res = _ok(["run", TINY, "--arrival-curve", "diurnal:mean_rps=2,amplitude=0.9,period_s=60,peak_s=30",
               "--duration-s", "120", "--out", tmp_path])
    assert "arrivals diurnal 2/s ±90%, period 60 s, peak at 30 s over 120 s" in " ".join(res.output.split())
    rows = _csv(tmp_path / "requests.csv")
    start = max(float(r["finished_s"]) for r in rows if r["warmup"] == "True")  # the warm-ups run one at a time first
    sent = sorted(float(r["sent_s"]) - start for r in rows if r["warmup"] == "False")
    assert 180 < len(sent) < 300 and 0 < sent[0] and sent[-1] < 120
    # the half period around each peak expects 1/2 + 0.9/π = 0.79 of the arrivals (seeded: 162 of 207, 0.78)
    near_peaks = sum(15 <= t % 60 < 45 for t in sent)
    assert near_peaks > 0.7 * len(sent)


def test_replay_warp_sends_each_request_at_its_warped_time(tmp_path):
    spec = "piecewise:points=0:1/60:6/120:1"
    res = _ok(["replay", TRACE, "--workers", "2", "--arrival-curve", spec, "--out", tmp_path, "--requests"])
    trace = list(read_mooncake(TRACE, block_size=64))
    mean = trace_mean_rps(len(trace), trace[-1].arrival_s)
    expected = {w.request.request_id: w.arrival_s
                for w in warp_trace(trace, parse_arrival_curve(spec).curve(), mean_rps=mean)}
    rows = _csv(tmp_path / "requests.csv")
    assert len(rows) == len(trace)
    assert {int(r["request_id"]): float(r["sent_s"]) for r in rows} == pytest.approx(expected, rel=1e-5, abs=1e-6)  # requests.csv: 6 digits
    assert "300 requests over 86.79 s at 3.457/s now span" in res.output


def test_time_scale_is_speed_inverted(tmp_path):
    _ok(["replay", TRACE, "--workers", "2", "--time-scale", "0.5", "--out", tmp_path / "scaled"])
    _ok(["replay", TRACE, "--workers", "2", "--speed", "2", "--out", tmp_path / "fast"])
    scaled, fast = _csv(tmp_path / "scaled" / "summary.csv")[0], _csv(tmp_path / "fast" / "summary.csv")[0]
    assert {k: v for k, v in scaled.items() if k != "wall_s"} == {k: v for k, v in fast.items() if k != "wall_s"}


def test_a_session_trace_warps_its_session_starts(tmp_path):
    res = _ok(["replay", SESSIONS, "--workers", "2", "--arrival-curve", "constant:rate_rps=0.25"])
    assert "session starts warped onto constant 0.25/s" in res.output


def test_traces_warp_writes_the_load_replay_sends(tmp_path):
    # The warped file holds the same lines with timestamps Λ⁻¹(r̄·t) in whole ms; replayed, it gives the summary of
    # the replay that warps as it reads (the 400-request head of the conversation trace rises to 6/s and falls).
    spec = "piecewise:points=0:0.5/60:6/120:0.5"
    conversation = REPO / "tests" / "fixtures" / "traces" / "conversation_head400.jsonl"
    res = _ok(["traces", "warp", conversation, "--arrival-curve", spec, "--out", tmp_path / "warped.jsonl"])
    assert "400 requests over 141 s at 2.837/s warped onto piecewise (linear) 0.5-6/s over 120 s, now over 140 s" \
        in " ".join(res.output.split())
    original = [json.loads(line) for line in conversation.read_text().splitlines() if line.strip()]
    warped = [json.loads(line) for line in (tmp_path / "warped.jsonl").read_text().splitlines()]
    curve = parse_arrival_curve(spec).curve()
    mean = trace_mean_rps(len(original), original[-1]["timestamp"] / 1000)
    assert [w["timestamp"] for w in warped] == [round(1000 * curve.inverse(mean * o["timestamp"] / 1000))
                                                for o in original]
    assert [{**w, "timestamp": 0} for w in warped] == [{**o, "timestamp": 0} for o in original]
    _ok(["replay", tmp_path / "warped.jsonl", "--workers", "4", "--router", "kv-aware", "--out", tmp_path / "file"])
    _ok(["replay", conversation, "--workers", "4", "--router", "kv-aware", "--arrival-curve", spec,
         "--out", tmp_path / "warp"])
    by_file, by_warp = (_csv(tmp_path / d / "summary.csv")[0] for d in ("file", "warp"))
    assert {k: v for k, v in by_file.items() if k != "wall_s"} == {k: v for k, v in by_warp.items() if k != "wall_s"}


@pytest.mark.parametrize("args, expected", [
    (["run", TINY, "--arrival-curve", "diurnal:mean_rps=3,amplitude=1.5"],
     "'--arrival-curve': amplitude: Input should be less than or equal to 1"),
    (["run", TINY, "--arrival-curve", "sine:mean_rps=3"], "unknown curve kind 'sine'; allowed: constant, piecewise"),
    (["run", TINY, "--arrival-curve", "piecewise:points=0:1/x:2"], "points: 'x:2' is not T:R"),
    (["run", TINY, "--arrival-curve", "bursts:base_rps=1,bursts=10:5"], "bursts: '10:5' is not AT:DURATION:EXTRA"),
    (["run", TINY, "--duration-s", "60"], "--duration-s is the span of an arrival curve: give --arrival-curve"),
    (["run", TINY, "--arrival-curve", "2", "--concurrency", "4"], "--concurrency is a closed loop"),
    (["run", TINY, "--arrival-curve", "piecewise:points=0:0.01", "--duration-s", "1"],
     "none left to measure after discard_first"),
    (["replay", TRACE, "--workers", "2", "--time-scale", "2", "--speed", "2"], "--time-scale F is --speed 1/F"),
    (["replay", TRACE, "--workers", "2", "--arrival-curve", "piecewise:points=0:1/10:0"],
     "the curve brings only 5 arrivals in all, fewer than the trace's 300 requests"),
    (["replay", REPO / "tests" / "fixtures" / "traces" / "agentic_mooncake.jsonl", "--workers", "2",
      "--arrival-curve", "3"], "an agentic-mooncake trace is sent by its dependencies"),
    (["traces", "warp", TRACE, "--arrival-curve", "piecewise:points=0:1/10:0", "--out", "x.jsonl"],
     "the curve brings only 5 arrivals in all, fewer than the trace's 300 requests"),
    (["traces", "warp", TRACE, "--arrival-curve", "diurnal:mean_rps=1", "--out", "x.jsonl"],
     "amplitude: Field required"),
])
def test_bad_curves_are_one_line_errors(args, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    last = [line for line in result.output.strip().splitlines() if line.strip()][-1]
    assert last.startswith("Error:") and expected in last, result.output
