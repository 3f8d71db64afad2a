"""The sizes an HDF5 file (a Keras ``.h5``, or the weights inside a ``.keras``) declares, checked before any dataset
is read.

A dataset's shape is a number in the file's header: a file of a few kilobytes can declare a 7 GB kernel whose
storage was never written (reading it gives the fill value, all 7 GB of it). Before anything is read, every
dataset must declare no more bytes than the file holds (a filtered, compressed dataset may declare more, up to
the model limit), all of them together no more than the model limit, and keep its data inside the file (no
external or virtual storage naming other files). docs/files.md lists the limits.
"""

from __future__ import annotations

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
