"""What kvsim's commands print, in one place: result tables fitted to the terminal (plain text when piped), their rows
as CSV or JSON (`--format`), the prose lines around them, and the indented entries of the listings (`kvsim routers`,
`engines`, `hardware`).

Where each thing goes, by `--format`:

    --format   a Table (console.print(table))              its rows (console.data)   prose (console.print(text))
    table      stdout: fitted to a terminal, plain if piped  -                         stdout
    csv, json  -                                             stdout                    stderr

so that `--format csv|json` leaves nothing on stdout but the rows. A terminal is stdout's `isatty()`, or what
`TTY_COMPATIBLE=1|0` says (rich's variable, honoured so that tests and CI can choose); FORCE_COLOR is not a terminal.

Piped, a table is plain text: one line per row, columns aligned and separated by two spaces, a `-` rule under the
headers, nothing wrapped, abbreviated or cut (no box-drawing characters: it greps and diffs).

On a terminal of W columns (`layout`), the first of these that fits:

1. every header on one line;
2. headers wrapped at their spaces (a column is never narrower than its widest value or longest header word);
3. headers abbreviated (`short`, else ABBREVIATIONS), as few as needed, explained in a legend under the table;
4. the table split into blocks of columns, each repeating the key columns (`key=True`: what names a row), each
   fitted by 1-3;
5. a block that does not fit even so (its key columns and one other are wider than W) is printed wider than W: the
   terminal folds its lines, but no value is cut.

Values never wrap; only `prose` columns (descriptions) wrap, at their spaces.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import click
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

FORMATS = ("table", "csv", "json")
_FORMAT_KEY = "kvsim.format"

GAP = 2
"""Spaces between two columns (rich's padding of 1 on each side, collapsed, no vertical rules)."""

PROSE_MIN_WIDTH = 24
"""A prose column (a description) is not squeezed below this many characters (or its longest word)."""

ABBREVIATIONS = {
    "workers": "W",
    "concurrency": "conc",
    "measured": "meas",
    "hit rate": "hit",
    "token hit": "tok hit",
    "full hit": "full",
    "request hit": "req hit",
    "prefix reuse": "reuse",
    "of bound": "/bound",
    "max share": "max sh",
    "goodput req/s": "gp/s",
    "goodput share": "gp share",
    "load max/mean": "max/mean",
    "TTFT p50 ms": "p50 ms",
    "TTFT p99 ms": "p99 ms",
    "TTFT GPU-hit p50": "GPU-hit p50",
    "TTFT CPU-hit p50": "CPU-hit p50",
    "TTFT miss p50": "miss p50",
    "request_hit_rate": "req hit",
    "token_hit_rate": "tok hit",
    "full_hit_rate": "full hit",
    "throughput_rps": "req/s",
    "goodput_rps": "gp/s",
    "goodput_fraction": "gp share",
    "ttft_p50_ms": "p50 ms",
    "ttft_p90_ms": "p90 ms",
    "ttft_p99_ms": "p99 ms",
    "tpot_p50_ms": "TPOT p50",
    "tpot_p99_ms": "TPOT p99",
    "e2e_p50_ms": "E2E p50",
    "e2e_p99_ms": "E2E p99",
    "simulated hit rate": "sim hit",
    "simulated TTFT p99 ms": "sim p99 ms",
    "analytic answer": "analytic",
    "simulated below answer": "below answer",
    "feasible": "ok",
}
"""Short headers for narrow terminals, one spelling for every command (a column may give its own)."""


# --- which format, and whether stdout is a terminal ------------------------------------------------------------------

def format_option(carries: str) -> Callable:
    """`--format table|csv|json` for a command that prints results; `carries` says what csv and json hold (e.g.
    "the rows of summary.csv"). The choice is kept in the click context (`current_format`), not passed on."""

    def remember(ctx: click.Context, param: click.Parameter, value: str) -> str:
        ctx.meta[_FORMAT_KEY] = value
        return value

    return click.option(
        "--format", "output_format", type=click.Choice(FORMATS), default="table", show_default=True,
        expose_value=False, is_eager=True, callback=remember,
        help=f"table: fitted to the terminal (plain text when piped); csv or json: {carries}, on stdout, with every "
             "other line on stderr.")


def current_format() -> str:
    """The invocation's `--format` ('table' outside a command, or in one without the option)."""
    ctx = click.get_current_context(silent=True)
    return "table" if ctx is None else ctx.meta.get(_FORMAT_KEY, "table")


def is_terminal(stream) -> bool:
    forced = os.environ.get("TTY_COMPATIBLE", "")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _console(stream, width: int | None = None) -> Console:
    """A console on `stream` as it is now (click's test runner swaps sys.stdout): a terminal's width (COLUMNS wins),
    or `width`; off a terminal no styles and, unless given a width, no wrapping."""
    terminal = is_terminal(stream)
    return Console(file=stream, force_terminal=terminal, width=width, soft_wrap=not terminal and width is None)


# --- the table a command fills ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Column:
    """A column: its header, how its cells align, whether it names the row (`key`: repeated in every block of a split
    table), whether its cells are prose that may wrap, and its short header ('' when none)."""

    header: str
    justify: str = "right"
    key: bool = False
    prose: bool = False
    short: str = ""


class Table:
    """A result table: a title, columns, rows of text cells (formatted by the command), a caption. It is printed by
    `console.print(table)`, fitted as the module says; it never cuts a cell."""

    def __init__(self, title: str = "", caption: str = "") -> None:
        self.title, self.caption = title, caption
        self.columns: list[Column] = []
        self.rows: list[tuple[str, ...]] = []

    def add_column(self, header: str, justify: str = "right", *, key: bool = False, prose: bool = False,
                   short: str | None = None) -> None:
        short = ABBREVIATIONS.get(header, "") if short is None else short
        self.columns.append(Column(header, justify, key, prose, "" if short == header else short))

    def add_row(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.columns)} columns "
                             f"({', '.join(c.header for c in self.columns)})")
        self.rows.append(tuple(str(c) for c in cells))


