"""Reading ``.npz`` files handed to edgedeploy (data sets, golden vectors) as untrusted input.

An ``.npz`` is a zip archive of ``.npy`` arrays. Before NumPy reads a byte of it: the file must be a regular
file within its size limit (:func:`edgedeploy.core.files.check_input_file`), every member must be an ``.npy`` array,
and the members together may not unpack to more than the same limit (a small compressed file can unpack to
gigabytes). Arrays of objects are refused (``allow_pickle=False``: no code runs from a data file). After it:
:func:`check_finite` refuses NaN and infinities with the array's name and the first bad index.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Iterable

from edgedeploy.errors import InvalidInputError
from edgedeploy.core.files import LIMITS, check_input_file, short

NPZ_HINT = "save the data with numpy.savez"


def _fail(path: Path, what: str, hint: str = NPZ_HINT) -> InvalidInputError:
    return InvalidInputError(f"{short(str(path))}: {what}", hint)


def npz_members(path: Path | str, what: str = "data file", limit: str | int = "data") -> list[str]:
    """The array names of the ``.npz`` at ``path``, after the checks above (not reading any array)."""
    path = check_input_file(path, what, limit)
    max_bytes = LIMITS[limit] if isinstance(limit, str) else int(limit)
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise _fail(path, f"is not a readable .npz file ({short(str(exc), 80)})") from None
    names = []
    for info in infos:
        if info.is_dir() or not info.filename.endswith(".npy"):
            raise _fail(path, f"member '{short(info.filename, 60)}' is not a .npy array",
                        f"keep only arrays in the file ({NPZ_HINT})")
        names.append(info.filename[: -len(".npy")])
    unpacked = sum(i.file_size for i in infos)
    if unpacked > max_bytes:
        raise _fail(path, f"unpacks to {unpacked:,} bytes, over the limit of {max_bytes:,}",
                    "see 'Size limits' in docs/files.md")
    return names


def read_npz(path: Path | str, what: str = "data file", limit: str | int = "data",
             keys: Iterable[str] | None = None) -> dict[str, Any]:
    """``{name: array}`` of the ``.npz`` at ``path`` (only ``keys`` when given), after the checks above; a file
    NumPy cannot read is one :class:`InvalidInputError` naming it."""
    import numpy as np

    names = npz_members(path, what, limit)
    wanted = names if keys is None else [k for k in keys if k in names]
    try:
        with np.load(path, allow_pickle=False) as npz:
            out = {k: npz[k] for k in wanted}
    except InvalidInputError:
        raise
    except Exception as exc:  # a damaged archive fails in zipfile, zlib or numpy's header reader in many ways
        raise _fail(Path(path), f"is not a readable .npz file ({type(exc).__name__}: {short(str(exc), 80)})"
                    ) from exc
    for k, a in out.items():
        if not isinstance(a, np.ndarray):
            raise _fail(Path(path), f"member '{short(k, 60)}' is not a .npy array",
                        f"keep only arrays in the file ({NPZ_HINT})")
    return out


def first_non_finite(array: Any) -> tuple[tuple[int, ...], float, int] | None:
    """Where the first NaN or infinity of a numeric array is (its index, the value, how many there are), or None
    when every value is finite (integers and booleans always are)."""
    import numpy as np

    a = np.asarray(array)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)):
        return None
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    index = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), a.shape))
    return index, a[index].item() if a.ndim else a.item(), int(bad.sum())


def check_finite(path: Path | str, name: str, array: Any) -> None:
    """Refuse an array holding NaN or infinities: one error naming the file, the array, the first bad index and
    the fix."""
    found = first_non_finite(array)
    if found is None:
        return
    index, value, count = found
    where = f"index {list(index)}" if len(index) != 1 else f"index {index[0]}"
    sample = f" (sample {index[0]})" if len(index) > 1 else ""
    more = f"; {count:,} non-finite values in all" if count > 1 else ""
    raise _fail(Path(path), f"'{name}' holds {value} at {where}{sample}{more}",
                f"replace or drop the samples whose '{name}' is not finite (numpy.isfinite finds them)")
