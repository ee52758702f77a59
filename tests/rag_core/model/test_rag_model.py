"""RagModel with real parts: FAISS index versions over real Wikipedia passages, real encoders, a real BART.

References: ``Encoder.encode_questions`` for the trainable question tower,
``IndexRetriever`` for retrieval, transformers' ``RagRetriever.postprocess_docs``
for the generator inputs and ``RagSequenceForGeneration`` /
``RagTokenForGeneration`` for the loss.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch

from rag_core.index.encoders import Encoder, EncoderConfig, EncoderError, check_compatible, packaged_model_path
from rag_core.model.question_encoder import QuestionEncoder
from rag_core.model.rag_model import (
    GeneratorConfig,
    RagModel,
    RagModelError,
    context_strings,
    default_generator,
)
from rag_core.model.retriever import IndexRetriever
from rag_core.perf.device import DeviceError
from tests.helpers.encoderfiles import TOKENIZER_FILES, save_tiny_bert
from tests.helpers.rag_models import ANSWERS, QUESTIONS, TINY_GENERATOR, make_model



# ----------------------------------------------------------------------------- builders


def spread_weights(module: torch.nn.Module, seed: int = 0) -> None:
    """Standard-normal weights: a tiny BART at init_std 0.02 barely reads its context (STACK.md)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))


def save_tiny_dpr(cls: type, directory: Path, seed: int) -> None:
    from transformers import DPRConfig

    torch.manual_seed(seed)
    config = DPRConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=128, projection_dim=16)
    cls(config).save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(packaged_model_path() / name, directory / name)


# ----------------------------------------------------------------------------- question encoder


@pytest.mark.parametrize("which", ["tiny", "minilm", "dpr"])
def test_question_encoder_equals_encode_questions(which: str, tmp_path: Path) -> None:
    if which == "tiny":
        config = EncoderConfig(path=str(save_tiny_bert(tmp_path / "tiny")), dtype="float32")
    elif which == "minilm":  # the packaged default, with its sentence-transformers pooling files
        config = EncoderConfig(dtype="float32")
    else:
        from transformers import DPRContextEncoder, DPRQuestionEncoder

        save_tiny_dpr(DPRContextEncoder, tmp_path / "ctx", seed=0)
        save_tiny_dpr(DPRQuestionEncoder, tmp_path / "q", seed=1)
        config = EncoderConfig(path=str(tmp_path / "ctx"), question_path=str(tmp_path / "q"), dtype="float32")
    questions = QUESTIONS + ["a much longer question about the history of the city of rome and its empire?"]
    encoder = Encoder.load(config)
    tower = QuestionEncoder.from_encoder_config(config).eval()
    with torch.no_grad():
        ours = tower(questions).numpy()
    np.testing.assert_allclose(ours, encoder.encode_questions(questions), atol=2e-6, rtol=1e-5)
    assert tower.base_fingerprint == encoder.fingerprint and tower.dim == encoder.dim
    assert tower.train()(questions[:2]).requires_grad
    if which != "minilm":  # saved and reloaded (a DPR question tower stays one): the same vectors
        tower.save_pretrained(tmp_path / "saved")
        again = QuestionEncoder.from_pretrained(tmp_path / "saved", tower.settings()).eval()
        assert type(again.model) is type(tower.model)
        with torch.no_grad():
            torch.testing.assert_close(again(questions), torch.from_numpy(ours))


