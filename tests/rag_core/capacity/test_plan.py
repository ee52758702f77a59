"""The capacity planner on a real multistream dump of the sample's pages, calibrated with a real (tiny) encoder."""

from __future__ import annotations

import bz2
import dataclasses
import math
from pathlib import Path

import pytest

from rag_core.capacity.dump_plan import plan_rebuild
from rag_core.capacity.plan import (
    GB,
    STAGE_OVERHEAD,
    Budget,
    CapacityError,
    Rates,
    check_budget,
    index_bytes_per_vector,
    predict,
)
from rag_core.errors import DumpError
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.wiki.dumps import DumpSource
from rag_core.wiki.multistream import iter_shard_pages, plan_shards, read_index
from rag_core.wiki.passages import passages_from_pages
from tests.helpers.encoderfiles import save_tiny_bert
from tests.rag_core.capacity.sample_dump import sample_multistream

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RATES = Rates(passages_per_dump_byte=0.002, parse_bytes_per_cpu_s=1e6, embed_passages_per_cpu_s=100.0,
              index_vectors_per_cpu_s=10_000.0, passage_bytes=300.0, index_text_bytes=350.0, dim=384,
              encoder_bytes=90_000_000)


@pytest.fixture(scope="module")
def dump(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, EncoderConfig]:
    folder = tmp_path_factory.mktemp("plan")
    path, index = sample_multistream(folder)
    return path, index, EncoderConfig(path=str(save_tiny_bert(folder / "tiny")), dtype="float32")


def ingested_passages(path: Path, index: Path) -> int:
    """What ingest's reader and chunker make of the whole dump."""
    streams = read_index(DumpSource(str(index)))
    shard = plan_shards(streams, path.stat().st_size, 1)[0]
    return passages_from_pages(iter_shard_pages(DumpSource(str(path)), shard))[0].num_rows


def test_plan_of_a_real_dump_predicts_every_figure(dump: tuple[Path, Path, EncoderConfig]) -> None:
    path, index, encoder = dump
    plan = plan_rebuild(str(path), str(index), Budget(workers=2), encoder, n_streams=12)  # all 12 streams
    assert plan.pages == 60
    assert plan.passages == ingested_passages(path, index)  # every stream sampled: the count is exact
    assert plan.factory == "Flat" and plan.shards == 4  # the index stage's own rules at this size
    assert plan.disk_bytes["dump"] == path.stat().st_size
    assert all(plan.disk_bytes[k] > 0 for k in ("passages", "embeddings", "index"))
    assert plan.disk_bytes["embeddings"] >= plan.passages * 4 * 32  # 32-d float32 vectors at least
    assert all(h > 0 for h in plan.hours.values()) and plan.worker_memory_bytes > 0
    assert plan.summary()["fits"] and not plan.over


def test_plan_from_a_few_streams_is_near_the_whole(dump: tuple[Path, Path, EncoderConfig]) -> None:
    path, index, encoder = dump
    plan = plan_rebuild(str(path), None, Budget(), encoder, n_streams=3)  # index found beside the dump
    assert plan.pages == 60
    assert abs(plan.passages / ingested_passages(path, index) - 1) < 0.5


def test_a_budget_too_small_is_refused_with_its_numbers(dump: tuple[Path, Path, EncoderConfig]) -> None:
    path, index, encoder = dump
    plan = plan_rebuild(str(path), str(index), Budget(workers=1, disk_gb=1e-4, deadline_hours=1e-4), encoder,
                        n_streams=2)
    assert len(plan.over) == 2
    with pytest.raises(CapacityError) as refused:
        check_budget(plan)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message
    assert f"{plan.disk_total / GB:,.3g} GB (budget 0.0001 GB)" in message
    assert "deadline 0.0001 h" in message


def test_malformed_index_names_the_file(dump: tuple[Path, Path, EncoderConfig], tmp_path: Path) -> None:
    path, _, encoder = dump
    bad = tmp_path / "broken-index.txt.bz2"
    bad.write_bytes(bz2.compress(b"this is not an index\n"))
    with pytest.raises(DumpError, match=r"broken-index\.txt\.bz2: line 1 is not 'offset:page_id:title'"):
        plan_rebuild(str(path), str(bad), Budget(), encoder)
    elsewhere = tmp_path / "other-index.txt.bz2"  # well formed, but its offsets run past this dump
    elsewhere.write_bytes(bz2.compress(f"{path.stat().st_size + 10}:1:A\n".encode()))
    with pytest.raises(DumpError, match=r"other-index\.txt\.bz2: its last stream starts at byte .* past the dump"):
        plan_rebuild(str(path), str(elsewhere), Budget(), encoder)


def test_worker_memory_picks_a_smaller_index_and_more_shards() -> None:
    roomy = predict("d", 1_000_000, 10**10, RATES, Budget(workers=4))
    tight = predict("d", 1_000_000, 10**10, RATES, Budget(workers=4, worker_memory_gb=2.0))
    assert roomy.passages == tight.passages == 20_000_000
    # no memory limit: the sharded version's fast-scan lists, searched as one index by whoever holds them
    assert roomy.factory.startswith("IVF") and roomy.factory.endswith(",PQ192x4fs,RFlat")
    # the very factory the rebuild resolves for that version (its IVF lists sized by its training sample)
    rebuilt = IndexConfig().resolve_factory(20_000_000, 384, total_vectors=20_000_000, shards=roomy.shards)
    assert roomy.factory == rebuilt, (roomy.factory, rebuilt)
    assert tight.factory != roomy.factory and tight.disk_bytes["index"] < roomy.disk_bytes["index"]
    assert tight.worker_memory_bytes <= 2.0 * GB < roomy.worker_memory_bytes
    # serving search, each of the 4 workers holds a quarter of the codes and raw vectors
    assert roomy.worker_memory_bytes > 20_000_000 * index_bytes_per_vector(roomy.factory, 384) / 4
    # vectors on which the calibration's fast-scan missed the target: the graph the rebuild falls back to
    alike = predict("d", 1_000_000, 10**10, dataclasses.replace(RATES, fast_scan=False), Budget(workers=4))
    assert alike.factory == "HNSW32" and alike.disk_bytes["index"] > roomy.disk_bytes["index"]
    tried = predict("d", 1_000_000, 10**10, dataclasses.replace(RATES, fast_scan=False, refused_index_cpu_s=360.0),
                    Budget(workers=4))  # the rebuild tries the fast-scan once before refusing it
    extra_cpu_s = (tried.hours["index"] - alike.hours["index"]) * 3600 * 4
    assert extra_cpu_s == pytest.approx(360.0 * STAGE_OVERHEAD["index"])
    # shards the embedding rule makes too large to build in a worker are split until one fits
    few = EmbedConfig(passages_per_shard=10_000_000)
    assert predict("d", 1_000_000, 10**10, RATES, Budget(workers=4), few).shards == 4  # at least min_shards
    split = predict("d", 1_000_000, 10**10, RATES, Budget(workers=4, worker_memory_gb=2.0), few)
    assert split.shards > 4 and split.worker_memory_bytes <= 2.0 * GB
    # the hours scale with the workers: twice the workers, half the per-passage stages
    double = predict("d", 1_000_000, 10**10, RATES, Budget(workers=8))
    for stage in ("ingest", "embed", "index"):
        assert math.isclose(double.hours[stage] * 2, roomy.hours[stage])
