"""Value and key serialization.

msgpack is the default for plain data (None, bool, int of any size, float, str, bytes, list, dict, tuple,
date, datetime, Decimal, numpy scalars). pickle is used only when the user opts in explicitly, because unpickling
runs arbitrary code.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import pickle
from typing import Any, Protocol

import msgpack

from spate.errors import InvalidKeyError, SerializationError, SettingError, short_repr

_EXT_TUPLE = 1
_EXT_DATE = 2
_EXT_DATETIME = 3
_EXT_DECIMAL = 4
_EXT_BIGINT = 5  # ints outside msgpack's 64-bit range
_EPOCH = _dt.datetime(1970, 1, 1)
_EPOCH_TZ = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def _default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _packb(list(obj)))
    if isinstance(obj, _dt.datetime):
        if obj.tzinfo is None:
            micros = (obj - _EPOCH) // _dt.timedelta(microseconds=1)
            return msgpack.ExtType(_EXT_DATETIME, _packb([micros, False]))
        micros = (obj - _EPOCH_TZ) // _dt.timedelta(microseconds=1)
        return msgpack.ExtType(_EXT_DATETIME, _packb([micros, True]))
    if isinstance(obj, _dt.date):
        return msgpack.ExtType(_EXT_DATE, _packb(obj.toordinal()))
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, int) and not isinstance(obj, bool):
        return msgpack.ExtType(_EXT_BIGINT, str(int(obj)).encode())
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    item = getattr(obj, "item", None)  # numpy / pandas scalars
    if item is not None and type(obj).__module__.split(".")[0] in ("numpy", "pandas"):
        return item()
    raise SerializationError(f"cannot encode {type(obj).__qualname__} with msgpack: convert it to plain data or "
                             "use another serializer")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_TUPLE:
        return tuple(_unpackb(data))
    if code == _EXT_DATE:
        return _dt.date.fromordinal(_unpackb(data))
    if code == _EXT_DATETIME:
        micros, aware = _unpackb(data)
        return (_EPOCH_TZ if aware else _EPOCH) + _dt.timedelta(microseconds=micros)
    if code == _EXT_DECIMAL:
        return decimal.Decimal(data.decode())
    if code == _EXT_BIGINT:
        return int(data.decode())
    raise SerializationError(f"unknown msgpack extension type {code}; written by a newer spate?")


_free_packers: list[msgpack.Packer] = []


def _packb(obj: Any) -> bytes:
    # Packers are costly to create and not re-entrant (tuples pack their items from inside ``_default``),
    # so each call borrows one from a free list; this also keeps threads apart.
    packer = _free_packers.pop() if _free_packers else msgpack.Packer(
        default=_default, strict_types=True, use_bin_type=True)
    try:
        return packer.pack(obj)
    except BaseException:
        packer.reset()
        raise
    finally:
        _free_packers.append(packer)


def packb_many(objs: Any) -> list[bytes]:
    """``_packb`` of each of ``objs``, with one borrowed packer (bulk state writes, keys of a batch)."""
    packer = _free_packers.pop() if _free_packers else msgpack.Packer(
        default=_default, strict_types=True, use_bin_type=True)
    try:
        pack = packer.pack
        return [pack(obj) for obj in objs]
    except BaseException:
        packer.reset()
        raise
    finally:
        _free_packers.append(packer)


def _unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, strict_map_key=False)


class Serializer(Protocol):
    """Turns values into bytes and back. ``name`` is recorded in checkpoints."""

    name: str

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class MsgpackSerializer:
    """Default serializer: msgpack with extensions for tuple, date, datetime and Decimal."""

    name = "msgpack"
    dumps = staticmethod(_packb)
    loads = staticmethod(_unpackb)


class PickleSerializer:
    """Pickle protocol 5. Only for users who opted in: unpickling runs code from the checkpoint."""

    name = "pickle"

    def dumps(self, obj: Any) -> bytes:
        return pickle.dumps(obj, protocol=5)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)  # noqa: S301 - explicit opt-in only


MSGPACK = MsgpackSerializer()
PICKLE = PickleSerializer()
_CUSTOM: dict[str, Serializer] = {}


def register_serializer(serializer: Serializer) -> Serializer:
    """Make a custom serializer known by its ``name`` so state written with it can be restored.

    Raises:
        SettingError: ``serializer.name`` is "msgpack" or "pickle", which name spate's own.
    """
    if serializer.name in ("msgpack", "pickle"):
        raise SettingError(f"serializer name {serializer.name!r} is reserved for spate's own serializer: give "
                           "yours another name")
    _CUSTOM[serializer.name] = serializer
    return serializer


def resolve_serializer(spec: str | Serializer | None, allow_pickle: bool = False) -> Serializer:
    """``None``/"msgpack" → msgpack; "pickle" → pickle; any object with dumps/loads/name is used as is.

    Raises:
        SettingError: a name no serializer is registered under, or a reserved name (see
            :func:`register_serializer`).
    """
    if spec is None or spec == "msgpack":
        return MSGPACK
    if spec == "pickle":
        return PICKLE
    if isinstance(spec, str):
        if spec in _CUSTOM:
            return _CUSTOM[spec]
        raise SettingError(f"unknown serializer {spec!r}: use 'msgpack' (default), 'pickle' or a Serializer "
                           "(spate.serde.register_serializer makes one known by its name)")
    return register_serializer(spec)


def check_pickle_allowed(name: str, allow_pickle: bool, what: str) -> None:
    """Refuse serializer ``name`` if it is pickle and the reader did not opt in: a descriptor (or a
    checkpoint) saying "pickle" is not consent to unpickle, only the reader's ``allow_pickle`` is."""
    if name == "pickle" and not allow_pickle:
        raise SerializationError(f"{what} uses pickle; reading it runs code from the checkpoint, so pass "
                                 "allow_pickle=True (LocalRunner, SubtaskConfig, StreamSettings / "
                                 "spark.spate.allowPickle; CLI: --allow-pickle) if you trust it")


