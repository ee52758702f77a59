"""Build leases on a local folder and on a real S3 server (SeaweedFS): one winner, heartbeats, takeover, release."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rag_core.leases import (
    LEASES_DIR,
    Lease,
    LeaseHeldError,
    LeaseRecord,
    holding_lease,
    live_leases,
    read_lease,
    take_lease,
    try_take_lease,
)
from rag_core.storage import Store

REPO = Path(__file__).resolve().parents[2]


def test_one_of_many_concurrent_takers_wins(store: Store) -> None:
    results: list[Lease | LeaseRecord] = []
    barrier = threading.Barrier(16)

    def take(i: int) -> None:
        barrier.wait()
        results.append(try_take_lease(store, "ingest", "enwiki-0123abcd", note=f"taker {i}"))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [r for r in results if isinstance(r, Lease)]
    assert len(won) == 1, [r for r in results if isinstance(r, Lease)]
    holder = won[0].record
    assert all(r.holder == holder.holder for r in results if isinstance(r, LeaseRecord))  # the others see who won
    assert read_lease(store, "ingest", "enwiki-0123abcd") == holder and won[0].took_over is None
    assert won[0].release() and read_lease(store, "ingest", "enwiki-0123abcd") is None


def test_a_heartbeat_keeps_the_lease_and_release_frees_it(store: Store) -> None:
    with take_lease(store, "index", "d1", ttl_s=1.0, protects=["embeddings/*/d1/"]) as lease:
        lease.start_heartbeat(every_s=0.2)
        first = lease.record.heartbeat
        time.sleep(2.0)  # twice the ttl: only the heartbeat keeps it live
        other = try_take_lease(store, "index", "d1", ttl_s=1.0)
        assert isinstance(other, LeaseRecord) and other.holder == lease.record.holder and other.heartbeat > first
        assert lease.protect("indexes/v9/")
        assert [r.protects for r in live_leases(store)] == [("embeddings/*/d1/", "indexes/v9/")]
        record = live_leases(store)[0]
        assert holding_lease([record], "embeddings/0123/d1/rows-0-10.npy") == record
        assert holding_lease([record], "indexes/v9/") == record and holding_lease([record], "indexes/") == record
        assert holding_lease([record], "embeddings/0123/d2/rows-0-10.npy") is None
    assert read_lease(store, "index", "d1") is None and live_leases(store) == []
    assert isinstance(try_take_lease(store, "index", "d1"), Lease)


def test_an_expired_lease_is_taken_over_and_its_old_holder_learns_it_lost(store: Store) -> None:
    old = take_lease(store, "ingest", "d1", ttl_s=0.5)  # no heartbeat: as if its run hung or died
    time.sleep(0.7)
    assert live_leases(store) == [] and read_lease(store, "ingest", "d1") == old.record  # expired, still there
    new = take_lease(store, "ingest", "d1", ttl_s=30)
    assert new.took_over == old.record and new.record.holder != old.record.holder
    assert not old.refresh() and old.lost  # its conditional heartbeat fails: the record is no longer its own
    assert not old.release()  # and its release leaves the new holder's lease alone
    assert read_lease(store, "ingest", "d1") == new.record
    new.release()


def test_a_waiting_taker_gets_the_lease_when_the_holder_releases_and_a_bounded_wait_names_the_holder(
        store: Store) -> None:
    first = take_lease(store, "ingest", "d1", ttl_s=30, note="wikirag ingest sample.xml")
    with pytest.raises(LeaseHeldError) as caught:
        take_lease(store, "ingest", "d1", wait_s=0.3, poll_s=0.1)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(store.url_of(LEASES_DIR, "ingest", "d1.json"))
    assert f"held by {first.record.holder} on " in text and f"pid {os.getpid()} (wikirag ingest sample.xml)" in text

    waits: list[LeaseRecord] = []
    threading.Timer(0.5, first.release).start()
    started = time.monotonic()
    second = take_lease(store, "ingest", "d1", wait_s=30, poll_s=0.1, on_wait=waits.append)
    assert 0.4 < time.monotonic() - started < 10 and waits == [first.record] and second.took_over is None
    second.release()


def test_a_damaged_lease_protects_nothing_and_is_taken(store: Store) -> None:
    store.write_bytes(b"{not json", LEASES_DIR, "ingest", "d1.json")
    assert live_leases(store) == []
    lease = take_lease(store, "ingest", "d1")
    assert read_lease(store, "ingest", "d1") == lease.record
    lease.release()


HOLD = """
import sys, time
from rag_core.leases import take_lease
from rag_core.storage import Store
with take_lease(Store(sys.argv[1]), "ingest", "d1", ttl_s=1.0):
    print("held", flush=True)
    if sys.argv[2] == "fail":
        raise RuntimeError("the build failed")
    time.sleep(600)
"""


def test_a_failed_run_releases_its_lease_and_a_killed_one_is_taken_over_after_its_ttl(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    failed = subprocess.run([sys.executable, "-c", HOLD, store.url, "fail"], capture_output=True, text=True, env=env,
                            timeout=120)
    assert failed.returncode == 1 and "the build failed" in failed.stderr and failed.stdout == "held\n"
    assert read_lease(store, "ingest", "d1") is None  # released on the way out

    killed = subprocess.Popen([sys.executable, "-c", HOLD, store.url, "hang"], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert killed.stdout.readline() == "held\n"
        held = read_lease(store, "ingest", "d1")
        time.sleep(1.5)  # its heartbeat thread keeps it live past the ttl
        assert isinstance(try_take_lease(store, "ingest", "d1"), LeaseRecord)
        assert read_lease(store, "ingest", "d1").heartbeat > held.heartbeat
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    with pytest.raises(LeaseHeldError):  # just killed: its lease is live until the ttl runs out
        take_lease(store, "ingest", "d1", wait_s=0)
    lease = take_lease(store, "ingest", "d1", wait_s=10, poll_s=0.1)
    assert lease.took_over is not None and lease.took_over.pid == killed.pid
    lease.release()
