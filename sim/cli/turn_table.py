"""The per-turn figures `kvsim run` and `kvsim replay` print, and write as `turns.csv`, when the workload has sessions."""

from __future__ import annotations

from sim.cli.app import console, fmt, hit_rates_legend
from sim.cli.render import Table
from sim.results.report import TURN_COLUMNS, csv_bytes
from sim.results.summary import MAX_TURN, SessionFigures


def show_turns(figures: SessionFigures | None, *, host_tier: bool) -> None:
    """A row per turn (nothing without sessions); with a host KV tier, the gap survival on the GPU alone beside."""
    if figures is None:
        return
    sessions = "an unknown number of" if figures.num_sessions < 0 else f"{figures.num_sessions:,}"
    table = Table(title=f"per turn ({sessions} sessions, {figures.counts.requests:,} requests; turn 0 is a "
                        f"session's first)")
    for col in ("turn", "requests", "hit rate", "token hit", "TTFT p50 ms", "TTFT p99 ms", "re-prefilled tokens",
                "gap survival", *(("GPU gap survival",) if host_tier else ())):
        table.add_column(col, key=col == "turn")
    for row in figures.turn_rows():
        turn = row["turn"]
        table.add_row(f"{turn}+" if turn == MAX_TURN else str(turn), str(row["requests"]),
                      fmt(row["request_hit_rate"]), fmt(row["token_hit_rate"]), fmt(row["ttft_p50_ms"], ".0f"),
                      fmt(row["ttft_p99_ms"], ".0f"), str(row["reprefill_tokens"]), fmt(row["gap_survival"]),
                      *((fmt(row["gpu_gap_survival"]),) if host_tier else ()))
    console.print(table)
    console.print(f"{hit_rates_legend('hit rate', 'token hit')}; re-prefilled tokens: of the context the earlier "
                  f"turns left cacheable, tokens computed again; gap survival: share of the turns with a context "
                  f"that found all of it cached" + ("; GPU gap survival: on the GPU alone, without the host tier"
                                                    if host_tier else ""), highlight=False)


def turn_files(figures: SessionFigures | None) -> dict[str, bytes]:
    """`turns.csv` when there are sessions, else nothing."""
    return {} if figures is None else {"turns.csv": csv_bytes(figures.turn_rows(), TURN_COLUMNS)}
