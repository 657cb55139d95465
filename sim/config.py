"""The base of every configuration model (scenario sections, engine specs): unknown keys are errors, values frozen,
and no infinite or NaN number gets in (it would reach the event loop: an infinite step time never ends). The one
grammar of `k=v` lists, and how a model's validation errors are told (`validation_problems`: every problem, where it
is, the nearest valid name), for scenario files and router options alike."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Tag, ValidationError

GIB = 1 << 30
"""Bytes per GiB: what every `*-gib` option and field is multiplied by."""


class ConfigModel(BaseModel):
    # NOTE: defer_build: a model's validator is built when it first validates (or is asked for its schema), not when
    # its class is defined. Built at import, the ~50 section models cost every command ~50 ms, most of them for
    # sections the command never validates on their own; the same rules either way.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


def key_value(item: str, form: str = "key=value") -> tuple[str, str]:
    """One `key=value` item as (key, value), both stripped (the value may be empty: what it may be is the caller's
    rule); a one-line ValueError naming the item and `form`, the allowed form, when it has no `=` or no key."""
    key, eq, value = (s.strip() for s in item.partition("="))
    if not eq or not key:
        raise ValueError(f"{item.strip()!r} is not {form}")
    return key, value


def key_values(text: str, form: str = "key=value,...") -> dict[str, str]:
    """A comma-separated `key=value,key=value` list as {key: value} in the order given (empty items skipped): the
    one grammar of every `k=v` list (`--slo`, `--tolerance`, router options, search spaces). A one-line ValueError
    names the item that is not `key=value` (with `form`, the allowed form) or the key given twice."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, value = key_value(item, form)
        if key in pairs:
            raise ValueError(f"{key}: given twice")
        pairs[key] = value
    return pairs


# ---- what is wrong with an input: every problem, where it is and the nearest valid name ----------------------------

Loc = tuple[str | int, ...]
"""Where in an input a problem is: the keys and list indices leading to it, as the input writes them."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an input: `loc` (empty: the input as a whole) and `message`, which says why."""

    loc: Loc
    message: str

    def text(self) -> str:
        """`engine.block_size: Input should be ...`, or the message alone for the whole input."""
        return f"{dotted(self.loc)}: {self.message}" if self.loc else self.message


