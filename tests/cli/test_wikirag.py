"""The CLI at the edge: settings read once, flags that never touch the environment, defaults from the configs."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from cli.indexes import CleanupConfig
from cli.wikirag import build_parser, main, read_settings, rebuild_configs
from rag_core.index.plan import GateConfig
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.wiki.ingest import IngestConfig
from runtime.settings import Settings, StoreAccess
from tasks.adapters.index_queries import MAX_K, SearchConfig


def help_text(capsys: pytest.CaptureFixture, *command: str) -> str:
    """``wikirag COMMAND --help`` as one line (argparse wraps it)."""
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return re.sub(r"\s+", " ", capsys.readouterr().out)


def test_no_flag_means_the_config_classes_defaults() -> None:
    args = build_parser().parse_args(["index-rebuild", "dump.xml.bz2"])
    assert rebuild_configs(args) == (IngestConfig(dump="dump.xml.bz2"), EmbedConfig(), IndexConfig(), GateConfig())
    args = build_parser().parse_args(["index-rebuild", "d", "--shards", "4", "--factory", "HNSW32", "--recall-queries",
                                      "50", "--encoder-dtype", "float32", "--memory-budget-gb", "0.5",
                                      "--encoder-engine", "int8"])
    ingest, embed, index, gate = rebuild_configs(args)
    assert (embed.shards, embed.encoder, index.factory, index.memory_budget_bytes, gate.recall_queries) == (
        4, EncoderConfig(dtype="float32", engine="int8"), "HNSW32", 1 << 29, 50)
    assert index.recall_target == IndexConfig().recall_target and ingest.words_per_passage == 100


@pytest.mark.parametrize(("argv", "verbose"), [
    (["plan", "dump.xml.bz2", "-v"], True),  # after the command
    (["-v", "plan", "dump.xml.bz2"], True),  # before it, not reset by the command's parser
    (["plan", "dump.xml.bz2"], False),
    (["indexes", "list", "--verbose"], True),  # after a command's own action
    (["models", "rollback", "wikirag-qa", "-v"], True),
])
def test_verbose_is_taken_before_or_after_the_command(argv: list[str], verbose: bool) -> None:
    assert build_parser().parse_args(argv).verbose is verbose


def test_the_help_names_every_variable_the_settings_read() -> None:
    variables = [f.validation_alias or f"WIKIRAG_{name.upper()}" for name, f in Settings.model_fields.items()]
    assert len(variables) == 14
    epilog = " ".join(build_parser().epilog.split())
    assert [v for v in variables if v not in epilog] == []


def test_help_shows_the_defaults_of_the_config_classes(capsys: pytest.CaptureFixture) -> None:
    rebuild = help_text(capsys, "index-rebuild")
    assert f"(default {IndexConfig().recall_target})" in rebuild and f"(default {IndexConfig().factory}:" in rebuild
    assert f"(default {GateConfig().recall_queries})" in rebuild
    assert f"one per {EmbedConfig().passages_per_shard:,} passages, at least {EmbedConfig().min_shards}" in rebuild
    assert f"(default {EncoderConfig().dtype}: bf16 where" in rebuild and "{auto,float32,bfloat16}" in rebuild
    assert f"(default {EncoderConfig().engine}: int8 q/k/v and FFN inputs for" in rebuild
    assert "{auto,torch,int8}" in rebuild
    ingest = help_text(capsys, "ingest")
    for name in ("words_per_passage", "max_residue_rate", "shards"):
        assert f"(default {IngestConfig.model_fields[name].default}" in ingest
    search = help_text(capsys, "search")
    assert f"(default {SearchConfig().k}, at most {MAX_K})" in search
    assert f"(default {CleanupConfig().older_than_hours:g})" in help_text(capsys, "indexes", "gc")
    assert f"one per core, {Settings().workers} here" in help_text(capsys, "ingest")


def _helps(parser: argparse.ArgumentParser, command: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(command and flag, help text) of every option of every subcommand."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _helps(sub, (*command, name))
        elif action.help and action.help != argparse.SUPPRESS:
            found.append((" ".join((*command, *action.option_strings[-1:], action.dest)), action.help))
    return found


def test_every_help_text_closes_what_it_opens() -> None:
    # Help texts are assembled from the config classes' descriptions; a cut in the wrong place left one
    # reading "a timed probe decides), else float32)".
    helps = _helps(build_parser())
    assert len(helps) > 50
    for where, text in helps:
        depth = 0
        for char in text:
            depth += {"(": 1, ")": -1}.get(char, 0)
            assert depth >= 0, (where, text)
        assert depth == 0, (where, text)


def test_flags_override_settings_without_touching_the_environment(home: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("WIKIRAG_WORKERS", "3")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    before = dict(os.environ)
    settings = read_settings(build_parser().parse_args(["ingest", "d", "--store", "s3://b/p", "--workers", "5"]))
    assert (settings.store_url, settings.workers, settings.dask_address) == ("s3://b/p", 5, None)
    assert read_settings(build_parser().parse_args(["ingest", "d"])).workers == 3  # the environment's
    assert main(["--home", str(tmp_path / "other"), "indexes", "--store", str(tmp_path / "store")]) == 0
    assert dict(os.environ) == before and "no published index" in capsys.readouterr().err

    assert main(["search", "q", "-k", "0", "--store", str(tmp_path)]) == 2  # a bad value: one line, no traceback
    err = capsys.readouterr().err
    assert err == "wikirag: error: -k 0: Input should be greater than or equal to 1\n"  # the flag, as given


def test_store_access_keeps_credentials_out_of_what_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    access = Settings(store="s3://bucket/prefix").store_access()
    assert access.options()["secret"] == "very-secret" and access.options("s3://other/x")["key"] == "key"
    assert access.options("https://dumps.wikimedia.org/x.bz2") == {} and access.store().options["key"] == "key"
    assert "very-secret" not in access.model_dump_json() and "very-secret" not in repr(access)
    assert StoreAccess.model_validate("/a/local/store") == StoreAccess(url="/a/local/store")


def test_the_lease_ttl_reaches_the_flows_store_access_and_a_bad_one_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    assert Settings().store_access().lease_ttl_s == StoreAccess(url="x").lease_ttl_s == 120.0  # the default
    monkeypatch.setenv("WIKIRAG_LEASE_TTL_S", "30")
    assert Settings().store_access().lease_ttl_s == 30.0
    for bad, why in (("1", "greater than or equal to 5"), ("86400", "less than or equal to 21600")):
        monkeypatch.setenv("WIKIRAG_LEASE_TTL_S", bad)
        assert main(["indexes", "--store", str(tmp_path)]) == 2
        assert capsys.readouterr().err == f"wikirag: error: WIKIRAG_LEASE_TTL_S='{bad}': Input should be {why}\n"


def test_run_flags_set_the_main_jobs_fine_tune(capsys: pytest.CaptureFixture) -> None:
    from cli.wikirag import short_run_fields
    from rag_core.train.jobs import ShortRun

    parse = build_parser().parse_args
    assert short_run_fields(parse(["run"])) == {}  # ShortRun's own defaults
    assert ShortRun(**short_run_fields(parse(["run", "--train-layers", "all"]))).train_layers is None
    assert short_run_fields(parse(["run", "--train-layers", "8", "--max-steps", "3"])) == {"train_layers": 8,
                                                                                          "max_steps": 3}
    for bad in ("0", "-2", "some"):
        with pytest.raises(SystemExit):
            parse(["run", "--train-layers", bad])
        assert f"'{bad}': give a number of decoder blocks >= 1, or all" in capsys.readouterr().err
    assert f"(default {ShortRun().train_layers} of SmolLM2's 30" in help_text(capsys, "run")


def test_finetune_trains_the_last_blocks_by_default_and_every_parameter_when_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from cli.train import finetune_request
    from rag_core.train.jobs import TRAINED_BLOCKS, ShortRun

    def layers(*flags: str) -> int | None:
        args = build_parser().parse_args(["finetune", "--task", "cloze", "--generator", str(tmp_path), *flags])
        return finetune_request(args, Settings(home=tmp_path))["recipe"]["train_generator_layers"]

    assert layers() == TRAINED_BLOCKS == ShortRun().train_layers  # `wikirag finetune` and the main job agree
    assert layers("--train-layers", "all") is None and layers("--train-layers", "4") == 4
    with pytest.raises(SystemExit):
        layers("--train-layers", "0")
    assert "'0': give a number of decoder blocks >= 1, or all" in capsys.readouterr().err
    assert f"(default {TRAINED_BLOCKS}: cheaper steps" in help_text(capsys, "finetune")


def test_train_and_dev_files_are_checked_at_once_and_made_absolute(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's ranks do not run in the shell's folder: a relative --train reaches them as an absolute path, a
    missing one stops the command before anything starts, and evaluate without --dev says what it needs."""
    (tmp_path / "nq-train.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["finetune", "--task", "nq", "--train", "nq-train.jsonl", "--dev",
                                      "s3://bucket/nq-dev.jsonl"])
    assert (args.train, args.dev) == (str(tmp_path / "nq-train.jsonl"), "s3://bucket/nq-dev.jsonl")
    for command in (["finetune", "--task", "nq", "--train", "missing.jsonl", "--dev", "nq-train.jsonl"],
                    ["evaluate", "--model", "models:/wikirag-nq/1", "--task", "nq", "--dev", "missing.jsonl"]):
        with pytest.raises(SystemExit) as stopped:
            build_parser().parse_args(command)
        assert stopped.value.code == 2 and "missing.jsonl: no such file" in capsys.readouterr().err
    code = main(["--home", str(tmp_path / "home"), "evaluate", "--model", "models:/wikirag-nq/1", "--task", "nq"])
    err = capsys.readouterr().err
    assert code == 2 and err == "wikirag: error: --task nq needs --dev FILE (only cloze draws its own held-out " \
                                "questions)\n", err


