"""TensorFlow Lite Micro as a static library for Cortex-M55, built once per tree and settings, then cached.

Only what firmware links is compiled: the runtime, the kernels of the operators the model uses and the
CMSIS-NN sources those kernels call (the full tree, 318 sources, takes minutes on two cores). The library lives in
``$XDG_CACHE_HOME/edgedeploy/tflm/<key>``, where the key hashes the tree (each file's path, size and
modification time), the compile settings and the compiler version; a model with new operators
adds their kernels to the same library, and only those are compiled.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Iterable

from edgedeploy import __version__
from edgedeploy.errors import DiskFullError, UsageError
from edgedeploy.export.bundle import cmake_path
from edgedeploy.core.files import atomic_write_text
from edgedeploy.core.nospace import writing
from edgedeploy.core.proc import check, run_command, which
from edgedeploy.hil.emulate.render import fill, template
from edgedeploy.hil.emulate.toolchain import Toolchain

KERNELS = "tensorflow/lite/micro/kernels"
# runtime sources, relative to the tree; test-only sources left out
RUNTIME_DIRS = (
    "tensorflow/lite/micro",
    "tensorflow/lite/micro/arena_allocator",
    "tensorflow/lite/micro/memory_planner",
    "tensorflow/lite/micro/tflite_bridge",
    "tensorflow/lite/micro/cortex_m_generic",
    "tensorflow/lite/core/api",
    "tensorflow/lite/core/c",
    "tensorflow/lite/kernels",
    "tensorflow/lite/kernels/internal",
    "tensorflow/lite/kernels/internal/reference",
    "tensorflow/compiler/mlir/lite/core/api",
    "tensorflow/compiler/mlir/lite/schema",
)
RUNTIME_SKIP = {  # test-only sources, and what the interpreter links without (recording allocators, profiler, hexdump)
    "fake_micro_context.cc", "mock_micro_graph.cc", "test_helpers.cc", "test_helper_custom_ops.cc", "hexdump.cc",
    "micro_profiler.cc", "micro_time.cc", "recording_micro_allocator.cc", "recording_single_arena_buffer_allocator.cc",
    "system_setup.cc", "non_persistent_buffer_planner_shim.cc",
}  # fmt: skip
ALWAYS_KERNELS = ("kernel_util.cc",)
CMSIS_NN_SOURCES = "third_party/cmsis_nn/Source"
TEMPLATES = ("tflm.cmake", "tflm_CMakeLists.txt.in", "arm-none-eabi.cmake")

_ADD_RE = re.compile(
    r"TfLiteStatus\s+(Add\w+)\s*\(\s*const\s+TFLMRegistration&\s+registration\s*=\s*(?:tflite::)?(Register_\w+)\(\)\s*\)"
    r"\s*\{\s*return\s+AddBuiltin\(\s*BuiltinOperator_(\w+)",
    re.S,
)
_ADD_NO_ARG_RE = re.compile(  # e.g. AddResizeNearestNeighbor(): the registration is not a parameter
    r"TfLiteStatus\s+(Add\w+)\s*\(\s*\)\s*\{\s*return\s+AddBuiltin\(\s*BuiltinOperator_(\w+)\s*,\s*(?:tflite::)?(Register_\w+)\(\)",
    re.S,
)


@dataclass(frozen=True)
class OpKernel:
    op: str  # builtin operator, e.g. CONV_2D
    method: str  # MicroMutableOpResolver method, e.g. AddConv2D
    sources: tuple[str, ...]  # kernel sources, relative to the tree


@cache
def resolver_methods(tree: Path) -> dict[str, tuple[str, str]]:
    """Builtin operator -> (``MicroMutableOpResolver`` method, registration function), read from the tree."""
    text = (tree / "tensorflow/lite/micro/micro_mutable_op_resolver.h").read_text(encoding="utf-8")
    found = {op: (method, reg) for method, reg, op in _ADD_RE.findall(text)}
    found.update({op: (method, reg) for method, op, reg in _ADD_NO_ARG_RE.findall(text)})
    return found


@cache
def _registration_files(tree: Path) -> dict[str, str]:
    """Registration function -> the kernel source defining it (CMSIS-NN's before the reference one)."""
    found: dict[str, str] = {}
    pattern = re.compile(r"^TFLMRegistration\s+(Register_\w+)\s*\(\s*\)\s*\{", re.M)
    for folder in (f"{KERNELS}/cmsis_nn", KERNELS):
        for path in sorted((tree / folder).glob("*.cc")):
            for reg in pattern.findall(path.read_text(encoding="utf-8", errors="replace")):
                found.setdefault(reg, str(path.relative_to(tree)))
    return found


def op_kernels(tree: Path, ops: Iterable[str]) -> list[OpKernel]:
    """The resolver method and kernel sources of each operator; an operator TFLM lacks is a UsageError."""
    methods, files = resolver_methods(tree), _registration_files(tree)
    out = []
    for op in sorted(set(ops)):
        if op not in methods or methods[op][1] not in files:
            raise UsageError(
                f"operator {op} has no TensorFlow Lite Micro kernel in {tree}",
                "the CPU path can run only models whose operators TFLM implements",
            )
        method, reg = methods[op]
        source = files[reg]
        stem = Path(source).stem
        sources = [source]
        common = f"{KERNELS}/{stem}_common.cc"
        if (tree / common).is_file():
            sources.append(common)
        out.append(OpKernel(op, method, tuple(sources)))
    return out


def runtime_sources(tree: Path) -> list[str]:
    srcs = []
    for folder in RUNTIME_DIRS:
        for path in sorted((tree / folder).glob("*.cc")):
            if path.name not in RUNTIME_SKIP:
                srcs.append(str(path.relative_to(tree)))
    srcs += [f"{KERNELS}/{k}" for k in ALWAYS_KERNELS]
    return srcs


_CMSIS_NAME_RE = re.compile(r"\b(arm_\w+|\w+_table_\w+)\b")  # CMSIS-NN's functions and its lookup tables
# a definition at file scope: a line that starts with its type (not static, extern or a preprocessor line)
_CMSIS_DEF_RE = re.compile(r"^(?!static\b|extern\b)[A-Za-z_][\w \t*]*?\b(arm_\w+|\w+_table_\w+)\s*[(\[]", re.M)


@cache
def _cmsis_nn_index(tree: Path) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    """CMSIS-NN's C files: name -> the files defining it, and file -> the names it mentions."""
    defined: dict[str, set[str]] = {}
    mentions: dict[str, frozenset[str]] = {}
    for path in sorted((tree / CMSIS_NN_SOURCES).rglob("*.c")):
        rel = str(path.relative_to(tree))
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in _CMSIS_DEF_RE.findall(text):
            defined.setdefault(name, set()).add(rel)
        mentions[rel] = frozenset(_CMSIS_NAME_RE.findall(text))
    return {k: frozenset(v) for k, v in defined.items()}, mentions


def cmsis_nn_sources(tree: Path, sources: Iterable[str]) -> list[str]:
    """The CMSIS-NN C files that ``sources`` (relative to the tree) call, and those these call in turn.

    A name is followed to every file that defines it at file scope, so a file the linker could need is never left
    out; the linker drops what is compiled but unused (``--gc-sections``) either way. A source the tree lacks is
    left to the build, which names it.
    """
    defined, mentions = _cmsis_nn_index(tree)
    names: set[str] = set()
    for source in sources:
        try:
            text = (tree / source).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue  # a file the tree lacks: the build names it
        names |= set(_CMSIS_NAME_RE.findall(text))
    chosen: set[str] = set()
    todo = list(names)
    while todo:
        for rel in defined.get(todo.pop(), ()):
            if rel not in chosen:
                chosen.add(rel)
                todo.extend(mentions[rel] - names)
                names |= mentions[rel]
    return sorted(chosen)


def library_sources(tree: Path, kernels: Iterable[OpKernel]) -> set[str]:
    """What the library compiles for these kernels: the runtime, the kernels and the CMSIS-NN files they call."""
    tflm = set(runtime_sources(tree)) | {s for k in kernels for s in k.sources}
    return tflm | set(cmsis_nn_sources(tree, tflm))


# a file-scope name with internal linkage: `static ... NAME(` or `static ... NAME[`, `= ...`, `;`
_STATIC_DEF_RE = re.compile(r"^static\b[^;{}=()\[\]]*?\b(\w+)\s*[(\[=;]", re.M)
_MACRO_DEF_RE = re.compile(r"^\s*#\s*define\b", re.M)


def compiled_alone(tree: Path, sources: Iterable[str]) -> list[str]:
    """The C files of ``sources`` that must not share a unity file with others: those defining a macro (it would
    reach the files after them) and those whose static functions or tables share a name with another file's.

    The other C files compile in one unity file (CMake's unity build), each a few hundred milliseconds less.
    A file the tree lacks is left to the build, which names it.
    """
    statics: dict[str, set[str]] = {}
    alone: set[str] = set()
    for source in sources:
        if not source.endswith(".c"):
            continue
        try:
            text = (tree / source).read_text(encoding="utf-8", errors="replace")
        except OSError:
            alone.add(source)
            continue
        if _MACRO_DEF_RE.search(text):
            alone.add(source)
        for name in set(_STATIC_DEF_RE.findall(text)):
            statics.setdefault(name, set()).add(source)
    for files in statics.values():
        if len(files) > 1:
            alone |= files
    return sorted(alone)


def tree_digest(tree: Path) -> str:
    """A hash of the tree's files (path, size, modification time): changes when any file does."""
    h = hashlib.sha256()
    for top in ("tensorflow", "third_party"):
        for dirpath, dirnames, filenames in os.walk(tree / top):
            dirnames.sort()
            for name in sorted(filenames):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"{os.path.relpath(os.path.join(dirpath, name), tree)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgedeploy" / "tflm"


def cache_key(tree: Path, toolchain: Toolchain) -> str:
    h = hashlib.sha256()
    h.update(tree_digest(tree).encode())
    h.update(f"\0{tree}\0{toolchain.gcc}\0{toolchain.gcc_version}\0{cmake_generator()}\0".encode())
    for name in TEMPLATES:
        h.update(template(name).encode())
    return h.hexdigest()[:20]


@dataclass(frozen=True)
class TflmLibrary:
    path: Path  # libtflm.a
    key: str
    compiled_now: bool  # whether this call compiled anything
    seconds: float
    sources: int

    @property
    def schema_header(self) -> Path:
        """The header CMake wrote for the library's precompiled FlatBuffers schema (``.gch`` beside it): firmware
        built with the same settings includes it to load the schema instead of parsing it again."""
        return self.path.parent / "CMakeFiles" / "tflm.dir" / "cmake_pch.hxx"


# A full cache: the fix names where the cache is and how to move it.
CACHE_FULL_HINT = ("free space on that disk, or set XDG_CACHE_HOME to a folder on a disk with room, then run the "
                   "command again")


def build_library(tree: Path, kernels: list[OpKernel], toolchain: Toolchain, timeout: float = 1800) -> TflmLibrary:
    """``libtflm.a`` with the runtime and these kernels, from the cache when it already has them. A full disk under
    the cache, met by edgedeploy, CMake or the compiler, is a :class:`DiskFullError` naming the cache folder."""
    key = cache_key(tree, toolchain)
    root = cache_root() / key
    try:
        with writing(root):  # what the steps below do not name themselves
            return _build_library(tree, kernels, toolchain, timeout, key, root)
    except DiskFullError as exc:
        raise DiskFullError(exc.message, CACHE_FULL_HINT) from None


def _build_library(tree: Path, kernels: list[OpKernel], toolchain: Toolchain, timeout: float, key: str,
                   root: Path) -> TflmLibrary:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per cache entry at a time
        listed = root / "sources.txt"
        have = set(listed.read_text().split()) if listed.is_file() else set()
        want = library_sources(tree, kernels)
        lib = root / "build" / "libtflm.a"
        if want <= have and lib.is_file():
            return TflmLibrary(lib, key, False, 0.0, len(have))
        sources = sorted(have | want)
        src = root / "src"
        src.mkdir(exist_ok=True)
        atomic_write_text(src / "tflm.cmake", template("tflm.cmake"))
        atomic_write_text(src / "toolchain.cmake", template("arm-none-eabi.cmake"))
        atomic_write_text(
            src / "CMakeLists.txt", fill(template("tflm_CMakeLists.txt.in"), {"VERSION": __version__, "TFLM_DIR": cmake_path(tree, "the TFLM folder")})
        )
        body = "\n".join(f'  "${{TFLM_DIR}}/{s}"' for s in sources)
        alone = "\n".join(f'  "${{TFLM_DIR}}/{s}"' for s in compiled_alone(tree, sources))
        atomic_write_text(src / "sources.cmake", f"set(TFLM_SOURCES\n{body})\nset(TFLM_C_ALONE\n{alone})\n")
        build = root / "build"
        log = root / "build.log"
        cfg = run_command(
            [toolchain.cmake, "-S", src, "-B", build, "-G", cmake_generator(), f"-DCMAKE_TOOLCHAIN_FILE={src / 'toolchain.cmake'}",
             "-DCMAKE_BUILD_TYPE=Release", *toolchain.cmake_defines()],
            timeout=300,
            log_file=log,
        )
        check(cfg, "configuring the TensorFlow Lite Micro build", f"see {log}", writes=root)
        res = run_command([toolchain.cmake, "--build", build, "--parallel", str(os.cpu_count() or 2)], timeout=timeout,
                          log_file=root / "build-compile.log")
        check(res, "compiling TensorFlow Lite Micro", f"see {root / 'build-compile.log'}", writes=root)
        atomic_write_text(listed, "\n".join(sources) + "\n")
        return TflmLibrary(lib, key, True, cfg.seconds + res.seconds, len(sources))


def cmake_generator() -> str:
    """Ninja when installed (it starts faster), else make."""
    return "Ninja" if which("ninja") else "Unix Makefiles"
