"""The int8 engine: calibrated int8 q/k/v and FFN inputs hold the vectors; auto picks it only where it should."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import rag_core
from rag_core.perf import int8_engine
from rag_core.perf.precision import Precision
from rag_core.index.encoders import Encoder, EncoderConfig, EncoderError, _engine, packaged_model_path
from tests.conftest import SAMPLE_BZ2


@pytest.fixture(scope="module")
def passages(wiki: Path) -> tuple[list[str], list[str]]:
    """300 real passages of the sample, every 14th: more than the engine's MIN_TEXTS, in one call."""
    table, _, _ = rag_core.passages_from_pages(rag_core.iter_pages(rag_core.DumpSource(str(SAMPLE_BZ2))))
    picked = table.take(np.arange(0, table.num_rows, 14)[:300])
    assert picked.num_rows == 300 > int8_engine.MIN_TEXTS
    return picked.column("title").to_pylist(), picked.column("text").to_pylist()


@pytest.fixture(scope="module")
def float32_vectors(passages: tuple[list[str], list[str]]) -> np.ndarray:
    return Encoder.load(EncoderConfig(dtype="float32", engine="torch")).encode_passages(*passages)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache of int8 weights for each test: each quantizes for itself, and the user's cache is untouched."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _int8_modules(model: torch.nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if type(m).__name__ == "Int8Linear"]


def test_int8_vectors_stay_within_cosine_0999_of_float32_on_real_passages(
        passages: tuple[list[str], list[str]], float32_vectors: np.ndarray) -> None:
    encoder = Encoder.load(EncoderConfig(dtype="float32", engine="int8"))
    assert encoder.engine == "int8" and encoder.fingerprint["engine"] == "int8"
    # Interchangeable with float32 vectors, as bf16 ones are: the embedding files' key does not change.
    assert encoder.fingerprint_id == Encoder.load(EncoderConfig(dtype="float32", engine="torch")).fingerprint_id
    vectors = encoder.encode_passages(*passages)
    assert _int8_modules(encoder._int8) == [f"encoder.layer.{i}.{part}" for i in range(6) for part in
                                            ("attention.self.query", "attention.self.key", "attention.self.value",
                                             "intermediate.dense")]
    cosine = (vectors * float32_vectors).sum(1)  # both L2-normalised
    assert cosine.min() >= 0.999, f"worst passage at cosine {cosine.min():.5f}"
    assert np.abs(vectors - float32_vectors).max() > 1e-4  # int8 did run: the vectors moved, a little
    # Same weights from the same calibration text: another process, worker or machine gets the same vectors.
    other = Encoder.load(EncoderConfig(dtype="float32", engine="int8"))
    again = int8_engine.swap_in(other.context.model,
                                int8_engine.int8_weights(other.context.model, other._calibration_pass)).state_dict()
    assert all(torch.equal(tensor, again[name]) for name, tensor in encoder._int8.state_dict().items())


def test_questions_and_small_calls_stay_float32(passages: tuple[list[str], list[str]],
                                                float32_vectors: np.ndarray) -> None:
    encoder = Encoder.load(EncoderConfig(dtype="float32", engine="int8"))
    titles, texts = passages
    small = encoder.encode_passages(titles[:20], texts[:20])
    np.testing.assert_allclose(small, float32_vectors[:20], atol=1e-5)
    questions = [f"what is {t}?" for t in titles]  # a large call, but of questions
    reference = Encoder.load(EncoderConfig(dtype="float32", engine="torch")).encode_questions(questions)
    np.testing.assert_allclose(encoder.encode_questions(questions), reference, atol=1e-5)
    assert encoder._int8 is None  # nothing was quantized for them


def test_calibrating_never_recurses_when_the_calibration_itself_is_a_large_call(
        passages: tuple[list[str], list[str]], float32_vectors: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8_engine, "MIN_TEXTS", 16)  # the 57 calibration passages are a large call now
    encoder = Encoder.load(EncoderConfig(dtype="float32", engine="int8"))
    titles, texts = passages
    vectors = encoder.encode_passages(titles[:64], texts[:64])
    assert len(_int8_modules(encoder._int8)) == 6 * len(int8_engine.TARGETS)
    assert (vectors * float32_vectors[:64]).sum(1).min() >= 0.999


