"""The adapters below the tasks: MLflow (tracking, registry, the model flavor and its checksums), Dask (the
sharded index and retriever held by workers, bounded waits) and torchrun (the launcher and its ranks), plus the
index queries the CLI and the main job's report share. They import ``runtime`` and ``rag_core``, never a task
module, a flow or the CLI."""
