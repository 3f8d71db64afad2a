"""The weight decoder's own process: reads length-prefixed encoded weight streams on stdin and answers each with its
decoded values (little-endian int32). Vela's codec ends its process on a damaged stream; the caller
(:class:`edgedeploy.core.proc.PipeWorker`) sees the end and names the operation."""

from __future__ import annotations

import struct
import sys


def main() -> None:
    import numpy as np
    from ethosu import mlw_codec

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return
        data = stdin.read(struct.unpack("<I", head)[0])
        values = np.asarray(mlw_codec.decode(bytearray(data)), dtype="<i4").tobytes()
        stdout.write(struct.pack("<I", len(values)) + values)
        stdout.flush()


if __name__ == "__main__":
    main()