def serializer_by_name(name: str, allow_pickle: bool, what: str) -> Serializer:
    """The serializer a checkpoint recorded; pickle only if the reader opted in."""
    if name == "msgpack":
        return MSGPACK
    if name == "pickle":
        check_pickle_allowed(name, allow_pickle, what)
        return PICKLE
    if name in _CUSTOM:
        return _CUSTOM[name]
    raise SerializationError(f"{what} uses serializer {name!r}, which this process does not know; call "
                             "spate.serde.register_serializer() with it before restoring")


def encode(serializer: Serializer, value: Any, what: str) -> bytes:
    """Encode ``value`` or raise a :class:`SerializationError` that names ``what`` and the fix."""
    try:
        return serializer.dumps(value)
    except Exception as e:  # noqa: BLE001 - every serializer failure becomes one clear error
        hint = ("store plain data (None, bool, int, float, str, bytes, list, dict, tuple, date, datetime, "
                "Decimal) or opt in to pickle with serializer='pickle' and allow_pickle=True"
                if serializer.name == "msgpack"
                else "make the value serializable")
        raise SerializationError(f"{what}: cannot serialize value of type {type(value).__qualname__} with "
                                 f"{serializer.name} ({e}); {hint}") from e


def encode_key(key: Any) -> bytes:
    """Canonical bytes of a state key or namespace (msgpack; tuples stay tuples)."""
    try:
        return _packb(key)
    except UnicodeEncodeError as e:
        raise InvalidKeyError(f"key {short_repr(key)} holds a string that is not valid Unicode ({e.reason} at "
                              f"position {e.start}); keys are stored as UTF-8: remove lone surrogates from the "
                              "data, or key by bytes (s.encode('utf-8', 'surrogatepass'))") from e
    except Exception as e:  # noqa: BLE001
        raise InvalidKeyError(f"unsupported key {short_repr(key)} of type {type(key).__qualname__}: keys must be "
                              "int, str, bytes, bool, float, date, datetime, Decimal, None or tuples of them "
                              "(convert bytearray with bytes())") from e


def encode_keys(keys: Any) -> list[bytes]:
    """:func:`encode_key` of each of ``keys`` (one error names the first bad key)."""
    try:
        return packb_many(keys)
    except Exception:  # noqa: BLE001 - find the key and say what is wrong with it
        for key in keys:
            encode_key(key)
        raise


def decode_key(data: bytes) -> Any:
    return _unpackb(data)
