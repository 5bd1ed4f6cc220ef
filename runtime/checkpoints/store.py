"""Where checkpoint files go: one interface over a local directory, S3, GCS or HDFS.

Workers write their snapshots and the coordinator its manifests through a
:class:`CheckpointStore`; a restore reads them back, often only the segments of the key
groups it needs (:meth:`~CheckpointStore.get_range`). :func:`open_store` turns the
configured location into a store: a path or ``file://`` URI gives a :class:`LocalStore`,
an ``s3://``, ``gs://`` or ``hdfs://`` URI an :class:`ArrowStore` over ``pyarrow.fs``.
Every method blocks (callers run them in a thread), and a store may be used from several
threads at once.

The contract, which ``tests/test_checkpoint_store.py`` checks against every store:

1. **Atomic puts.** A reader sees nothing (or the previous content) or the whole new
   content, never a part, even if the writer is killed midway. A local disk gets a temp
   file in the same directory, renamed over the path when complete; an object store
   publishes an object only when its upload completes, so there the path is written
   directly.
2. **Durable puts.** Once :meth:`~CheckpointStore.put` returns, the bytes survive a crash
   of the process, and on a local disk of the machine (the file and its directory are
   fsynced). On other filesystems, as durable as closing a file makes it there.
3. **Chunks are not joined.** A big snapshot comes as a sequence of chunks, written one
   after the other as the sequence hands them over.
4. **Paths stay inside the store.** A path is relative and '/'-separated, of components
   made of ``[A-Za-z0-9._-]`` other than ``.`` and ``..``; any other is refused before the
   store is touched. :meth:`~CheckpointStore.list` only ever returns such paths: the temp
   files of unfinished puts carry a ``~`` and are never listed.
5. **Directories are prefixes.** A store holds files; a directory exists while a file is
   under it. ``list(prefix)`` is recursive, ``delete(prefix)`` removes everything under
   it, and neither minds a prefix that does not exist. (Where there are real
   directories, ``a`` cannot be a file while ``a/b`` is one; callers never need that.)

What is worth knowing about the filesystems under :class:`ArrowStore`:

- S3 has no rename: pyarrow's ``move`` copies then deletes, which is neither atomic nor
  cheap. A multipart upload, though, only becomes an object when completed, so writing
  the path directly is atomic. pyarrow cannot abandon an upload (apache/arrow#40502):
  closing, or dropping, an output stream completes it with what was written. So when
  taking a chunk from the caller's sequence raises midway, the store has to let the
  partial object be published and then deletes it: readers could glimpse it meanwhile
  and the previous content is gone. (The store's own write errors fail the upload
  instead; an in-memory list of bytes cannot fail to hand over its chunks.) A writer
  killed midway leaves an incomplete multipart upload, invisible but billed until a
  bucket lifecycle rule (``AbortIncompleteMultipartUpload``) removes it.
- S3 has no directories either: pyarrow fakes empty ones with zero-byte ``dir/`` marker
  objects, and writes one for the parent when the last object under it is deleted. Such
  markers are not files, so ``list`` never shows them.
- pyarrow's S3 URIs take credentials as user info (``s3://KEY:SECRET@bucket/prefix``,
  percent-encoded), not as query parameters; without them the AWS chain applies
  (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, instance metadata). Query
  parameters: ``region``, ``scheme``, ``endpoint_override``, ``allow_bucket_creation``
  and a few more; any other is refused. Without ``region`` or ``endpoint_override``,
  opening asks AWS for the bucket's region. The store never creates buckets. By default
  every upload is multipart, three requests for the smallest file;
  ``allow_delayed_open=true`` makes a small one a single PutObject (atomic too).
- Reading past the end of an S3 object is an error in pyarrow (not on a local file), so
  :meth:`~CheckpointStore.get_range` cuts the range at the end itself.
- HDFS renames, but does not rename over an existing file: pyarrow deletes the old one
  first, so an overwrite passes through "nothing", which the contract allows. pyarrow's
  local filesystem renames atomically but never fsyncs: :func:`open_store` gives a
  :class:`LocalStore` for local paths.

Exceptions::

    StreamRuntimeError
    └── CheckpointStoreError (OSError)    the filesystem failed (permission, network,
        │                                 missing bucket, a file where a directory
        │                                 should be) or the location cannot be opened;
        │                                 the message names the store, the path and the
        │                                 cause
        ├── CheckpointNotFound (FileNotFoundError)
        │                                 get, get_range or size of a file that is not
        │                                 there
        └── CheckpointPathError (ValueError)
                                          a path not of the form above
    TypeError                             put() of data that is not bytes-like, or a
                                          sequence with a chunk that is not
    ValueError                            get_range() with a negative offset or length
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from ..durable import fsync_dir
from ..errors import StreamRuntimeError

__all__ = [
    "ArrowStore",
    "CheckpointNotFound",
    "CheckpointPathError",
    "CheckpointStore",
    "CheckpointStoreError",
    "Data",
    "LocalStore",
    "open_store",
]

logger = logging.getLogger(__name__)

Chunk = bytes | bytearray | memoryview
Data = Chunk | Sequence[Chunk]

ARROW_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs")  # what open_store hands to pyarrow
OBJECT_STORES = frozenset({"s3", "gcs"})  # pyarrow type_names that publish on close
SECRET_QUERY_WORDS = ("secret", "token", "password", "credential")  # masked in uri

_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")  # a URI's; 2+ characters: no drive letter
_TEMP_MARK = "~"  # in temp names only: no valid path has one, so list() skips them
_ALLOWED = (
    "a checkpoint path is relative and '/'-separated, each component made of letters, "
    "digits, '.', '_' and '-', and not '.' or '..'"
)


class CheckpointStoreError(StreamRuntimeError, OSError):
    """The store could not do what was asked; the message says which store, path and why."""


class CheckpointNotFound(CheckpointStoreError, FileNotFoundError):
    """No file at ``path`` in the store at ``uri``."""

    def __init__(self, uri: str, path: str) -> None:
        super().__init__(f"no checkpoint file {path!r} in store {uri}")
        self.uri = uri
        self.path = path


class CheckpointPathError(CheckpointStoreError, ValueError):
    """A path a store refuses, before touching anything."""

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"invalid checkpoint path {path!r}: {reason}; {_ALLOWED}")
        self.path = path


def _check_path(path: str, *, root_ok: bool = False) -> str:
    """``path`` if valid (``""`` too when ``root_ok``); raises CheckpointPathError."""
    if not isinstance(path, str):
        raise CheckpointPathError(path, f"a str is expected, not {type(path).__name__}")
    if path == "":
        if root_ok:
            return path
        raise CheckpointPathError(path, "it is empty")
    if path.startswith("/"):
        raise CheckpointPathError(path, "it is absolute")
    for part in path.split("/"):
        if part == "":
            raise CheckpointPathError(path, "it has an empty component")
        if part in (".", ".."):
            raise CheckpointPathError(path, f"it has a {part!r} component")
        if not _COMPONENT.fullmatch(part):
            raise CheckpointPathError(path, f"component {part!r} has other characters")
    return path


def _is_valid(path: str) -> bool:
    try:
        _check_path(path)
    except CheckpointPathError:
        return False
    return True


def _chunks(data: Data) -> Iterator[memoryview]:
    """The bytes of ``data`` as flat byte views, taken from a sequence one at a time."""
    if isinstance(data, bytes | bytearray | memoryview):
        yield memoryview(data).cast("B")
        return
    if isinstance(data, str):
        raise TypeError("checkpoint data is bytes or a sequence of bytes, not str")
    for i, chunk in enumerate(data):
        try:
            view = memoryview(chunk)
        except TypeError:
            raise TypeError(
                f"chunk {i} of checkpoint data is {type(chunk).__name__}, not bytes-like"
            ) from None
        yield view.cast("B")


def _check_range(offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise ValueError(f"a range needs offset >= 0 and length >= 0, got {offset}, {length}")


def _cause(exc: BaseException) -> str:
    """The first line of an error, for a message (pyarrow's can run to pages)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


class CheckpointStore(ABC):
    """Files under one root, by relative path (see the module docstring's contract)."""

    uri: str
    """Where the store is, safe to log and record: no secrets in it."""

    @abstractmethod
    def put(self, path: str, data: Data) -> int:
        """Write ``data`` (bytes, or a sequence of chunks written in order without being
        joined) at ``path``, replacing any file there, atomically and durably; returns
        the bytes written. Creates the directories on the way."""

    @abstractmethod
    def get(self, path: str) -> bytes:
        """The whole file; CheckpointNotFound if there is none."""

    @abstractmethod
    def get_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer if the file ends first, none if it
        ended before); CheckpointNotFound if there is no file."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file is at ``path`` (a directory is not a file)."""

    @abstractmethod
    def size(self, path: str) -> int:
        """The file's bytes; CheckpointNotFound if there is none."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every file under directory ``prefix`` (the whole store for ``""``),
        recursively, as sorted paths relative to the store's root; [] for a missing
        prefix. Temp files of unfinished puts are never listed."""

    @abstractmethod
    def delete(self, path_or_prefix: str) -> None:
        """Remove the file at ``path_or_prefix``, or the directory and everything under
        it (temp files of puts that died too); nothing there is fine."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class LocalStore(CheckpointStore):
    """A directory on a local disk (created if missing): fsynced temp file, rename,
    fsynced directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))
        self.uri = self.root.as_uri()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointStoreError(
                f"checkpoint store {self.uri}: cannot create its directory: {exc}"
            ) from exc

    def _file(self, path: str, *, root_ok: bool = False) -> Path:
        return self.root.joinpath(*_check_path(path, root_ok=root_ok).split("/"))

    def _failed(self, action: str, path: str, exc: OSError) -> CheckpointStoreError:
        return CheckpointStoreError(
            f"checkpoint store {self.uri}: cannot {action} {path!r}: {_cause(exc)}"
        )

    def _make_dirs(self, directory: Path) -> None:
        """Create ``directory`` and its missing parents, each made durable in its parent."""
        missing = []
        while not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for d in reversed(missing):
            # Made meanwhile by a concurrent put; or a file, and then the write fails.
            with contextlib.suppress(FileExistsError):
                d.mkdir()
            fsync_dir(d.parent)

    def put(self, path: str, data: Data) -> int:
        target = self._file(path)
        temp = target.with_name(f".{target.name[:100]}{_TEMP_MARK}{uuid.uuid4().hex}.tmp")
        written = 0
        try:
            self._make_dirs(target.parent)
            with open(temp, "xb") as f:
                for chunk in _chunks(data):
                    written += f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
            fsync_dir(target.parent)
        except BaseException as exc:
            with contextlib.suppress(OSError):  # not created, or renamed already
                temp.unlink()
            if isinstance(exc, OSError):
                raise self._failed("write", path, exc) from exc
            raise
        return written

    def get(self, path: str) -> bytes:
        file = self._file(path)
        try:
            return file.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise CheckpointNotFound(self.uri, path) from None
        except OSError as exc:
            raise self._failed("read", path, exc) from exc

    def get_range(self, path: str, offset: int, length: int) -> bytes:
        file = self._file(path)
        _check_range(offset, length)
        try:
            with open(file, "rb") as f:
                f.seek(offset)
                return f.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise CheckpointNotFound(self.uri, path) from None
        except OSError as exc:
            raise self._failed("read", path, exc) from exc

    def exists(self, path: str) -> bool:
        return self._file(path).is_file()

    def size(self, path: str) -> int:
        file = self._file(path)
        if not file.is_file():
            raise CheckpointNotFound(self.uri, path)
        try:
            return file.stat().st_size
        except FileNotFoundError:
            raise CheckpointNotFound(self.uri, path) from None
        except OSError as exc:
            raise self._failed("stat", path, exc) from exc

    def list(self, prefix: str = "") -> list[str]:
        top = self._file(prefix, root_ok=True)

        def failed(exc: OSError) -> None:
            if not isinstance(exc, FileNotFoundError | NotADirectoryError):
                raise self._failed("list", prefix, exc) from exc

        found = []
        for directory, _, files in os.walk(top, onerror=failed):
            rel = Path(directory).relative_to(self.root).as_posix()
            for name in files:
                p = name if rel == "." else f"{rel}/{name}"
                if _is_valid(p):
                    found.append(p)
        return sorted(found)

    def delete(self, path_or_prefix: str) -> None:
        target = self._file(path_or_prefix)
        try:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
            fsync_dir(target.parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._failed("delete", path_or_prefix, exc) from exc


def _mask(uri: str) -> str:
    """``uri`` with the password of its user info and secret query values as ``***``."""
    head, question, query = uri.partition("?")
    scheme, slashes, rest = head.partition("://")
    if slashes:
        netloc, slash, path = rest.partition("/")
        userinfo, at, host = netloc.rpartition("@")
        if at and ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
        head = f"{scheme}://{netloc}{slash}{path}"
    items = []
    for item in query.split("&") if query else ():
        key, equals, _ = item.partition("=")
        secret = equals and any(word in key.lower() for word in SECRET_QUERY_WORDS)
        items.append(f"{key}=***" if secret else item)
    return head + question + "&".join(items)


class ArrowStore(CheckpointStore):
    """A directory (or bucket prefix) of any ``pyarrow.fs`` filesystem, by URI, e.g.
    ``s3://bucket/prefix?region=eu-west-1``: direct writes on object stores, temp file
    and ``move`` on filesystems with renames (see the module docstring)."""

    def __init__(self, uri: str) -> None:
        self.uri = _mask(uri)
        try:
            self._fs, root = pafs.FileSystem.from_uri(uri)
        except (OSError, pa.ArrowException) as exc:
            raise CheckpointStoreError(
                f"cannot open checkpoint store {self.uri}: {_cause(exc)}"
            ) from exc
        if not root.strip("/") and self._fs.type_name in OBJECT_STORES:
            raise CheckpointStoreError(
                f"checkpoint store {self.uri} names no bucket: give scheme://bucket[/prefix]"
            )
        self._root = root if root == "/" else root.rstrip("/")
        self._renames = self._fs.type_name not in OBJECT_STORES

    def _full(self, path: str) -> str:
        return self._root.rstrip("/") + "/" + path if path else self._root

    def _failed(self, action: str, path: str, exc: BaseException) -> CheckpointStoreError:
        return CheckpointStoreError(
            f"checkpoint store {self.uri}: cannot {action} {path!r}: {_cause(exc)}"
        )

    def _missing(self, path: str, exc: BaseException) -> CheckpointStoreError:
        """The error for a read of ``path`` that raised ``exc``: not found if no file."""
        try:
            is_file = self._fs.get_file_info(self._full(path)).type == pafs.FileType.File
        except (OSError, pa.ArrowException):
            is_file = True  # cannot tell: report the read's own error
        if isinstance(exc, FileNotFoundError) or not is_file:
            return CheckpointNotFound(self.uri, path)
        return self._failed("read", path, exc)

    def put(self, path: str, data: Data) -> int:
        full = self._full(_check_path(path))
        if self._renames:
            return self._put_by_rename(path, full, data)
        written = 0
        try:
            out = self._fs.open_output_stream(full)
        except (OSError, pa.ArrowException) as exc:
            raise self._failed("write", path, exc) from exc
        try:
            for chunk in _chunks(data):
                written += out.write(chunk)
        except BaseException as exc:
            self._unpublish(out, path, full)
            if isinstance(exc, OSError | pa.ArrowException):
                raise self._failed("write", path, exc) from exc
            raise
        try:
            out.close()
        except (OSError, pa.ArrowException) as exc:
            raise self._failed("write", path, exc) from exc
        return written

    def _unpublish(self, out: pa.NativeFile, path: str, full: str) -> None:
        """After a direct put failed midway. pyarrow cannot abandon an upload: closing
        publishes what was written, unless the upload itself failed. Delete what got
        published."""
        try:
            out.close()
        except (OSError, pa.ArrowException):
            return  # the upload failed: nothing was published
        try:
            self._fs.delete_file(full)
        except (OSError, pa.ArrowException) as exc:
            logger.error(
                "checkpoint store %s: a put of %r failed midway and its partial object "
                "could not be deleted: %s",
                self.uri,
                path,
                _cause(exc),
            )

    def _put_by_rename(self, path: str, full: str, data: Data) -> int:
        parent, name = full.rsplit("/", 1)
        temp = f"{parent}/.{name[:100]}{_TEMP_MARK}{uuid.uuid4().hex}.tmp"
        written = 0
        try:
            self._fs.create_dir(parent, recursive=True)
            with self._fs.open_output_stream(temp) as out:
                for chunk in _chunks(data):
                    written += out.write(chunk)
            self._fs.move(temp, full)
        except BaseException as exc:
            with contextlib.suppress(OSError, pa.ArrowException):  # not created, or moved
                self._fs.delete_file(temp)
            if isinstance(exc, OSError | pa.ArrowException):
                raise self._failed("write", path, exc) from exc
            raise
        return written

    def get(self, path: str) -> bytes:
        full = self._full(_check_path(path))
        try:
            with self._fs.open_input_file(full) as f:
                return f.read()
        except (OSError, pa.ArrowException) as exc:
            raise self._missing(path, exc) from exc

    def get_range(self, path: str, offset: int, length: int) -> bytes:
        full = self._full(_check_path(path))
        _check_range(offset, length)
        try:
            with self._fs.open_input_file(full) as f:
                if offset >= f.size():
                    return b""
                return f.read_at(min(length, f.size() - offset), offset)
        except (OSError, pa.ArrowException) as exc:
            raise self._missing(path, exc) from exc

    def _info(self, path: str) -> pafs.FileInfo:
        try:
            return self._fs.get_file_info(self._full(path))
        except (OSError, pa.ArrowException) as exc:
            raise self._failed("look up", path, exc) from exc

    def exists(self, path: str) -> bool:
        return self._info(_check_path(path)).type == pafs.FileType.File

    def size(self, path: str) -> int:
        info = self._info(_check_path(path))
        if info.type != pafs.FileType.File:
            raise CheckpointNotFound(self.uri, path)
        return info.size

    def list(self, prefix: str = "") -> list[str]:
        top = self._full(_check_path(prefix, root_ok=True))
        selector = pafs.FileSelector(top, recursive=True, allow_not_found=True)
        try:
            infos = self._fs.get_file_info(selector)
        except (NotADirectoryError, FileNotFoundError):
            return []  # a file, not a directory (local filesystems say so)
        except (OSError, pa.ArrowException) as exc:
            raise self._failed("list", prefix, exc) from exc
        base = self._root.rstrip("/") + "/"
        found = []
        for info in infos:
            where = urlsplit(info.path).path if "://" in info.path else info.path
            if info.type == pafs.FileType.File and where.startswith(base):
                rel = where[len(base) :]
                if _is_valid(rel):
                    found.append(rel)
        return sorted(found)

    def delete(self, path_or_prefix: str) -> None:
        full = self._full(_check_path(path_or_prefix))
        try:
            kind = self._fs.get_file_info(full).type
            if kind == pafs.FileType.Directory:
                self._fs.delete_dir(full)
            elif kind != pafs.FileType.NotFound:
                self._fs.delete_file(full)
        except FileNotFoundError:
            pass  # deleted meanwhile
        except (OSError, pa.ArrowException) as exc:
            raise self._failed("delete", path_or_prefix, exc) from exc


def open_store(location: str | os.PathLike[str]) -> CheckpointStore:
    """The store at ``location``: a path (absolute, or relative to the working directory)
    or ``file://`` URI gives a :class:`LocalStore`; an ``s3://``, ``gs://``/``gcs://``,
    ``hdfs://`` or ``viewfs://`` URI an :class:`ArrowStore`. Raises CheckpointStoreError
    for any other scheme, or a URI pyarrow cannot open."""
    if not isinstance(location, str):
        return LocalStore(location)
    match = _SCHEME.match(location)
    if match is None:
        return LocalStore(location)
    scheme = match[1].lower()
    if scheme == "file":
        parts = urlsplit(location)
        if parts.netloc not in ("", "localhost"):
            raise CheckpointStoreError(
                f"checkpoint location {location!r}: a file:// URI names a local path, "
                f"not host {parts.netloc!r}"
            )
        return LocalStore(unquote(parts.path))
    if scheme in ARROW_SCHEMES:
        return ArrowStore(location)
    accepted = ", ".join(f"{s}://" for s in ("file", *ARROW_SCHEMES))
    raise CheckpointStoreError(
        f"checkpoint location {_mask(location)!r} has scheme {scheme!r}: give a local "
        f"path (starting with './' if it has a ':') or a URI of {accepted}"
    )
