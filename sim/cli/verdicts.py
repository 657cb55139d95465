"""What compare, tune and plan router say about their answers: whether a winner is separated from the runner-up
(THE RULE of `sim.results.stats`: 95 % intervals that do not overlap), constraints judged with the interval, the
objective named, and kvsim's own policy marked wherever routers are listed or compared.

Only wording lives here; the decisions are `sim.results.stats.standing` / `against_limit` and
`sim.studies.tune.settle`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sim.results.stats import Interval, Standing
from sim.routing.spec import split_router_spec
from sim.scenario import ScenarioError
from sim.studies.tune import Constraint, Objective, Trial, Verdict

OWN_MARK = "†"
OWN_POLICY_NOTE = (f"{OWN_MARK} kvsim's own policy (policies/kvsim_router.py): a design kvsim proposes, not a router "
                   "product one can deploy")
OWN_POLICY_FIGURE_NOTE = f"{OWN_MARK} kvsim's own policy, not a router product one can deploy"
"""The same, short enough for a figure's title."""


def own_policy(spec: str) -> bool:
    """Whether the router of `spec` (NAME or NAME:key=value,...) is kvsim's own policy, not a product's."""
    from sim.runner import router_class

    try:
        return bool(router_class(split_router_spec(spec)[0]).own_policy)
    except ScenarioError:
        return False


def marked(spec: str) -> str:
    """`spec` with the mark of kvsim's own policy after its name (for tables and figure labels, never for --router
    text to paste)."""
    if not own_policy(spec):
        return spec
    name, colon, options = spec.partition(":")
    return f"{name}{OWN_MARK}{colon}{options}"


def own_policy_note(specs: Sequence[str], *, figure: bool = False) -> str | None:
    """The legend line for the mark (shorter for a figure), when one of `specs` carries it."""
    if not any(own_policy(s) for s in specs):
        return None
    return OWN_POLICY_FIGURE_NOTE if figure else OWN_POLICY_NOTE


def pm(interval: Interval, spec: str) -> str:
    """`mean ± half-width` ('-' without a mean; no ± with one run)."""
    if math.isnan(interval.mean):
        return "-"
    return format(interval.mean, spec) + ("" if math.isnan(interval.half_width) else f" ± {format(interval.half_width, spec)}")


def spec_for(column: str, value: float) -> str:
    """How a column's values print: latencies and large values whole, rates to 3 decimals."""
    return ".0f" if column.endswith("_ms") or abs(value) >= 100 else ".3f"


def repeats_text(needed: float, who: str = "them") -> str:
    """The estimate of `stats.repeats_to_separate`, as a clause: 'about 12 repeats each would separate {who} ...'."""
    if math.isnan(needed):
        return ""
    if math.isinf(needed):
        return "their means are equal or too close for any practical number of repeats to separate them"
    return f"about {int(needed):,} repeats each would separate {who} (an estimate from the observed means and sds)"


def names(items: Sequence[str], at_most: int = 5) -> str:
    """'a', 'a and b', 'a, b and c', 'a, b, c, d, e and 3 more'."""
    items = list(items)
    if len(items) > at_most:
        items = [*items[:at_most], f"{len(items) - at_most} more"]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def lead_text(metric: str, labels: Sequence[str], intervals: Sequence[Interval], leader: int, st: Standing,
              others: Sequence[int], repeats: int, *, what: str = "candidates") -> str:
    """One line on the leader of `metric` among `labels` (its standing `st` against `others`, indices into labels):
    separated from the runner-up, or indistinguishable from the top candidates and how many repeats would tell."""
    value = lambda i: f"{labels[i]} {pm(intervals[i], spec_for(metric, intervals[i].mean))}"  # noqa: E731
    if not others:
        return f"{metric}: {value(leader)}, the only one of the {what}"
    if st.settled is None:
        return (f"{metric}: highest on the mean {value(leader)}, but {repeats} run{'s' * (repeats != 1)} give no "
                "interval to tell it from the others: give --repeats 3 or more")
    if st.settled:
        runner = min(others, key=lambda i: abs(intervals[i].mean - intervals[leader].mean))
        return (f"{metric}: {value(leader)} leads, separated from the runner-up {value(runner)} beyond the 95 % "
                "intervals")
    tied = [others[i] for i in st.tied]
    clause = repeats_text(st.repeats_to_separate, "them" if len(tied) == 1 else f"{labels[leader]} from the others")
    return (f"{metric}: not settled: {names([value(leader), *(value(i) for i in tied)])} are indistinguishable at "
            f"{repeats} repeats (their 95 % intervals overlap)" + (f"; {clause}" if clause else ""))


