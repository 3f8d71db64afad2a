"""The sizes an HDF5 file (a Keras ``.h5``, or the weights inside a ``.keras``) declares, checked before any dataset
is read.

A dataset's shape is a number in the file's header: a file of a few kilobytes can declare a 7 GB kernel whose
storage was never written (reading it gives the fill value, all 7 GB of it). Before anything is read, every
dataset must declare no more bytes than the file holds (a filtered, compressed dataset may declare more, up to
the model limit), all of them together no more than the model limit, and keep its data inside the file (no
external or virtual storage naming other files). docs/files.md lists the limits.

A ``.keras`` file is a zip archive: :func:`keras_weights` checks the sizes its members declare (each and all
together at most the model limit) before anything is unpacked, unpacks ``model.weights.h5`` into a temporary file
(no more bytes than it declares), and checks that file's datasets as above before any is read.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Iterator

from edgedeploy.core.files import LIMITS
from edgedeploy.errors import InvalidInputError

FIX = "the file is damaged or was replaced; save the model again (model.save)"


def check_datasets(group, where: str, file_bytes: int) -> None:
    """Refuse, naming ``where`` and the dataset, a dataset of ``group`` (an open ``h5py`` file or group) whose
    declared size the file cannot hold, or whose data lies outside the file."""
    import h5py

    limit = LIMITS["model"]
    totals = {"all": 0, "unfiltered": 0}

    def visit(name: str, obj) -> None:
        if not isinstance(obj, h5py.Dataset):
            return
        shape = obj.shape or ()
        declared = obj.dtype.itemsize
        for d in shape:
            declared *= int(d)
        plist = obj.id.get_create_plist()
        filtered = plist.get_nfilters() > 0
        if plist.get_external_count() > 0 or obj.is_virtual:
            raise InvalidInputError(f"{where}: dataset '{name}' keeps its data outside the file "
                                    f"({'virtual' if obj.is_virtual else 'external'} storage)", FIX)
        totals["all"] += declared
        totals["unfiltered"] += 0 if filtered else declared
        dims = "x".join(str(int(d)) for d in shape) or "a scalar"
        room, held = (limit, "the model limit allows") if filtered else (file_bytes, "the file holds")
        if declared > room:
            raise InvalidInputError(f"{where}: dataset '{name}' declares {dims} {obj.dtype} ({declared:,} bytes), "
                                    f"more than {held} ({room:,} bytes)", FIX)
        if totals["unfiltered"] > file_bytes or totals["all"] > limit:
            if totals["unfiltered"] > file_bytes:
                over, room, held = totals["unfiltered"], file_bytes, "the file holds"
            else:
                over, room, held = totals["all"], limit, "the model limit allows"
            raise InvalidInputError(f"{where}: the datasets up to '{name}' declare {over:,} bytes, more than {held} "
                                    f"({room:,} bytes)", FIX)

    group.visititems(visit)


WEIGHTS = "model.weights.h5"  # the weights member of a .keras archive


def check_archive_sizes(z: zipfile.ZipFile, path: Path | str) -> None:
    """Refuse a ``.keras`` archive whose members declare more unpacked bytes than the model limit (one member or
    all together), naming the file and the member: checked before anything is unpacked."""
    limit, total = LIMITS["model"], 0
    for info in z.infolist():
        total += info.file_size
        if info.file_size > limit or total > limit:
            what = f"its member '{info.filename}' unpacks to {info.file_size:,} bytes" if info.file_size > limit \
                else f"its members up to '{info.filename}' unpack to {total:,} bytes"
            raise InvalidInputError(f"{path}: {what}, over the limit of {limit:,}",
                                    "see 'Size limits' in docs/files.md")


@contextlib.contextmanager
def keras_weights(z: zipfile.ZipFile, path: Path | str) -> Iterator[object | None]:
    """The ``model.weights.h5`` of the ``.keras`` archive ``z`` (read from ``path``) as an open ``h5py`` file whose
    datasets were checked (:func:`check_datasets`), or None when the archive holds none. The archive's declared
    sizes are checked first (:func:`check_archive_sizes`)."""
    import h5py

    check_archive_sizes(z, path)
    if WEIGHTS not in z.namelist():
        yield None
        return
    declared = z.getinfo(WEIGHTS).file_size
    with tempfile.TemporaryDirectory(prefix="edgedeploy-keras-") as tmp:
        unpacked = Path(tmp) / WEIGHTS
        with z.open(WEIGHTS) as src, open(unpacked, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)  # zipfile stops at the declared size and checks the CRC
        with h5py.File(unpacked, "r") as f:
            check_datasets(f, f"model {path} (its {WEIGHTS})", declared)
            yield f
