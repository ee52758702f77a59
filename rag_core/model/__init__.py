"""The RAG model: marginalisation, the trainable question encoder, the retriever, generators, decoding."""
