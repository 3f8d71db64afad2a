"""Channel widths chosen by the NPU: each layer's cycle staircase learned from Vela, and the per-group widths
that buy the most cycles for the least expected loss, toward a cycle budget.

Every group of channels (:func:`edgedeploy.keras.channel_surgery.channel_groups`) has a few candidate widths
(:data:`FRACTIONS` of its width, or the coarser :data:`GRIDS` the recipe's ``thin_candidates`` asks for, rounded
down to the NPU-friendly step of :func:`candidate_widths`). An operator's cycles depend on the widths of the group
it reads and the group it writes, so the groups are coloured (no operator reads and writes groups of one colour)
and the candidate models are the rows of an orthogonal array: in 25 compiles (9 for three widths a group, 4 for
two) every pair of widths meets on every pair of colours, so every operator's
cycles are measured at every (input width, output width) it can take. The model's predicted cycles are the
sum of its operators' measured cycles (plus what no operator names); :func:`choose` finds the widths of least
expected loss whose prediction meets the budget on every target; :func:`shortlist` adds the choices of least
expected loss predicted just over it, which the caller compiles together to take the best Vela puts within it;
:func:`alternatives` gives the choices a short fine-tuning tries against the one taken.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

FRACTIONS = (1.0, 0.875, 0.75, 0.625, 0.5)  # the candidate widths, as fractions of a group's width
N = len(FRACTIONS)  # a prime: the orthogonal array below has N * N rows and up to N + 1 columns
# candidate widths a group (the recipe's thin_candidates) -> their fractions; each count a prime, for the array
GRIDS = {5: FRACTIONS, 3: (1.0, 0.75, 0.5), 2: (1.0, 0.5)}


STEPS = (8, 4, 2, 1)  # channel steps of the candidate widths: the NPU's OFM block depth (8) first


def candidate_widths(size: int, multiple: int = 1, count: int = N) -> list[int]:
    """The ``count`` (:data:`GRIDS`) candidate widths of a group of ``size`` channels, widest first: each fraction
    rounded down to a multiple of the largest step of :data:`STEPS` that keeps the widths distinct (a 64-wide
    group: 64, 56, 48, 40, 32; 32: 32, 28, 24, 20, 16; 16: 16, 14, 12, 10, 8), never below one step. Steps below
    ``multiple`` are not taken while ``size`` allows one (2:4 sparsity: 4, else Ethos-U85 runs the layers
    reading the group dense)."""
    steps = [s for s in STEPS if s >= multiple and s <= size] or [1]
    for step in steps:
        widths = [size] + [max(step, int(size * f) // step * step) for f in GRIDS[count][1:]]
        if len(set(widths)) == len(widths):
            return widths
    return widths


def orthogonal_rows(colours: int, n: int = N) -> list[tuple[int, ...]]:
    """An orthogonal array OA(n*n, colours, n, 2) for a prime ``n``: every pair of columns holds every pair of
    values once."""
    if colours > n + 1:
        raise ValueError(f"at most {n + 1} colours")
    rows = []
    for i in range(n):
        for j in range(n):
            row = [i, j] + [(i + k * j) % n for k in range(1, n)]
            rows.append(tuple(row[:colours]))
    return rows


def colour_groups(groups: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """A greedy colouring of the groups: the two groups of an edge (an operator's input and output) differ."""
    near: dict[str, set[str]] = {g: set() for g in groups}
    for a, b in edges:
        if a != b and a in near and b in near:
            near[a].add(b)
            near[b].add(a)
    colours: dict[str, int] = {}
    for g in sorted(groups, key=lambda g: -len(near[g])):
        taken = {colours[n] for n in near[g] if n in colours}
        colours[g] = next(c for c in range(len(groups) + 1) if c not in taken)
    return colours


@dataclass
class Staircase:
    """Measured cycles per operator row at each (input value, output value), per target."""

    groups: list[str]
    widths: dict[str, list[int]]  # group -> candidate widths (value index -> width)
    colours: dict[str, int]
    ops: list[tuple[str | None, str | None]]  # per operator row: (group read, group written)
    cycles: dict[str, list[dict[tuple[int, int], float]]] = field(default_factory=dict)  # target -> row -> cost
    rest: dict[str, float] = field(default_factory=dict)  # target -> cycles no operator row names
    full: dict[str, float] = field(default_factory=dict)  # target -> NPU cycles at full width (the ptq model)

    def predict(self, target: str, values: Mapping[str, int]) -> float:
        total = self.rest[target]
        for row, (gin, gout) in enumerate(self.ops):
            key = (values.get(gin, 0) if gin else 0, values.get(gout, 0) if gout else 0)
            table = self.cycles[target][row]
            total += table.get(key, _nearest(table, key))
        return total

    def values(self, group: str) -> range:
        """The value indices of ``group``'s candidate widths."""
        return range(len(self.widths[group]))


def _nearest(table: dict[tuple[int, int], float], key: tuple[int, int]) -> float:
    if not table:
        return 0.0
    return table[min(table, key=lambda k: abs(k[0] - key[0]) + abs(k[1] - key[1]))]


def learn(assignments: list[dict[str, int]], measured: Mapping[str, list[dict[str, Any]]],
          stair: Staircase) -> None:
    """Fill ``stair``'s tables from the grid's compiles: ``measured[target][i]`` holds ``npu_cycles`` and
    ``rows`` (each operator row's cycles, in the order of ``stair.ops``) of the model built with
    ``assignments[i]`` (group -> value index)."""
    for target, runs in measured.items():
        tables: list[dict[tuple[int, int], list[float]]] = [{} for _ in stair.ops]
        rests = []
        for values, run in zip(assignments, runs):
            rows = run["rows"]
            for r, (gin, gout) in enumerate(stair.ops):
                key = (values.get(gin, 0) if gin else 0, values.get(gout, 0) if gout else 0)
                tables[r].setdefault(key, []).append(rows[r])
            rests.append(run["npu_cycles"] - sum(rows))
            if all(v == 0 for v in values.values()):
                stair.full[target] = float(run["npu_cycles"])
        stair.cycles[target] = [{k: float(np.mean(v)) for k, v in t.items()} for t in tables]
        stair.rest[target] = float(np.mean(rests)) if rests else 0.0


EXHAUSTIVE = 50_000  # width choices searched one by one when there are at most this many


def _choices(stair: Staircase, free: Sequence[str]) -> int:
    return int(np.prod([len(stair.widths[g]) for g in free]))


def choose(stair: Staircase, budgets: Mapping[str, float], drops: Mapping[str, Sequence[float]],
           fixed: Mapping[str, int] | None = None) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Value index per group of least expected loss (the sum of ``drops[group][value]``) whose predicted cycles are
    within the budget on every target; the one of fewest cycles (worst target's prediction / budget) when none
    is. Every choice is tried when there are at most :data:`EXHAUSTIVE`; else greedily: from full width, the step
    (any narrower width of one group) that lowers the worst target's prediction / budget the most per unit of
    expected loss, until the budget is met, then each group widened back while it still is.
    Returns the choice and the steps of the greedy search (empty when exhaustive)."""
    fixed = dict(fixed or {})
    free = [g for g in stair.groups if g not in fixed]

    def worst(v):
        return max(stair.predict(t, v) / budgets[t] for t in budgets)

    def loss(v):
        return sum(drops[g][v[g]] for g in free)

    if _choices(stair, free) <= EXHAUSTIVE:
        best, best_key = None, None
        for combo in itertools.product(*(stair.values(g) for g in free)):
            values = {**fixed, **dict(zip(free, combo))}
            w = worst(values)
            key = (0, loss(values), w) if w <= 1.0 else (1, w, loss(values))
            if best_key is None or key < best_key:
                best, best_key = values, key
        assert best is not None  # (the product holds at least one choice)
        return best, []
    values = {g: 0 for g in stair.groups}
    values.update(fixed)
    steps: list[dict[str, Any]] = []
    while worst(values) > 1.0:
        step, best_gain = None, 0.0
        now = worst(values)
        for g in free:
            for v in range(values[g] + 1, len(stair.widths[g])):
                bought = now - worst({**values, g: v})
                cost = max(1e-6, drops[g][v] - drops[g][values[g]])
                if bought > 0 and bought / cost > best_gain:
                    step, best_gain = (g, v), bought / cost
        if step is None:
            break
        values[step[0]] = step[1]
        steps.append({"group": step[0], "width": stair.widths[step[0]][step[1]],
                      "predicted": {t: round(stair.predict(t, values)) for t in budgets}})
    for g in sorted(free, key=lambda g: -drops[g][values[g]]):  # give back what the budget does not need
        while values[g] > 0 and worst({**values, g: values[g] - 1}) <= 1.0:
            values[g] -= 1
    return values, steps


SHORTLIST = 8  # choices compiled together to check the prediction
SLACK = 0.03  # how far over the budget a choice may be predicted and still be compiled (the prediction's error)


def shortlist(stair: Staircase, budgets: Mapping[str, float], drops: Mapping[str, Sequence[float]],
              fixed: Mapping[str, int] | None = None, count: int = SHORTLIST, slack: float = SLACK
              ) -> list[dict[str, int]]:
    """Up to ``count`` choices to compile, least expected loss first: :func:`choose`'s, then those of least
    expected loss predicted within ``1 + slack`` times the budget on every target (every choice when there are at
    most :data:`EXHAUSTIVE`, else the neighbours of :func:`choose`'s: one group a step wider, or one wider and
    another a step narrower). The prediction misses Vela by a few percent either way, so the choice that
    uses the budget best is found by compiling these, not by the prediction alone."""
    fixed = dict(fixed or {})
    free = [g for g in stair.groups if g not in fixed]
    first, _ = choose(stair, budgets, drops, fixed)

    def worst(v):
        return max(stair.predict(t, v) / budgets[t] for t in budgets)

    def loss(v):
        return sum(drops[g][v[g]] for g in free)

    pool: Iterable[dict[str, int]]
    if _choices(stair, free) <= EXHAUSTIVE:
        pool = ({**fixed, **dict(zip(free, combo))} for combo in itertools.product(*(stair.values(g) for g in free)))
    else:
        wider = [{**first, g: first[g] - 1} for g in free if first[g] > 0]
        pool = wider + [{**w, h: w[h] + 1} for w in wider for h in free if w[h] + 1 < len(stair.widths[h])]
    ranked = sorted(((loss(v), worst(v), tuple(v[g] for g in stair.groups)) for v in pool), key=lambda r: r[:2])
    out = [first]
    for _loss, w, key in ranked:
        if len(out) >= count:
            break
        values = dict(zip(stair.groups, key))
        if w <= 1.0 + slack and values not in out:
            out.append(values)
    return out


def alternatives(stair: Staircase, budgets: Mapping[str, float], drops: Mapping[str, Sequence[float]],
                 first: Mapping[str, int], fixed: Mapping[str, int] | None = None, count: int = SHORTLIST
                 ) -> list[dict[str, int]]:
    """Up to ``count`` choices to try against ``first`` by fine-tuning, least expected loss first: for each free
    group, the choice of least expected loss predicted within the budget on every target that gives the group
    another width than ``first`` does (:func:`choose` with the group held at each other width). The expected
    loss adds what each group costs alone, one-shot; it can rank a choice that narrows one group far below one
    that narrows several a little, while fine-tuning recovers the first better. One alternative per group keeps
    every group's other widths in play at a cost of at most one fine-tuning per group."""
    fixed = dict(fixed or {})
    free = [g for g in stair.groups if g not in fixed]

    def met(v):
        return all(stair.predict(t, v) <= budgets[t] for t in budgets)

    def loss(v):
        return sum(drops[g][v[g]] for g in free)

    def key(v):
        return tuple(stair.widths[g][v[g]] for g in stair.groups)

    found: dict[tuple[int, ...], dict[str, int]] = {}
    for g in free:
        best = None
        for v in stair.values(g):
            if stair.widths[g][v] == stair.widths[g][first[g]]:
                continue
            values, _ = choose(stair, budgets, drops, {**fixed, g: v})
            values = {h: values[h] for h in stair.groups}
            if met(values) and (best is None or loss(values) < loss(best)):
                best = values
        if best is not None and key(best) != key(first):
            found.setdefault(key(best), best)
    return sorted(found.values(), key=lambda v: (loss(v), key(v)))[:count]
