"""Vela's debug database (``--enable-debug-db``), parsed in pure functions: encoded bytes per weight stream."""

from __future__ import annotations

import logging
import csv
import io
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from edgedeploy.errors import EdgeDeployError, InvalidInputError, ToolFailedError

log = logging.getLogger("edgedeploy")

# Vela's weight encoder keeps a palette of at most 32 distinct values per weight stream.
PALETTE_LIMIT = 32


WEIGHT_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "CONV_3D")
# A debug database read back from a run folder: at most this many bytes (the DS-CNN's is 49 KB).
DEBUG_DB_LIMIT = 16 << 20
_TABLE_OPEN = '<table name="'
_NAME_MAX = 200
_CDATA_OPEN = re.compile(r">\s*<!\[CDATA\[\s*")
_TABLE_CLOSE = re.compile(r"\]\]>\s*</table>")


def parse_debug_db(text: str, where: str = "Vela's debug database",
                   error: type[EdgeDeployError] = ToolFailedError) -> dict[str, list[dict[str, str]]]:
    """The tables of Vela's ``*_debug.xml`` (``--enable-debug-db``): name -> rows (column -> text).

    One pass from the start: each search begins where the last ended, so the time is linear in the text's
    length whatever it holds (a CDATA section that never closes ends the parse at once). ``where`` names the
    file and ``error`` is raised for a damaged database (a fresh one is Vela's failure; one read back, the
    input's)."""
    tables = {}
    pos = 0
    while (start := text.find(_TABLE_OPEN, pos)) >= 0:
        name_at = start + len(_TABLE_OPEN)
        name_end = text.find('"', name_at, name_at + _NAME_MAX + 1)
        opened = _CDATA_OPEN.match(text, name_end + 1) if name_end >= 0 else None
        if opened is None:  # not a table of Vela's form: look on after its opening
            pos = name_at
            continue
        name = text[name_at:name_end]
        body_end = text.find("]]>", opened.end())
        if body_end < 0:
            raise error(f"{where}: the CDATA of table '{name[:40]}' (byte {start:,}) is never closed",
                        "re-run the compile with --debug-db")
        closed = _TABLE_CLOSE.match(text, body_end)
        if closed is None:
            raise error(f"{where}: table '{name[:40]}' (byte {start:,}) is not closed after its CDATA",
                        "re-run the compile with --debug-db")
        try:
            rows = csv.DictReader(io.StringIO(text[opened.end() : body_end].replace("\0", ""), newline=""))
            tables[name] = [{k: v for k, v in r.items() if isinstance(k, str) and isinstance(v, str)} for r in rows]
        except csv.Error as exc:
            raise error(f"{where}: table '{name[:40]}' is not CSV ({exc})", "re-run the compile with --debug-db"
                        ) from exc
        pos = closed.end()
    if not tables:
        raise error(f"no <table> in {where}", "re-run the compile with --debug-db")
    return tables


def read_debug_db(path: Path) -> dict[str, list[dict[str, str]]]:
    """The tables of a debug database read back from a run folder: a regular file of at most
    :data:`DEBUG_DB_LIMIT` bytes, parsed in one pass; a damaged one is :class:`InvalidInputError` naming it."""
    from edgedeploy.core.files import read_input_text, short

    what = "Vela's debug database"
    return parse_debug_db(read_input_text(path, what, DEBUG_DB_LIMIT), f"{what} {short(str(path))}",
                          InvalidInputError)


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


def weight_layers(tables: Mapping[str, list[dict[str, str]]]) -> list[dict[str, Any]]:
    """One row per NPU operation that reads weights, from the ``perf`` and ``perf_debug`` tables.

    Fields: ``source_op`` (the operator's index in the input .tflite, Vela's ``ext_key``), ``operator``,
    ``name`` (its output tensor), ``encoded_weight_bytes`` (Vela's ``weight_total_bytes``; they add up to
    ``total_npu_encoded_weights`` of the summary CSV), ``vela_distinct_weights`` (``weight_distinct``),
    ``weight_read_cycles`` (``est_weight_read_cycles``), ``weight_transfer_cycles``, ``weight_format``,
    ``op_cycles`` and ``npu_cycles``, and ``weight_access_cycles`` (the ``*Weights_ac`` columns per memory).
    """
    perf = {r.get("id"): r for r in tables.get("perf", [])}
    ext = {r.get("id"): _int(r.get("ext_key")) for r in tables.get("source", [])}
    out = []
    for r in tables.get("perf_debug", []):
        total = _int(r.get("weight_total_bytes"))
        if total is None:
            continue
        p = perf.get(r.get("id"), {})
        access = {k[: -len("Weights_ac")]: _int(v) for k, v in r.items()
                  if k.endswith("Weights_ac") and _int(v) is not None}
        out.append({
            "vela_id": _int(r.get("id")),
            "source_op": ext.get(p.get("source_id")),
            "operator": p.get("operator", ""),
            "name": p.get("name", ""),
            "encoded_weight_bytes": total,
            "vela_distinct_weights": _int(r.get("weight_distinct")),
            "weight_format": r.get("weight_format", ""),
            "weight_read_cycles": _int(r.get("est_weight_read_cycles")),
            "weight_transfer_cycles": _int(r.get("weight_transfer_cycles")),
            "op_cycles": _int(p.get("op_cycles")),
            "npu_cycles": _int(p.get("npu_cycles")),
            "weight_access_cycles": access,
        })
    return out


