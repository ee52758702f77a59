"""The index stage: encoders, embedding files, FAISS shard indexes, versions (manifest, pins, cleanup), building one, search."""
