"""How far a requirement check misses, and which leaf comes closest to a requirement no leaf meets.

A check is one entry of a row's ``requirements``: ``met`` (True, False, or None when it cannot be judged), and
when missed ``excess`` (value - limit, in the check's unit) and ``excess_pct``. One measure serves the report
(per target), the walk (a leaf on every target) and the messages that name the closest leaf.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from edgedeploy.core.units import fmt_in_unit

T = TypeVar("T")


def shortfall(check: Mapping[str, Any]) -> float:
    """How far a check misses, relative to its limit (the excess itself without a limit): 0 when met, infinitely
    far when it cannot be judged or says not by how much."""
    if check.get("met") is True:
        return 0.0
    if check.get("met") is None or check.get("excess") is None:
        return math.inf
    limit = check.get("limit")
    return check["excess"] / limit if limit else check["excess"]


def describe_miss(name: str, check: Mapping[str, Any], leaf: str, target: str | None = None) -> str:
    """One line on the check ``name`` that ``leaf`` (on ``target``, for a judgment across targets) misses."""
    who = leaf if target is None else f"{leaf} on {target}"
    if name == "fits_board" and check.get("met") is False:
        return f"{name}: {who} does not fit ({check.get('why')})"
    if check.get("met") is None or check.get("excess") is None:
        return f"{name}: {who}{'' if target is None else ':'} {check.get('why', 'cannot be judged')}"
    unit = check.get("unit", "")
    pct = check.get("excess_pct")
    return (
        f"{name} {fmt_in_unit(check['limit'], unit)}: closest is {who} with {fmt_in_unit(check['value'], unit)}, "
        f"over by {fmt_in_unit(check['excess'], unit)}" + (f" ({pct:.1f}%)" if pct is not None else "")
    )


def miss_entry(name: str, check: Mapping[str, Any], leaf: str, target: str | None = None) -> dict[str, Any]:
    """A requirement no leaf meets, as the report and the walk record it: the closest leaf and its miss."""
    return {"requirement": name, "closest_leaf": leaf, **({} if target is None else {"target": target}),
            "limit": check.get("limit"), "value": check.get("value"), "excess": check.get("excess"),
            "excess_pct": check.get("excess_pct"), "unit": check.get("unit", ""),
            "text": describe_miss(name, check, leaf, target)}


def closest_misses(names: Iterable[str], candidates: Sequence[T],
                   check_of: Callable[[T, str], Mapping[str, Any] | None],
                   order: Callable[[T], Any]) -> list[tuple[str, T, Mapping[str, Any]]]:
    """For each requirement of ``names`` that no candidate meets: (name, the candidate that misses it least, its
    check). ``check_of(candidate, name)`` is the candidate's check (None: it has none, and is left out); ties go
    to the candidate ``order`` ranks first."""
    out = []
    for name in names:
        checks = [(c, k) for c in candidates for k in [check_of(c, name)] if k is not None]
        if not checks or any(k.get("met") is True for _, k in checks):
            continue
        c, k = min(checks, key=lambda ck: (shortfall(ck[1]), order(ck[0])))
        out.append((name, c, k))
    return out
