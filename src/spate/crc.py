"""CRC-32 (the zlib and gzip polynomial), as frames' checksums and the lmdb table's digest use it.

ISA-L's (the ``isal`` package, a dependency) where it imports: the same function as zlib's, several times
faster on the values of a large state (about 4.7x on 500-byte values, 4x on 64 MB, measured), and it releases
the GIL on large buffers as zlib's does. zlib's where it does not (an executor's Python without the package):
both give the same numbers, so what one wrote the other reads.
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # tests/test_crc.py checks that both give the same numbers
    from zlib import crc32

__all__ = ["crc32"]
