"""Verification: run a compiled leaf on the NPU model and compare with TFLite's reference kernels.

For each case the NPU model's outputs must equal the reference's bit for bit. Where they differ, the first
NPU operation whose output differs from the TFLite tensor it stands for is named, with the TFLite operator Vela
compiled it from (Vela's debug database, :mod:`edgedeploy.npu.origin`) and the largest difference. Which tensor
an operation's output is compared with is found from the data: the integer tensor of the same size that its
output equals in most cases.

One difference is documented rather than a failure: TFLite 2.21's reference FULLY_CONNECTED rounds its
output scaling once, while Vela compiles it as a 1x1 convolution, which the NPU's TFL rounding mode (and TFLite's
reference CONV_2D) rounds twice; the two results differ by at most 1 at that layer, for some inputs. Where Vela
fuses an activation's lookup table into that layer's operation, the difference is recognised at the activation's
output through the table (:mod:`edgedeploy.npu.fused_tables`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInputError, MismatchError, NpuModelError, UsageError
from .bounds import CASES_LIMIT, MEMORY_ENV, MIB, WORK_ENV, Cost, leaf_cost, memory_limit
from . import u85_commands, u85_ops
from .commands import Operation, counts, decode_for
from .featuremap import feature_map, read
from .fused_tables import Table, activation_table, explained
from .leaf_layout import Leaf, read_leaf
from .machine import run
from .origin import describe, origins, recompiled_tables, recorded_tables
from .u85_ofm_order import stored_shape
from .reference import Reference, declared_bytes, run_reference

DEFAULT_COUNT = 8
MODELLED_FAMILIES = ("ethos-u55", "ethos-u65", "ethos-u85")  # verify, compile --verify and the HIL npu device
DOCUMENTED = {"FULLY_CONNECTED": (1, "TFLite's reference FULLY_CONNECTED rounds its output scaling once; the NPU "
                                      "(TFL rounding, as TFLite's CONV_2D) rounds twice")}
SCHEMA = "edgedeploy.verify"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class VerifyOptions:
    """What ``edgedeploy verify`` checks: the leaf and target, the input data or seed, and the number of cases."""

    leaf: str | None = None
    target: str | None = None
    data: Path | None = None
    count: int = DEFAULT_COUNT
    seed: int = 0

    def check(self) -> None:
        if not 1 <= self.count <= CASES_LIMIT:
            raise UsageError(f"--count is {self.count:,}", f"pass a number of cases from 1 to {CASES_LIMIT:,}")
        if self.seed < 0:
            raise UsageError(f"--seed is {self.seed}", "pass a seed >= 0")


@dataclass
class VerifyResult:
    """A leaf on the functional NPU model against TFLite's reference kernels: cases, exact ones, largest difference."""

    leaf: str
    target: str
    npu: str
    cases: int
    inputs: str  # where the inputs came from
    status: str  # bit-exact, documented-difference, mismatch
    exact_cases: int
    documented_cases: int
    max_abs_diff: int
    operations: dict[str, int]
    first_difference: dict[str, Any] | None = None
    documented: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("bit-exact", "documented-difference")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **{k: v for k, v in vars(self).items()}}


