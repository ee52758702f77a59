"""The published generated-QA dataset: one immutable folder per index version and recipe, manifest last.

``<store>/tasks/generated-qa/<index version>/<key>/`` holds ``part-<shard>.parquet``
(every kept pair with its offsets, rule, round-trip rank and split), ``train.jsonl``
and ``dev.jsonl`` (the examples-jsonl files the ``generated-qa`` task kind loads), and
``manifest.json``, written last: a folder without it is not published, and a
published one is never rewritten. ``key`` hashes the recipe and the held-out
(dev and test) questions, so other settings or other held-out files make another
folder, and the same ones find the one made before.

Held-out files are read leniently: JSON lines or a JSON array of records whose
question is under one of ``QUESTION_KEYS`` (answers under ``ANSWER_KEYS``, the
page under ``TITLE_KEYS``; the project's bench questions, NQ-open, WebQuestions,
KILT and examples jsonl all fit), or CuratedTrec's tsv.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa

from rag_core.parquet_bytes import table_to_parquet
from rag_core.storage import Store
from rag_core.train.examples import Example, Provenance, TaskDataError, examples_jsonl
from rag_core.model.retriever import RetrieverError
from rag_core.train.generated_qa import KIND, GeneratedQAConfig, HeldOut, Search, pair_examples
from rag_core.train import generated_qa, generated_qa_reader, question_rules, sentence_views, verb_forms
from rag_core.train.readers import json_array_records, jsonl_records, read_text, tsv_rows

DATASET_DIR = ("tasks", KIND)
MANIFEST = "manifest.json"
QUESTION_KEYS = ("question", "input", "qText", "query", "Question", "claim")
ANSWER_KEYS = ("answers", "answer", "targets", "output")
TITLE_KEYS = ("article", "title")
_FORMAT = ("JSON lines or a JSON array of records with a question under one of "
           f"{', '.join(QUESTION_KEYS)}, or CuratedTrec tsv (id, type, question, answer regex)")


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):  # KILT's output is [{"answer": ...}, ...]
        return [t for v in value for t in (_texts(v.get("answer")) if isinstance(v, dict) else _texts(v))]
    return []


def held_out_examples(url: str, options: Mapping[str, Any] | None = None) -> list[Example]:
    """The questions (answers, pages) of one dev or test file (module docstring); TaskDataError when none."""
    text = read_text(url, options)
    out: list[Example] = []
    if url.endswith(".tsv"):
        out = [Example(str(i), f[2].strip(), (), "held-out") for i, (_, f) in enumerate(tsv_rows(url, text, _FORMAT))
               if len(f) >= 3 and f[2].strip()]
    else:
        stripped = text.lstrip()
        records = (json_array_records(url, text, _FORMAT) if stripped.startswith("[")
                   else jsonl_records(url, text, _FORMAT))
        for i, (_, obj) in enumerate(records):
            if not isinstance(obj, dict):
                continue
            question = next((obj[k] for k in QUESTION_KEYS if isinstance(obj.get(k), str) and obj[k].strip()), None)
            if question is None:
                continue
            answers = next((_texts(obj[k]) for k in ANSWER_KEYS if k in obj), [])
            title = next((obj[k] for k in TITLE_KEYS if isinstance(obj.get(k), str)), None)
            pages = [Provenance(title=title)] if title else []
            for p in obj.get("provenance", []) if isinstance(obj.get("provenance"), list) else []:
                if isinstance(p, dict):
                    pages.append(Provenance(title=p.get("title"), passage_id=p.get("passage_id")))
            out.append(Example(str(i), question, tuple(answers), "held-out", provenance=tuple(pages)))
    if not out:
        raise TaskDataError(f"{url}: no questions found; a dev or test file is {_FORMAT}")
    return out


def held_out(urls: Iterable[str], options: Mapping[str, Any] | None = None) -> HeldOut:
    """Every dev and test item of ``urls``, for :meth:`HeldOut.holds`."""
    return HeldOut.of(e for url in urls for e in held_out_examples(url, options))


def index_search(store: Store, index_version: str) -> Search:
    """A :data:`~rag_core.train.generated_qa.Search` over an index version with its own question encoder (the one
    its manifest records, checked against its fingerprint)."""
    from rag_core.index.encoders import Encoder, EncoderConfig, check_compatible
    from rag_core.index.manifest import IndexManifest
    from rag_core.index.search import ShardedIndex

    index = ShardedIndex.load(store, index_version)
    manifest = IndexManifest.model_validate(index.manifest)
    if manifest.encoder is None:
        raise RetrieverError(f"index {index_version} records no encoder; its questions cannot be searched")
    encoder = Encoder.load(EncoderConfig(**(manifest.encoder_config or {})))
    check_compatible(manifest.encoder, encoder.fingerprint)

    def search(questions: Sequence[str], k: int) -> list[list[tuple[str, str, str]]]:
        hits = index.search(encoder.encode_questions(list(questions)), k)
        return [[(h.passage_id, h.title or "", h.text or "") for h in found] for found in hits]

    return search


def key_modules(config: GeneratedQAConfig) -> tuple[ModuleType, ...]:
    """The modules whose code decides which pairs ``config`` makes: an edit to one makes another dataset, never
    reuses the old one (the rules ask the questions; generated_qa's round trip and caps drop and thin them; with
    the reader on, it drops pairs or writes their targets too)."""
    modules = (question_rules, sentence_views, verb_forms, generated_qa)
    return (*modules, generated_qa_reader) if config.reads() else modules


def dataset_key(config: GeneratedQAConfig, held: HeldOut, reader_dtype: str | None = None) -> str:
    """12 hex digits naming the recipe, the code of :func:`key_modules`, the held-out items the pairs were
    filtered against and, when the generator reads (``config.reads()``), the dtype it reads in."""
    digest = hashlib.sha256(config.model_dump_json().encode())
    if reader_dtype is not None:
        digest.update(f"reader dtype {reader_dtype}\n".encode())
    for module in key_modules(config):
        digest.update(Path(module.__file__).read_bytes())
    for item in sorted(held.questions) + sorted("\t".join(p) for p in held.answer_places):
        digest.update(item.encode() + b"\n")
    return digest.hexdigest()[:12]


def dataset_folder(store: Store, index_version: str, key: str) -> Store:
    return store.child(*DATASET_DIR, index_version, key)


def published_dataset(folder: Store) -> dict[str, Any] | None:
    """The manifest of a published dataset, or None when the folder holds none (not made, or not finished)."""
    return folder.read_json(MANIFEST) if folder.exists(MANIFEST) else None


def publish_dataset(folder: Store, table: pa.Table, counts: Counter[str], *, index_version: str,
                    config: GeneratedQAConfig, held_out_files: Sequence[str]) -> dict[str, Any]:
    """Write the parts and the train/dev files, then the manifest (last); returns the manifest."""
    files: dict[str, dict[str, Any]] = {}

    def put(name: str, data: bytes, rows: int) -> None:
        folder.write_bytes(data, name)
        files[name] = {"rows": rows, "sha256": hashlib.sha256(data).hexdigest()}

    shards = table.column("shard").to_pylist()
    for shard in sorted(set(shards)):
        part = table.filter(pa.array([s == shard for s in shards], pa.bool_()))
        put(f"part-{shard:05d}.parquet", table_to_parquet(part, compression="zstd"), part.num_rows)
    splits = {split: pair_examples(table, split) for split in ("train", "dev")}
    for split, examples in splits.items():
        put(f"{split}.jsonl", examples_jsonl(examples), len(examples))
    manifest = {
        "kind": KIND, "index_version": index_version, "config": json.loads(config.model_dump_json()),
        "held_out_files": list(held_out_files), "counts": dict(counts),
        "rules": dict(Counter(table.column("rule").to_pylist())), "files": files,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    folder.write_json(manifest, MANIFEST)
    return manifest
