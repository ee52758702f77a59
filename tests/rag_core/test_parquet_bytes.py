"""Parquet bytes through Arrow's own buffers (rag_core/parquet_bytes.py explains the abort this avoids)."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa

from rag_core.parquet_bytes import parquet_to_table, table_to_parquet

ROOT = Path(__file__).resolve().parents[2]


def test_round_trip_keeps_rows_columns_and_compression() -> None:
    table = pa.table({"passage_id": ["a", "b", "ü"], "n": [1, 2, 3]})
    for compression in ("snappy", "zstd"):
        data = table_to_parquet(table, compression=compression)
        assert data[:4] == b"PAR1" and parquet_to_table(data).equals(table)
        assert parquet_to_table(data, ["n"]).column_names == ["n"]


def test_no_module_hands_arrow_a_python_file_object() -> None:
    """``pq.read_table(io.BytesIO(...))`` or ``pq.write_table(t, io.BytesIO())`` anywhere in the package is the bug."""
    found = []
    for path in [p for d in ("rag_core", "flows", "tasks") for p in (ROOT / d).rglob("*.py")]:
        nodes = list(ast.walk(ast.parse(path.read_text())))
        bytesio_names = {t.id for n in nodes if isinstance(n, ast.Assign) and "BytesIO" in ast.unparse(n.value)
                         for t in n.targets if isinstance(t, ast.Name)}
        for node in nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("read_table", "write_table", "ParquetFile") and (
                    "BytesIO" in ast.unparse(node)
                    or any(isinstance(a, ast.Name) and a.id in bytesio_names for a in node.args)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