def verify_run(run_dir: Path, options: VerifyOptions) -> VerifyResult:
    """Verify one compiled leaf of a run folder; raise :class:`MismatchError` when an output differs."""
    from ..export.locate import check_given_data, locate

    options.check()
    src = locate(Path(run_dir), options.leaf, options.target)
    if options.data is not None:
        check_given_data(src, options.data)
    family = str(src.target_info.get("npu_family") or "")
    if family not in MODELLED_FAMILIES:
        raise NpuModelError(f"target {src.target} is an {family or 'unknown'} NPU; the functional model covers "
                            "the Ethos-U55, Ethos-U65 and Ethos-U85",
                            "verify a leaf compiled for an ethos-u55-*, ethos-u65-* or ethos-u85-* target")
    # a data path recorded in the manifest is not followed (it may point anywhere): --data names the file
    result = verify_leaf(src.vela_model, src.int8_model, options.data, options.count, options.seed,
                         kind=str(src.data_info.get("task") or "classification"))
    result.leaf, result.target = src.leaf, src.target
    if not result.ok:
        first = result.first_difference or {}
        compiled = ""
        if "word" in first:  # Vela's debug database: the TFLite operator and Keras layers the operation compiles
            found = operation_origin(src, first["word"])
            first["origin"] = found
            compiled = (f", which Vela compiled from {describe(found)}" if "tflite_operator" in found
                        else f" (no TFLite operator named: {found['unmapped']})")
        raise MismatchError(
            f"'{src.leaf}' on {src.target}: {result.cases - result.exact_cases - result.documented_cases} of "
            f"{result.cases} cases differ from TFLite's reference kernels (largest difference {result.max_abs_diff}); "
            f"first at NPU {first.get('operation', 'output')}{compiled}"
            + _differs_from(first),
            "compile the model again; if it persists, report the Vela version and this model",
        )
    return result


def _differs_from(first: dict[str, Any]) -> str:
    """Which TFLite tensor the operation's output was compared with, unless it is the one its origin names."""
    if not first.get("tflite_tensor"):
        return ""
    if first.get("origin", {}).get("tflite_output") == first["tflite_tensor"]:
        return f"; its output differs from that operator's by up to {first['max_abs_diff']}"
    return (f"; its output differs from TFLite {first['tflite_operator']} '{first['tflite_tensor']}' by up to "
            f"{first['max_abs_diff']}")


def operation_origin(src, word: int) -> dict[str, Any]:
    """The TFLite operator that the NPU operation at ``word`` compiles (:func:`edgedeploy.npu.origin.origins`),
    from the compile's debug database or Vela run again with one; ``{"unmapped": why}`` when neither maps it."""
    from edgedeploy.tflite.reader import read_tflite

    leaf = read_leaf(src.vela_model)
    try:
        tables, why = recorded_tables(src.manifest, src.compile_record), ""
    except InvalidInputError as exc:  # the mismatch stands; the damaged database only leaves it unmapped
        return {"unmapped": exc.one_line()}
    if tables is None:
        tables, why = recompiled_tables(src.int8_model, src.target, src.compile_record, leaf.commands)
    if tables is None:
        return {"unmapped": why}
    found = origins(tables, read_tflite(src.int8_model).operators).get(4 * word)
    return found or {"unmapped": f"Vela's debug database has no operation at word {word}"}


def verify_leaf(vela_model: Path, int8_model: Path, data: Path | None, count: int, seed: int = 0,
                kind: str = "classification") -> VerifyResult:
    """Run the int8 model on TFLite's reference kernels and the NPU subgraph of ``vela_model`` on the model, and
    compare. Operators Vela left on the CPU are TFLite's own: the NPU subgraph takes its inputs from the
    reference run's tensors of the same names, and its outputs are compared with the tensors of theirs."""
    t0 = time.perf_counter()
    leaf = read_leaf(vela_model)
    ops = decode_for(leaf.product, leaf.commands, str(vela_model))
    if leaf.product == u85_commands.PRODUCT:
        u85_ops.check(ops, leaf.npu, str(vela_model))
    cost = leaf_cost(leaf, ops)  # every declared size bounded before anything is allocated
    reference = _reference_bytes(int8_model)
    if data is None:
        _check_cases(cost, count, reference)
    inputs, described = load_cases(int8_model, data, count, seed, kind)
    _check_cases(cost, int(inputs[0].shape[0]), reference)
    t1 = time.perf_counter()
    ref = run_reference(int8_model, inputs)
    t2 = time.perf_counter()
    npu_inputs, expected = _npu_boundary(vela_model, leaf, inputs, ref)
    snaps: list[tuple[Operation, np.ndarray]] = []
    tables: dict[int, Table] = {}  # operation index -> the lookup table its output stage applied
    u85 = leaf.product == u85_commands.PRODUCT

    def keep(op: Operation, memory) -> None:
        if op.kind != "DMA" and not u85_ops.chained_output(op):  # a chained OFM never reaches memory
            fm = feature_map(op, "OFM")
            snaps.append((op, read(memory(fm.region), fm, stored_shape(op), op.title).astype(fm.dtype)))
            if (table := activation_table(op, memory, u85)) is not None:
                tables[op.index] = table

    outs, _ = run(leaf, npu_inputs, on_op=keep, ops=ops)
    t3 = time.perf_counter()
    result = compare(leaf, ops, outs, expected, ref, snaps, tables)
    result.inputs = described
    result.seconds = {"read": round(t1 - t0, 3), "tflite_reference": round(t2 - t1, 3), "npu_model": round(t3 - t2, 3)}
    return result


