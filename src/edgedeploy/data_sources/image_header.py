"""An image's width and height, read from its header before the image is decoded.

A few hundred bytes of PNG, GIF or JPEG can declare an image of 65,535 x 65,535 pixels (a compressed file of
zeros is small whatever its size): decoded and converted to float32 for resizing, that is tens of gigabytes. The
header's size is read here (PNG's IHDR, GIF's logical screen, BMP's DIB header, JPEG's first start-of-frame
marker) and an image over :data:`PIXEL_LIMIT` is refused in one line naming the file and its declared size.
"""

from __future__ import annotations

import struct

from ..errors import InvalidInputError
from edgedeploy.core.files import short

# pixels of one image: Pillow's decompression-bomb threshold (Image.MAX_IMAGE_PIXELS); decoded as 4 channels and
# converted to float32 for resizing, about 1.8 GB
PIXEL_LIMIT = 89_478_485
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def declared_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` as the image's header declares them; None when the header is not one of these
    formats or is cut short (the decoder then says what is wrong)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24 and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:2] == b"BM" and len(data) >= 26:
        header = struct.unpack("<I", data[14:18])[0]
        if header == 12:
            return struct.unpack("<HH", data[18:22])
        width, height = struct.unpack("<ii", data[18:26])
        return abs(width), abs(height)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        if marker in _SOF:
            if pos + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            return width, height
        if marker == 0xDA:  # start of scan before any frame header
            return None
        pos += 2 + length
    return None


def check_image_size(data: bytes, name: str) -> None:
    """Refuse an image whose header declares more than :data:`PIXEL_LIMIT` pixels."""
    size = declared_size(data)
    if size is not None and size[0] * size[1] > PIXEL_LIMIT:
        raise InvalidInputError(f"{short(name)}: the header declares {size[0]:,} x {size[1]:,} pixels, over the "
                                f"limit of {PIXEL_LIMIT:,} pixels per image",
                                "shrink the image (the model's input is resized from it anyway)")
