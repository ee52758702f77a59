"""No test module is imported by another module: what tests share lives in tests/helpers/ or a conftest.py.

Importing a test module to reach its builders runs its fixtures' definitions a second time, collects nothing
new and ties one test file's private names to another's; the builders are public names of tests/helpers/.
Every import counts, also those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _is_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") for part in dotted.split("."))


def imported_test_modules(source: str) -> list[str]:
    """The imported modules of ``source`` that are test modules (``test_*``), by dotted name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_test_module(node.module):
                found.append(node.module)
            else:  # ``from tests.flows import test_stopping`` imports the test module itself
                found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("test_")]
    return found


def test_no_module_under_tests_or_bench_imports_a_test_module() -> None:
    offenders = [f"{path.relative_to(ROOT)}: imports {module}"
                 for folder in ("tests", "bench") for path in sorted((ROOT / folder).rglob("*.py"))
                 for module in imported_test_modules(path.read_text())]
    assert offenders == [], "move the shared builder to tests/helpers/ (fixtures to a conftest.py):\n" + "\n".join(
        offenders)


def test_the_check_finds_each_form_of_importing_a_test_module() -> None:
    source = ("from tests.flows.test_index_rebuild import write_dump\n"
              "import tests.rag_core.test_leases\n"
              "from tests.flows import test_stopping, conftest\n"
              "def later():\n    from tests.rag_core.index.test_faiss_index import recall_at\n"
              "from tests.helpers.pages import write_dump\nimport testing_tools\n")
    assert imported_test_modules(source) == ["tests.flows.test_index_rebuild", "tests.rag_core.test_leases",
                                           "tests.flows.test_stopping", "tests.rag_core.index.test_faiss_index"]
