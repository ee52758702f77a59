"""The store interface on a local folder and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from rag_core.errors import StoreError
from rag_core.storage import Store, StorePathError, StoreUnreachableError, join_url, relative_path, translate_errors
from runtime.settings import s3_config
from tests.conftest import S3Server


def _roundtrip(store: Store) -> None:
    store.check_writable()
    store.write_json({"a": 1}, "x", "m.json")
    store.write_bytes(b"payload", "x", "sub", "p.bin")
    assert store.read_json("x", "m.json") == {"a": 1}
    assert store.read_bytes("x", "sub", "p.bin") == b"payload"
    assert store.list("x") == ["m.json", "sub"]
    assert store.list("nothing-here") == []
    store.move_tree(("x", "sub"), ("y",))
    assert store.read_bytes("y", "p.bin") == b"payload" and not store.exists("x", "sub", "p.bin")
    store.remove("x")
    assert not store.exists("x", "m.json")


def test_local_store(tmp_path: Path) -> None:
    _roundtrip(Store(str(tmp_path / "store")))
    _roundtrip(Store(f"file://{tmp_path / 'store2'}"))


def test_local_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    for i in range(5):
        store.write_json({"i": i}, "m.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_s3_store(s3_server: S3Server) -> None:
    _roundtrip(Store(f"s3://{s3_server.bucket}/storage-test", s3_server.options()))


def test_store_pickles_without_its_filesystem(s3_server: S3Server) -> None:
    store = Store(f"s3://{s3_server.bucket}/pickled", s3_server.options())
    store.write_bytes(b"1", "f")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.read_bytes("f") == b"1"
    assert s3_server.secret not in repr(store)


def test_wrong_secret_is_refused_clearly(s3_server: S3Server) -> None:
    store = Store(f"s3://{s3_server.bucket}/x", s3_server.options(secret="not-the-secret"))
    with pytest.raises(StoreError, match=r"refused by the store .*check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        store.check_writable()


def test_unreachable_store(tmp_path: Path) -> None:
    options = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9",
               "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}}
    with pytest.raises(StoreError, match="unreachable.*AWS_ENDPOINT_URL"):
        Store("s3://bucket/prefix", options).check_writable()


def test_a_store_that_does_not_answer_is_reported_while_botocore_retries(s3_server: S3Server,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A refused connection is a warning at its first failed try, not tens of seconds of silence before the error;
    the tries within the next 10 s add no line, and an answer that is final (a missing key) adds none."""
    dead = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9", "config_kwargs": s3_config(2)}
    with caplog.at_level(logging.WARNING, logger="wikirag.store"), pytest.raises(StoreUnreachableError):
        Store("s3://bucket/notice", dead).read_bytes("a")
    assert [r.getMessage() for r in caplog.records if r.name == "wikirag.store"] == [
        "S3 store at 127.0.0.1:9: EndpointConnectionError on try 1 of 3; retrying, with up to 3 s of backoff, before "
        "giving up"]
    caplog.clear()
    live = Store(f"s3://{s3_server.bucket}/notice", {**s3_server.options(), "config_kwargs": s3_config(2)})
    with caplog.at_level(logging.WARNING, logger="wikirag.store"), pytest.raises(FileNotFoundError):
        live.read_bytes("missing")
    live.write_bytes(b"1", "present")
    assert live.read_bytes("present") == b"1"
    assert [r for r in caplog.records if r.name == "wikirag.store"] == []
    assert live.fs._wikirag_retry_notice  # the quiet above is the hook's, not a store without one


def test_task_files_read_from_s3_get_the_retry_notice_too(caplog: pytest.LogCaptureFixture) -> None:
    """A task file read straight through fsspec (rag_core.train.readers), not a Store: the same warning."""
    from rag_core.errors import StoreError
    from rag_core.train.readers import read_text

    dead = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9", "config_kwargs": s3_config(1)}
    with caplog.at_level(logging.WARNING, logger="wikirag.store"), pytest.raises(StoreError):
        read_text("s3://bucket/train.jsonl", dead)
    assert [r.getMessage() for r in caplog.records if r.name == "wikirag.store"] == [
        "S3 store at 127.0.0.1:9: EndpointConnectionError on try 1 of 2; retrying, with up to 1 s of backoff, before "
        "giving up"]


def test_a_server_error_through_the_retries_is_an_unreachable_store() -> None:
    """botocore's last 503, as s3fs hands it on (an OSError caused by the ClientError): one line, and the kind of
    error that stops a stage's other shards."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    busy = ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "Please reduce your request rate."},
                        "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
    expected = r"s3://b/p/x: reading failed: the store answered HTTP 503 \(.*\); check AWS_ENDPOINT_URL.*then rerun"
    with pytest.raises(StoreUnreachableError, match=expected), translate_errors("s3://b/p/x", "reading"):
        raise translate_boto_error(busy)


def test_a_server_failing_its_requests_points_at_its_disk_not_its_address() -> None:
    """HTTP 500 comes from a server that answers: the hint is its disk and log (tests/flows/test_disk_full.py meets
    a real full one), where a 503 points at the address and whether the server runs."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    failing = ClientError({"Error": {"Code": "InternalError", "Message": "We encountered an internal error."},
                           "ResponseMetadata": {"HTTPStatusCode": 500}}, "PutObject")
    with pytest.raises(StoreUnreachableError) as error, translate_errors("s3://b/p/x", "writing"):
        raise translate_boto_error(failing)
    message = str(error.value)
    assert message.startswith("s3://b/p/x: writing failed: the store answered HTTP 500 ("), message
    assert message.endswith("; the server is up but failing: check its free disk space and its log, then rerun "
                            "(a rebuild reuses finished work)"), message


