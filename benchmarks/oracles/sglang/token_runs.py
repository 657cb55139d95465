"""The token-id encoding the SGLang oracle scripts share with kvsim's streams.

A run `[k, start, n]` is the token ids `k * SCALE + start .. + n - 1`, so distinct runs never share a token id
and kvsim reads the same runs as token identities.
"""

from __future__ import annotations

from array import array

SCALE = 1_000_000


def ids_of(runs) -> array:
    """Runs to token ids."""
    out = array("q")
    for k, start, n in runs:
        base = k * SCALE + start
        out.extend(range(base, base + n))
    return out


def runs_of(ids) -> list[list[int]]:
    """Token ids back to canonical runs [k, start, n]."""
    out: list[list[int]] = []
    for t in ids:
        k, o = divmod(int(t), SCALE)
        if out and out[-1][0] == k and out[-1][1] + out[-1][2] == o:
            out[-1][2] += 1
        else:
            out.append([k, o, 1])
    return out