def _reference_bytes(int8_model: Path) -> int:
    """What TFLite's reference run keeps of one case (every tensor), refused when one case would not fit."""
    from edgedeploy.core.files import short

    total, largest = declared_bytes(int8_model)
    if total > memory_limit():
        raise InvalidInputError(f"{int8_model}: its tensors declare {total:,} bytes (the largest '{short(largest, 80)}'"
                                f"), over the NPU model's memory limit of {memory_limit() // MIB:,} MiB",
                                f"convert the model again, or raise {MEMORY_ENV}")
    return total


def _check_cases(cost: Cost, cases: int, reference: int) -> None:
    """The cases, every operation's output and every reference tensor kept for the comparison, within the NPU
    model's memory and work."""
    why = cost.over(cases, True, reference)
    if why is not None:
        raise UsageError(f"--count {cases:,}: the NPU model of {cost.where} needs {why}",
                         f"pass --count {cost.max_cases(True, reference):,} or fewer, or raise {MEMORY_ENV} or "
                         f"{WORK_ENV}")


def _npu_boundary(path: Path, leaf: Leaf, inputs: list[np.ndarray], ref: Reference):
    """The NPU subgraph's inputs and the outputs expected of it: the model's own when Vela mapped every operator
    to the NPU, else the reference run's tensors named as the subgraph's inputs and outputs."""
    from edgedeploy.tflite.reader import read_tflite

    n = inputs[0].shape[0]
    if all(o.op == "CUSTOM:ethos-u" for o in read_tflite(path).operators):
        if len(inputs) != len(leaf.inputs):
            raise NpuModelError(f"{path} takes {len(leaf.inputs)} inputs; the model {len(inputs)}",
                                "compile the model again with Vela")
        # each output by its name: Vela may list a model's several outputs in another order than TFLite does
        named = [ref.tensors.get(t.name) for t in leaf.outputs]
        expected = named if all(e is not None for e in named) else ref.outputs
        return [x.reshape((n,) + tuple(t.shape)) for x, t in zip(inputs, leaf.inputs)], expected
    missing = [t.name for t in leaf.inputs + leaf.outputs if t.name not in ref.tensors]
    if missing:
        raise NpuModelError(f"{path}: the NPU subgraph's tensors {', '.join(missing)} are not in the int8 model",
                            "verify a leaf whose CPU operators keep their tensor names (as Vela does)")
    return ([ref.tensors[t.name].reshape((n,) + tuple(t.shape)) for t in leaf.inputs],
            [ref.tensors[t.name] for t in leaf.outputs])


