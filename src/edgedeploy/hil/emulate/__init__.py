"""Run a firmware bundle on an emulated Cortex-M55 (QEMU's mps3-an547 board) with TensorFlow Lite Micro."""
