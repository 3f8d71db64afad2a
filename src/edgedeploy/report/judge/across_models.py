"""(model, leaf) pairs of a sweep judged against each other: one overall recommendation per target.

Among the pairs that meet the requirements, those no other meeting pair beats on quality, flash and latency at
once are the candidates; of them the least optimized, then the best quality, then the smaller flash (as
:mod:`.recommend` does within one model). Quality across models is the accuracy, or the task metric itself
signed by its direction (:func:`.pareto.quality_across_models`). Models judged by different metrics, or
measured on different data, are not ranked against each other (:func:`comparable`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from edgedeploy.core.units import fmt_bytes

from .pareto import objectives, pair_rank, quality_across_models, undominated


def comparable(models: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """Whether the models' leaves can be ranked against each other on quality, and why not."""
    judged = [m for m in models if m.get("measure")]
    if len(judged) < 2:
        return True, ""
    names = {m["measure"]["name"] for m in judged}
    if len(names) > 1:
        shown = ", ".join(f"{m['name']} by {m['measure']['name']}" for m in judged)
        return False, (f"the models are judged by different metrics ({shown}): their leaves are not ranked "
                       "against each other on quality")
    # the same evaluation samples: the same clips and classes (``eval_set``, even through different front ends),
    # else the same file and split
    data = {d.get("eval_set") or (d.get("sha256"), d.get("eval_split")) for m in judged for d in [m.get("data") or {}]}
    if len(data) > 1 or any(k is None or (isinstance(k, tuple) and k[0] is None) for k in data):
        shown = ", ".join(f"{m['name']}: {Path(str((m.get('data') or {}).get('path'))).name}" for m in judged)
        return False, (f"the models were scored on different data ({shown}): their {next(iter(names))} is not "
                       "ranked across models")
    return True, ""


def _point(row: Mapping[str, Any]) -> tuple[float, float, float]:
    return objectives(row, quality_across_models)


def overall(rows: list[dict[str, Any]], target: str, ok: bool, why: str,
            models: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The overall recommendation on ``target`` among the sweep's rows (``ok``: the models are comparable, else
    ``why`` not); marks each row's ``front`` and the chosen row's ``overall``."""
    group = [r for r in rows if r["target"] == target]
    own = "; ".join(f"{m['name']}: {(m['recommendations'].get(target) or {}).get('leaf') or 'none'}"
                    for m in models if m.get("recommendations") is not None)
    if not ok:
        for r in group:
            r["front"] = None
        return {"target": target, "model": None, "leaf": None, "front": [],
                "message": f"no overall recommendation on {target}: {why}; each model's own: {own or 'none'}"}
    judged = [r for r in group if quality_across_models(r) is not None and math.isfinite(sum(_point(r)[1:]))]
    on_front = {id(r) for r in undominated(judged, _point)}
    in_judged = {id(r) for r in judged}
    for r in group:
        r["front"] = None if id(r) not in in_judged else id(r) in on_front
    front = sorted((r for r in judged if r["front"]), key=pair_rank)
    meeting = [r for r in judged if r.get("meets_requirements") in (True, None)]
    if not meeting:
        return {"target": target, "model": None, "leaf": None, "front": [f"{r['model']}/{r['leaf']}" for r in front],
                "message": f"no (model, leaf) meets the requirements on {target}"}
    best = min(undominated(meeting, _point), key=pair_rank)
    best["overall"] = True
    q = quality_across_models(best)
    measure = next((m["measure"] for m in models if m["name"] == best["model"] and m.get("measure")), None) or {}
    shown_q = "" if q is None else (f"{q:.2f}% accuracy" if measure.get("name") == "accuracy" else
                                    f"int8 {measure.get('name')} {abs(q):.4g}")
    flash = best["values"]["compiled_model_bytes"]["value"]
    latency = (best["values"].get("latency_ms") or {}).get("value")
    why_not = ("; no requirements set: the least-optimized pair no other beats on quality, flash and latency"
               if all(r.get("meets_requirements") is None for r in group) else
               "; the least-optimized pair meeting the requirements that no other meeting pair beats on quality, "
               "flash and latency")
    return {"target": target, "model": best["model"], "leaf": best["leaf"],
            "front": [f"{r['model']}/{r['leaf']}" for r in front],
            "message": (f"{target}: {best['model']} / {best['leaf']} ({shown_q}, {fmt_bytes(flash)} flash"
                        + (f", {latency:.3f} ms" if latency is not None else "") + ")" + why_not)}


def sweep_unmet(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Targets where (model, leaf) pairs were judged against requirements and none met them."""
    out = []
    for t in doc["targets"]:
        judged = [r for r in doc["rows"] if r["target"] == t and r.get("meets_requirements") is not None]
        if judged and not any(r["meets_requirements"] for r in judged):
            out.append({"target": t, "message": f"no (model, leaf) of the sweep meets the requirements on {t}"})
    return out
