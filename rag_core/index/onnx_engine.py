"""ONNX Runtime as an optional float32 CPU engine of an encoder tower (``EncoderConfig(engine="onnx")``).

Why it exists: on a CPU without native bf16 the encoder runs in float32, and
there torch spends ~80% of its time in MKL's GEMMs (profiled under the AVX2
emulation) and ~11% in its attention kernel; ONNX Runtime brings its own
GEMMs (MLAS) and fused attention, layer norm and GELU. Measured
(bench/embed_bench.py): 6-12% faster than torch on an AMD EPYC, 12% slower
natively on the Intel CPU with AMX; a CPU-dependent winner, so not the
default. Its rows under the AVX2 emulation compare it, on the CPU's own
kernels, with a torch held to AVX2: MLAS picks its instruction set from the
CPU's flags and reads none of the emulation's variables. Its vectors equal
torch's float32 ones to ~1e-6 (tests/rag_core/index/test_encoders.py). Needs
``pip install 'wikirag[onnx]'``.

The tower is exported in memory with torch's TorchScript-based exporter
(``torch.onnx.export(..., dynamo=False)``; dynamic batch and length) from a
copy loaded with eager attention, whose masked softmax ONNX Runtime fuses.
Exporting takes a few seconds, so the encoder builds a session only for a
call that encodes at least :data:`MIN_TEXTS` texts (a shard of passages),
never for a handful of questions.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

MIN_TEXTS = 256  # texts in one call before an export pays for itself (~4 s against ~0.03 s saved a passage)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def available() -> bool:
    """True when onnxruntime and onnx (needed to export) are installed."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class OnnxTower:
    """An exported tower run by ONNX Runtime; called like the torch model, it returns torch tensors."""

    def __init__(self, session: Any, output: str) -> None:
        self.session = session
        self.output = output  # "last_hidden_state" or "pooler_output" (DPR)

    def __call__(self, *, input_ids, attention_mask, token_type_ids) -> SimpleNamespace:
        import torch

        feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy(),
                 "token_type_ids": token_type_ids.numpy()}
        (out,) = self.session.run(None, feeds)
        return SimpleNamespace(**{self.output: torch.from_numpy(out)})


def export_tower(path: Path, model_cls: Any, output: str, threads: int) -> OnnxTower:
    """Export the float32 model saved at ``path`` (loaded by ``model_cls``) and open it in ONNX Runtime."""
    return open_session(export_onnx(path, model_cls, output), output, threads)


def export_onnx(path: Path, model_cls: Any, output: str) -> bytes:
    """The float32 model saved at ``path`` as an ONNX model (dynamic batch and length), serialized."""
    import torch

    model = model_cls.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager").eval()

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask,
                                      token_type_ids=token_type_ids), output)

    example = torch.ones(2, 8, dtype=torch.long)
    buffer = io.BytesIO()
    dims = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(Tower(), (example, example, torch.zeros_like(example)), buffer, input_names=list(INPUTS),
                          output_names=[output], opset_version=17, dynamo=False,
                          dynamic_axes={**{name: dims for name in INPUTS}, output: {0: "batch"} | (
                              {1: "tokens"} if output == "last_hidden_state" else {})})
    return buffer.getvalue()


def open_session(model: bytes, output: str, threads: int) -> OnnxTower:
    """An ONNX Runtime CPU session of a serialized tower, all graph optimizations on."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return OnnxTower(session, output)