def constraint_text(c: Constraint, trial: Trial) -> str:
    """`c` judged with the trial's interval, e.g. 'ttft_p99_ms<=250 undecided (226 ± 108 straddles 250)'."""
    iv = trial.interval(c.column)
    status = c.status(iv)
    value = pm(iv, spec_for(c.column, iv.mean))
    if status == "undecided":
        why = "one run: no interval" if math.isnan(iv.half_width) and not math.isnan(iv.mean) else "straddles"
        return f"{c.text()} undecided ({value} {why} {c.bound:g})" if why == "straddles" else (
            f"{c.text()} undecided ({value}: {why})")
    return f"{c.text()} {status} ({value}: the whole interval {'meets' if status == 'met' else 'fails'} it)"


def settled_text(v: Verdict, label: Sequence[str], repeats: int, what: str, kind: tuple[str, str] = ("", "")) -> str:
    """The verdict of an answer (tune's trial or plan's router) against its contenders, as one sentence;
    `label[i]` names candidate i (e.g. '7', 'kvsim†'), `kind` what goes before one label and before several
    (('trial ', 'trials ')), `what` the candidates ('settings', 'routers')."""
    metric = v.metric.column

    def some(indices: Sequence[int]) -> str:
        return kind[len(indices) > 1] + names([label[i] for i in indices])

    if not v.contenders:
        return (f"the only {what[:-1]} tried" if len(v.candidates) == 1
                else f"every other {what[:-1]} fails the constraints over its whole interval")
    if v.settled is None:
        return (f"{repeats} run{'s' * (repeats != 1)} per {what[:-1]} give no interval, so nothing separates it from "
                f"the other {what}: give --repeats 3 or more")
    parts = []
    if v.settled:
        parts.append(f"separated from every other {what[:-1]} on {metric} beyond the 95 % intervals")
    if v.tied:
        clause = repeats_text(v.repeats_to_separate, "them" if len(v.tied) == 1 else "it from them")
        parts.append(f"not settled: {some(v.tied)} "
                     f"{'is' if len(v.tied) == 1 else 'are'} indistinguishable from it on {metric} at {repeats} "
                     "repeats (95 % intervals overlap)" + (f"; {clause}" if clause else ""))
    if v.ahead:
        parts.append(f"{some(v.ahead)} {'has' if len(v.ahead) == 1 else 'have'} a "
                     f"{'higher' if v.metric.maximize else 'lower'} {metric} beyond the intervals but constraints "
                     "that are undecided")
    return "; ".join(parts)


def safe_text(v: Verdict, label: Sequence[str], what: str, kind: str = "") -> str:
    """When the answer's constraints are undecided: which candidate surely meets them (the whole interval), if any."""
    if v.status != "undecided":
        return ""
    if v.best_met is None:
        return f"no {what[:-1]} meets the constraints over the whole interval"
    iv = v.candidates[v.best_met].interval(v.metric.column)
    return (f"the best that meets the constraints over the whole interval: {kind}{label[v.best_met]} "
            f"({v.metric.column} {pm(iv, spec_for(v.metric.column, iv.mean))})")


def objective_text(objective: Objective, *, defaulted: bool) -> str:
    """The objective named as a user reads it, e.g. 'maximize:throughput_rps (throughput, the default without an
    SLO)'."""
    plain = {"throughput_rps": "throughput, requests/s", "goodput_rps": "goodput, requests/s meeting the SLO",
             "request_hit_rate": "request hit rate"}.get(objective.column, "")
    why = ("the default without an SLO; with --slo it is goodput" if objective.column == "throughput_rps"
           else "the default with an SLO set") if defaulted else ""
    inside = "; ".join(x for x in (plain, why) if x)
    return objective.text() + (f" ({inside})" if inside else "")
