"""What a run leaves: per-request records and counters, summaries (rates derived from counts), streaming statistics
for long replays, and reports (tables, CSV, figures)."""
