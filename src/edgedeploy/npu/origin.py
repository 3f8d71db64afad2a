"""Where an NPU operation came from: Vela's debug database maps each operation of the command stream back to the
TFLite operator it compiles, and that operator's output tensor names the Keras layers it was converted from.

The database's ``queue`` table gives the byte offset of each operation command in the stream (word offset x 4)
and the optimised operator it runs; the ``optimised`` table gives that operator's ``source_id``; the ``source``
table gives its ``ext_key``, the operator's index in the int8 model Vela read.

A compile run with ``--debug-db`` keeps the database; otherwise, on a mismatch, Vela is run again with it on the
same int8 model, target and ``--optimise``, and the database is used only when that compile's command stream is
the one that was verified, word for word.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from edgedeploy.keras.model import base_name
from edgedeploy.tflite.reader import OperatorInfo
from edgedeploy.vela.debugdb import read_debug_db

DEBUG_DB = "debug_db"  # the compile record's output role of Vela's debug database


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def keras_layers(tensor_name: str) -> list[str]:
    """The Keras layers a TFLite tensor name mentions, in order: the path component after the model's scope in
    each ``;``-separated part (``functional_1/conv2d/BiasAdd`` -> ``conv2d``), TFMOT wrapper prefixes dropped."""
    found: list[str] = []
    for part in tensor_name.split(";"):
        segments = part.split("/")
        if len(segments) >= 3:  # model scope / layer / op
            name = base_name(segments[1])
            if name not in found:
                found.append(name)
    return found


def origins(tables: Mapping[str, list[dict[str, str]]], operators: Sequence[OperatorInfo]) -> dict[int, dict[str, Any]]:
    """Byte offset of each operation command in the stream -> the TFLite operator it compiles: its index, type,
    output tensor and the Keras layers that tensor names, with Vela's name for the operation it optimised it to.
    Rows that point nowhere (an operator Vela made itself, an index outside the model) are left out."""
    optimised = {r.get("id"): r for r in tables.get("optimised", [])}
    source = {r.get("id"): r for r in tables.get("source", [])}
    out: dict[int, dict[str, Any]] = {}
    for row in tables.get("queue", []):
        offset = _int(row.get("offset"))
        opt = optimised.get(row.get("optimised_id"))
        src = source.get(opt.get("source_id")) if opt else None
        index = _int(src.get("ext_key")) if src else None
        if opt is None or offset is None or index is None or not 0 <= index < len(operators):
            continue
        op = operators[index]
        out[offset] = {"tflite_operator_index": index, "tflite_operator": op.op, "tflite_output": op.output_name,
                       "keras_layers": keras_layers(op.output_name), "vela_operator": opt.get("operator", "")}
    return out


def describe(origin: Mapping[str, Any]) -> str:
    """``TFLite operator 3 CONV_2D 'tensor' (its tensor names Keras layers conv2d_1, ...)`` for a message."""
    layers = origin.get("keras_layers") or []
    named = f" (its tensor names Keras layer{'s' if len(layers) > 1 else ''} {', '.join(layers)})" if layers else ""
    return (f"TFLite operator {origin['tflite_operator_index']} {origin['tflite_operator']} "
            f"'{origin['tflite_output']}'{named}")


def recorded_tables(manifest, record) -> dict[str, list[dict[str, str]]] | None:
    """The debug database a compile with ``--debug-db`` kept beside its outputs (inside the run folder, with the
    hash the manifest records), or None; a damaged or oversized one is :class:`InvalidInputError` naming it."""
    from edgedeploy.core.manifest import artifacts_intact

    art = record.output(DEBUG_DB)
    if art is None or not artifacts_intact(manifest, [art]):
        return None
    return read_debug_db(manifest.resolve(art))


def recompiled_tables(int8_model: Path, target_name: str, record, commands: Sequence[int]
                      ) -> tuple[dict[str, list[dict[str, str]]] | None, str]:
    """Vela run again on ``int8_model`` with its debug database, for the target and ``--optimise`` the compile
    ``record`` used: (tables, "") when its command stream equals ``commands``, else (None, why not)."""
    from edgedeploy.config.targets import get_target
    from edgedeploy.errors import EdgeDeployError
    from edgedeploy.npu.leaf_layout import read_leaf
    from edgedeploy.vela.outputs import OPTIMISE_CHOICES
    from edgedeploy.vela.runner import DEBUG_DB_FLAG, NEEDED, VelaRequest, run_all

    params = record.params or {}
    optimise = params.get("optimise", "Performance")
    if optimise not in OPTIMISE_CHOICES or params.get("extra_vela_args"):
        return None, "the compile used Vela options edgedeploy does not repeat; compile with --debug-db"
    try:
        target = get_target(target_name)
    except Exception:  # a target file that moved: no mapping, the mismatch is still reported
        return None, f"target {target_name} is not found again; compile with --debug-db"
    if params.get("target_fingerprint") not in (None, target.fingerprint()):
        return None, f"target {target_name} changed since the compile; compile with --debug-db"
    with tempfile.TemporaryDirectory(prefix="edgedeploy-debugdb-") as tmp:
        request = VelaRequest(Path(int8_model), target, Path(tmp), optimise, (DEBUG_DB_FLAG,))
        try:
            (result,) = run_all([request], 1, need=NEEDED | {"debug_db"})
        except EdgeDeployError:
            return None, "Vela did not write its debug database again"
        if list(read_leaf(result.files["vela_model"]).commands) != list(commands):
            return None, "Vela's command stream differs when compiled again; compile with --debug-db"
        return result.debug_tables, ""
