"""Encoders against trusted references: sentence-transformers for MiniLM, transformers' DPR for DPR."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import rag_core
from rag_core.index.encoders import (
    Encoder,
    EncoderConfig,
    EncoderError,
    check_compatible,
    default_encoder_config,
    packaged_model_path,
)
from rag_core.perf.precision import choose_precision
from tests.conftest import SAMPLE_BZ2

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


@pytest.fixture(scope="module")
def passages(wiki: Path) -> list[dict]:
    """64 real passages of varied length: the articles' short last windows mixed with full ones."""
    table, _, _ = rag_core.passages_from_pages(rag_core.iter_pages(rag_core.DumpSource(str(SAMPLE_BZ2))))
    rows = table.to_pylist()
    short = [r for r in rows if r["n_words"] < 100][:24]
    full = [r for r in rows if r["n_words"] == 100][::50][:64 - len(short)]
    mixed = [(short + full)[i] for i in np.random.default_rng(0).permutation(len(short) + len(full))]
    assert len(mixed) == 64 and len({r["n_words"] for r in mixed}) > 10
    return mixed


@pytest.fixture(scope="module")
def fp32() -> Encoder:
    return Encoder.load(EncoderConfig(dtype="float32"))


@pytest.fixture(scope="module")
def bf16() -> Encoder:
    return Encoder.load(EncoderConfig(dtype="bfloat16"))


def _columns(rows: list[dict]) -> tuple[list[str], list[str]]:
    return [r["title"] for r in rows], [r["text"] for r in rows]


@pytest.fixture(scope="module")
def fp32_vectors(passages: list[dict], fp32: Encoder) -> np.ndarray:
    """The 64 passages encoded in float32, in one sorted-and-batched call."""
    return fp32.encode_passages(*_columns(passages))


def test_default_is_the_packaged_minilm(fp32: Encoder) -> None:
    assert default_encoder_config().path is None
    assert (packaged_model_path() / "model.safetensors").is_file()
    fp = fp32.fingerprint
    assert fp["name"] == "all-MiniLM-L6-v2" and fp["kind"] == "sentence" and fp["dim"] == 384
    assert (fp["pooling"], fp["normalize"], fp["max_length"]) == ("mean", True, 256)


def test_mean_pooling_equals_sentence_transformers(passages: list[dict], fp32_vectors: np.ndarray) -> None:
    from sentence_transformers import SentenceTransformer

    rows = passages[:20]
    reference = SentenceTransformer(str(packaged_model_path()), device="cpu").encode(
        [f"{r['title']}. {r['text']}" for r in rows], batch_size=16)  # the documented passage format
    assert fp32_vectors.dtype == np.float32 and fp32_vectors.shape == (64, 384)
    np.testing.assert_allclose(fp32_vectors[:20], reference, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(fp32_vectors, axis=1), 1.0, atol=1e-5)


def test_bf16_stays_within_cosine_0999_of_fp32(passages: list[dict], fp32_vectors: np.ndarray,
                                              bf16: Encoder) -> None:
    a, b = fp32_vectors, bf16.encode_passages(*_columns(passages))
    assert b.dtype == np.float32 and b.shape == a.shape
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() >= 0.999, cosine.min()


def test_sorting_by_length_keeps_the_input_order(passages: list[dict], fp32: Encoder,
                                                 fp32_vectors: np.ndarray) -> None:
    titles, texts = _columns(passages)
    pick = np.random.default_rng(1).permutation(64)[:16]  # another order, other batch mates
    shuffled = fp32.encode_passages([titles[i] for i in pick], [texts[i] for i in pick])
    np.testing.assert_allclose(shuffled, fp32_vectors[pick], atol=2e-5)
    shortest = min(range(64), key=lambda i: len(texts[i]))
    for i in (0, shortest):  # one at a time: no padding at all
        np.testing.assert_allclose(fp32.encode_passages([titles[i]], [texts[i]])[0], fp32_vectors[i], atol=2e-5)
    done: list[int] = []
    fp32.encode_questions(["who founded anarchism?"] * 5, progress=done.append)
    assert sum(done) == 5
    assert fp32.encode_questions([]).shape == (0, 384)


