"""What the result commands print: at 80, 100 and 200 columns every router name and every value of their tables whole
(the values those of the CSV the command writes); piped, no box-drawing characters; `--format csv` the bytes of the
command's CSV file and `--format json` its rows, with nothing else on stdout; the listings within 100 columns."""

from __future__ import annotations

import csv
import io
import json
import re
import sys

import pytest
from click.testing import CliRunner

from sim.cli import main, render
from tests.support.calibration_inputs import write_calibration_inputs
from tests.support.paths import FIXTURES, SCENARIOS, TRACES

BOX_DRAWING = re.compile("[\u2500-\u257f]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")
LONG_NAMES = "vllm-router-prefix-aware,aibrix-least-kv-cache,kv-aware"


def terminal(args: list[str], monkeypatch, columns: int = 100) -> tuple[str, list[render.Table]]:
    """The command's stdout on a terminal of `columns` (ANSI codes removed) and the tables it printed."""
    tables: list[render.Table] = []
    show = render.show_table

    def recording(table):
        tables.append(table)
        show(table)

    monkeypatch.setattr(render, "show_table", recording)
    res = CliRunner().invoke(main, args, env={"COLUMNS": str(columns), "TTY_COMPATIBLE": "1"},
                             catch_exceptions=False)
    monkeypatch.setattr(render, "show_table", show)
    assert res.exit_code == 0, res.output
    return ANSI.sub("", res.stdout), tables


def rendered(table: render.Table, columns: int, monkeypatch) -> str:
    out = io.StringIO()
    with monkeypatch.context() as m:
        m.setenv("COLUMNS", str(columns))
        m.setenv("TTY_COMPATIBLE", "1")
        m.setattr(sys, "stdout", out)
        render.show_table(table)
    return ANSI.sub("", out.getvalue())


def assert_whole_at_every_width(tables: list[render.Table], monkeypatch) -> None:
    """Every cell of every table on one line of its rendering at 80, 100 and 200 columns, no line wider than that,
    nothing ellipsised."""
    assert tables
    for table in tables:
        for columns in (80, 100, 200):
            text = rendered(table, columns, monkeypatch)
            lines = text.splitlines()
            assert "…" not in text and max(map(len, lines)) <= columns, (columns, text)
            for c, column in enumerate(table.columns):
                if column.prose:
                    continue
                for row in table.rows:
                    assert any(row[c] in line for line in lines), (columns, column.header, row[c], text)


def pm(row: dict, metric: str, spec: str) -> str:
    return f"{float(row[metric]):{spec}} ± {float(row[metric + '_ci95']):{spec}}"


@pytest.mark.slow
def test_compare_shows_every_router_and_value_whole_at_100_columns(tmp_path, monkeypatch):
    out = tmp_path / "out"
    args = ["compare", "--prefixes", "24", "--workers", "6", "--concurrency", "8", "--router", LONG_NAMES,
            "--repeats", "2", "--jobs", "1", "--out", str(out)]
    text, tables = terminal(args, monkeypatch)
    for row in csv.DictReader((out / "compare.csv").open()):
        line = next(line for line in text.splitlines() if row["router"] in line.split()[:2])
        for value in (pm(row, "request_hit_rate", ".3f"), pm(row, "token_hit_rate", ".3f"),
                      pm(row, "ttft_p50_ms", ".0f"), pm(row, "ttft_p99_ms", ".0f")):
            assert value in line, (value, line)
    assert_whole_at_every_width(tables, monkeypatch)


@pytest.mark.slow
def test_sweep_tune_and_plan_tables_are_whole_at_80_100_and_200_columns(tmp_path, monkeypatch):
    runs = [
        ["sweep", "--prefixes", "2,24", "--workers", "6", "--concurrency", "8", "--router", LONG_NAMES,
         "--jobs", "1"],
        ["tune", "--router", "aibrix-prefix-cache", "--budget", "6", "--repeats", "2", "--prefixes", "24", "--jobs",
         "1"],
        ["plan", "router", "--router", "kv-aware,aibrix-prefix-cache", "--constraint", "ttft_p99_ms<=400",
         "--budget", "4", "--repeats", "2", "--prefixes", "24", "--jobs", "1"],
        ["plan", "capacity", "--prefixes", "8", "--target-hit-rate", "0.6", "--vary", "kv-gib", "--min", "1",
         "--max", "2", "--step", "0.5", "--router", "vllm-router-prefix-aware", "--repeats", "2", "--horizon", "200",
         "--jobs", "1"],
    ]
    for args in runs:
        text, tables = terminal(args, monkeypatch, columns=80)
        assert "…" not in text
        assert_whole_at_every_width(tables, monkeypatch)
        if args[0] in ("tune", "plan") and args[1] != "capacity":  # the answer to paste stays on one line
            [paste] = [line for line in text.splitlines() if line.startswith("paste: ")]
            assert re.fullmatch(r"paste: --router [^ ]+", paste), paste


