"""The checkpoint store's contract, run against every store: LocalStore on a directory,
ArrowStore on a file:// URI, and ArrowStore on S3 served by a real moto server.

Faults are real: a child process killed with SIGKILL in the middle of a put (it says
when it is there, on stdout), a chunk sequence that raises, a bucket that does not exist.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.checkpoints.store import (
    ArrowStore,
    CheckpointNotFound,
    CheckpointPathError,
    CheckpointStore,
    CheckpointStoreError,
    LocalStore,
    open_store,
)
from runtime.errors import StreamRuntimeError
from tests.s3server import ACCESS_KEY, SECRET_KEY, S3Server, running_s3_server

REPO = Path(__file__).resolve().parents[1]
BUCKET = "checkpoints"
MiB = 1024 * 1024
CHILD_TIMEOUT_S = 60  # a child imports pyarrow, then writes a few MB before saying so

Location = tuple[str, str]  # ("local", directory) or ("arrow", URI with any secrets)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with running_s3_server() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(params=["local", "arrow-file", "arrow-s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """Where a fresh, empty store is; the S3 server starts only for the S3 cases."""
    if request.param == "arrow-s3":
        s3: S3Server = request.getfixturevalue("s3")
        return "arrow", s3.uri(BUCKET, f"store-{uuid.uuid4().hex}")
    root = tmp_path / "store"
    return ("local", str(root)) if request.param == "local" else ("arrow", root.as_uri())


def make_store(kind: str, where: str) -> CheckpointStore:
    return LocalStore(where) if kind == "local" else ArrowStore(where)


@pytest.fixture
def store(location: Location) -> CheckpointStore:
    return make_store(*location)


def is_s3(location: Location) -> bool:
    return location[1].startswith("s3://")


def local_root(location: Location) -> Path:
    """The directory of a store on the local disk."""
    kind, where = location
    return Path(where) if kind == "local" else Path(unquote(urlsplit(where).path))


# Writing and reading


@pytest.mark.parametrize("data", [b"hello", bytearray(b"hello"), memoryview(b"xhellox")[1:-1]])
def test_put_then_get_round_trips_bytes(store: CheckpointStore, data: bytes) -> None:
    assert store.put("job/1/manifest", data) == 5
    assert store.get("job/1/manifest") == b"hello"


def test_an_empty_file_round_trips(store: CheckpointStore) -> None:
    assert store.put("empty", b"") == 0
    assert store.get("empty") == b""
    assert store.size("empty") == 0
    assert store.exists("empty")


def test_chunks_are_written_in_order(store: CheckpointStore) -> None:
    chunks = [b"abc", memoryview(b"defg"), bytearray(b"h"), b"", b"ij"]
    assert store.put("t/chunks", chunks) == 10
    assert store.get("t/chunks") == b"abcdefghij"


def test_a_large_chunk_sequence_round_trips(store: CheckpointStore) -> None:
    chunks = [bytes([i]) * MiB for i in range(20)]  # on S3, a multipart upload
    assert store.put("big/snapshot", chunks) == 20 * MiB
    assert store.size("big/snapshot") == 20 * MiB
    assert store.get("big/snapshot") == b"".join(chunks)
    assert store.get_range("big/snapshot", 10 * MiB - 2, 4) == b"\x09\x09\x0a\x0a"


def test_a_large_put_to_s3_is_a_multipart_upload(s3: S3Server) -> None:
    prefix = f"multipart-{uuid.uuid4().hex}"
    ArrowStore(s3.uri(BUCKET, prefix)).put("big", [b"\x01" * MiB] * 20)
    etag = s3.client().head_object(Bucket=BUCKET, Key=f"{prefix}/big")["ETag"]
    assert "-" in etag, f"a single-part object: {etag}"  # multipart ETags end in -<parts>


def test_overwrite_replaces_the_whole_file(store: CheckpointStore) -> None:
    store.put("f", b"x" * 1000)
    store.put("f", [b"new", b"er"])
    assert store.get("f") == b"newer"
    assert store.size("f") == 5


def test_get_range_reads_a_segment(store: CheckpointStore) -> None:
    data = bytes(range(256)) * 16
    store.put("segments", [data[:1000], data[1000:]])

    @settings(max_examples=40, deadline=None)
    @given(offset=st.integers(0, len(data) + 8), length=st.integers(0, 600))
    def reads(offset: int, length: int) -> None:
        assert store.get_range("segments", offset, length) == data[offset : offset + length]

    reads()


def test_get_range_refuses_a_negative_offset_or_length(store: CheckpointStore) -> None:
    store.put("f", b"0123")
    with pytest.raises(ValueError, match="offset >= 0"):
        store.get_range("f", -1, 2)
    with pytest.raises(ValueError, match="length >= 0"):
        store.get_range("f", 0, -2)


def test_size_and_exists(store: CheckpointStore) -> None:
    assert not store.exists("d/f")
    store.put("d/f", [b"12", b"345"])
    assert store.exists("d/f")
    assert store.size("d/f") == 5
    assert not store.exists("d"), "a directory is not a file"


@pytest.mark.parametrize("read", ["get", "get_range", "size"])
def test_reading_a_missing_file_raises_not_found(store: CheckpointStore, read: str) -> None:
    store.put("d/f", b"x")
    for path in ("d/missing", "missing/f", "d"):
        args = (path, 0, 1) if read == "get_range" else (path,)
        with pytest.raises(CheckpointNotFound) as caught:
            getattr(store, read)(*args)
        assert isinstance(caught.value, FileNotFoundError)
        assert repr(path) in str(caught.value)
        assert store.uri in str(caught.value)
        assert caught.value.path == path


# Listing and deleting


@pytest.fixture
def filled(store: CheckpointStore) -> CheckpointStore:
    for path in ("b/2", "a/1", "a/sub/3", "ab/4", "c"):
        store.put(path, path.encode())
    return store


def test_list_is_sorted_recursive_and_relative(filled: CheckpointStore) -> None:
    assert filled.list() == ["a/1", "a/sub/3", "ab/4", "b/2", "c"]


def test_list_of_a_prefix_is_the_directory_only(filled: CheckpointStore) -> None:
    assert filled.list("a") == ["a/1", "a/sub/3"]  # not ab/4
    assert filled.list("a/sub") == ["a/sub/3"]


def test_list_of_a_missing_prefix_or_a_file_is_empty(filled: CheckpointStore) -> None:
    assert filled.list("missing") == []
    assert filled.list("a/missing/deeper") == []
    assert filled.list("c") == []


def test_delete_a_file(filled: CheckpointStore) -> None:
    filled.delete("a/1")
    assert not filled.exists("a/1")
    assert filled.list() == ["a/sub/3", "ab/4", "b/2", "c"]


def test_delete_a_prefix_removes_everything_under_it(filled: CheckpointStore) -> None:
    filled.delete("a")
    assert filled.list() == ["ab/4", "b/2", "c"]
    assert filled.list("a") == []
    assert not filled.exists("a/sub/3")


def test_delete_of_a_missing_path_is_fine(filled: CheckpointStore) -> None:
    filled.delete("missing")
    filled.delete("a/missing/deeper")
    filled.delete("c")
    filled.delete("c")
    assert filled.list() == ["a/1", "a/sub/3", "ab/4", "b/2"]


def test_a_new_store_is_empty(store: CheckpointStore) -> None:
    assert store.list() == []
    store.delete("anything")


FILES = [f"{d}/{f}" for d in ("x", "y") for f in ("p", "q", "r")]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(FILES), st.binary(max_size=40)),
        st.tuples(st.just("delete"), st.sampled_from([*FILES, "x", "y"]), st.just(b"")),
    ),
    max_size=12,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_a_store_behaves_like_a_dict(store: CheckpointStore, ops: list) -> None:
    store.delete("m")  # the same store serves every example
    model: dict[str, bytes] = {}
    for op, path, data in ops:
        path = f"m/{path}"
        if op == "put":
            store.put(path, [data[:7], data[7:]])
            model[path] = data
        else:
            store.delete(path)
            model = {p: d for p, d in model.items() if p != path and not p.startswith(path + "/")}
    assert store.list("m") == sorted(model)
    for path, data in model.items():
        assert store.get(path) == data


# Paths

BAD_PATHS = ["../x", "/abs", "a//b", "a/./b", "a b", "", "a/", "a/../../x", "x\n", "é", "a\\b"]
OPERATIONS: dict[str, Callable[[CheckpointStore, str], object]] = {
    "put": lambda store, path: store.put(path, b"x"),
    "get": lambda store, path: store.get(path),
    "get_range": lambda store, path: store.get_range(path, 0, 1),
    "size": lambda store, path: store.size(path),
    "exists": lambda store, path: store.exists(path),
    "delete": lambda store, path: store.delete(path),
    "list": lambda store, path: store.list(path),
}


@pytest.mark.parametrize("path", BAD_PATHS)
def test_a_bad_path_is_refused_by_every_operation(
    store: CheckpointStore, location: Location, path: str
) -> None:
    for name, operation in OPERATIONS.items():
        if name == "list" and path == "":
            continue  # the whole store
        with pytest.raises(CheckpointPathError) as caught:
            operation(store, path)
        assert isinstance(caught.value, ValueError)
        assert repr(path) in str(caught.value), name
        assert "letters, digits, '.', '_' and '-'" in str(caught.value), name
    assert store.list() == []
    if not is_s3(location):
        assert set(os.listdir(local_root(location).parent)) <= {"store"}


@settings(max_examples=200, deadline=None)
@given(path=st.text(alphabet="ab./_-~ \\\x00é", max_size=10))
def test_any_string_is_refused_or_stored_at_exactly_that_path(path: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(Path(tmp, "store"))
        try:
            store.put(path, b"x")
        except CheckpointPathError:
            assert store.list() == []
        else:
            assert store.list() == [path]
            assert Path(tmp, "store", path).read_bytes() == b"x"
        assert os.listdir(tmp) == ["store"]


def test_paths_may_hold_dots_dashes_and_underscores(store: CheckpointStore) -> None:
    path = "job-1.v2/ck_0007/.meta/..data"
    store.put(path, b"x")
    assert store.list() == [path]


# Failures


class FailingChunks(Sequence[bytes]):
    """Two chunks, then the sequence raises: a snapshot that fails while it is written."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> bytes:  # type: ignore[override]
        if i >= 2:
            raise RuntimeError("snapshot failed")
        return b"x" * 1000


