"""Connects the HIL tests in this folder to a device.

Here the device is the one `--edgedeploy-device` names (the `edgedeploy_device` fixture):

- `host` (the default): the TensorFlow Lite Micro interpreter on this machine, running the
  bundle's int8 model (the reference the golden vectors came from), so the tests run anywhere;
- `qemu`: the bundle's firmware (its CPU path, built with TFLM for Cortex-M55) on QEMU's
  emulated mps3-an547 board, so the suite runs in CI without hardware:

      pytest examples/hil --edgedeploy-bundle FWDIR --edgedeploy-device qemu \\
          --edgedeploy-tflm-dir TFLM_DIR   # or set EDGEDEPLOY_TFLM_DIR

- `npu`: the bundle's compiled model (NAME_vela.tflite, Vela's command stream and weights) on
  edgedeploy's functional model of the Ethos-U55/U65/U85, so the tests check what ships to the NPU
  without a board or an FVP (results only, not timing):

      pytest examples/hil --edgedeploy-bundle FWDIR --edgedeploy-device npu

- `serial:PORT[@BAUD]`: firmware with the bundle's device runner (edgedeploy_runner.c, see
  docs/porting.md) on a serial port or any pyserial URL; the model hash is checked first, and
  each case's inference time is listed at the end of the run:

      pytest examples/hil --edgedeploy-bundle FWDIR --edgedeploy-device serial:/dev/ttyACM0@115200
      edgedeploy emulate FWDIR --serve tcp:4000 &   # the same firmware on QEMU's UART
      pytest examples/hil --edgedeploy-bundle FWDIR --edgedeploy-device serial:socket://127.0.0.1:4000

For firmware of your own, return your own transport instead, e.g. over a serial port whose
firmware reads one input and answers with the outputs:

    import serial
    from edgedeploy.hil.testing import stream_transport

    @pytest.fixture(scope="session")
    def device(golden_bundle):
        port = serial.Serial("/dev/ttyACM0", 115200, timeout=10)
        yield stream_transport(port, golden_bundle)
        port.close()

or through files with semihosting on an FVP:

    from edgedeploy.hil.testing import command_transport

    @pytest.fixture(scope="session")
    def device(tmp_path_factory):
        work = tmp_path_factory.mktemp("fvp")
        return command_transport(
            ["FVP_Corstone_SSE-300_Ethos-U55", "-a", "hil.elf", "-C", "mps3_board.uart0.out_file=-"],
            input_file=work / "input.bin", output_file=work / "output.bin", cwd=work)
"""

import pytest


@pytest.fixture(scope="session")
def device(edgedeploy_device):
    return edgedeploy_device
