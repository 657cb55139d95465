"""Request traces: Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids`), read lazily.

Each line's `hash_ids` are chained hashes of 512-token blocks (equal ids mean the same block *and* the same whole
prefix before it; the last block may be partial). The engine's block size must divide the trace's: trace block
`h` becomes the k sub-blocks `h·k + j` (j < k) of the engine's size, which keeps the chaining (a sub-block's
identity still names its whole prefix). Only full engine blocks get hashes, as in vLLM: a partial last trace block of r
tokens contributes floor(r / B) hashed sub-blocks and its remainder is the request's unhashed tail.
"""

from __future__ import annotations

import json
import math
from itertools import chain, repeat
from collections.abc import Hashable, Iterator
from typing import BinaryIO
from dataclasses import dataclass
from pathlib import Path

from sim.workloads.request import Request

TRACE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A malformed trace line; the message names the file, the line number and the field."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float
    request: Request


def field(obj: dict, name: str, kind: type, path: Path, line: int):
    """`obj[name]` checked to be of `kind` (int, float: any finite or infinite number, list, str), or TraceError
    naming the file, the line and the field."""
    if name not in obj:
        raise TraceError(f"{path}:{line}: missing field {name!r}")
    value = obj[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TraceError(f"{path}:{line}: field {name!r} must be an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TraceError(f"{path}:{line}: field {name!r} must be a number, got {value!r}")
    if kind is list and not isinstance(value, list):
        raise TraceError(f"{path}:{line}: field {name!r} must be a list, got {type(value).__name__}")
    if kind is str and not isinstance(value, str):
        raise TraceError(f"{path}:{line}: field {name!r} must be a string, got {value!r}")
    return value


_NUMBER_TYPES = (int, float)
"""The exact types of a JSON number (`field`'s `float`: an int or a float, no bool)."""


def open_binary(path: Path) -> BinaryIO:
    """`path` opened for reading bytes, or a TraceError naming it and why it cannot be opened."""
    try:
        return path.open("rb")
    except OSError as err:
        raise TraceError(f"{path}: cannot open ({err.strerror})") from None


def json_object(text: str | bytes, path: Path, line_no: int) -> dict:
    """The JSON object on line `line_no`, or TraceError naming it (not UTF-8, not JSON, NaN or Infinity, not an
    object)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TraceError(f"{path}:{line_no}: not UTF-8 text (byte {err.start} of the line)") from None
    try:
        # NOTE: json.loads refuses a leading BOM with its own message; the shared decoder would not.
        obj = json.loads(text, parse_constant=_no_constant) if text.startswith("\ufeff") else _DECODER.decode(text)
    except TraceError as err:  # NaN, Infinity
        raise TraceError(f"{path}:{line_no}: {err}") from None
    except json.JSONDecodeError as err:
        raise TraceError(f"{path}:{line_no}: not valid JSON ({err.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{path}:{line_no}: expected a JSON object")
    return obj


def check_hash_ids(ids: list, n_in: int, trace_block_tokens: int, path: Path, line_no: int) -> None:
    """TraceError unless `ids` are ceil(n_in / trace block) non-negative integers."""
    # NOTE: type() is exact, so bools (an int subclass) fail; both checks run in C.
    if ids and (not set(map(type, ids)) <= {int} or min(ids) < 0):
        raise TraceError(f"{path}:{line_no}: field 'hash_ids' must hold non-negative integers")
    check_hash_count(ids, n_in, trace_block_tokens, path, line_no)


def check_hash_count(ids: list, n_in: int, trace_block_tokens: int, path: Path, line_no: int) -> None:
    """TraceError unless there are ceil(n_in / trace block) `ids` (`check_hash_ids` without the values' check)."""
    if len(ids) != -(-n_in // trace_block_tokens):
        raise TraceError(f"{path}:{line_no}: field 'hash_ids' has {len(ids)} ids; input_length {n_in} "
                         f"needs ceil({n_in}/{trace_block_tokens}) = {-(-n_in // trace_block_tokens)}")


def sub_block_hashes(ids: list[int], per_block: int, num_blocks: int) -> tuple[Hashable, ...]:
    """The first `num_blocks` engine-block hashes of trace blocks `ids`, each split into `per_block` sub-blocks."""
    if len(set(ids)) != len(ids):
        return _hashes_past_a_repeat(ids, per_block, num_blocks)
    if per_block == 1:
        return tuple(ids[:num_blocks])
    # NOTE: sub-block j of trace block h is the int h * per_block + j: unique, and cheaper to hash than a
    # tuple (trace ids are non-negative; kvsim's own synthetic keys are tuples, so they never collide).
    starts = [h * per_block for h in ids[: -(-num_blocks // per_block)]]
    return tuple(chain.from_iterable(map(range, starts, [s + per_block for s in starts])))[:num_blocks]


def _hashes_past_a_repeat(ids: list[int], per_block: int, num_blocks: int) -> tuple[Hashable, ...]:
    """`sub_block_hashes` of a prompt that repeats a trace id. A trace's ids are prefix hashes, so a repeat names a
    block at another position, hence another block, as vLLM's chained hashes (and Dynamo's mocker, which chains the
    ids) have it; keyed by the id alone it would be the same block twice in one prompt. Up to the first repeat the
    keys are the plain ones (the prompt shares them with every prompt of the same leading ids); from it on each trace
    block's key chains every id up to it, so two prompts share a block exactly when their ids agree up to it."""
    seen: set[int] = set()
    first = next(i for i, h in enumerate(ids) if h in seen or seen.add(h))
    out = list(sub_block_hashes(ids[:first], per_block, min(num_blocks, first * per_block)))
    link = hash(tuple(ids[:first]))
    for h in ids[first:]:
        if len(out) >= num_blocks:
            break
        link = hash((link, h))
        out.extend(("past a repeat", link, j) for j in range(per_block))
    return tuple(out[:num_blocks])


def read_mooncake(path: str | Path, *, block_size: int, trace_block_tokens: int = TRACE_BLOCK_TOKENS,
                  speed: float = 1.0, limit: int | None = None, first_request_id: int = 0) -> Iterator[TraceRequest]:
    """Yield the trace's requests in file order with arrival times `timestamp / 1000 / speed` (seconds).

    Lazy: one line in memory at a time. Raises TraceError (file:line: field) on the first malformed line: not
    UTF-8, not a JSON object, a missing field, a timestamp that is not a finite number >= 0 or goes backwards
    (Mooncake traces are sorted by arrival, and the replay relies on it), a negative output_length (0 is read as 1),
    hash_ids that are not ceil(input_length / trace block) non-negative integers; and on a trace with no request.
    """
    path = Path(path)
    if trace_block_tokens % block_size:
        raise TraceError(f"engine block size {block_size} must divide the trace's block size {trace_block_tokens}")
    if speed <= 0:
        raise TraceError(f"speed must be > 0, got {speed}")
    per_block = trace_block_tokens // block_size
    last_ts = None
    try:
        handle = path.open(encoding="utf-8")
    except OSError as err:
        raise TraceError(f"{path}: cannot open ({err.strerror})") from None
    with handle:
        rid = first_request_id
        line_no = 0
        for line_no, text in enumerate(_lines(handle, path), start=1):
            if limit is not None and rid - first_request_id >= limit:
                return
            text = text.strip()
            if not text:
                continue
            obj = json_object(text, path, line_no)
            ts, n_in, n_out, ids = (obj.get("timestamp"), obj.get("input_length"), obj.get("output_length"),
                                    obj.get("hash_ids"))
            # NOTE: the usual line's types checked at once (exact types: a bool is no number here); any other line
            # goes through `field`, field by field in this order, which names the first that is wrong.
            if not (type(ts) in _NUMBER_TYPES and type(n_in) is int and type(n_out) is int and type(ids) is list):
                ts = field(obj, "timestamp", float, path, line_no)
                n_in = field(obj, "input_length", int, path, line_no)
                n_out = field(obj, "output_length", int, path, line_no)
                ids = field(obj, "hash_ids", list, path, line_no)
            if ids and (not set(map(type, ids)) <= {int} or min(ids) < 0):
                check_hash_ids(ids, n_in, trace_block_tokens, path, line_no)
            if n_in < 1:
                raise TraceError(f"{path}:{line_no}: field 'input_length' must be >= 1, got {n_in}")
            if not math.isfinite(ts) or ts < 0:
                raise TraceError(f"{path}:{line_no}: field 'timestamp' must be a finite number of ms >= 0, got {ts}")
            if n_out < 0:
                raise TraceError(f"{path}:{line_no}: field 'output_length' must be >= 0, got {n_out}")
            if n_out < 1:
                n_out = 1  # a request always samples at least one token
            check_hash_count(ids, n_in, trace_block_tokens, path, line_no)  # the ids' values were checked above
            if last_ts is not None and ts < last_ts:
                raise TraceError(f"{path}:{line_no}: field 'timestamp' goes backwards ({ts} after {last_ts})")
            last_ts = ts
            hashes = sub_block_hashes(ids, per_block, n_in // block_size)
            # NOTE: token identities for token-granular caches: trace block h is the tokens (h, 0..511); the last
            # block has only the prompt's remaining tokens (a partial block's id names those tokens).
            last = n_in - (len(ids) - 1) * trace_block_tokens
            runs = (*zip(ids[:-1], repeat(trace_block_tokens)), (ids[-1], last))
            yield TraceRequest(ts / 1000.0 / speed, Request(
                request_id=rid, prompt_tokens=n_in, output_tokens=n_out, block_hashes=hashes,
                num_shareable_tokens=0, prefix_id=ids[0] if ids else None, token_runs=runs,
            ))
            rid += 1
        if rid == first_request_id:
            raise TraceError(f"{path}: no requests (an empty trace; {line_no} line(s))")


def _no_constant(name: str):
    raise TraceError(f"{name} is not a number a trace may hold")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""What `json.loads(text, parse_constant=_no_constant)` builds anew for every call (a decoder and its scanner: about
as much as parsing a Mooncake line), built once."""


def _lines(handle, path: Path) -> Iterator[str]:
    """The file's lines, or TraceError naming the line that is not UTF-8."""
    line_no = 0
    while True:
        line_no += 1
        try:
            text = handle.readline()
        except UnicodeDecodeError as err:
            raise TraceError(f"{path}:{line_no}: not UTF-8 text (byte {err.start} of the chunk read)") from None
        if not text:
            return
        yield text
