"""The export stage: a compiled model as a firmware bundle.

``edgedeploy export RUN_DIR --target T --out FWDIR`` reads the run manifest and
writes a folder that a Cortex-M build links directly:

- ``NAME.c`` / ``NAME.h``: the Vela-compiled model as a 16-byte aligned
  ``const uint8_t NAME_model[]`` placed in a named linker section, and the
  numbers firmware sizes its buffers with (tensor arena, input/output shapes,
  types, scales, zero points, class labels);
- ``CMakeLists.txt`` (``add_subdirectory(FWDIR)`` gives the library
  ``edgedeploy::NAME``) and ``edgedeploy.cmake`` (``edgedeploy_add_model()``
  regenerates the sources at build time when the model or the settings change);
- golden vectors for hardware-in-the-loop tests: real evaluation inputs,
  quantized with the model's input parameters, and the outputs the TensorFlow
  Lite Micro interpreter computes on the host with its reference kernels
  (``golden.npz``, ``NAME_golden.c`` / ``NAME_golden.h``), plus the int8 model
  they were computed from (``NAME_int8.tflite``);
- with golden vectors, the CPU path: that int8 model as C too (``NAME_cpu.c``,
  ``NAME_cpu_model[]``, part of ``edgedeploy::NAME``) with its own tensor arena
  (``NAME_CPU_TENSOR_ARENA_SIZE``: the host TFLM interpreter's arena total plus the
  runtime margin), for firmware without the NPU such as ``edgedeploy emulate``;
- ``manifest.json``: what the bundle holds, where it came from (hashes, tool
  versions) and the list of files edgedeploy wrote.

Generated files carry no timestamps: the same inputs give byte-identical files.
The bundle is written into a staging folder and renamed into place when
complete. A folder holding files edgedeploy did not write is refused unless
``force`` is set, and even then those files are left as they are.

Decisions firmware depends on:

- Tensor arena = Vela's SRAM figure (the memory Vela planned for the
  feature maps) + a runtime margin for what the TFLM interpreter allocates
  besides (its own structures), rounded up to 16 bytes. The margin is the
  target's ``memory.runtime_margin_bytes`` on board targets and
  :data:`DEFAULT_RUNTIME_MARGIN` (16 KiB) on NPU-only targets. In Vela's
  ``Dedicated_Sram`` memory modes the arena lives in DRAM and the SRAM is the
  NPU's cache: the arena is then sized from Vela's DRAM figure (which also
  counts read-only data, so it is an upper bound) and ``NAME_FAST_MEMORY_SIZE``
  gives the cache size.
- Model section: the board target's ``memory.model_section``; NPU-only targets
  use :data:`DEFAULT_SECTION` (``.rodata.nn_model``), which the standard GNU
  and Arm linker scripts' ``*(.rodata*)`` rule already places in flash.
  ``--section`` overrides both.
- Golden inputs: from the evaluation split only (``split == 1`` or
  ``x_test``); the first example of each class in turn, in file order, so a
  few cases cover many classes. Float features are quantized as TFLite's
  QUANTIZE kernel does: ``round(x / scale) + zero_point`` rounding half away
  from zero, clamped to the type's range. The vectors come from the int8 model
  *before* Vela, since the host cannot run the ``ethos-u`` custom operator.
"""

from .c_files import (
    BundleSpec,
    CpuModel,
    GoldenSet,
    render_cpu_source,
    render_golden_header,
    render_golden_source,
    render_model_header,
    render_model_source,
)
from .c_literals import (
    arena_size,
    c_bytes,
    c_float,
    c_int,
    c_numbers,
    c_string,
    c_type_of,
    dtype_bytes,
    elements,
    guard_name,
    model_attribute,
    round_up,
    tensor_defines,
)
from .cmake import render_cmake_module, render_cmakelists
from .conventions import (
    ARENA_ALIGNMENT,
    BUNDLE_MANIFEST,
    BUNDLE_SCHEMA,
    BUNDLE_SCHEMA_VERSION,
    C_TYPES,
    DEFAULT_GOLDEN,
    DEFAULT_RUNTIME_MARGIN,
    DEFAULT_SECTION,
    GOLDEN_NPZ,
    HOST_ARENA_MIN,
    MODEL_ALIGNMENT,
    TFLM_PACKAGE,
    TFLM_PIN,
    check_c_name,
    check_section,
    default_name,
)
from .golden_vectors import (
    EvalData,
    _import_tflm,
    compare_outputs,
    dequantize,
    golden_arrays,
    load_eval_data,
    make_golden,
    npz_bytes,
    package_version,
    prepare_inputs,
    quantize,
    run_tflite,
    run_tflm,
    select_cases,
)
from .locate import ExportOptions, ExportSource, locate
from .outdir import OutDirState, _refuse_foreign, _write_bundle, inspect_out_dir
from .bundle_stage import ExportResult, export_bundle, resolve_section