# --- fitting a table to a width --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Block:
    """Columns of a table printed together (indices into `Table.columns`, in order), their widths, and which of them
    show their short header."""

    columns: tuple[int, ...]
    widths: tuple[int, ...]
    short: frozenset[int]

    @property
    def width(self) -> int:
        return sum(self.widths) + GAP * (len(self.widths) - 1)


HEADER_BREAKS = "_/"
"""A header wraps at its spaces and after these (`request_hit_rate`, `load max/mean`)."""

PROSE_BREAKS = ","
"""A prose cell wraps at its spaces and after these (a router spec `NAME:key=value,key=value`)."""


def _pieces(text: str, breaks: str) -> list[str]:
    """`text` cut where it may wrap: at spaces (each piece keeps the space before the next) and after `breaks`."""
    pieces, start = [], 0
    for i, char in enumerate(text):
        if char in breaks or (char == " " and i + 1 < len(text) and text[i + 1] != " "):
            pieces.append(text[start:i + 1])
            start = i + 1
    pieces.append(text[start:])
    return [p for p in pieces if p]


def _longest_piece(text: str, breaks: str) -> int:
    return max((cell_len(p.rstrip(" ")) for p in _pieces(text, breaks)), default=0)


def fill(text: str, width: int, breaks: str, first_width: int | None = None) -> list[str]:
    """`text` as lines no wider than `width` (the first no wider than `first_width`, if given), broken only between
    pieces: a piece wider than its line has a line of its own."""
    lines: list[str] = []
    line = ""
    for piece in _pieces(text, breaks):
        limit = width if lines or first_width is None else first_width
        if line and cell_len((line + piece).rstrip(" ")) > limit:
            lines.append(line.rstrip(" "))
            line = ""
        line += piece
    lines.append(line.rstrip(" "))
    return lines


