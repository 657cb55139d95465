"""How a table is fitted to a width (sim/cli/render.py): headers wrap, then abbreviate with a legend, then the table
splits into blocks that repeat its key columns; no value is ever cut; piped, it is plain text."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from sim.cli import render
from sim.cli.render import Table, layout

BOX_DRAWING = re.compile("[\u2500-\u257f]")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def routers_table() -> Table:
    """Two routers, a key column and seven values: 11 + 7 x 13 + 7 x 2 = 116 columns wide on one line."""
    t = Table(title="two routers", caption="a caption")
    t.add_column("router", justify="left", key=True)
    for header in ("hit rate", "token hit", "TTFT p50 ms", "TTFT p99 ms", "req/s", "goodput req/s", "load max/mean"):
        t.add_column(header)
    t.add_row("kv-aware", *(["0.911 ± 0.013"] * 7))
    t.add_row("round-robin", *(["0.149 ± 0.013"] * 7))
    return t


def printed(table: Table, monkeypatch, *, columns: int, terminal: bool = True) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("TTY_COMPATIBLE", "1" if terminal else "0")
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    render.show_table(table)
    monkeypatch.undo()
    return ANSI.sub("", out.getvalue())


def test_a_table_that_fits_is_one_block_of_one_line_headers():
    [block] = layout(routers_table(), 116)
    assert block.columns == tuple(range(8)) and block.short == frozenset() and block.width == 116


def test_a_table_too_wide_splits_into_blocks_that_repeat_the_key_column():
    blocks = layout(routers_table(), 60)
    # router (11) + 3 values x (13 + 2) = 56: three values to a block, the router in each
    assert [b.columns for b in blocks] == [(0, 1, 2, 3), (0, 4, 5, 6), (0, 7)]
    assert all(b.width <= 60 for b in blocks)


def test_headers_wrap_before_they_are_abbreviated():
    t = Table()
    t.add_column("router", justify="left", key=True)
    t.add_column("request_hit_rate")
    t.add_column("concurrency")
    t.add_row("kv-aware", "0.911", "8")
    assert layout(t, 8 + 16 + 11 + 4)[0].short == frozenset()         # on one line each
    assert layout(t, 8 + 8 + 11 + 4)[0].short == frozenset()          # request_ / hit_rate
    [block] = layout(t, 8 + 8 + 10 + 4)                                # concurrency -> conc
    assert block.short == frozenset({2}) and block.widths == (8, 8, 4)


def test_an_abbreviated_header_is_explained_under_the_table(monkeypatch):
    t = Table()
    t.add_column("router", justify="left", key=True)
    t.add_column("concurrency")
    t.add_row("kv-aware", "8")
    text = printed(t, monkeypatch, columns=16)
    assert text.splitlines()[0].split() == ["router", "conc"]
    assert "abbreviated: conc = concurrency" in " ".join(text.split())


@pytest.mark.parametrize("columns", [24, 40, 60, 80, 100, 200])
def test_no_cell_is_cut_at_any_width(monkeypatch, columns):
    table = routers_table()
    text = printed(table, monkeypatch, columns=columns)
    lines = text.splitlines()
    for row in table.rows:
        for cell in row:
            assert any(cell in line for line in lines), (columns, cell)
    assert "…" not in text
    widest = max(b.width for b in layout(table, columns))
    # NOTE: only a block that cannot fit even alone (the key and one value: 11 + 2 + 13 = 26) is wider than the width
    assert all(len(line) <= max(columns, widest) for line in lines)
    assert widest <= columns or columns < 26


def test_a_prose_column_wraps_at_spaces_and_commas_and_takes_the_room_left(monkeypatch):
    t = Table()
    t.add_column("router", justify="left", key=True)
    t.add_column("best setting", justify="left", prose=True)
    t.add_row("aibrix", "aibrix-prefix-cache:imbalance_abs_count=18,standard_deviation_factor=2.861")
    lines = printed(t, monkeypatch, columns=60).splitlines()
    assert lines[2].split()[1] == "aibrix-prefix-cache:imbalance_abs_count=18,"
    assert lines[3].strip() == "standard_deviation_factor=2.861"


def test_piped_a_table_is_plain_text_one_line_per_row(monkeypatch):
    table = routers_table()
    text = printed(table, monkeypatch, columns=40, terminal=False)
    assert not BOX_DRAWING.search(text)
    lines = text.splitlines()
    assert lines[0] == "two routers" and lines[-1] == "a caption"
    assert lines[1].split()[:3] == ["router", "hit", "rate"] and set(lines[2]) == {"-"}
    assert [re.split(r"\s{2,}", line.strip()) for line in lines[3:5]] == [list(r) for r in table.rows]


def test_a_listing_entry_wraps_with_indented_continuation_lines(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    render.entry("event_lag_s", "state=events: delay (s) from an engine publishing KV events to the router applying "
                 "them", detail="(default 0.0)", indent=4)
    monkeypatch.undo()
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["    event_lag_s (default 0.0):", "        state=events: delay (s) from an"]
    assert all(line.startswith("        ") and len(line) <= 40 for line in lines[1:]) and len(lines) == 4


def test_only_the_rendering_module_draws_tables():
    cli = Path(render.__file__).parent
    drawing = [p.name for p in cli.glob("*.py") if p.name != "render.py" and "rich.table" in p.read_text()]
    assert drawing == []
