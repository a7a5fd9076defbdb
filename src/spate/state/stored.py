"""How keyed state is stored: the record a snapshot keeps of each state (:class:`StateMeta`) and the bytes of its
values.

Values are stored serialized. With a TTL, each stored value (each list element, each map entry) starts with
its expiry time (u64 ms, processing time); a list value is its elements one after another, each
``[expiry (u64)] length (u32) data``. The decoders here read stored values outside a running backend too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from spate.state import descriptors as d

EXPIRY = struct.Struct(">Q")  # a TTL'd value's expiry time (ms), before its data
LENGTH = struct.Struct(">I")  # a list element's length, before its data
# Bound once: hot paths in other modules call them directly (a method call on a name imported from another
# module would build a bound method per call).
pack_expiry = EXPIRY.pack
unpack_expiry = EXPIRY.unpack_from
pack_length = LENGTH.pack


@dataclass(frozen=True)
class StateMeta:
    """What a snapshot records about one keyed state (its id is local to the table that wrote it)."""

    name: str
    sid: int
    kind: str
    ttl_ms: int | None
    serializer: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StateMeta:
        return StateMeta(data["name"], data["sid"], data["kind"], data.get("ttl_ms"), data["serializer"])


def live_list(raw: bytes, now: int) -> bytes | None:
    """The unexpired elements of a TTL'd list value: ``raw`` itself if none expired, None if all did."""
    out = []
    pos, n, dropped = 0, len(raw), False
    while pos < n:
        exp = EXPIRY.unpack_from(raw, pos)[0]
        ln = LENGTH.unpack_from(raw, pos + 8)[0]
        end = pos + 12 + ln
        if exp > now:
            out.append(raw[pos:end])
        else:
            dropped = True
        pos = end
    if not dropped:
        return raw
    return b"".join(out) if out else None


def decode_list(raw: bytes, ttl: bool, now_ms: int, loads: Callable[[bytes], Any]) -> list[Any]:
    """Elements of a stored list value that have not expired at ``now_ms``."""
    out = []
    pos, n = 0, len(raw)
    while pos < n:
        if ttl:
            exp = EXPIRY.unpack_from(raw, pos)[0]
            pos += 8
        ln = LENGTH.unpack_from(raw, pos)[0]
        pos += 4
        if not ttl or exp > now_ms:
            out.append(loads(raw[pos:pos + ln]))
        pos += ln
    return out


def decode_stored(meta: StateMeta, raw: bytes, loads: Callable[[bytes], Any], now_ms: int) -> tuple[bool, Any]:
    """Decode one stored entry of state ``meta`` outside a running backend: (live, value)."""
    if meta.kind == d.LIST:
        items = decode_list(raw, bool(meta.ttl_ms), now_ms, loads)
        return bool(items), items
    if meta.ttl_ms:
        if EXPIRY.unpack_from(raw)[0] <= now_ms:
            return False, None
        raw = raw[8:]
    return True, loads(raw)