class _Sizes:
    """What each column of a table needs, header form by form: on one line, wrapped, abbreviated."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.value = [max((cell_len(r[j]) for r in table.rows), default=0) for j in range(len(table.columns))]
        # NOTE: a prose cell may wrap, but not below PROSE_MIN_WIDTH (or its longest piece).
        self.prose_min = [max((_longest_piece(r[j], PROSE_BREAKS) for r in table.rows), default=0)
                          for j in range(len(table.columns))]

    def need(self, j: int, form: str) -> int:
        col = self.table.columns[j]
        if col.prose and form != "line":
            values = max(self.prose_min[j], min(self.value[j], PROSE_MIN_WIDTH))
        else:
            values = self.value[j]
        header = {"line": cell_len(col.header), "wrap": _longest_piece(col.header, HEADER_BREAKS),
                  "short": _longest_piece(col.short or col.header, HEADER_BREAKS)}[form]
        return max(values, header)

    def fit(self, columns: Sequence[int], limit: float, abbreviate: bool = True) -> Block | None:
        """`columns` in at most `limit` characters, with as few abbreviations (none unless `abbreviate`) and wrapped
        headers as fit, or None."""
        def total(forms: dict[int, str]) -> int:
            return sum(self.need(j, f) for j, f in forms.items()) + GAP * (len(forms) - 1)

        forms = {j: "line" for j in columns}
        if total(forms) <= limit:
            return self._block(forms, limit)
        forms = self._minimal_forms(columns, abbreviate)
        if total(forms) > limit:
            return None
        # NOTE: spare room first spells out abbreviated headers (a shorter legend), then unwraps headers.
        for before, after in (("short", "wrap"), ("wrap", "line")):
            for j in columns:
                if forms[j] == before and total({**forms, j: after}) <= limit:
                    forms[j] = after
        return self._block(forms, limit)

    def natural(self) -> Block:
        """Every column as wide as its header and cells: the piped form."""
        return self._block({j: "line" for j in range(len(self.table.columns))}, 0)

    def minimal(self, columns: Sequence[int]) -> Block:
        return self._block(self._minimal_forms(columns), 0)

    def _minimal_forms(self, columns: Sequence[int], abbreviate: bool = True) -> dict[int, str]:
        return {j: "short" if abbreviate and self.table.columns[j].short else "wrap" for j in columns}

    def _block(self, forms: dict[int, str], limit: float) -> Block:
        widths = {j: self.need(j, f) for j, f in forms.items()}
        spare = limit - (sum(widths.values()) + GAP * (len(widths) - 1))
        for j in forms:  # a prose column takes the room left, up to its widest cell
            if self.table.columns[j].prose and spare > 0:
                grow = min(spare, max(0, self.value[j] - widths[j]))
                widths[j] += int(grow)
                spare -= grow
        return Block(tuple(forms), tuple(widths[j] for j in forms),
                     frozenset(j for j, f in forms.items() if f == "short"))


def layout(table: Table, limit: int) -> list[Block]:
    """The blocks `table` is printed in at `limit` columns (see the module's docstring)."""
    sizes = _Sizes(table)
    every = range(len(table.columns))
    whole = sizes.fit(every, limit)
    if whole is not None:
        return [whole]
    keys = [j for j in every if table.columns[j].key]

    def groups(abbreviate: bool) -> list[list[int]]:
        """The other columns packed in order, as many to a block as fit beside the keys."""
        packed: list[list[int]] = []
        for j in every:
            if j in keys:
                continue
            if packed and sizes.fit(sorted([*keys, *packed[-1], j]), limit, abbreviate) is not None:
                packed[-1].append(j)
            else:
                packed.append([j])
        return packed or [[]]

    # NOTE: abbreviations only if they save a block.
    spelled, short = groups(False), groups(True)
    blocks = []
    for group in short if len(short) < len(spelled) else spelled:
        columns = sorted([*keys, *group])
        blocks.append(sizes.fit(columns, limit) or sizes.minimal(columns))
    return blocks


# --- printing a table ------------------------------------------------------------------------------------------------

_PLAIN_BOX = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
"""No vertical rules, a `-` rule under the headers: the piped form."""


def _rich_table(table: Table, block: Block, plain: bool) -> RichTable:
    out = RichTable(box=_PLAIN_BOX if plain else box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                    collapse_padding=True, padding=(0, 1), header_style="" if plain else "bold")
    for j, w in zip(block.columns, block.widths):
        col = table.columns[j]
        # NOTE: overflow fold, not rich's ellipsis: a cell wider than its column (never, by `layout`) breaks, whole.
        header = col.short if j in block.short else col.header
        out.add_column(Text("\n".join(fill(header, w, HEADER_BREAKS))), justify=col.justify, width=w, overflow="fold")
    for row in table.rows:
        out.add_row(*(Text("\n".join(fill(row[j], w, PROSE_BREAKS)) if table.columns[j].prose else row[j])
                      for j in block.columns))
    return out


def _paragraph(console: Console, text: str) -> None:
    if text:
        console.print(Text(text), soft_wrap=not console.is_terminal)


def show_table(table: Table) -> None:
    """Print `table` to stdout, fitted to the terminal or plain when piped (nothing with --format csv|json)."""
    if current_format() != "table":
        return
    if not is_terminal(sys.stdout):
        block = _Sizes(table).natural()
        console = _console(sys.stdout, width=max(block.width, 1))
        with console.capture() as drawn:
            console.print(_rich_table(table, block, plain=True))
        lines = [table.title, *(line.rstrip() for line in drawn.get().splitlines()), table.caption]
        click.echo("\n".join(line for line in lines if line))  # NOTE: rich pads the last column; a diff would see it
        return
    console = _console(sys.stdout)
    blocks = layout(table, console.width)
    _paragraph(console, table.title)
    for i, block in enumerate(blocks):
        if i:
            console.print()
        # NOTE: a block wider than the terminal (rule 5) is laid out at its own width, not squeezed by rich.
        wide = _console(sys.stdout, width=block.width) if block.width > console.width else console
        wide.print(_rich_table(table, block, plain=False))
    _paragraph(console, table.caption)
    shorts = sorted({j for b in blocks for j in b.short})
    if shorts:
        _paragraph(console, "abbreviated: " + "; ".join(
            f"{table.columns[j].short} = {table.columns[j].header}" for j in shorts))


# --- rows as CSV or JSON ---------------------------------------------------------------------------------------------

def _json_value(value: object) -> object:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # a numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_text(rows: Iterable[dict], columns: Sequence[str]) -> str:
    """`rows` as a JSON array of objects with `columns` as keys (NaN and missing values as null)."""
    return json.dumps([{c: _json_value(row.get(c)) for c in columns} for row in rows], indent=1)


def show_data(rows: Sequence[dict], columns: Sequence[str]) -> None:
    """With --format csv or json, print `rows` (the rows of the command's CSV file, its columns) on stdout."""
    from sim.results.report import csv_bytes

    fmt = current_format()
    if fmt == "csv":
        click.echo(csv_bytes(rows, columns).decode(), nl=False)
    elif fmt == "json":
        click.echo(json_text(rows, columns))


# --- listings --------------------------------------------------------------------------------------------------------

def entry(head: str, text: str = "", *, detail: str = "", indent: int = 0, hang: int = 4) -> None:
    """`head detail: text` wrapped at the terminal's width (80 or COLUMNS when piped), the first line indented
    `indent`, the continuation lines `hang` more; `head` in bold on a terminal."""
    console = _console(sys.stdout)
    line = " ".join(x for x in (head, detail) if x)
    line = f"{line}: {text}" if text else line
    limit = max(console.width, indent + hang + 20)
    lines = fill(line, limit - indent - hang, PROSE_BREAKS, first_width=limit - indent)
    out = Text("\n".join(" " * (indent if i == 0 else indent + hang) + text for i, text in enumerate(lines)))
    out.stylize("bold", indent, indent + len(head))
    console.print(out, soft_wrap=True, highlight=False)


class Output:
    """The commands' stdout: `print` takes prose (rich text, as rich's Console.print) or a `Table`; `data` the rows
    for --format csv|json. Prose goes to stdout, or to stderr with --format csv|json."""

    def print(self, *objects: object, **kwargs) -> None:
        if len(objects) == 1 and isinstance(objects[0], Table):
            show_table(objects[0])
            return
        stream = sys.stdout if current_format() == "table" else sys.stderr
        _console(stream).print(*objects, **kwargs)

    @staticmethod
    def data(rows: Sequence[dict], columns: Sequence[str]) -> None:
        show_data(rows, columns)


console = Output()