def test_fingerprint_is_stable_and_tracks_settings(fp32: Encoder, bf16: Encoder) -> None:
    again = Encoder.load(EncoderConfig(dtype="float32"))
    assert again.fingerprint == fp32.fingerprint and again.fingerprint_id == fp32.fingerprint_id
    assert len(fp32.fingerprint_id) == 16 and int(fp32.fingerprint_id, 16) >= 0
    # The dtype is recorded but does not key the embedding files: bf16 and fp32 vectors are interchangeable.
    assert (bf16.fingerprint["dtype"], fp32.fingerprint["dtype"]) == ("bfloat16", "float32")
    assert bf16.fingerprint_id == fp32.fingerprint_id
    assert bf16.fingerprint["weights_sha256"] == fp32.fingerprint["weights_sha256"]
    cls = Encoder.load(EncoderConfig(dtype="float32", pooling="cls"))
    assert cls.fingerprint["pooling"] == "cls" and cls.fingerprint_id != fp32.fingerprint_id
    renamed = Encoder.load(EncoderConfig(dtype="float32", name="minilm"))
    assert renamed.fingerprint["name"] == "minilm" and renamed.fingerprint_id == fp32.fingerprint_id


def test_auto_dtype_is_the_default_and_the_fingerprint_records_what_this_machine_chose() -> None:
    assert EncoderConfig().dtype == "auto"
    encoder = Encoder.load(EncoderConfig())
    chosen = choose_precision("auto", "cpu")
    assert encoder.precision == chosen and encoder.fingerprint["dtype"] == chosen.dtype
    assert next(encoder.context.model.parameters()).dtype == chosen.torch_dtype


def test_vectors_embedded_in_one_dtype_are_reused_by_a_machine_running_the_other(
        passages: list[dict], fp32: Encoder, bf16: Encoder, tmp_path: Path) -> None:
    """An AMX machine (bf16) embeds a shard; an AVX2 one (fp32) finds it done and searches it, and back."""
    import pyarrow as pa

    from rag_core.index.incremental_embedding import embed_rows, load_reuse_table
    from rag_core.index.embedding_files import read_rows
    from rag_core.storage import Store

    rows = passages[:6]
    table = pa.table({"passage_id": [f"p{i}" for i in range(6)], "title": [r["title"] for r in rows],
                      "text": [r["text"] for r in rows]})
    store = Store(str(tmp_path / "store"))
    first = embed_rows(store, "dump-a", 0, table, bf16)
    assert (first["skipped"], first["encoded"], first["fingerprint"]["dtype"]) == (False, 6, "bfloat16")
    again = embed_rows(store, "dump-a", 0, table, fp32)
    assert again["skipped"] and again["fingerprint"]["dtype"] == "bfloat16"  # the record says who wrote it
    # Incremental rebuild of a later dump on the fp32 machine: every vector reused, none encoded.
    later = embed_rows(store, "dump-b", 0, table, fp32, load_reuse_table(store, fp32.fingerprint_id, "dump-a"))
    assert (later["reused"], later["encoded"]) == (6, 0)
    check_compatible(first["fingerprint"], fp32.fingerprint)  # and an fp32 query encoder may search them
    _, stored = read_rows(store, fp32.fingerprint_id, "dump-a", 0, 6)
    fresh = fp32.encode_passages(*_columns(rows))
    assert ((stored * fresh).sum(1) / np.linalg.norm(stored, axis=1) / np.linalg.norm(fresh, axis=1)).min() >= 0.999


def test_auto_engine_with_float32_asked_for_is_torch_and_there_is_no_onnx_engine() -> None:
    assert Encoder.load(EncoderConfig(dtype="float32")).engine == "torch"
    with pytest.raises(ValueError, match="engine"):
        EncoderConfig(engine="onnx")