class ProblemsError(ValueError):
    """Bad input, with every problem found in `problems`; its text is them all on one line, `; `-separated."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(p.text() for p in self.problems))


def dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


def nearest(name: str, allowed: Iterable[str]) -> str | None:
    """The allowed name closest to a misspelt `name` (difflib's ratio >= 0.7: its default 0.6 takes `trtllm` for
    `vllm`), or None."""
    close = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.7)
    return close[0] if close else None


def suggestion(name: str, allowed: Iterable[str]) -> str:
    """What to tell a user who gave the unknown `name`: `did you mean X?` (the nearest allowed name), else the list."""
    allowed = list(allowed)
    near = nearest(name, allowed)
    return f"did you mean {near}?" if near else f"allowed: {', '.join(allowed) or 'none'}"


def validation_problems(err: ValidationError, model: type[BaseModel], *, noun: str = "key") -> list[Problem]:
    """Every problem of pydantic's `err` (from validating `model`), each located as the input writes it.

    * A union's tags leave the location (`engine.vllm.block_size` is the file's `engine.block_size`), and a union
      member's type mismatch is dropped when another member got further (a mapping given for `int | LengthSpec`
      is judged as a LengthSpec); when no member did, their mismatches are one problem.
    * An unknown key (`unknown {noun}`) names the section's nearest field (`did you mean kv_cache_bytes?`), or its
      fields when none is near. When a section has an unknown key and misses a required one, the unknown one is
      said to be probably the missing one misspelt (a pair by name, or the only two), and the missing one says so.
    """
    walked = [(e, _walk(model, tuple(e["loc"]))) for e in err.errors()]
    went_deeper = {(w.union_at, w.tag) for _, w in walked if w.union_at is not None and not w.ends_at_tag}
    mismatches: dict[Loc, list[str]] = {}
    kept: list[tuple[dict, _Walk]] = []
    for e, w in walked:
        if w.ends_at_tag:
            if any(at == w.union_at and tag != w.tag for at, tag in went_deeper):
                continue
            if w.union_at in mismatches:
                mismatches[w.union_at].append(_message(e))
                continue
            mismatches[w.union_at] = [_message(e)]
        kept.append((e, w))
    misspelt = _pair_misspellings([w.loc for e, w in kept if e["type"] == "extra_forbidden"],
                                  [w.loc for e, w in kept if e["type"] == "missing"])
    problems = []
    for e, w in kept:
        if w.ends_at_tag:
            message = "; or ".join(dict.fromkeys(mismatches[w.union_at]))
        elif e["type"] == "extra_forbidden":
            key, fields = str(w.loc[-1]), w.section_fields
            if w.loc in misspelt:
                message = f"unknown {noun}; probably the required {misspelt[w.loc][-1]}, misspelt"
            else:
                message = f"unknown {noun}" + ("" if fields is None else f"; {suggestion(key, fields)}")
        elif e["type"] == "missing" and w.loc in misspelt.values():
            typo = next(k for k, v in misspelt.items() if v == w.loc)
            message = f"{_message(e)}; probably given misspelt, as {typo[-1]}"
        else:
            message = _message(e)
        problems.append(Problem(w.loc, message))
    return problems


def _message(error: dict) -> str:
    return error["msg"].removeprefix("Value error, ")


def _pair_misspellings(unknown: Iterable[Loc], missing: Iterable[Loc]) -> dict[Loc, Loc]:
    """{an unknown key's loc: the loc of the missing key (same section) it probably misspells}."""
    pairs: dict[Loc, Loc] = {}
    for section in {loc[:-1] for loc in unknown}:
        typos = [loc for loc in unknown if loc[:-1] == section]
        wanted = {str(loc[-1]): loc for loc in missing if loc[:-1] == section}
        if len(typos) == 1 and len(wanted) == 1:
            pairs[typos[0]] = next(iter(wanted.values()))
            continue
        for loc in typos:
            near = nearest(str(loc[-1]), wanted)
            if near is not None:
                pairs[loc] = wanted.pop(near)
    return pairs


@dataclass(slots=True)
class _Walk:
    loc: Loc = ()
    section_fields: list[str] | None = None  # the fields of the model the last key was looked up in
    union_at: Loc | None = None  # where the last union the walk entered is (its loc, tags left out)
    tag: str | None = None  # the union member it entered
    ends_at_tag: bool = False  # the error is about the union member as a whole (its type)


def _walk(model: type[BaseModel], raw: Loc) -> _Walk:
    """Follow pydantic's error location `raw` through `model`'s field types: the location without union tags, and
    the fields of the section its last key is in."""
    walk = _Walk()
    loc: list[str | int] = []
    current: Any = model
    for i, part in enumerate(raw):
        members = _members(current)
        if len(members) > 1 and isinstance(part, str):  # pydantic names the union member it tried
            walk.union_at, walk.tag, walk.ends_at_tag = tuple(loc), part, i == len(raw) - 1
            # a member with a validator is named as its wrapper: `function-after[_check(), LengthSpec]`
            name = part[:-1].split(", ")[-1] if part.endswith("]") else part
            current = next((t for tags, t in members if part in tags or name in tags), None)
            continue
        current = members[0][1] if members else None
        origin = get_origin(current)
        walk.section_fields = None
        if isinstance(part, int) and origin in (list, tuple):
            current = get_args(current)[0] if get_args(current) else None
        elif isinstance(part, str) and isinstance(current, type) and issubclass(current, BaseModel):
            walk.section_fields = list(current.model_fields)
            field = current.model_fields.get(part)
            current = None if field is None else field.annotation
        elif origin is dict:
            current = get_args(current)[1] if get_args(current) else None
        else:
            current = None
        loc.append(part)
    walk.loc = tuple(loc)
    return walk


def _members(tp: Any) -> list[tuple[set[str], Any]]:
    """The alternatives of a (possibly Annotated, Optional) type, each with the tags pydantic may name it by."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *meta = get_args(tp)
        tags = {m.tag for m in meta if isinstance(m, Tag)}
        return [(names | tags, t) for names, t in _members(base)]
    if origin in (Union, UnionType):
        return [m for arg in get_args(tp) if arg is not type(None) for m in _members(arg)]
    names = {getattr(tp, "__name__", str(tp)), str(tp)}
    if isinstance(tp, type) and issubclass(tp, BaseModel) and "kind" in tp.model_fields:
        names |= {str(v) for v in get_args(tp.model_fields["kind"].annotation)}
    return [(names, tp)]


def named_registry(noun: str, classes: Sequence[Any], *, taken: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One plugin family's registry, `{cls.name: cls}` in the order given, loud on an empty or repeated name (or one
    already in `taken`, another family that shares the namespace): routers, disaggregated routers, autoscalers."""
    registry: dict[str, Any] = {}
    for cls in classes:
        if not cls.name or cls.name in registry or (taken is not None and cls.name in taken):
            raise RuntimeError(f"{noun} name {cls.name!r} is empty or registered twice")
        registry[cls.name] = cls
    return registry


class LazyRegistry(Mapping[str, Any]):
    """One plugin family's registry whose classes are imported when first looked up: `{name: "module:Class"}` in the
    order given, read as `{name: cls}` (a `Mapping`: `registry[name]`, `get`, `in`, iteration and `len` as a dict's).

    Names, membership, iteration and `len` import nothing; `registry[name]` imports the one module that defines the
    class (so a command that runs one router loads one router's module, not all of them), and `items()`/`values()`
    import every one (a listing of all the routers). Loud, as `named_registry`, on an empty or repeated name (or one
    already in `taken`), and on a class whose own `name` is not the name it is registered under.
    """

    def __init__(self, noun: str, entries: Sequence[tuple[str, str]], *, taken: Mapping[str, Any] | None = None):
        self._noun = noun
        self._paths: dict[str, str] = {}
        for name, path in entries:
            if not name or name in self._paths or (taken is not None and name in taken):
                raise RuntimeError(f"{noun} name {name!r} is empty or registered twice")
            self._paths[name] = path
        self._classes: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        cls = self._classes.get(name)
        if cls is None:
            module, _, attr = self._paths[name].partition(":")  # an unknown name: KeyError, as a dict's
            cls = getattr(importlib.import_module(module), attr)
            if cls.name != name:
                raise RuntimeError(f"{self._noun} {self._paths[name]} is named {cls.name!r}, registered as {name!r}")
            self._classes[name] = cls
        return cls

    def __contains__(self, name: object) -> bool:
        return name in self._paths

    def __iter__(self):
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __repr__(self) -> str:
        return f"LazyRegistry({self._noun!r}, {list(self._paths)})"
