"""Every option that sets a config field shows that field's default in ``--help`` (and, where the command reads the
value from its arguments, has it as its own default): a default typed by hand that differs from the config class
fails here."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest
from pydantic import BaseModel

from cli.options import default
from cli.wikirag import build_parser
from rag_core.train.jobs import FinetuneRequest
from rag_core.train.jobs import ShortRun
from rag_core.index.plan import GateConfig
from rag_core.index.encoders import EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.index.retention import CleanupConfig
from rag_core.wiki.dump_site import DumpSiteConfig
from rag_core.wiki.ingest import IngestConfig
from tasks.adapters.index_queries import SearchConfig

# Options that set a config field without cli.options.config_option (their help is written around the value, or the
# class lives in a module the parser cannot import before Prefect's settings are known).
MAPPED: dict[tuple[str, str], tuple[type[BaseModel], str]] = {
    ("run", "--max-steps"): (ShortRun, "max_steps"),
    ("run", "--train-layers"): (ShortRun, "train_layers"),
    ("finetune", "--eval-examples"): (FinetuneRequest, "eval_examples"),
    ("finetune", "--decoding"): (FinetuneRequest, "decoding"),
    ("finetune", "--eval-precision"): (FinetuneRequest, "eval_precision"),
    ("ingest", "--words"): (IngestConfig, "words_per_passage"),
    ("ingest", "--shards"): (IngestConfig, "shards"),
    ("ingest", "--max-residue-rate"): (IngestConfig, "max_residue_rate"),
    ("index-rebuild", "--factory"): (IndexConfig, "factory"),
    ("index-rebuild", "--recall-target"): (IndexConfig, "recall_target"),
    ("index-rebuild", "--recall-queries"): (GateConfig, "recall_queries"),
    ("index-rebuild", "--encoder-dtype"): (EncoderConfig, "dtype"),
    ("index-rebuild", "--encoder-engine"): (EncoderConfig, "engine"),
    ("search", "-k"): (SearchConfig, "k"),
    ("indexes gc", "--older-than"): (CleanupConfig, "older_than_hours"),
    ("dumps check", "--site"): (DumpSiteConfig, "site"),
    ("dumps check", "--wiki"): (DumpSiteConfig, "wiki"),
    ("dumps mirror", "--site"): (DumpSiteConfig, "site"),
    ("dumps mirror", "--wiki"): (DumpSiteConfig, "wiki"),
    ("dumps mirror", "--connections"): (DumpSiteConfig, "connections"),
}


def options(parser: argparse.ArgumentParser, command: str = "") -> dict[tuple[str, str], argparse.Action]:
    """(command path, flag) -> action, for every option of every command and subcommand."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(options(sub, f"{command} {name}".strip()))
        elif action.option_strings:
            found[(command, action.option_strings[-1])] = action
    return found


def shown_default(help_text: str) -> str:
    """The value after "default" in a help text (the first one)."""
    match = re.search(r"\(default:? ([^;,)\s]+)", help_text)
    assert match, help_text
    return match.group(1).rstrip(":")


def same(shown: str, value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return shown == str(value)
    return float(shown.replace(",", "")) == value


def config_options() -> dict[tuple[str, str], tuple[argparse.Action, type[BaseModel], str]]:
    every = options(build_parser())
    built = {key: (action, *action.config_field) for key, action in every.items() if hasattr(action, "config_field")}
    for key, (model, name) in MAPPED.items():
        assert key in every, f"{key}: no such option any more; update MAPPED"
        built[key] = (every[key], model, name)
    return built


def test_every_config_option_shows_and_takes_its_fields_default() -> None:
    found = config_options()
    assert len(found) >= 30, sorted(found)
    wrong = []
    for (command, flag), (action, model, name) in found.items():
        value = default(model, name)
        if action.default is not None and action.default != value:  # a flag the command reads itself
            wrong.append((command, flag, action.default, f"{model.__name__}.{name}", value))
        if value is None:
            if "default" not in action.help:  # None is said in words
                wrong.append((command, flag, action.help, f"{model.__name__}.{name}", value))
        elif not same(shown_default(action.help), value):
            wrong.append((command, flag, action.help, f"{model.__name__}.{name}", value))
    assert wrong == []


@pytest.mark.parametrize("command", ["finetune", "ask", "generated-qa", "run", "ingest", "index-rebuild", "search"])
def test_the_rendered_help_shows_the_same_defaults(command: str, capsys: pytest.CaptureFixture) -> None:
    from cli.wikirag import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for (where, flag), (action, model, name) in config_options().items():
        value = default(model, name)
        if where == command and value is not None:
            assert f"(default {shown_default(action.help)}" in text.replace("(default: ", "(default "), (flag, value)


def test_nproc_has_one_default() -> None:
    every = options(build_parser())
    assert every[("run", "--nproc")].default == every[("finetune", "--nproc")].default
    assert all(f"default {every[(c, '--nproc')].default}" in every[(c, "--nproc")].help for c in ("run", "finetune"))


def test_refresh_tolerance_help_names_the_flows_default() -> None:
    from rag_core.evaluate.refresh_policy import TOLERANCE_POINTS

    action = options(build_parser())[("refresh", "--tolerance")]
    assert action.default is None and f"default {TOLERANCE_POINTS} point" in action.help


def test_building_the_parser_imports_neither_prefect_nor_mlflow() -> None:
    """Prefect reads its settings when imported: a command sets PREFECT_HOME and the API URL after parsing, so a
    parser that imported it would send flows to a temporary server of its own."""
    import subprocess
    import sys
    from pathlib import Path

    program = ("import sys; from cli.wikirag import build_parser; build_parser(); "
               "print(sorted({'prefect', 'mlflow', 'dask.distributed'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.strip() == "[]"
