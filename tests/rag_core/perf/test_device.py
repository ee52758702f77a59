"""The device rule (rag_core.perf.device): forced values, WIKIRAG_DEVICE, refusals, and the process-group backend."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rag_core.errors import WikiragError
from rag_core.perf.device import (ENV, DeviceError, choose_device, decide_device, describe_device,
                                  process_group_backend)

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@pytest.mark.parametrize(("requested", "cuda", "rank", "expected"), [
    ("auto", 0, 0, "cpu"),
    ("auto", 0, 3, "cpu"),
    ("auto", 1, 0, "cuda:0"),
    ("auto", 4, 3, "cuda:3"),
    ("cpu", 2, 0, "cpu"),
    ("cuda", 1, 0, "cuda:0"),
    ("cuda", 4, 2, "cuda:2"),
    ("cuda:1", 4, 2, "cuda:1"),
    ("cuda:1", 2, 0, "cuda:1"),
    (" CUDA:1 ", 2, 0, "cuda:1"),
])
def test_decide_device(requested: str, cuda: int, rank: int, expected: str) -> None:
    assert decide_device(requested, cuda=cuda, local_rank=rank) == expected


@pytest.mark.parametrize("requested", ["gpu", "cuda:x", "mps", ""])
def test_an_unknown_device_is_refused_in_one_line(requested: str) -> None:
    with pytest.raises(DeviceError) as caught:
        decide_device(requested, cuda=1)
    message = str(caught.value)
    assert isinstance(caught.value, WikiragError) and "\n" not in message
    assert repr(requested) in message and "auto, cpu, cuda or cuda:N" in message


def test_cuda_is_refused_where_there_is_none() -> None:
    with pytest.raises(DeviceError, match="no CUDA device"):
        decide_device("cuda:0", cuda=0)


@pytest.mark.parametrize(("requested", "rank"), [("auto", 2), ("cuda", 2), ("cuda:5", 0)])
def test_more_ranks_than_gpus_is_refused_in_one_line(requested: str, rank: int) -> None:
    """torchrun --nproc-per-node 3 on a 2-GPU node: the third rank names the problem instead of a CUDA error."""
    with pytest.raises(DeviceError) as caught:
        decide_device(requested, cuda=2, local_rank=rank)
    assert "torch sees 2 CUDA device(s) here" in str(caught.value) and "\n" not in str(caught.value)


def test_the_environment_forces_the_device_over_auto_only() -> None:
    assert choose_device("auto", environ={ENV: "cpu"}) == "cpu"
    assert choose_device("cpu", environ={ENV: "cuda"}) == "cpu"  # an explicit config wins
    assert choose_device("auto", environ={ENV: ""}) == ("cuda:0" if torch.cuda.is_available() else "cpu")


def test_a_bad_environment_value_is_refused_naming_the_variable() -> None:
    with pytest.raises(DeviceError) as caught:
        choose_device("auto", environ={ENV: "tpu"})
    assert str(caught.value) == f"{ENV} 'tpu' is not a device; use auto, cpu, cuda or cuda:N"


@NO_CUDA
def test_forcing_cuda_without_cuda_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "cuda")
    with pytest.raises(DeviceError, match=f"{ENV} 'cuda': torch sees no CUDA device here"):
        choose_device()


def test_backend_is_nccl_on_cuda_and_gloo_on_cpu() -> None:
    assert process_group_backend("cuda") == "nccl"
    assert process_group_backend("cuda:3") == "nccl"
    assert process_group_backend("cpu") == "gloo"
    assert describe_device("cpu") == "cpu"


def test_the_chosen_backend_reduces_here(tmp_path) -> None:
    """A one-rank group on the backend the rule picks for this machine's device runs an all_reduce."""
    device = choose_device("auto", environ={})
    if device.startswith("cuda") and not dist.is_nccl_available():
        pytest.skip("torch built without NCCL")
    dist.init_process_group(process_group_backend(device), init_method=f"file://{tmp_path / 'rendezvous'}",
                            rank=0, world_size=1)
    try:
        total = torch.ones(3, device=device)
        dist.all_reduce(total)
        assert total.tolist() == [1.0, 1.0, 1.0]
        assert dist.get_backend() == process_group_backend(device)
    finally:
        dist.destroy_process_group()
