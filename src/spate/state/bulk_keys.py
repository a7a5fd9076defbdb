"""The keys of a bulk call: each key's key group and its part of every primary (``len(key) (u16) | key``),
computed once per call and checked against the subtask's key groups.

Keys are given either as a sequence of keys (a list, a numpy or Arrow array; their key groups computed here) or
as any object with ``key_groups`` and ``encoded_keys`` (a ``KeyedBatch`` or fired timers: computed once per
batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from spate.errors import InvalidKeyError, short_repr
from spate.keygroups import normalize_key
from spate.serde import decode_key, encode_keys
from spate.state.key_scope import KeyScope
from spate.state.layout import U16

_U16_PACK = U16.pack
_MAX_KEY_BYTES = 0xFFFF


class KeySet(Protocol):
    """Keys with their key groups and encodings already computed."""

    @property
    def key_groups(self) -> Sequence[int]: ...

    @property
    def encoded_keys(self) -> list[bytes]: ...


Keys = KeySet | Sequence[Any]


def plain_values(values: Any) -> Sequence[Any]:
    """Python values of a list, numpy array or Arrow array (numpy and Arrow scalars do not serialize)."""
    if hasattr(values, "tolist"):
        return values.tolist()  # type: ignore[no-any-return]
    if hasattr(values, "to_pylist"):
        return values.to_pylist()  # type: ignore[no-any-return]
    return values  # type: ignore[no-any-return]


def key_parts(scope: KeyScope, keys: Keys) -> tuple[Sequence[int], list[bytes]]:
    """(key groups, key parts) of ``keys``, in their order; an error names the first key this subtask does not
    own or that encodes too long."""
    if hasattr(keys, "encoded_keys") and hasattr(keys, "key_groups"):
        kgs, encoded = keys.key_groups, keys.encoded_keys
    else:
        normalized = [normalize_key(k) for k in plain_values(keys)]
        kgs = [scope._hash(k) % scope.max_parallelism for k in normalized]
        encoded = encode_keys(normalized)
    if len(kgs) != len(encoded):
        raise ValueError(f"{len(kgs)} key groups for {len(encoded)} keys")
    _check(scope, kgs, encoded)
    return kgs, [_U16_PACK(len(kb)) + kb for kb in encoded]


def _check(scope: KeyScope, kgs: Sequence[int], encoded: list[bytes]) -> None:
    owned = scope.key_groups
    if kgs and (min(kgs) < owned.start or max(kgs) >= owned.stop):
        kg, kb = next((kg, kb) for kg, kb in zip(kgs, encoded, strict=True) if kg not in owned)
        raise _bad_key(scope, kg, kb)
    if encoded and max(map(len, encoded)) > _MAX_KEY_BYTES:
        kg, kb = next((kg, kb) for kg, kb in zip(kgs, encoded, strict=True) if len(kb) > _MAX_KEY_BYTES)
        raise _bad_key(scope, kg, kb)


def _bad_key(scope: KeyScope, kg: int, kb: bytes) -> InvalidKeyError:
    key = decode_key(kb)
    if len(kb) > _MAX_KEY_BYTES:
        return InvalidKeyError(f"key {short_repr(key)} encodes to {len(kb)} bytes; the limit is 65535")
    return InvalidKeyError(f"key {short_repr(key)} is in key group {kg}, which this subtask does not own "
                           f"({scope.key_groups.start}..{scope.key_groups.stop - 1}): pass only keys of this subtask "
                           "(a batch's keys, or keys routed with spate.keygroups.key_group)")


__all__ = ["KeySet", "Keys", "key_parts", "plain_values"]
