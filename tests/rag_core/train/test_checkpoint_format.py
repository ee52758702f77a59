"""Checkpoint tensors in the safetensors format, written with one copy of the data (the rank that writes a
generator's Adam moments holds them once more, not twice)."""

from __future__ import annotations

import subprocess
import sys

import torch
from safetensors.torch import load

from rag_core.train.checkpoints import serialise_tensors


def test_serialised_tensors_load_back_with_safetensors_itself() -> None:
    tensors = {"weight": torch.randn(3, 5), "step": torch.tensor(7, dtype=torch.int64),
               "bf16": torch.randn(4).to(torch.bfloat16), "empty": torch.zeros(0),
               "bytes": torch.randint(0, 255, (9,), dtype=torch.uint8), "transposed": torch.randn(6, 2).t(),
               "mask": torch.tensor([True, False])}
    back = load(bytes(serialise_tensors(tensors)))
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name


# In a fresh process: the peak RSS while serialising, above the RSS before it, over the tensors' size (256 MB).
# The kernel's high-water mark is reset first (clear_refs 5): the lifetime peak would also count whatever importing
# torch and making the tensors held for a moment, which varies with the machine (seen: up to 1.4 GB more inside a test run).
PEAK = """
import re, sys, torch
from safetensors.torch import save
from rag_core.train.checkpoints import serialise_tensors
def status(field):
    return int(re.search(rf"^{field}:\\s+(\\d+) kB", open("/proc/self/status").read(), re.M).group(1)) * 1024
tensors = {f"moment.{i}": torch.randn(8_000_000) for i in range(8)}
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
data = {"ours": serialise_tensors, "safetensors": save}[sys.argv[1]](tensors)
print((status("VmHWM") - before) / 256e6)
"""


def test_serialising_holds_one_copy_of_the_data() -> None:
    def peak(which: str) -> float:
        done = subprocess.run([sys.executable, "-c", PEAK, which], capture_output=True, text=True, check=True)
        return float(done.stdout)

    assert peak("ours") < 1.3
    assert peak("safetensors") > 1.8  # safetensors' own save: every tensor's bytes, then the file's
