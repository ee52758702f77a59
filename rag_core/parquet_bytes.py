"""Parquet to and from bytes in memory, without a Python file object in between.

``pq.read_table(io.BytesIO(data))`` makes Arrow's I/O threads call back into
Python for every read; one of them still waiting for the GIL while the
interpreter finalizes is ended with ``pthread_exit`` inside C++ code, and the
process aborts ("terminate called without an active exception", exit 134)
after having done its work (apache/arrow#34314 and #45017).  Arrow's own
buffers keep every byte on the C++ side.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq


def table_to_parquet(table: pa.Table, *, compression: str = "snappy") -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression)
    return sink.getvalue().to_pybytes()


def parquet_to_table(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    return pq.read_table(pa.BufferReader(data), columns=list(columns) if columns is not None else None)
