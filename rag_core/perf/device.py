"""The torch device every wikirag model runs on, and the process-group backend that goes with it.

One rule, so that the encoder, training and evaluation agree (:func:`choose_device`):

- ``WIKIRAG_DEVICE`` (``cpu``, ``cuda`` or ``cuda:N``) forces a device; an unknown value, or ``cuda``
  on a machine where torch sees no CUDA device, is refused in one line;
- an explicit device from a config (anything but ``auto``) wins over the rule, checked the same way;
- otherwise ``auto``: ``cuda:LOCAL_RANK`` (``cuda:0`` outside a torchrun rank) where torch sees a CUDA
  device, else ``cpu``. A bare ``cuda`` also becomes ``cuda:LOCAL_RANK``: each rank of a node gets its own
  GPU, and DDP's ``device_ids`` and ``torch.cuda.set_device`` get an index; ``cuda:N`` is kept as given.

The precision on that device is :func:`rag_core.perf.precision.choose_precision` (bf16 on GPUs that
support it). Distributed training uses NCCL on CUDA and gloo on CPU (:func:`process_group_backend`):
gloo cannot reduce CUDA tensors without copying them to the host, and NCCL does not run on CPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from rag_core.errors import WikiragError

ENV = "WIKIRAG_DEVICE"
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class DeviceError(WikiragError):
    """A device that cannot be used here (an unknown name, or CUDA asked for on a machine without it)."""


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False with a CPU-only torch build)."""
    import torch

    return torch.cuda.is_available()


def cuda_device_count() -> int:
    """How many CUDA devices torch sees (0 with a CPU-only torch build)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def decide_device(requested: str, *, cuda: int, local_rank: int = 0, source: str = "device") -> str:
    """The rule in the module docstring with the facts passed in: ``requested`` (auto/cpu/cuda/cuda:N), how many
    CUDA devices there are (0: none), and the rank's local index (auto on CUDA gives ``cuda:LOCAL_RANK``)."""
    value = requested.strip().lower()
    if not _DEVICE.match(value):
        raise DeviceError(f"{source} {requested!r} is not a device; use auto, cpu, cuda or cuda:N")
    if value == "cpu" or (value == "auto" and not cuda):
        return "cpu"
    if not cuda:
        raise DeviceError(f"{source} {requested!r}: torch sees no CUDA device here (CPU-only torch build or no GPU); "
                          f"use cpu or auto, or install a CUDA build of torch")
    device = value if ":" in value else f"cuda:{local_rank}"
    if int(device.split(":")[1]) >= cuda:
        raise DeviceError(f"{source} {requested!r} is {device}, but torch sees {cuda} CUDA device(s) here; "
                          f"run at most {cuda} ranks per node (--nproc) or name a device below cuda:{cuda}")
    return device


def choose_device(requested: str = "auto", *, local_rank: int | None = None,
                  environ: Mapping[str, str] | None = None) -> str:
    """The device to run on: ``WIKIRAG_DEVICE`` when set and ``requested`` is ``auto``, else ``requested``,
    resolved by :func:`decide_device` against this machine; ``local_rank`` defaults to torchrun's ``LOCAL_RANK``."""
    env = os.environ if environ is None else environ
    if local_rank is None:
        local_rank = int(env.get("LOCAL_RANK", 0))
    forced = env.get(ENV, "").strip()
    source = "device"
    if requested.strip().lower() == "auto" and forced:
        requested, source = forced, ENV
    value = requested.strip().lower()
    # torch is imported only when the answer depends on it: ``cpu`` is cpu on any build
    cuda = cuda_device_count() if value != "cpu" and _DEVICE.match(value) else 0
    return decide_device(requested, cuda=cuda, local_rank=local_rank, source=source)


def process_group_backend(device: str) -> str:
    """The torch.distributed backend for ranks on ``device``: ``nccl`` on CUDA, ``gloo`` on CPU."""
    return "nccl" if device.startswith("cuda") else "gloo"


def cuda_native_bf16(device: str) -> bool:
    """Whether the GPU ``device`` computes bf16 natively (compute capability 8.0+, or ROCm).

    Not ``torch.cuda.is_bf16_supported()``: by default that also answers True where bf16 is only emulated
    (a T4 or V100 can hold bf16 tensors but has no bf16 tensor cores, so bf16 runs slower than float32), and
    it asks about the current device rather than ``device``.
    """
    import torch

    if torch.version.hip:
        return True
    return torch.cuda.get_device_properties(torch.device(device)).major >= 8


def describe_device(device: str) -> str:
    """One line naming the device: the GPU's name, memory and bf16 support on CUDA; ``cpu`` otherwise."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    bf16 = "native bf16" if cuda_native_bf16(device) else "no native bf16"
    return (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability {props.major}.{props.minor}, "
            f"{bf16}, CUDA {torch.version.cuda}, torch {torch.__version__}")