def test_a_question_longer_than_the_tower_reads_is_a_warning_once(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    config = EncoderConfig(path=str(save_tiny_bert(tmp_path / "tiny")), dtype="float32", max_length=16)
    tower = QuestionEncoder.from_encoder_config(config).eval()
    words = " ".join(["rome"] * 40) + " ?"  # 41 word tokens, plus [CLS] and [SEP]
    with caplog.at_level(logging.WARNING, logger="wikirag"), torch.no_grad():
        tower(["who founded rome?" + " " * 30])  # long in characters only: read whole, no warning
        assert not caplog.records
        cut = tower(["who founded rome?", words])
        tower([words])
    assert [r.getMessage() for r in caplog.records] == [
        "the question 'rome rome rome rome rome rome rome rome '... is 43 tokens; the question encoder reads its first "
        "16, so the rest does not steer retrieval (said once)"]
    with torch.no_grad():  # what it read: the first 16 tokens
        torch.testing.assert_close(cut[1], tower([" ".join(["rome"] * 14)])[0])


# ----------------------------------------------------------------------------- retrieval step


def test_retrieval_step_shapes_scores_and_inputs(indexes: SimpleNamespace) -> None:
    model = make_model(indexes, max_context_length=300)
    batch = model.retrieve(QUESTIONS)
    b, n = len(QUESTIONS), 3
    assert batch.n_docs == n and batch.doc_scores.shape == (b, n) and batch.question_vectors.shape == (b, 32)
    assert batch.context_input_ids.shape[0] == b * n and batch.context_input_ids.shape[1] <= 300
    assert batch.context_attention_mask.shape == batch.context_input_ids.shape
    assert batch.index_version == indexes.v1 == model.index_version == model.trained_index_version
    assert batch.doc_scores.requires_grad

    # Same passages as the retriever alone finds for Encoder's question vectors; doc scores = <q, stored vector>.
    reference = IndexRetriever.load(indexes.store, indexes.v1).retrieve(indexes.encoder.encode_questions(QUESTIONS), n)
    assert batch.passage_ids == reference.passage_ids and batch.titles == reference.titles
    expected = np.einsum("bd,bnd->bn", batch.question_vectors.detach().numpy(), reference.doc_vectors)
    np.testing.assert_allclose(batch.doc_scores.detach().numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(batch.doc_scores.detach().numpy(), reference.index_scores, atol=1e-5)
    assert all(set(ids) <= indexes.v1_ids for ids in batch.passage_ids)
    assert model.retrieve(QUESTIONS[:1], n_docs=5).doc_scores.shape == (1, 5)

    # The generator inputs are transformers' RagRetriever.postprocess_docs, token for token.
    from transformers.models.rag.retrieval_rag import RagRetriever

    fake = SimpleNamespace(config=SimpleNamespace(title_sep=" / ", doc_sep=" // ", max_combined_length=300),
                           generator_tokenizer=model.generator_tokenizer)
    docs = [{"title": t, "text": x} for t, x in zip(batch.titles, batch.texts)]
    ids, mask = RagRetriever.postprocess_docs(fake, docs, QUESTIONS, None, n, return_tensors="pt")
    width = batch.context_input_ids.shape[1]
    assert torch.equal(ids[:, :width], batch.context_input_ids) and torch.equal(mask[:, :width],
                                                                                  batch.context_attention_mask)
    assert not mask[:, width:].any()  # they pad to 300, we to the longest row
    first = model.generator_tokenizer.decode(batch.context_input_ids[0], skip_special_tokens=True)
    assert first.startswith(f"{batch.titles[0][0].lower()} / ")


def test_context_strings_follow_transformers() -> None:
    from transformers import AutoTokenizer
    from transformers.models.rag.retrieval_rag import RagRetriever

    titles = [['"Quoted"', 'Two  spaces'], ['"Only left', 'x"']]
    texts = [["first  text", "second"], ["third   text", ""]]
    questions = ["q one?", "q  two"]
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_model_path()))
    fake = SimpleNamespace(config=SimpleNamespace(title_sep=" | ", doc_sep=" || ", max_combined_length=40),
                           generator_tokenizer=tokenizer)
    ours = context_strings(titles, texts, questions, title_sep=" | ", doc_sep=" || ", prefix="summarize: ")
    assert ours[0] == "summarize: Quoted | first text || q one?"
    assert ours[3] == "summarize: x | || q two"
    docs = [{"title": t, "text": x} for t, x in zip(titles, texts)]
    expected, _ = RagRetriever.postprocess_docs(fake, docs, questions, "summarize: ", 2)
    assert tokenizer(ours, max_length=40, truncation=True, padding="max_length")["input_ids"] == expected


# ----------------------------------------------------------------------------- gradients and loss