def test_the_listings_fit_100_columns_and_name_every_profile_whole():
    from policies import ROUTERS
    from sim.timing.hardware import hardware_profiles

    texts = {}
    for args in (["hardware"], ["routers"], ["routers", "kv-aware", "llm-d"], ["engines"]):
        res = CliRunner().invoke(main, args, env={"COLUMNS": "100"})
        assert res.exit_code == 0, res.output
        texts[args[0]] = texts.get(args[0], "") + res.output
        assert max(map(len, res.output.splitlines())) <= 100, args
        assert "PydanticUndefined" not in res.output and not BOX_DRAWING.search(res.output)
    lines = texts["hardware"].splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) == {"-"})
    assert [line.split()[0] for line in lines[rule + 1:rule + 1 + len(hardware_profiles())]] == list(hardware_profiles())
    assert "host_link.bandwidth (default null)" in texts["hardware"]
    assert all(f"\n{name}: " in texts["routers"] for name in ROUTERS)
    assert "    state (default exact): How the router learns" in texts["routers"]  # kvsim routers kv-aware
    # NOTE: every line but an engine's first is indented (its continuation lines and its options')
    assert [line.split(":")[0] for line in texts["engines"].splitlines() if not line.startswith(" ")] == [
        "sglang", "vllm"]


def test_an_unknown_router_to_describe_is_one_line():
    res = CliRunner().invoke(main, ["routers", "nope"])
    assert res.exit_code == 2 and res.output.strip().splitlines()[-1].startswith(
        "Error: Invalid value for NAME: unknown router nope; allowed: aibrix-least-kv-cache,")


def _commands(tmp_path):
    """Each result command as (args, the CSV file it writes), cheap settings."""
    tiny = ["--scenario", str(SCENARIOS / "tiny-cpu.yaml")]
    scenario, measured = write_calibration_inputs(tmp_path, {"time_model.step_overhead_s": 0.004})
    trace = str(TRACES / "conversation_head400.jsonl")
    return {
        "run": (["run", "--prefixes", "7", "--workers", "3", "--out", "{out}"], "summary.csv"),
        "sweep": (["sweep", "--prefixes", "2,7", "--workers", "3", "--concurrency", "4", "--router",
                   "random,kv-aware", "--jobs", "1", "--out", "{out}"], "summary.csv"),
        "compare": (["compare", "--prefixes", "7", "--workers", "3", "--concurrency", "4", "--router",
                     "random,kv-aware", "--repeats", "2", "--jobs", "1", "--out", "{out}"], "compare.csv"),
        "tune": (["tune", "--router", "kv-aware", "--budget", "4", "--repeats", "2", "--prefixes", "7", "--jobs",
                  "1", "--out", "{out}"], "tune.csv"),
        "plan capacity": (["plan", "capacity", "--prefixes", "8", "--target-hit-rate", "0.6", "--vary", "kv-gib",
                           "--min", "1", "--max", "2", "--step", "0.5", "--repeats", "2", "--horizon", "200",
                           "--jobs", "1", "--out", "{out}"], "plan.csv"),
        "plan router": (["plan", "router", "--router", "random,kv-aware", "--budget", "2", "--repeats", "2",
                         "--prefixes", "7", "--jobs", "1", "--out", "{out}"], "plan.csv"),
        "replay": (["replay", trace, "--workers", "2", "--kv-tokens", "100000", "--limit", "40", "--out", "{out}"],
                   "summary.csv"),
        "validate": (["validate", str(FIXTURES / "real-vllm" / "w2-n12-c1.csv"), *tiny, "--out", "{out}/v.csv"],
                     "v.csv"),
        "calibrate": (["calibrate", "--scenario", str(scenario), "--measured", str(measured), "--fit",
                       "time_model.step_overhead_s", "--repeats", "1", "--starts", "1", "--refine", "1",
                       "--max-evaluations", "4", "--jobs", "1", "--out", "{out}/fit.yaml", "--report",
                       "{out}/residuals.csv"], "residuals.csv"),
    }


@pytest.mark.parametrize("command", [
    "run", "validate", "calibrate",
    *(pytest.param(c, marks=pytest.mark.slow) for c in ("sweep", "compare", "tune", "plan capacity", "plan router",
                                                          "replay")),
])
def test_format_csv_is_the_file_json_its_rows_and_piped_tables_have_no_boxes(tmp_path, command):
    args, name = _commands(tmp_path)[command]
    results = {}
    for fmt in ("table", "csv", "json"):
        out = tmp_path / fmt
        out.mkdir()
        res = CliRunner().invoke(main, [a.replace("{out}", str(out)) for a in args] + ["--format", fmt],
                                 env={"TTY_COMPATIBLE": None}, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        results[fmt] = (res, (out / name).read_bytes())
    table, _ = results["table"]
    assert not BOX_DRAWING.search(table.stdout) and "…" not in table.stdout
    res, written = results["csv"]
    assert res.stdout.encode() == written  # nothing but the rows on stdout...
    assert "wrote" in res.stderr           # ...and the rest on stderr
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    res, written = results["json"]
    data = json.loads(res.stdout)
    header = next(csv.reader(io.StringIO(written.decode())))
    assert len(data) == len(rows) and all(list(obj) == header for obj in data)
    for obj, row in zip(data, rows):
        for key in ("router", "metric", "point", "trial"):
            if key in row:
                assert str(obj[key]) == row[key]
