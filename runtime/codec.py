"""msgpack encoding of records, state and messages.

Everything msgpack knows (None, bool, int, float, str, bytes, list, dict) travels natively;
tuples come back as tuples (arrays decode as tuples, keeping records hashable); any other
picklable object is wrapped in an extension type holding its pickle. Decoding a frame that
is not valid raises :class:`CodecError` naming the problem.
"""

from __future__ import annotations

import pickle
from typing import Any

import msgpack

from .errors import StreamRuntimeError

__all__ = ["CodecError", "packb", "unpackb"]

_PICKLE_EXT = 1


class CodecError(StreamRuntimeError, ValueError):
    """Bytes that do not decode, or an object that cannot be encoded."""


def _default(obj: Any) -> Any:
    if type(obj) is tuple:  # strict types send tuples here: plain arrays, decoded as tuples
        return list(obj)
    try:
        return msgpack.ExtType(_PICKLE_EXT, pickle.dumps(obj, protocol=5))
    except Exception as exc:
        raise CodecError(f"cannot encode {type(obj).__name__} object {obj!r}: {exc}") from exc


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _PICKLE_EXT:
        return pickle.loads(data)
    raise CodecError(f"unknown msgpack extension type {code}")


# strict_types: subclasses of msgpack types (namedtuples, defaultdicts...) are pickled, so
# they arrive as what they were; surrogatepass: strings with lone surrogates travel too.
_packer_kwargs = {
    "default": _default,
    "use_bin_type": True,
    "strict_types": True,
    "unicode_errors": "surrogatepass",
}


def packb(obj: Any) -> bytes:
    try:
        return msgpack.packb(obj, **_packer_kwargs)
    except CodecError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def unpackb(data: bytes) -> Any:
    try:
        return msgpack.unpackb(
            data,
            use_list=False,
            raw=False,
            ext_hook=_ext_hook,
            strict_map_key=False,
            unicode_errors="surrogatepass",
        )
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"frame of {len(data)} bytes does not decode: {exc}") from exc
