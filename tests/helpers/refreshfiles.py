"""Two index versions of real passages whose dumps differ in one fact, and a champion registered against the first:
what the refresh tests start from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from rag_core.storage import Store
from rag_core.train.examples import Example

NEW_FACT = "Zanzibar 2099"


def edited(passages: pa.Table, passage_id: str, old: str, new: str) -> pa.Table:
    """The passages of a later dump in which one fact changed: its page has a new revision (so every passage id of
    the page changes), and the passage ``passage_id`` reads ``new`` where it read ``old``."""
    page, revision, chunk = passage_id.rsplit("-", 2)
    rows = passages.to_pylist()
    for row in rows:
        if str(row["page_id"]) == page:
            row["revision_id"] = int(revision) + 1
            row["passage_id"] = f"{page}-{int(revision) + 1}-{row['chunk']}"
            if str(row["chunk"]) == chunk:
                assert old in row["text"], "the fact to edit must be in the passage"
                row["text"] = row["text"].replace(old, new)
    return pa.Table.from_pylist(rows, schema=passages.schema)


@dataclass
class TwoVersions:
    store: Store
    old: str  # the version the champion is registered against
    new: str  # LATEST: the same passages, one fact edited
    model_dir: Path  # a saved RAG model (tiny BERT encoder, tiny Llama) over ``old``
    dev: list[Example]  # cloze questions of two pages; dev[0]'s gold passage is the edited one
    dev_url: str
    fact: str  # dev[0]'s answer, as ``old`` reads it


def two_versions(root: Path, n_dev: int = 6) -> TwoVersions:
    """Publish both versions on a local store under ``root`` and save the model (needs the ``wiki`` fixture)."""
    from rag_core.index.encoders import Encoder, EncoderConfig
    from rag_core.model.generators import GeneratorConfig
    from rag_core.model.rag_model import RagConfig, RagModel
    from rag_core.model.retriever import IndexRetriever
    from rag_core.train.cloze import ClozeConfig, cloze_examples
    from rag_core.train.examples import write_examples
    from tests.helpers.encoderfiles import save_tiny_bert
    from tests.helpers.generatorfiles import save_tiny_llama
    from tests.helpers.passagefiles import publish_small_index, sample_passages

    passages = sample_passages().slice(0, 160)
    drawn = cloze_examples(passages, ClozeConfig(seed=0))
    # questions of both pages (Anarchism, Autism): the first is the one whose fact the later dump edits
    first = drawn.dev[0].provenance[0].title
    dev = [*drawn.dev[:n_dev - 2], *[e for e in drawn.train if e.provenance[0].title != first][:2]]
    gold, fact = dev[0].provenance[0].passage_id, dev[0].targets[0]
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(root / "encoder")), dtype="float32"))
    store = Store(str(root / "store"))
    old = publish_small_index(store, "d1", passages, encoder, shards=2)
    new = publish_small_index(store, "d2", edited(passages, gold, fact, NEW_FACT), encoder, shards=2)
    config = RagConfig(n_docs=2, question_encoder=encoder.config,
                       generator=GeneratorConfig(path=str(save_tiny_llama(root / "llama"))))
    model_dir = RagModel.create(config, IndexRetriever.load(store, old)).save_pretrained(root / "rag")
    dev_url = write_examples(dev, str(root / "dev.jsonl"))
    return TwoVersions(store, old, new, model_dir, dev, dev_url, fact)


def register_trained(tracking_uri: str, versions: TwoVersions, index_version: str, value: float) -> str:
    """Register the model bound to ``index_version`` as a fine-tune would (its run names the dev set); its version."""
    return register_champion(tracking_uri, versions.store, versions.model_dir, versions.dev_url, len(versions.dev),
                             index_version, value)


def register_champion(tracking_uri: str, store: Store, model_dir: Path, dev_url: str, n_dev: int,
                      index_version: str, value: float = 0.0) -> str:
    """Register the saved RAG model ``model_dir`` as ``wikirag-cloze`` bound to ``index_version`` of ``store``, as a
    fine-tune would (its run names the dev set, of ``n_dev`` questions); the version registered."""
    from tasks.adapters.mlflow_registry import log_rag_model, register
    from tasks.adapters.mlflow_tracking import tracked_run

    tags = {"wikirag.task": "cloze", "wikirag.dev": dev_url}
    with tracked_run(tracking_uri, "wikirag-cloze", "finetune", tags) as run:
        run.log_params({"max_dev_examples": n_dev})
        uri = log_rag_model(tracking_uri, run.run_id, model_dir, store_url=store.url, index_version=index_version)
        return register(tracking_uri, uri, "cloze", run_id=run.run_id, metric="em", value=value, margin=0.0,
                        store=store, index_version=index_version).version
