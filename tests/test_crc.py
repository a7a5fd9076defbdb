"""spate.crc: the CRC-32 of frames and digests is zlib's function, whichever implementation computes it (files
written with one read with the other), and the fast one is in use where the package is installed."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from spate import crc


@given(st.binary(max_size=9000), st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data, start):
    assert crc.crc32(data, start) == zlib.crc32(data, start)
    assert crc.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


def test_the_fast_implementation_is_used_where_installed():
    from isal import isal_zlib  # a dependency: installed with spate

    assert crc.crc32 is isal_zlib.crc32
    assert crc.crc32_combine is getattr(isal_zlib, "crc32_combine", crc.combine)


@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_two_pieces_crcs_combine_into_the_whole_ones(a, b):
    whole = zlib.crc32(a + b)
    assert crc.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == whole
    assert crc.combine(zlib.crc32(a), zlib.crc32(b), len(b)) == whole  # ours, where ISA-L is not installed


def test_combining_over_gigabytes_is_isals_too():
    from isal import isal_zlib

    for n in (1, 4096, 12 << 30, (1 << 40) + 7):
        assert crc.combine(0x1234ABCD, 0x0F0F0F0F, n) == isal_zlib.crc32_combine(0x1234ABCD, 0x0F0F0F0F, n)
