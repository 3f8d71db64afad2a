"""Hardware in the loop: the host side of the device runner's framed protocol, over any byte stream."""