def test_gradient_reaches_the_question_encoder_through_doc_scores_only(indexes: SimpleNamespace) -> None:
    model = make_model(indexes).train()
    stored = [v.copy() for v in model.retriever.vectors]
    batch = model.retrieve(QUESTIONS)
    loss = model(batch, ANSWERS)
    assert loss.shape == (3,) and torch.isfinite(loss).all()
    # d doc_scores[b, z] / d q[b] is the stored vector of passage z: the documents enter as constants.
    (grad_q,) = torch.autograd.grad(batch.doc_scores.sum(), batch.question_vectors, retain_graph=True)
    reference = IndexRetriever.load(indexes.store, indexes.v1).retrieve(batch.question_vectors.detach().numpy(), 3)
    torch.testing.assert_close(grad_q, torch.from_numpy(reference.doc_vectors.sum(axis=1)))

    torch.optim.SGD(model.parameters(), lr=1.0).zero_grad()
    loss.sum().backward()
    tower = [p.grad for p in model.question_encoder.parameters() if p.grad is not None]
    assert tower and any(g.abs().sum() > 0 for g in tower)
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    assert all(np.array_equal(a, b) for a, b in zip(stored, model.retriever.vectors))  # the index stays frozen

    # With one document p(z|x) = 1 whatever the score: no gradient reaches the question encoder at all.
    model.zero_grad()
    one = model.retrieve(QUESTIONS, n_docs=1)
    model(one, ANSWERS).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.question_encoder.parameters())
    assert any(p.grad is not None and p.grad.any() for p in model.generator.parameters())


@pytest.mark.parametrize("kind", ["sequence", "token"])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_loss_equals_transformers_rag(indexes: SimpleNamespace, kind: str, epsilon: float) -> None:
    from transformers import RagConfig as HFRagConfig
    from transformers import RagSequenceForGeneration, RagTokenForGeneration

    model = make_model(indexes, kind=kind, label_smoothing=epsilon)
    hf_class = RagSequenceForGeneration if kind == "sequence" else RagTokenForGeneration
    hf_config = HFRagConfig.from_question_encoder_generator_configs(
        model.question_encoder.model.config, model.generator.config, n_docs=3, label_smoothing=epsilon)
    reference = hf_class(config=hf_config, question_encoder=model.question_encoder.model,
                         generator=model.generator).eval()
    spread_weights(model.generator)  # after the reference's post_init: both see these weights
    model.eval()

    batch = model.retrieve(QUESTIONS)
    labels = model.answer_labels(ANSWERS)  # [b, T]: [CLS] answer [SEP] pad...
    assert labels.shape[0] == 3 and (labels[:, 0] == model.generator_tokenizer.cls_token_id).all()
    ours = model(batch, ANSWERS)
    (ours_grad,) = torch.autograd.grad(ours.sum(), batch.question_vectors, retain_graph=True)

    start = torch.full((3, 1), model.generator.config.decoder_start_token_id)
    hf_labels = torch.cat([start, labels], dim=1)  # their convention: decoder input = labels, target shifted
    theirs = reference(context_input_ids=batch.context_input_ids, context_attention_mask=batch.context_attention_mask,
                       doc_scores=batch.doc_scores, labels=hf_labels, n_docs=3, reduce_loss=False).loss
    (theirs_grad,) = torch.autograd.grad(theirs.sum(), batch.question_vectors)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-4, atol=1e-5)
    other = make_model(indexes, kind="token" if kind == "sequence" else "sequence", label_smoothing=epsilon)
    spread_weights(other.generator)
    assert not torch.allclose(other.eval()(other.retrieve(QUESTIONS), ANSWERS), ours, atol=1e-3)  # kind matters


def save_tiny_generator(family: str, directory: Path) -> Path:
    """A tiny T5 or BERT2BERT EncoderDecoderModel over the MiniLM vocabulary, saved with that tokenizer."""
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    if family == "t5":  # T5's convention: the decoder starts with pad
        model = T5ForConditionalGeneration(T5Config(vocab_size=30522, d_model=32, d_kv=16, d_ff=64, num_layers=1,
                                                    num_heads=2, pad_token_id=0, eos_token_id=102,
                                                    decoder_start_token_id=0))
    else:
        bert = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 64, "max_position_embeddings": 128}
        config = EncoderDecoderConfig.from_encoder_decoder_configs(
            BertConfig(**bert), BertConfig(**bert, is_decoder=True, add_cross_attention=True))
        config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 101, 0, 102
        model = EncoderDecoderModel(config=config)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(packaged_model_path() / name, directory / name)
    return directory