def test_a_chunk_sequence_that_raises_leaves_no_file(store: CheckpointStore) -> None:
    with pytest.raises(RuntimeError, match="snapshot failed"):
        store.put("d/f", FailingChunks())
    assert not store.exists("d/f")
    assert store.list() == []


def test_data_that_is_not_bytes_is_refused(store: CheckpointStore) -> None:
    with pytest.raises(TypeError, match="not str"):
        store.put("f", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="chunk 1 of checkpoint data is str"):
        store.put("f", [b"ok", "text"])  # type: ignore[list-item]
    assert store.list() == []


def test_a_file_where_a_directory_should_be_is_a_store_error(
    store: CheckpointStore, location: Location
) -> None:
    if is_s3(location):
        pytest.skip("an object store has no directories: 'a' and 'a/b' can both be objects")
    store.put("a", b"file")
    with pytest.raises(CheckpointStoreError) as caught:
        store.put("a/b", b"x")
    assert not isinstance(caught.value, CheckpointNotFound | CheckpointPathError)
    assert store.uri in str(caught.value)
    assert "'a/b'" in str(caught.value)
    assert store.list() == ["a"]


def test_a_missing_bucket_is_a_store_error_naming_the_cause(s3: S3Server) -> None:
    store = ArrowStore(s3.uri("no-such-bucket", "x"))
    with pytest.raises(CheckpointStoreError) as caught:
        store.put("f", b"x")
    message = str(caught.value)
    assert store.uri in message
    assert "'f'" in message
    assert "bucket does not exist" in message
    assert isinstance(caught.value.__cause__, OSError)