def load_cases(int8_model: Path, data: Path | None, count: int, seed: int,
               kind: str = "classification") -> tuple[list[np.ndarray], str]:
    """``count`` input cases typed as the int8 model takes them: rows of the evaluation data, else seeded random
    integers (a model with float inputs needs data)."""
    from ..export.golden_vectors import load_eval_data, prepare_inputs
    from edgedeploy.tflite.reader import read_tflite

    model = read_tflite(int8_model)
    if len(model.inputs) != 1:
        raise NpuModelError(f"{int8_model} has {len(model.inputs)} inputs; verification covers one-input models",
                            "verify a single-input model")
    tin = model.inputs[0]
    shape = tuple(int(d) for d in tin.shape[1:])
    if data is not None:
        n_classes = int(np.prod(model.outputs[0].shape[1:])) if model.outputs else 1
        ev = load_eval_data(Path(data), shape, n_classes, kind)
        rows = min(count, int(ev.x.shape[0]))
        typed, _ = prepare_inputs(ev.x[:rows], tin)
        return [np.asarray(typed).reshape((rows,) + shape)], f"{rows} evaluation rows of {Path(data).name}"
    kinds: dict[str, type[np.integer[Any]]] = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32}
    if tin.dtype not in kinds:
        raise UsageError(f"{int8_model} takes {tin.dtype} input; random cases are integers",
                         "pass --data DATA.npz with evaluation rows")
    rng = np.random.default_rng(seed)
    info = np.iinfo(kinds[tin.dtype])
    x = rng.integers(info.min, int(info.max) + 1, size=(count,) + shape).astype(info.dtype)
    return [x], f"{count} random {tin.dtype} cases (seed {seed}; --data gives evaluation rows instead)"


def compare(leaf: Leaf, ops: list[Operation], outs: list[np.ndarray], expected: list[np.ndarray], ref: Reference,
            snaps: list[tuple[Operation, np.ndarray]], tables: dict[int, Table] | None = None) -> VerifyResult:
    n = outs[0].shape[0]
    differs = np.zeros(n, dtype=bool)
    max_diff = 0
    for o, r in zip(outs, expected):
        a, b = o.reshape(n, -1).astype(np.int64), r.reshape(n, -1).astype(np.int64)
        differs |= (a != b).any(axis=1)
        max_diff = max(max_diff, int(np.abs(a - b).max()) if a.size else 0)
    mapping = _map_tensors(snaps, ref, n)
    where = {i: (name, slice(None)) for i, name in mapping.items()} | _map_parts(snaps, ref, n, mapping)
    first: dict[str, Any] | None = None
    documented_cases = 0
    notes: list[str] = []
    for case in np.flatnonzero(differs).tolist():
        found = _first_difference(case, snaps, where, ref)
        note = _documented(case, found, snaps, where, ref, tables or {})
        if note is not None:
            documented_cases += 1
            if note not in notes:
                notes.append(note)
        elif first is None:
            first = {**found, "case": int(case)}
    exact = int(n - differs.sum())
    status = ("bit-exact" if exact == n else "documented-difference" if exact + documented_cases == n else "mismatch")
    return VerifyResult("", "", leaf.npu, n, "", status, exact, documented_cases, max_diff, counts(ops), first, notes)


def _documented(case: int, found: dict[str, Any], snaps, where: dict[int, tuple[str, slice]], ref: Reference,
                tables: dict[int, Table]) -> str | None:
    """The note of the documented difference that explains a case's first difference, or None: a documented
    operator's output within its bound, or such an operator's output seen through a lookup table that Vela fused
    into the same NPU operation (:mod:`edgedeploy.npu.fused_tables`)."""
    operator = found.get("tflite_operator", "")
    bound, note = DOCUMENTED.get(operator, (None, ""))
    if bound is not None:
        return note if found["max_abs_diff"] <= bound else None
    at = next(((op, val[case]) for op, val in snaps if op.word == found.get("word")), None)
    if at is None or at[0].index not in tables or at[0].index not in where:
        return None
    op, npu = at
    after, part = where[op.index]
    inputs = ref.operands.get(after, ())
    if len(inputs) != 1 or inputs[0] not in ref.tensors or ref.tensors[inputs[0]].shape != ref.tensors[after].shape:
        return None
    before = inputs[0]
    bound, note = DOCUMENTED.get(ref.producers.get(before, ""), (None, ""))
    if bound is None or not explained(npu, _part(ref.tensors[before][case], part),
                                      _part(ref.tensors[after][case], part), tables[op.index], bound):
        return None
    return (f"{note}; where Vela fuses the {operator} after it into the same operation (a lookup table), the "
            f"difference reaches the {operator}'s output through the table")