@pytest.mark.filterwarnings("ignore:Version v4.12.0 introduces:FutureWarning")  # EncoderDecoderModel(labels=...)
@pytest.mark.parametrize("family", ["bart", "t5", "bert2bert"])
def test_one_document_loss_is_the_generators_own_seq2seq_loss(indexes: SimpleNamespace, tmp_path: Path,
                                                               family: str) -> None:
    """With n_docs = 1 RAG is the plain generator: our targets and shift match each family's own ``labels=``."""
    if family == "bart":
        generator = TINY_GENERATOR
    else:
        generator = GeneratorConfig(path=str(save_tiny_generator(family, tmp_path / family)))
    model = make_model(indexes, generator=generator, n_docs=1)
    spread_weights(model.generator)
    batch = model.retrieve(QUESTIONS)
    ours = model(batch, ANSWERS)  # [b]
    labels = model.answer_labels(ANSWERS)
    own = model.generator(input_ids=batch.context_input_ids, attention_mask=batch.context_attention_mask,
                          labels=labels.masked_fill(labels == model.pad_token_id, -100)).loss  # mean over tokens
    torch.testing.assert_close(ours.sum(), own * (labels != model.pad_token_id).sum(), rtol=1e-5, atol=1e-3)
    answers = model.generate(QUESTIONS, max_length=5)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)


# ----------------------------------------------------------------------------- saving, loading, hot-swap