@pytest.mark.parametrize(("command", "teardown"), [(["--home", "h", "search", "q", "-k", "0"], False),
                                                   (["ingest", "missing.xml"], True)])
def test_the_program_skips_the_interpreters_teardown_after_a_read_only_commands_error(
        command: list[str], teardown: bool, tmp_path: Path) -> None:
    """A read-only command's error ends the process at once (a native thread could abort the teardown after the
    error line, exit 134); any other command's error still runs the teardown (atexit: Prefect's log flush), with the
    objects the imports made frozen, so that the teardown's garbage collection does not walk them again."""
    import subprocess
    import sys

    program = ("import atexit, gc; from cli.wikirag import entry; "
               "atexit.register(lambda: print('teardown ran, frozen:', gc.get_freeze_count() > 10_000)); "
               f"entry({[*command, '--store', str(tmp_path / 'store')]!r})")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2], env={**os.environ, "WIKIRAG_HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("wikirag: error: ")
    assert ("teardown ran, frozen: True" in proc.stdout) is teardown, proc.stdout


def test_indexes_show_puts_each_gate_on_one_line_with_what_it_observed() -> None:
    from cli.indexes import _gate_lines

    gates = {"embeddings": "passed (5 expectations, 4,391 rows)", "index-counts": "passed (3 expectations, 4 rows)",
             "index-counts: expect_column_sum_to_be_between(ntotal)": 4391}
    assert _gate_lines(gates) == {
        "embeddings": "passed (5 expectations, 4,391 rows)",
        "index-counts": "passed (3 expectations, 4 rows); expect_column_sum_to_be_between(ntotal) = 4391"}


@pytest.mark.parametrize("command", [["ask", "q"], ["generated-qa"], ["finetune", "--task", "cloze"],
                                     ["evaluate", "--model", "models:/m/1", "--task", "cloze"], ["refresh"]])
def test_every_command_that_reads_an_index_version_takes_search_s_version_flag(command: list[str]) -> None:
    """`search --version V` and `ask --index V` name the same thing: each takes both spellings."""
    for flag in ("--version", "--index"):
        assert build_parser().parse_args([*command, flag, "20261207T000000.000Z-0123abcd"]).index == \
            "20261207T000000.000Z-0123abcd"
