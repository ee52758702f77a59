"""Questions to passages from a published index version: a pure query, no flow run.

The query encoder defaults to the one the index manifest records; any other
must match the index's fingerprint (same weights, pooling and normalisation),
or the search stops with a clear error rather than returning nonsense.
"""

from __future__ import annotations

import json
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rag_core.errors import WikiragError
from rag_core.index.manifest import IndexManifest
from rag_core.storage import Store


class SearchConfig(BaseModel):
    """What a search asks for."""

    k: int = Field(5, ge=1, description="passages per question")
    version: str | None = Field(None, description="index version; None = LATEST")
    encoder_path: str | None = Field(None, description="query encoder directory; None = the one the index records")
    question_encoder_path: str | None = Field(None, description="DPR question encoder directory; None = recorded")


def read_questions(path: str | None, questions: list[str]) -> list[str]:
    """Questions from the arguments, then one per non-blank line of ``path`` ('-' is stdin)."""
    found = [q.strip() for q in questions if q.strip()]
    if path:
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise WikiragError(f"{path}: cannot read the questions file ({exc.__class__.__name__}: {exc}); "
                               "give a UTF-8 text file with one question per line") from exc
        found += [line.strip() for line in text.splitlines() if line.strip()]
    if not found:
        raise WikiragError("no questions: give them as arguments or one per line in --questions FILE")
    return found


def query_encoder_config(manifest: IndexManifest, encoder_path: str | None, question_path: str | None) -> Any:
    """The encoder to embed questions with: the flags', else the one recorded in the manifest."""
    from rag_core.index.encoders import EncoderConfig, EncoderError

    if encoder_path:
        return EncoderConfig(path=encoder_path, question_path=question_path)
    recorded = EncoderConfig(**(manifest.encoder_config or {}))
    for name in ("path", "question_path"):
        value = getattr(recorded, name)
        if value and not Path(value).expanduser().is_dir():
            raise EncoderError(f"index {manifest.version} was built with the encoder at {value}, which is not on "
                               "this machine; pass --encoder DIR (and --question-encoder DIR for DPR)")
    return recorded


def answer_questions(store: Store, questions: list[str], config: SearchConfig | None = None, *,
                     dask_address: str | None = None) -> list[dict]:
    """For each question, in order: ``{"question", "results": [{passage_id, title, text, score}, ...]}``.

    With ``dask_address`` the shards stay in that cluster's workers and only
    top-k lists come back; else they are loaded here.
    """
    from rag_core.index.encoders import Encoder, check_compatible
    from rag_core.index.search import ShardedIndex

    config = config or SearchConfig()
    with ExitStack() as stack:
        if dask_address:
            from distributed import Client

            from tasks.distributed_search import DaskShardedIndex

            client = stack.enter_context(Client(dask_address))
            index: Any = stack.enter_context(DaskShardedIndex.load(client, store, config.version))
        else:
            index = ShardedIndex.load(store, config.version)
        manifest = IndexManifest.model_validate(index.manifest)
        if manifest.encoder is None:
            raise WikiragError(f"index {manifest.version} records no encoder (published from bare vectors); "
                               "it cannot be searched with questions")
        encoder = Encoder.load(query_encoder_config(manifest, config.encoder_path, config.question_encoder_path))
        check_compatible(manifest.encoder, encoder.fingerprint)
        hits = index.search(encoder.encode_questions(questions), config.k)
    return [
        {"question": q, "results": [{"passage_id": h.passage_id, "title": h.title, "text": h.text,
                                     "score": round(h.score, 6)} for h in found]}
        for q, found in zip(questions, hits)
    ]


def print_results(results: list[dict], *, as_json: bool) -> None:
    """JSON lines, or a readable list: the question, then each passage's score, title and opening words."""
    for item in results:
        if as_json:
            print(json.dumps(item, ensure_ascii=False))
            continue
        print(f"Q: {item['question']}")
        for rank, hit in enumerate(item["results"], 1):
            snippet = textwrap.shorten(hit["text"] or "", width=160, placeholder=" ...")
            print(f"  {rank}. [{hit['score']:.3f}] {hit['title']}: {snippet}")
        print()