def summarize_layers(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over :func:`weight_layers` rows (missing values count as unavailable, not zero)."""

    def total(key: str) -> int | None:
        vals = [v for r in layers if (v := r.get(key)) is not None]
        return int(sum(vals)) if vals else None

    distinct = [d for r in layers if (d := r.get("int8_distinct")) is not None]
    return {
        "layers": len(layers),
        "encoded_weight_bytes": total("encoded_weight_bytes"),
        "weight_read_cycles": total("weight_read_cycles"),
        "weight_transfer_cycles": total("weight_transfer_cycles"),
        "max_int8_distinct": max(distinct) if distinct else None,
        "layers_over_palette": sum(1 for d in distinct if d > PALETTE_LIMIT),
        "palette_limit": PALETTE_LIMIT,
    }


def attach_int8(layers: list[dict[str, Any]], operators: Sequence[Any], tensors: Sequence[Any]) -> list[dict[str, Any]]:
    """Add each row's int8 weight tensor facts (name, distinct values per tensor, zeros) from the input .tflite.

    ``operators`` are :class:`~edgedeploy.tflite.reader.OperatorInfo` of the input model, ``tensors`` its
    :func:`~edgedeploy.tflite.reader.read_weight_tensors`; both in operator order.
    """
    import numpy as np  # here, not at the top: `edgedeploy report` reads this module's constants without numpy

    weighted = [o.index for o in operators if o.op in WEIGHT_OPS]
    wt = [t for t in tensors if t.op in WEIGHT_OPS]
    by_op = dict(zip(weighted, wt)) if len(weighted) == len(wt) else {}
    for row in layers:
        t = by_op.get(row.get("source_op"))
        if t is None:
            row.update(tensor=None, int8_distinct=None, int8_zero_fraction=None, int8_elements=None)
            continue
        values = t.values()
        row.update(tensor=t.name, tflite_op=t.op, int8_distinct=int(np.unique(values).size),
                   int8_zero_fraction=round(float(np.mean(values == 0)), 4), int8_elements=int(values.size),
                   within_palette=bool(np.unique(values).size <= PALETTE_LIMIT))
    return layers


def npu_weight_report(debug_xml: Path, model: Path) -> dict[str, Any]:
    """Per-layer NPU weight facts of one compile: Vela's debug database joined with the int8 model's tensors."""
    return weight_report(parse_debug_db(Path(debug_xml).read_text(encoding="utf-8")), model)


def weight_report(tables: Mapping[str, list[dict[str, str]]], model: Path) -> dict[str, Any]:
    """:func:`npu_weight_report` of a debug database already parsed (:func:`parse_debug_db`)."""
    from edgedeploy.tflite.reader import read_tflite, read_weight_tensors

    layers = weight_layers(tables)
    try:
        attach_int8(layers, read_tflite(model).operators, read_weight_tensors(model))
    except InvalidInputError as exc:
        log.warning("%s: int8 weights not read (%s)", model, exc.one_line())
    return {"source": "vela --enable-debug-db (perf, perf_debug, source tables)", "layers": layers,
            "summary": summarize_layers(layers)}


def layer_of_tensor(tensor_name: str, layer_names: Iterable[str]) -> str | None:
    """The Keras layer a TFLite weight tensor came from, by the names in its ';'/'/'-separated parts."""
    from edgedeploy.keras.model import base_name

    names = set(layer_names)
    segments = [base_name(seg) for part in tensor_name.split(";") for seg in part.split("/")]
    return next((s for s in segments if s in names), None)
