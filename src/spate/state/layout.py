"""Byte layout of state-table keys (documented in docs/formats.md, "State table keys").

A table key is ``key_group (u16) | primary | user_key``; the primary is
``state_id (u16) | len(key) (u16) | key | len(namespace) (u16) | namespace``. ``user_key`` is empty for
value/list/reducing/aggregating state and the encoded map key (never empty) for map entries and timers.
Everything of one key group is one contiguous, sorted range.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import islice
from operator import lt

from spate.errors import InvalidKeyError

U16 = struct.Struct(">H")
KEY_GROUP_LIMIT = 0x8000  # key groups are < 32768; prefixes >= 0xFF00 are reserved
META_PREFIX = b"\xff\xff"  # table-level metadata (state registry, checkpoint tag)
TOMBSTONE_PREFIX = b"\xff\xfe"  # in a table over read-only bases: this key of a base is deleted


def length_prefixed(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise InvalidKeyError(f"encoded key or namespace is {len(data)} bytes; the limit is 65535: use a shorter "
                              "value (e.g. a hash of it)")
    return U16.pack(len(data)) + data


def kg_prefix(key_group: int) -> bytes:
    return U16.pack(key_group)


def primary_length(flat: bytes) -> int:
    """Length of the primary at the start of ``flat`` (a table key without its key-group prefix)."""
    klen = U16.unpack_from(flat, 2)[0]
    nslen = U16.unpack_from(flat, 4 + klen)[0]
    return 6 + klen + nslen


def split_primary(primary: bytes) -> tuple[int, bytes, bytes]:
    """(state id, key bytes, namespace bytes) of a primary."""
    sid = U16.unpack_from(primary, 0)[0]
    klen = U16.unpack_from(primary, 2)[0]
    key = primary[4:4 + klen]
    nslen = U16.unpack_from(primary, 4 + klen)[0]
    return sid, key, primary[6 + klen:6 + klen + nslen]


VOID_NAMESPACE_PART = length_prefixed(b"")  # the namespace part of a primary in the default namespace


def ascending(keys: Sequence[bytes]) -> bool:
    """Whether ``keys`` are strictly ascending (in table order; a key twice is not), in a C loop."""
    return all(map(lt, keys, islice(keys, 1, None)))