def _part(arr: np.ndarray, part: slice) -> np.ndarray:
    """The channels ``part`` (of the last axis) of a tensor, as rows of channels."""
    return arr.reshape(-1, arr.shape[-1] if arr.ndim else 1)[:, part]


def _map_tensors(snaps, ref: Reference, n: int) -> dict[int, str]:
    """Operation index -> the TFLite tensor its output stands for.

    First the tensors an output equals in at least half the cases; then, for outputs left over (an operation
    that went wrong in most cases), the tensor of the same size and element type written by a TFLite operator
    between those of the neighbouring matched outputs, the nearest in mean absolute difference."""
    order = {name: i for i, name in enumerate(ref.producers)}  # TFLite operators in execution order
    produced = [name for name in ref.tensors if name in order]
    found: dict[int, str] = {}
    for op, val in snaps:
        flat = val.reshape(n, -1)
        best, best_agree = None, 0
        for name in produced:
            arr = ref.tensors[name]
            if int(np.prod(arr.shape[1:])) != flat.shape[1]:
                continue
            agree = int((arr.reshape(n, -1) == flat).all(axis=1).sum())
            if agree > best_agree:
                best, best_agree = name, agree
        if best is not None and 2 * best_agree >= n:
            found[op.index] = best
    positions = [op.index for op, _ in snaps]
    for k, (op, val) in enumerate(snaps):
        if op.index in found:
            continue
        before = [order[found[i]] for i in positions[:k] if i in found]
        after = [order[found[i]] for i in positions[k + 1 :] if i in found]
        lo, hi = max(before, default=-1), min(after, default=len(order))
        size = feature_map(op, "OFM").size
        flat = val.reshape(n, -1)
        best, best_dist = None, None
        for name in produced:
            arr = ref.tensors[name]
            if not lo < order[name] <= hi or arr.dtype.itemsize != size or int(np.prod(arr.shape[1:])) != flat.shape[1]:
                continue
            dist = float(np.abs(arr.reshape(n, -1).astype(np.int64) - flat).mean())
            if best_dist is None or dist < best_dist:
                best, best_dist = name, dist
        if best is not None and best not in found.values():
            found[op.index] = best
    return found


def _map_parts(snaps, ref: Reference, n: int, mapping: dict[int, str]) -> dict[int, tuple[str, slice]]:
    """Operation index -> (TFLite tensor, its channels) for the outputs left over that are a run of channels of a
    tensor (Vela splits an operation by output depth: with weights that stream, on the Ethos-U85): the tensor
    with the same positions and element type, and the first run of channels that the output equals in at least
    half the cases."""
    found: dict[int, tuple[str, slice]] = {}
    for op, val in snaps:
        if op.index in mapping or val.ndim < 2:
            continue
        depth = val.shape[-1]
        rows = val.reshape(n, -1, depth)
        for name, arr in ref.tensors.items():
            if (name not in ref.producers or arr.dtype != val.dtype or arr.ndim < 2 or arr.shape[-1] <= depth
                    or arr.size // (n * arr.shape[-1]) != rows.shape[1]):
                continue
            whole = arr.reshape(n, -1, arr.shape[-1])
            for start in range(arr.shape[-1] - depth + 1):
                agree = int((whole[:, :, start : start + depth] == rows).all(axis=(1, 2)).sum())
                if 2 * agree >= n:
                    found[op.index] = (name, slice(start, start + depth))
                    break
            if op.index in found:
                break
    return found


def _first_difference(case: int, snaps, where: dict[int, tuple[str, slice]], ref: Reference) -> dict[str, Any]:
    for op, val in snaps:
        if op.index not in where:
            continue
        name, part = where[op.index]
        a = _part(val[case], slice(None)).reshape(-1)
        b = _part(ref.tensors[name][case], part).reshape(-1).astype(np.int64)
        if not np.array_equal(a, b):
            return {"operation": op.title, "word": op.word, "tflite_tensor": name,
                    "tflite_operator": ref.producers.get(name, "?"), "max_abs_diff": int(np.abs(a - b).max())}
    return {"operation": "output (no intermediate tensor differs)", "max_abs_diff": 0}