def test_check_compatible(fp32: Encoder, bf16: Encoder) -> None:
    check_compatible(bf16.fingerprint, fp32.fingerprint)  # dtype may differ
    check_compatible(fp32.fingerprint, {**fp32.fingerprint, "max_length": 64})  # and max_length
    with pytest.raises(EncoderError, match=r"pooling \(index mean, query cls\).*rebuild the index"):
        check_compatible(fp32.fingerprint, {**fp32.fingerprint, "pooling": "cls"})
    with pytest.raises(EncoderError, match=r"weights_sha256 \(index 7e54.*normalize"):
        check_compatible(fp32.fingerprint, {**fp32.fingerprint, "weights_sha256": "0" * 64, "normalize": False})


def _save_tiny_dpr(cls: type, directory: Path, projection_dim: int, seed: int) -> torch.nn.Module:
    from transformers import DPRConfig

    torch.manual_seed(seed)
    config = DPRConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=128, projection_dim=projection_dim)
    model = cls(config).eval()
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:  # the MiniLM (BERT uncased) vocabulary: no hub needed
        shutil.copy(packaged_model_path() / name, directory / name)
    return model


def test_dpr_uses_cls_pooler_output_and_two_towers(passages: list[dict], tmp_path: Path) -> None:
    from transformers import AutoTokenizer, DPRContextEncoder, DPRQuestionEncoder

    ctx = _save_tiny_dpr(DPRContextEncoder, tmp_path / "ctx", projection_dim=16, seed=0)
    question = _save_tiny_dpr(DPRQuestionEncoder, tmp_path / "question", projection_dim=16, seed=1)
    encoder = Encoder.load(EncoderConfig(path=str(tmp_path / "ctx"), question_path=str(tmp_path / "question"),
                                         dtype="float32", max_length=128))
    fp = encoder.fingerprint
    assert (fp["kind"], fp["pooling"], fp["normalize"], fp["dim"]) == ("dpr", "cls", False, 16)
    assert fp["weights_sha256"] != fp["question_weights_sha256"] and fp["name"] == "ctx"

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "ctx"))
    titles, texts = _columns(passages[:6])
    ours = encoder.encode_passages(titles, texts)
    with torch.inference_mode():
        batch = tokenizer(titles, texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        reference = ctx(**batch).pooler_output.numpy()
        q_batch = tokenizer(["what is anarchism?", "who was Aristotle?"], padding=True, return_tensors="pt")
        q_reference = question(**q_batch).pooler_output.numpy()
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    np.testing.assert_allclose(encoder.encode_questions(["what is anarchism?", "who was Aristotle?"]),
                               q_reference, atol=1e-5)

    with pytest.raises(EncoderError, match="is a DPR question encoder; give the DPR context encoder as path"):
        Encoder.load(EncoderConfig(path=str(tmp_path / "question")))
    with pytest.raises(EncoderError, match="question_path must be a DPR question encoder"):
        Encoder.load(EncoderConfig(path=str(tmp_path / "ctx"), question_path=str(tmp_path / "ctx")))
    with pytest.raises(EncoderError, match="pool the \\[CLS\\] vector"):
        Encoder.load(EncoderConfig(path=str(tmp_path / "ctx"), pooling="mean"))


def test_missing_or_wrong_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EncoderError, match=r"nowhere: the passage encoder directory does not exist"):
        Encoder.load(EncoderConfig(path=str(tmp_path / "nowhere")))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a model")
    with pytest.raises(EncoderError, match=r"notes: not a transformers model directory \(no config.json\)"):
        Encoder.load(EncoderConfig(path=str(tmp_path / "notes")))
    (tmp_path / "notes" / "config.json").write_text("{}")
    with pytest.raises(EncoderError, match=r"no weights"):
        Encoder.load(EncoderConfig(path=str(tmp_path / "notes")))
