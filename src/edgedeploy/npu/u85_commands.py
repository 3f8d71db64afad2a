"""The Ethos-U85 register set: command codes and the values of its fields.

The U85 command word has the U55's layout (``code | mode | param << 16``; mode 0x4000 adds a 32-bit payload
word), so :func:`edgedeploy.npu.commands.decode` decodes it with these tables. The codes and fields are those of
the U85 register interface that Vela 5.2's U85 backend writes (``ethos_u85_interface.hpp``); they differ from the
U55's: other register numbers, a RESIZE operation, OFM scaling and rounding carried in the OFM_SCALE payload, a
weight format register (standard or fast weight decoding, 2:4 sparsity) and up to four weight streams.
:mod:`edgedeploy.npu.u85_describe` says what each decoded operation does.
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace

FAMILY = "Ethos-U85"
PRODUCT = 2  # the driver payload's configuration word, bits 28-31

# 16-bit commands (no payload word): operations, then registers
CMD0 = {
    0: "NPU_OP_STOP", 1: "NPU_OP_IRQ", 2: "NPU_OP_CONV", 3: "NPU_OP_DEPTHWISE", 5: "NPU_OP_POOL",
    6: "NPU_OP_ELEMENTWISE", 7: "NPU_OP_RESIZE", 16: "NPU_OP_DMA_START", 17: "NPU_OP_DMA_WAIT",
    18: "NPU_OP_KERNEL_WAIT", 19: "NPU_OP_PMU_MASK",
    256: "NPU_SET_IFM_PAD_TOP", 257: "NPU_SET_IFM_PAD_LEFT", 258: "NPU_SET_IFM_PAD_RIGHT",
    259: "NPU_SET_IFM_PAD_BOTTOM", 260: "NPU_SET_IFM_DEPTH_M1", 261: "NPU_SET_IFM_PRECISION",
    263: "NPU_SET_IFM_UPSCALE", 264: "NPU_SET_IFM_BROADCAST", 265: "NPU_SET_IFM_ZERO_POINT",
    266: "NPU_SET_IFM_WIDTH0_M1", 267: "NPU_SET_IFM_HEIGHT0_M1", 268: "NPU_SET_IFM_HEIGHT1_M1",
    271: "NPU_SET_IFM_REGION", 273: "NPU_SET_OFM_WIDTH_M1", 274: "NPU_SET_OFM_HEIGHT_M1",
    275: "NPU_SET_OFM_DEPTH_M1", 276: "NPU_SET_OFM_PRECISION", 277: "NPU_SET_OFM_BLK_WIDTH_M1",
    278: "NPU_SET_OFM_BLK_HEIGHT_M1", 279: "NPU_SET_OFM_BLK_DEPTH_M1", 280: "NPU_SET_OFM_ZERO_POINT",
    282: "NPU_SET_OFM_WIDTH0_M1", 283: "NPU_SET_OFM_HEIGHT0_M1", 284: "NPU_SET_OFM_HEIGHT1_M1",
    287: "NPU_SET_OFM_REGION", 288: "NPU_SET_KERNEL_WIDTH_M1", 289: "NPU_SET_KERNEL_HEIGHT_M1",
    290: "NPU_SET_KERNEL_STRIDE", 292: "NPU_SET_ACC_FORMAT", 293: "NPU_SET_ACTIVATION",
    294: "NPU_SET_ACTIVATION_MIN", 295: "NPU_SET_ACTIVATION_MAX", 296: "NPU_SET_WEIGHT_REGION",
    297: "NPU_SET_SCALE_REGION", 298: "NPU_SET_RESIZE_X_SCALE_N_M1", 299: "NPU_SET_RESIZE_Y_SCALE_N_M1",
    300: "NPU_SET_RESIZE_X_OFFSET", 301: "NPU_SET_RESIZE_Y_OFFSET", 302: "NPU_SET_WEIGHT_FORMAT",
    303: "NPU_SET_BLOCKDEP", 304: "NPU_SET_DMA0_SRC_REGION", 305: "NPU_SET_DMA0_DST_REGION",
    306: "NPU_SET_DMA0_SIZE0", 307: "NPU_SET_DMA0_SIZE1", 308: "NPU_SET_DMA0_IDX_REGION",
    384: "NPU_SET_IFM2_BROADCAST", 389: "NPU_SET_IFM2_PRECISION", 393: "NPU_SET_IFM2_ZERO_POINT",
    394: "NPU_SET_IFM2_WIDTH0_M1", 395: "NPU_SET_IFM2_HEIGHT0_M1", 396: "NPU_SET_IFM2_HEIGHT1_M1",
    399: "NPU_SET_IFM2_REGION",
}
# 32-bit commands (a payload word follows; the command's own parameter holds more fields for some)
CMD1 = {
    0: "NPU_SET_IFM_BASE0", 1: "NPU_SET_IFM_BASE1", 2: "NPU_SET_IFM_BASE2", 3: "NPU_SET_IFM_BASE3",
    4: "NPU_SET_IFM_STRIDE_X", 5: "NPU_SET_IFM_STRIDE_Y", 6: "NPU_SET_IFM_STRIDE_C",
    16: "NPU_SET_OFM_BASE0", 17: "NPU_SET_OFM_BASE1", 18: "NPU_SET_OFM_BASE2", 19: "NPU_SET_OFM_BASE3",
    20: "NPU_SET_OFM_STRIDE_X", 21: "NPU_SET_OFM_STRIDE_Y", 22: "NPU_SET_OFM_STRIDE_C",
    32: "NPU_SET_WEIGHT_BASE", 33: "NPU_SET_WEIGHT_LENGTH", 34: "NPU_SET_SCALE_BASE", 35: "NPU_SET_SCALE_LENGTH",
    36: "NPU_SET_OFM_SCALE", 37: "NPU_SET_IFM_SCALE", 38: "NPU_SET_IFM2_SCALE", 39: "NPU_SET_OP_SCALAR",
    48: "NPU_SET_DMA0_SRC", 49: "NPU_SET_DMA0_DST", 50: "NPU_SET_DMA0_LEN", 51: "NPU_SET_DMA0_SRC_STRIDE0",
    52: "NPU_SET_DMA0_SRC_STRIDE1", 53: "NPU_SET_DMA0_DST_STRIDE0", 54: "NPU_SET_DMA0_DST_STRIDE1",
    55: "NPU_SET_DMA0_IDX", 56: "NPU_SET_DMA0_IDX_MAX", 57: "NPU_SET_DMA0_IDX_SKIP1",
    128: "NPU_SET_IFM2_BASE0", 129: "NPU_SET_IFM2_BASE1", 130: "NPU_SET_IFM2_BASE2", 131: "NPU_SET_IFM2_BASE3",
    132: "NPU_SET_IFM2_STRIDE_X", 133: "NPU_SET_IFM2_STRIDE_Y", 134: "NPU_SET_IFM2_STRIDE_C",
    144: "NPU_SET_WEIGHT1_BASE", 145: "NPU_SET_WEIGHT1_LENGTH", 146: "NPU_SET_WEIGHT2_BASE",
    147: "NPU_SET_WEIGHT2_LENGTH", 148: "NPU_SET_WEIGHT3_BASE", 149: "NPU_SET_WEIGHT3_LENGTH",
    150: "NPU_SET_RESIZE_X", 151: "NPU_SET_RESIZE_Y", 256: "NPU_OP_BRANCH",
}
POOLING = {0: "MAX", 1: "AVERAGE", 2: "REDUCE_SUM", 3: "SUM", 4: "NONE", 5: "MIN", 6: "ARGMAX_X", 7: "ARGMAX_Y"}
ELEMENTWISE = {0: "MUL", 1: "ADD", 2: "SUB", 3: "MIN", 4: "MAX", 5: "LRELU", 6: "ABS", 7: "CLZ", 8: "SHR",
               9: "SHL", 10: "LSR", 11: "DIV", 16: "CMP_EQ", 17: "CMP_NE", 18: "CMP_GE", 19: "CMP_GT", 33: "AND",
               34: "OR", 35: "XOR", 36: "NOT", 42: "AND_NOT"}
RESIZE = {0: "BILINEAR", 1: "REPLICATE", 2: "NEAREST"}
ACTIVATION = {0: "NONE", 1: "LUT_U8_U8", 4: "LUT_S8_S8", 5: "LUT_S8_S16", 7: "LUT_S8_S32", 8: "LUT_S16_S16",
              9: "LUT_S16_S32", 10: "TANH", 11: "SIGMOID"}
OFM_ROUNDING = {0: "DOUBLE_SYMMETRIC", 1: "NATURAL", 2: "DOUBLE_ASYMMETRIC", 3: "SYMMETRIC", 4: "TRUNCATE_TO_ZERO",
                5: "TRUNCATE_TO_LOWER"}
BROADCAST = {0: "NONE", 1: "H", 2: "W", 3: "HW", 4: "C", 5: "CH", 6: "CW", 7: "CWH", 8: "SCALAR"}
UPSCALE = {0: "NONE", 1: "NEAREST", 2: "ZEROS"}
STORAGE = {0: "TILE2X2", 1: "TILE3X1", 2: "CHAINED", 3: "NONE"}
ACC_INPUT = {0: "RESET", 1: "KEEP", 2: "IFM2"}
TRANSPOSE = {0: "HWC", 1: "WHC", 2: "HCW", 3: "WCH", 6: "CHW", 7: "CWH"}
REVERSE = {0: "NONE", 1: "H", 2: "W", 3: "C"}
BITS = {0: 8, 1: 16, 2: 32, 3: 64}
FORMATS = {0: "NHWC", 1: "NHCWB16"}


@lru_cache(maxsize=1)
def registers() -> SimpleNamespace:
    """The U85 tables in the form :func:`edgedeploy.npu.commands.decode` takes."""
    return SimpleNamespace(
        family=FAMILY,
        cmd0=CMD0,
        cmd1=CMD1,
        operations=("NPU_OP_CONV", "NPU_OP_DEPTHWISE", "NPU_OP_POOL", "NPU_OP_ELEMENTWISE", "NPU_OP_RESIZE",
                    "NPU_OP_DMA_START"),
        no_result={"NPU_OP_STOP", "NPU_OP_IRQ", "NPU_OP_DMA_WAIT", "NPU_OP_KERNEL_WAIT", "NPU_OP_PMU_MASK"},
        pooling=POOLING,
        elementwise=ELEMENTWISE,
        resize=RESIZE,
    )

