"""Runs recipes under torchrun for the tests: ``torchrun ... -m tests.rag_core.train.recipe_runner SPEC.json``.

SPEC: ``{"store": URL, "runs": [TrainConfig as JSON, ...]}``. The process group is joined once
here, so one launch runs several recipes (each launch costs seconds of imports). Ranks other
than 0 get a store that refuses every write: a rank that writes fails the run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rag_core.errors import StoreError
from rag_core.storage import Store


class ReadOnlyStore(Store):
    """A real store whose writes raise: what ranks other than 0 get here."""

    def child(self, *parts: str) -> ReadOnlyStore:
        return ReadOnlyStore(self.url_of(*parts), self.options)

    def write_bytes(self, data: bytes, *parts: str) -> None:
        raise StoreError(f"{self.url_of(*parts)}: rank {os.environ.get('RANK')} wrote to the store; only rank 0 may")

    def remove(self, *parts: str) -> None:
        raise StoreError(f"{self.url_of(*parts)}: rank {os.environ.get('RANK')} removed from the store")

    def move_tree(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        raise StoreError(f"{self.url_of(*dst)}: rank {os.environ.get('RANK')} moved in the store")


def main(spec_file: str) -> int:
    import torch
    from torch import distributed as dist

    from rag_core.train.recipe import run
    from rag_core.train.train_config import Distributed, TrainConfig

    spec = json.loads(Path(spec_file).read_text())
    where = Distributed.from_environ(os.environ)
    store = Store(spec["store"]) if where.rank == 0 else ReadOnlyStore(spec["store"])
    torch.set_num_threads(1)
    if where.world_size > 1:
        dist.init_process_group("gloo")
    try:
        for config in spec["runs"]:
            run(TrainConfig.model_validate(config), store, distributed=where)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
