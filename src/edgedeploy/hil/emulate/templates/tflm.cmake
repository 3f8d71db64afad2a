# TensorFlow Lite Micro for Cortex-M55 with CMSIS-NN kernels: the compile settings TFLM's own make
# target uses for TARGET=cortex_m_generic TARGET_ARCH=cortex-m55 OPTIMIZED_KERNEL_DIR=cmsis_nn.
# Shared by the library build and the firmware build; TFLM_DIR is the TFLM tree.
set(TFLM_INCLUDE_DIRS
  "${TFLM_DIR}"
  "${TFLM_DIR}/third_party/flatbuffers/include"
  "${TFLM_DIR}/third_party/gemmlowp"
  "${TFLM_DIR}/third_party/ruy"
  "${TFLM_DIR}/third_party/cmsis/CMSIS/Core/Include"
  "${TFLM_DIR}/third_party/cmsis_nn"
  "${TFLM_DIR}/third_party/cmsis_nn/Include"
  "${TFLM_DIR}/third_party/kissfft"
  "${TFLM_DIR}/third_party/cortex_dfp/ARMCM55/Include")
set(TFLM_DEFINES
  CMSIS_NN KERNELS_OPTIMIZED_FOR_SPEED TF_LITE_STATIC_MEMORY TF_LITE_DISABLE_X86_NEON TF_LITE_MCU_DEBUG_LOG
  ARMCM55 CPU_M55=1 ARM_MODEL_USE_PMU_COUNTERS ARM_NN_ENABLE_F16=0 ARM_NN_ENABLE_F32=0
  "CMSIS_DEVICE_ARM_CORTEX_M_XX_HEADER_FILE=\"ARMCM55.h\"")
set(TFLM_C_OPTIONS -O2 -funsigned-char -ffunction-sections -fdata-sections)
set(TFLM_CXX_OPTIONS -O2 -funsigned-char -ffunction-sections -fdata-sections -fno-rtti -fno-exceptions
  -fno-threadsafe-statics)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_C_STANDARD 11)

function(tflm_settings target)
  target_include_directories(${target} PRIVATE ${TFLM_INCLUDE_DIRS})
  target_compile_definitions(${target} PRIVATE ${TFLM_DEFINES})
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:C>:${TFLM_C_OPTIONS}> $<$<COMPILE_LANGUAGE:CXX>:${TFLM_CXX_OPTIONS}>)
endfunction()
