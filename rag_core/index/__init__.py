"""The index stage: encoders, embedding shards, FAISS shard indexes, index versions, sharded search."""
