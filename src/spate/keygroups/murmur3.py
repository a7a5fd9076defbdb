"""Spark's Murmur3_x86_32 (``org.apache.spark.unsafe.hash.Murmur3_x86_32``) on unsigned 32-bit Python ints.

``hash_int``/``hash_long`` mix one 4-/8-byte value; ``hash_bytes`` is Spark's legacy ``hashUnsafeBytes``. Each
takes the running hash as its seed and returns the new unsigned hash, so a multi-column key chains them.
"""

from __future__ import annotations

import struct

#: Seed of Spark SQL's ``hash()`` (``Murmur3Hash``).
SEED = 42

M32 = 0xFFFFFFFF
C1 = 0xCC9E2D51
C2 = 0x1B873593
_UNPACK_WORDS = [struct.Struct(f"<{n}I").unpack_from for n in range(64)]


def hash_int(v: int, h: int) -> int:
    """Murmur3_x86_32.hashInt(v, seed=h) as an unsigned 32-bit int (``v`` may be any int)."""
    k = (v * C1) & M32
    k = (((k << 15) | (k >> 17)) * C2) & M32
    h ^= k
    h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & M32
    h ^= 4
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def hash_long(v: int, h: int) -> int:
    """Murmur3_x86_32.hashLong(v, seed=h): low word then high word, fmix with length 8."""
    k = ((v & M32) * C1) & M32
    k = (((k << 15) | (k >> 17)) * C2) & M32
    h ^= k
    h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & M32
    k = (((v >> 32) & M32) * C1) & M32
    k = (((k << 15) | (k >> 17)) * C2) & M32
    h ^= k
    h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & M32
    h ^= 8
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def hash_bytes(b: bytes, h: int) -> int:
    """Spark's legacy Murmur3_x86_32.hashUnsafeBytes(b, seed=h).

    Whole 4-byte little-endian words are mixed first; each remaining tail byte is then mixed on its own as
    a sign-extended byte (this differs from standard Murmur3 and is what Spark's ``hash()`` uses).
    """
    n = len(b)
    words = n >> 2
    if words:
        unpack = _UNPACK_WORDS[words] if words < 64 else struct.Struct(f"<{words}I").unpack_from
        for k in unpack(b):
            k = (k * C1) & M32
            k = (((k << 15) | (k >> 17)) * C2) & M32
            h ^= k
            h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & M32
    for i in range(words << 2, n):
        k = b[i]
        k = ((k - 256 if k > 127 else k) * C1) & M32
        k = (((k << 15) | (k >> 17)) * C2) & M32
        h ^= k
        h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64) & M32
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)