def test_a_local_root_that_cannot_be_made_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(CheckpointStoreError, match="cannot create its directory"):
        LocalStore(tmp_path / "file" / "store")


def test_concurrent_puts_to_distinct_paths(store: CheckpointStore) -> None:
    def put(i: int) -> int:
        data = [bytes([i]) * (1000 + i), str(i).encode()]
        return store.put(f"task-{i % 4}/part-{i}", data)

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(put, i) for i in range(32)]
        written = [f.result(timeout=60) for f in futures]
    assert written == [1000 + i + len(str(i)) for i in range(32)]
    assert store.list() == sorted(f"task-{i % 4}/part-{i}" for i in range(32))
    for i in range(32):
        assert store.get(f"task-{i % 4}/part-{i}") == bytes([i]) * (1000 + i) + str(i).encode()


# A writer killed midway

CHILD = """
import os, sys
from collections.abc import Sequence
from runtime.checkpoints.store import ArrowStore, LocalStore

kind, where, path = sys.argv[1:]
store = LocalStore(where) if kind == "local" else ArrowStore(where)

class Chunks(Sequence):
    # 6 chunks of 6 MiB; asked for the third, the first two are written: say so, wait.
    def __len__(self):
        return 6
    def __getitem__(self, i):
        if i >= 6:
            raise IndexError(i)
        if i == 2:
            print("midway", flush=True)
            sys.stdin.read()  # until killed; should the parent go first, never finish
            os._exit(3)
        return bytes([65 + i]) * (6 * 1024 * 1024)

store.put(path, Chunks())
"""