@pytest.mark.parametrize(("url", "says"), [
    ("ftp2://host/store", "ftp2://host/store: ftp2:// is no storage protocol fsspec knows; give a folder, file:// or "
                          "s3://BUCKET/PREFIX"),
    ("s3://", "s3://: no bucket; give s3://BUCKET or s3://BUCKET/PREFIX"),
    ("s3:///prefix-without-bucket", "s3:///prefix-without-bucket: no bucket"),
])
def test_a_store_url_without_a_known_protocol_or_a_bucket_is_one_line(url: str, says: str) -> None:
    with pytest.raises(StoreError) as error:
        Store(url)
    assert str(error.value).startswith(says), str(error.value)


def test_unwritable_local_store(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="blocked by a file"):
        Store(str(blocker / "store")).check_writable()


def test_join_url_joins_names_and_names_joined_by_slashes() -> None:
    assert join_url("s3://bucket/", "indexes", "v1/manifest.json") == "s3://bucket/indexes/v1/manifest.json"
    assert join_url("/srv/store", "embeddings/0123456789abcdef/d1", "rows-0000000000-0000000010.ab12cd34.npy") == (
        "/srv/store/embeddings/0123456789abcdef/d1/rows-0000000000-0000000010.ab12cd34.npy")
    assert join_url("file:///srv/store", "a..b", ".hidden", "...") == "file:///srv/store/a..b/.hidden/..."  # names
    assert join_url("/srv/store") == "/srv/store"


BAD_PARTS = {
    "..": "a '..'", "../../victim.npy": "a '..'", "indexes/../../victim.npy": "a '..'", "a/..": "a '..'",
    ".": "a '.'", "./manifest.json": "a '.'", "": "an empty name", "/etc/passwd": "an empty name",
    "indexes/": "an empty name", "indexes//v1": "an empty name", "s3://other/x": "an empty name",
    "a\x00b": "a NUL character",
}


@pytest.mark.parametrize("part", list(BAD_PARTS))
def test_join_url_refuses_a_part_that_could_leave_the_base(part: str) -> None:
    with pytest.raises(StorePathError) as err:
        join_url("/srv/store", "indexes", part)
    message = str(err.value)
    assert message.startswith(f"/srv/store/indexes/{part}: path {part!r} has {BAD_PARTS[part]}")
    assert message.endswith("; a path on a store is names joined by '/' that stays inside the folder it is joined to")
    assert "\n" not in message and isinstance(err.value, StoreError)


def test_relative_path_under_a_folder() -> None:
    assert relative_path("embeddings/f/d/x.npy", "m.json", under="embeddings") == "embeddings/f/d/x.npy"
    for path in ("indexes/v1/shard-00000.faiss", "embeddingsX/x.npy", "embeddings"):
        with pytest.raises(StorePathError, match=rf"^m\.json: path '{path}' is not under embeddings/, the only"):
            relative_path(path, "m.json", under="embeddings")
    with pytest.raises(StorePathError, match=r"^m\.json: path 'embeddings/\.\./x' has a '\.\.'"):
        relative_path("embeddings/../x", "m.json", under="embeddings")


def _victim(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    victim = folder / "victim.npy"
    victim.write_bytes(b"not the store's")
    return victim


def test_no_store_operation_reaches_outside_a_local_store(tmp_path: Path) -> None:
    """Every operation of a real local store, given a path that climbs out of it: refused, the file outside intact."""
    victim = _victim(tmp_path / "outside")
    store = Store(str(tmp_path / "store"))
    store.write_bytes(b"inside", "indexes", "v1", "shard-00000.faiss")
    escape = ("indexes", "v1", "../../../outside/victim.npy")
    calls = [lambda: store.remove(*escape), lambda: store.read_bytes(*escape), lambda: store.exists(*escape),
             lambda: store.write_bytes(b"x", *escape), lambda: store.list("..", "outside"),
             lambda: store.files("..", "outside"), lambda: store.child("..").remove("outside"),
             lambda: store.move_tree(("..", "outside"), ("stolen",)), lambda: store.remove("/" + str(victim))]
    for call in calls:
        with pytest.raises(StorePathError, match=r"has (a '\.\.'|an empty name)"):
            call()
    assert victim.read_bytes() == b"not the store's" and sorted(p.name for p in victim.parent.iterdir()) == [
        "victim.npy"]
    assert store.read_bytes("indexes", "v1", "shard-00000.faiss") == b"inside"


def test_no_store_operation_reaches_outside_an_s3_prefix(s3_server: S3Server) -> None:
    """On a real S3 server: a key beside the store's prefix is out of reach through '..'."""
    beside = Store(f"s3://{s3_server.bucket}/beside", s3_server.options())
    beside.write_bytes(b"not the store's", "victim.npy")
    store = Store(f"s3://{s3_server.bucket}/paths-store", s3_server.options())
    store.write_bytes(b"inside", "indexes", "v1", "shard-00000.faiss")
    for call in (lambda: store.remove("..", "beside", "victim.npy"), lambda: store.read_bytes("../beside/victim.npy"),
                 lambda: store.child("indexes", "v1").remove("../../../beside")):
        with pytest.raises(StorePathError, match=r"has a '\.\.'"):
            call()
    assert beside.read_bytes("victim.npy") == b"not the store's"
