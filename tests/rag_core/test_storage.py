"""The store interface on a local folder and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from rag_core.errors import StoreError
from rag_core.storage import Store, StoreUnreachableError, translate_errors
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


def test_unwritable_local_store(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="blocked by a file"):
        Store(str(blocker / "store")).check_writable()