def test_quantized_weights_are_kept_in_the_users_cache_and_read_back(
        passages: tuple[list[str], list[str]], own_cache: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(int8_engine, "MIN_TEXTS", 16)
    titles, texts = passages[0][:64], passages[1][:64]
    first = Encoder.load(EncoderConfig(dtype="float32", engine="int8"))
    vectors = first.encode_passages(titles, texts)
    folder = own_cache / "wikirag" / "int8"
    assert [p.name for p in folder.iterdir()] == [f"{int8_engine.cache_key(first.fingerprint_id)}.pt"]  # no .tmp

    calibrations = []
    quantize = int8_engine.int8_weights

    def counted(model: torch.nn.Module, calibrate) -> dict:
        calibrations.append(model)
        return quantize(model, calibrate)

    monkeypatch.setattr(int8_engine, "int8_weights", counted)
    # The next process (another encoder of the same model) reads the weights back instead of calibrating.
    second = Encoder.load(EncoderConfig(dtype="float32", engine="int8"))
    np.testing.assert_array_equal(second.encode_passages(titles, texts), vectors)
    assert not calibrations and len(_int8_modules(second._int8)) == 6 * len(int8_engine.TARGETS)
    kept = next(folder.iterdir())
    weights = int8_engine.read_cached(kept, second.context.model)
    assert weights is not None and not int8_engine.fits(
        second.context.model, {k: v for k, v in weights.items() if not k.endswith(".bias")})
    assert not int8_engine.fits(second.context.model, dict.fromkeys(weights, 0))  # loadable, but not tensors

    # A torn file: a warning that names it, quantized again, and replaced by a whole one.
    kept.write_bytes(kept.read_bytes()[:4096])
    with caplog.at_level("WARNING", logger="wikirag"):
        torn = Encoder.load(EncoderConfig(dtype="float32", engine="int8")).encode_passages(titles, texts)
    np.testing.assert_array_equal(torn, vectors)
    assert len(calibrations) == 1 and f"{kept}: unreadable cached int8 weights" in caplog.text
    assert int8_engine.read_cached(kept, second.context.model) is not None

    # A cache that cannot be written (here: a file where the folder would be) costs only the time to quantize.
    blocked = own_cache.parent / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    caplog.clear()
    with caplog.at_level("WARNING", logger="wikirag"):
        unkept = Encoder.load(EncoderConfig(dtype="float32", engine="int8")).encode_passages(titles, texts)
    np.testing.assert_array_equal(unkept, vectors)
    assert len(calibrations) == 2 and "could not keep the int8 weights in" in caplog.text


def test_gptq_rounding_fits_the_calibration_inputs_better_than_rounding_to_nearest() -> None:
    generator = torch.Generator().manual_seed(0)
    # Correlated input channels, as a layer's activations are (independent ones leave nothing to compensate).
    x = torch.randn(2000, 16, generator=generator, dtype=torch.float64) @ torch.randn(16, 64, generator=generator,
                                                                                       dtype=torch.float64)
    x += 0.1 * torch.randn(2000, 64, generator=generator, dtype=torch.float64)
    w = torch.randn(32, 64, generator=generator, dtype=torch.float64)
    scale = w.abs().amax(1) / 63
    nearest = (w / scale[:, None]).round().clamp(-63, 63)
    gptq = int8_engine.gptq_round(w, x.T @ x, scale, 63)
    assert gptq.abs().max() <= 63 and torch.equal(gptq, gptq.round())

    def error(q: torch.Tensor) -> float:
        return float(torch.linalg.norm(x @ (w - q * scale[:, None]).T))

    assert error(gptq) < 0.5 * error(nearest)


def test_each_token_is_quantized_on_its_own_range_and_the_gemm_adds_nothing_to_the_rounding() -> None:
    generator = torch.Generator().manual_seed(0)
    w_int8 = torch.randint(-63, 64, (256, 384), dtype=torch.int8, generator=generator)  # the engine's 7 bits
    w_scale = torch.rand(256, generator=generator) * 0.01 + 0.001
    inv_smooth = torch.rand(384, generator=generator) + 0.5
    bias = torch.randn(256, generator=generator)
    x = torch.randn(64, 384, generator=generator)
    packed = int8_engine.pack_weight(w_int8, w_scale)
    y = int8_engine.int8_linear(x, packed, inv_smooth, bias).double()
    rows = x.double() * inv_smooth.double()
    w = w_int8.double() * w_scale.double()[:, None]
    # Each smoothed input lands within one step (2/255 of its token's largest magnitude) of its value, so an
    # output moves at most a step times its weights' L1 norm. A saturating GEMM (weights beyond ±63 on AVX2
    # kernels) breaks this by far, as would a step taken from the whole call's range.
    step = 2 * rows.abs().amax(1, keepdim=True) / 255
    assert ((y - (rows @ w.T + bias.double())).abs() <= step * w.abs().sum(1) + 1e-4).all()
    # A token a thousand times louder leaves every other token's output exactly as it was.
    loud = x.clone()
    loud[0] *= 1000
    louder = int8_engine.int8_linear(loud, packed, inv_smooth, bias).double()
    assert torch.equal(louder[1:], y[1:])
    torch.testing.assert_close(louder[0] - bias, 1000 * (y[0] - bias), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize(("engine", "dtype_requested", "dtype", "device", "probe", "expected"), [
    ("auto", "auto", "float32", "cpu", 1.8, ("int8", "float32 on CPU, int8 probe 1.8x faster")),
    ("auto", "auto", "float32", "cpu", 1.1, ("torch", "float32 on CPU, int8 probe only 1.10x faster (< 1.2)")),
    ("auto", "auto", "bfloat16", "cpu", 1.8, ("torch", "bfloat16 on cpu")),
    ("auto", "auto", "float32", "cuda", 1.8, ("torch", "float32 on cuda")),
    ("auto", "float32", "float32", "cpu", 1.8, ("torch", "float32 asked for explicitly")),
    ("int8", "float32", "float32", "cpu", 0.5, ("int8", "asked for explicitly")),
])
def test_the_auto_rule_without_the_test_machines_cpu(engine, dtype_requested, dtype, device, probe, expected) -> None:
    probed = []

    def measured() -> float:
        probed.append(True)
        return probe

    assert int8_engine.decide_engine(engine, dtype_requested, dtype, device, measured) == expected
    # The probe runs only where its answer decides something.
    assert bool(probed) == (engine == "auto" and expected[1].startswith("float32 on CPU"))


def test_this_machines_auto_engine_follows_the_rule() -> None:
    precision = Precision("float32", "for the test")
    engine = _engine(EncoderConfig(), precision)
    speedup = int8_engine.int8_probe_speedup()
    assert speedup > 0 and engine == ("int8" if speedup >= int8_engine.MIN_INT8_SPEEDUP else "torch")
    assert _engine(EncoderConfig(), Precision("bfloat16", "for the test")) == "torch"


def test_auto_reads_the_int8_verdict_this_cpu_left_in_the_users_cache(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict kept for this machine decides auto without timing the probe again (each Dask worker's case)."""
    from rag_core.perf.probes import cached_probe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cached_probe(int8_engine.PROBE_NAME, lambda: 0.5) == 0.5  # as if int8 had timed slower on this CPU
    monkeypatch.setattr(int8_engine, "int8_probe_speedup", lambda: pytest.fail("the probe was timed again"))
    int8_engine._auto_engine.cache_clear()
    try:
        assert _engine(EncoderConfig(), Precision("float32", "for the test")) == "torch"
    finally:
        int8_engine._auto_engine.cache_clear()


def test_int8_refuses_what_it_cannot_run_and_auto_passes_it_by(tmp_path: Path, passages: tuple[list[str], list[str]],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EncoderError, match="engine int8 runs float32 models on CPU, not bfloat16 on cpu"):
        Encoder.load(EncoderConfig(dtype="bfloat16", engine="int8"))
    from transformers import DistilBertConfig, DistilBertModel

    # A model without BERT's FFN naming (DistilBERT's is ffn.lin1): a clear error on the first large call.
    DistilBertModel(DistilBertConfig(dim=32, hidden_dim=64, n_layers=1, n_heads=2)).save_pretrained(tmp_path / "d")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(packaged_model_path() / name, tmp_path / "d" / name)
    encoder = Encoder.load(EncoderConfig(path=str(tmp_path / "d"), dtype="float32", engine="int8"))
    with pytest.raises(EncoderError, match=r"/d: engine int8 needs a BERT-style encoder .*set engine to torch"):
        encoder.encode_passages(*passages)
    assert encoder._int8 is None
    # Where auto would pick int8 (an AVX2 CPU's decision, whatever this machine's), such a model runs float32.
    monkeypatch.setattr(int8_engine, "_auto_engine", lambda *_: "int8")
    automatic = Encoder.load(EncoderConfig(path=str(tmp_path / "d"), dtype="float32"))
    assert automatic.engine == "torch" and automatic.fingerprint["engine"] == "torch"
    assert Encoder.load(EncoderConfig(dtype="float32")).engine == "int8"  # the BERT-style default keeps it