def unfinished_writes(location: Location, s3: S3Server | None) -> list[str]:
    """What a put killed midway left behind, looking under the store."""
    if is_s3(location):
        assert s3 is not None
        prefix = location[1].split("@", 1)[1].split("?", 1)[0].removeprefix(f"{BUCKET}/")
        uploads = s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix + "/")
        return [u["Key"] for u in uploads.get("Uploads", [])]
    return sorted(
        os.path.join(d, name)
        for d, _, names in os.walk(local_root(location))
        for name in names
        if "~" in name
    )


@pytest.mark.parametrize("previous", [None, b"the previous checkpoint"])
def test_a_writer_killed_midway_leaves_nothing_or_the_previous_file(
    store: CheckpointStore,
    location: Location,
    request: pytest.FixtureRequest,
    previous: bytes | None,
) -> None:
    if previous is not None:
        store.put("job/ck-1/task-0", previous)
    before = store.list()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *location, "job/ck-1/task-0"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], CHILD_TIMEOUT_S)
        line = child.stdout.readline() if ready else b""
        assert line == b"midway\n", child.stderr.read() if child.poll() is not None else line
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=CHILD_TIMEOUT_S) == -signal.SIGKILL
    finally:
        child.kill()
        child.communicate(timeout=CHILD_TIMEOUT_S)

    s3 = request.getfixturevalue("s3") if is_s3(location) else None
    assert unfinished_writes(location, s3), "the child was not killed in the middle of a put"
    if previous is None:
        assert not store.exists("job/ck-1/task-0")
        with pytest.raises(CheckpointNotFound):
            store.get("job/ck-1/task-0")
    else:
        assert store.get("job/ck-1/task-0") == previous
    assert store.list() == before, "a temp file is listed"
    assert store.list("job") == before

    store.delete("job")
    assert store.list() == []
    if not is_s3(location):  # S3 keeps the upload until a lifecycle rule aborts it
        assert unfinished_writes(location, s3) == []


# Opening a store


def test_open_store_of_a_path(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ck"))
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path / "ck"
    assert store.uri == (tmp_path / "ck").as_uri()
    assert (tmp_path / "ck").is_dir()
    assert isinstance(open_store(tmp_path / "other"), LocalStore)


def test_open_store_of_a_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("rel/ck")
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path / "rel" / "ck"


def test_open_store_of_a_file_uri(tmp_path: Path) -> None:
    store = open_store((tmp_path / "with space").as_uri())
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path / "with space"
    with pytest.raises(CheckpointStoreError, match="not host 'elsewhere'"):
        open_store("file://elsewhere/x")


def test_open_store_of_an_s3_uri(s3: S3Server) -> None:
    store = open_store(s3.uri(BUCKET, f"opened-{uuid.uuid4().hex}"))
    assert isinstance(store, ArrowStore)
    store.put("f", b"x")
    assert store.get("f") == b"x"


def test_the_uri_of_an_s3_store_hides_the_secret(s3: S3Server) -> None:
    store = open_store(s3.uri(BUCKET, "p"))
    assert SECRET_KEY not in store.uri
    assert SECRET_KEY not in repr(store)
    assert store.uri.startswith(f"s3://{ACCESS_KEY}:***@{BUCKET}/p?endpoint_override=")


def test_open_store_of_an_unknown_scheme_says_what_is_accepted() -> None:
    with pytest.raises(CheckpointStoreError) as caught:
        open_store("ftp://user:hunter2@host/x")
    message = str(caught.value)
    assert "'ftp://user:***@host/x'" in message
    assert "hunter2" not in message
    assert "s3://" in message and "hdfs://" in message and "local path" in message


@pytest.mark.parametrize(
    ("uri", "reason"),
    [("s3://bucket/x?no_such_option=1", "no_such_option"), ("s3://?region=x", "no bucket")],
)
def test_open_store_of_a_uri_pyarrow_cannot_open(uri: str, reason: str) -> None:
    with pytest.raises(CheckpointStoreError, match=reason) as caught:
        open_store(uri)
    assert uri in str(caught.value)


def test_the_exceptions_keep_their_builtin_bases() -> None:
    assert issubclass(CheckpointStoreError, StreamRuntimeError)
    assert issubclass(CheckpointStoreError, OSError)
    assert issubclass(CheckpointNotFound, CheckpointStoreError)
    assert issubclass(CheckpointNotFound, FileNotFoundError)
    assert issubclass(CheckpointPathError, CheckpointStoreError)
    assert issubclass(CheckpointPathError, ValueError)


def test_the_s3_server_stops_without_leaving_threads() -> None:
    before = set(threading.enumerate())
    with running_s3_server() as server:
        server.create_bucket("bkt")
        ArrowStore(server.uri("bkt")).put("f", b"x")
    assert set(threading.enumerate()) <= before
