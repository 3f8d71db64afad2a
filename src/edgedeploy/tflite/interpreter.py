"""The one place a TFLite model is run on the host: LiteRT's interpreter (``ai-edge-litert``).

TensorFlow deprecated ``tf.lite.Interpreter`` in favour of LiteRT's. LiteRT's interpreter has the same kernels:
its default ones (XNNPACK where it applies) and TFLite's reference kernels (``BUILTIN_REF``), which do the same
integer arithmetic as TensorFlow Lite Micro and so serve ``verify`` and the golden vectors. It does not import
TensorFlow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgedeploy.errors import ToolMissingError

PACKAGE = "ai-edge-litert"
PIN = "ai-edge-litert==2.3.0"


def _litert():
    try:
        from ai_edge_litert import interpreter
    except ImportError as exc:
        raise ToolMissingError(f"LiteRT, the TFLite interpreter, is not installed ({exc.name})", f"pip install {PIN}") from exc
    return interpreter


def make_interpreter(
    model: bytes | Path,
    reference: bool = False,
    num_threads: int | None = None,
    keep_all_tensors: bool = False,
    allocate_now: bool = True,
) -> Any:
    """An interpreter for ``model`` (the model's bytes or its file): TFLite's reference kernels (``BUILTIN_REF``)
    when ``reference``, else its default kernels. ``keep_all_tensors`` keeps every intermediate tensor readable
    after ``invoke``. With ``allocate_now`` false the caller may resize inputs and then :func:`allocate`."""
    lite = _litert()
    resolver = lite.OpResolverType.BUILTIN_REF if reference else lite.OpResolverType.AUTO
    source: dict[str, bytes | str] = ({"model_content": bytes(model)}
                                      if isinstance(model, (bytes, bytearray, memoryview)) else {"model_path": str(model)})
    interp = lite.Interpreter(
        **source,
        num_threads=num_threads,
        experimental_op_resolver_type=resolver,
        experimental_preserve_all_tensors=keep_all_tensors,
    )
    if allocate_now:
        allocate(interp)
    return interp


def allocate(interpreter: Any) -> None:
    """``interpreter.allocate_tensors()`` without TFLite's XNNPACK notice on stderr."""
    from edgedeploy.keras.tfenv import without_xnnpack_notice

    with without_xnnpack_notice():
        interpreter.allocate_tensors()


def version() -> str | None:
    """The installed LiteRT version (None when it is missing)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(PACKAGE)
    except PackageNotFoundError:
        return None