def test_save_load_roundtrip_and_knowledge_update(indexes: SimpleNamespace, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    model = make_model(indexes, kind="token")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(model.retrieve(QUESTIONS), ANSWERS).sum().backward()
    optimizer.step()  # a trained question tower: its weights no longer hash like the index's
    model.eval()
    with torch.no_grad():
        before = model.retrieve(QUESTIONS)
        loss_before = model(before, ANSWERS)
    answers_before = model.generate(QUESTIONS, max_length=6)

    saved = model.save_pretrained(tmp_path / "model")
    assert sorted(p.name for p in saved.iterdir()) == ["generator", "question_encoder", "rag.json"]
    record = json.loads((saved / "rag.json").read_text())
    assert record["kind"] == "token" and record["n_docs"] == 3 and record["index_version"] == indexes.v1
    assert record["fingerprint_id"] == indexes.encoder.fingerprint_id
    assert record["question_weights_sha256"] != indexes.encoder.fingerprint["question_weights_sha256"]

    loaded = RagModel.from_pretrained(saved, IndexRetriever.load(indexes.store, indexes.v1)).eval()
    with torch.no_grad():
        after = loaded.retrieve(QUESTIONS)
        torch.testing.assert_close(loaded(after, ANSWERS), loss_before)
    assert after.passage_ids == before.passage_ids
    torch.testing.assert_close(after.doc_scores, before.doc_scores)
    assert torch.equal(after.context_input_ids, before.context_input_ids)
    assert loaded.generate(QUESTIONS, max_length=6) == answers_before
    assert all(isinstance(a, str) for a in answers_before) and len(answers_before) == 3

    # The trained tower no longer passes the full (search-time) check; the passage side is what still binds it.
    with pytest.raises(EncoderError, match="question_weights_sha256"):
        check_compatible(indexes.encoder.fingerprint, Encoder.load(
            EncoderConfig(path=str(saved / "question_encoder"), dtype="float32")).fingerprint)

    # Knowledge update: the same model over another dump's index version, no retraining.
    with caplog.at_level(logging.INFO, logger="rag_core.model.rag_model"):
        updated = RagModel.from_pretrained(saved, IndexRetriever.load(indexes.store, indexes.v2),
                                           overrides={"n_docs": 4})
    assert updated.trained_index_version == indexes.v1 and updated.index_version == indexes.v2
    assert f"trained against index {indexes.v1}, now retrieving from index {indexes.v2}" in caplog.text
    swapped = updated.retrieve(QUESTIONS)
    assert swapped.n_docs == 4 and swapped.index_version == indexes.v2
    assert all(set(ids) <= indexes.v2_ids for ids in swapped.passage_ids)
    with torch.no_grad():
        torch.testing.assert_close(swapped.question_vectors, before.question_vectors)  # same tower, other passages
    model.use_index(IndexRetriever.load(indexes.store, indexes.v2))
    assert model.retrieve(QUESTIONS).passage_ids == updated.retrieve(QUESTIONS, n_docs=3).passage_ids


def test_a_model_saved_where_it_ran_on_a_gpu_loads_on_the_machine_that_reads_it(indexes: SimpleNamespace,
                                                                                tmp_path: Path) -> None:
    # The device is where a model runs, not part of the model: a record naming cuda:0 (as a GPU-trained one did)
    # must load here on whatever the device rule picks, and a save records auto.
    model = make_model(indexes, kind="sequence")
    assert model.device == "cpu" and model.config.device == "auto"  # no CUDA on the test machines
    saved = model.save_pretrained(tmp_path / "model")
    record = json.loads((saved / "rag.json").read_text())
    assert record["config"]["device"] == "auto"
    record["config"]["device"] = "cuda:0"
    (saved / "rag.json").write_text(json.dumps(record))
    loaded = RagModel.from_pretrained(saved, IndexRetriever.load(indexes.store, indexes.v1))
    assert loaded.device == "cpu" and {p.device.type for p in loaded.parameters()} == {"cpu"}
    assert loaded.generate(QUESTIONS[:1], max_length=4)
    with pytest.raises(DeviceError, match="CUDA"):  # asked for by name, it is refused in one line
        RagModel.from_pretrained(saved, IndexRetriever.load(indexes.store, indexes.v1), overrides={"device": "cuda"})


def test_mismatched_encoder_is_a_clear_error(indexes: SimpleNamespace, tmp_path: Path) -> None:
    other = IndexRetriever.load(indexes.store, indexes.other)
    with pytest.raises(EncoderError, match="does not match the encoder .* weights_sha256"):
        make_model(indexes, version=indexes.other)  # a fresh model: the full check, as for search

    saved = make_model(indexes).save_pretrained(tmp_path / "model")
    message = (f"{saved}: this RAG model's question encoder was trained against passages embedded by 'tiny', "
               f"but index {indexes.other} was built with 'tiny-other': weights_sha256 .* differ; load the model "
               "onto an index version built with its passage encoder")
    with pytest.raises(EncoderError, match=message):
        RagModel.from_pretrained(saved, other)
    model = make_model(indexes)
    with pytest.raises(EncoderError, match="or fine-tune a new RAG model on this index"):
        model.use_index(other)
    assert model.index_version == indexes.v1  # unchanged after the refusal

    with pytest.raises(RagModelError, match="no rag.json; not a RAG model saved with RagModel.save_pretrained"):
        RagModel.from_pretrained(tmp_path, other)
    with pytest.raises(RagModelError, match="no config.json"):
        make_model(indexes, generator=GeneratorConfig(path=str(tmp_path / "missing")))
    with pytest.raises(TypeError, match="wrap a single question in a list"):
        model.retrieve("What is anarchism?")


# ----------------------------------------------------------------------------- default generator


def test_default_generator_is_small_seeded_and_leaves_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    model, tokenizer = default_generator(GeneratorConfig(), 512)
    again, _ = default_generator(GeneratorConfig(), 512)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert 4e6 < sum(p.numel() for p in model.parameters()) < 6e6
    assert model.config.vocab_size == len(tokenizer) == 30522
    assert (model.config.pad_token_id, model.config.decoder_start_token_id, model.config.eos_token_id) == (
        tokenizer.pad_token_id, tokenizer.sep_token_id, tokenizer.sep_token_id)


def test_a_few_hundred_steps_lower_the_default_generators_loss(indexes: SimpleNamespace, passages: pa.Table) -> None:
    """Copy task: the answer is the title of the passage the question retrieves first (it opens the context)."""
    model = make_model(indexes, generator=GeneratorConfig(), n_docs=2)
    texts = passages.slice(0, 200)["text"].to_pylist()[::12]  # [17]
    sample = [" ".join(text.split()[:10]) for text in texts]
    with torch.no_grad():
        answers = [titles[0] for titles in model.retrieve(sample).titles]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model.train()
    losses, started = [], time.perf_counter()
    for step in range(200):
        rows = [(4 * step + k) % len(sample) for k in range(4)]
        loss = model(model.retrieve([sample[r] for r in rows]), [answers[r] for r in rows]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    first, last = np.mean(losses[:20]), np.mean(losses[-20:])
    print(f"\nmean loss of steps 1-20 {first:.2f}, 181-200 {last:.3f}; "
          f"200 steps in {time.perf_counter() - started:.1f} s")
    assert last < 0.2 * first
