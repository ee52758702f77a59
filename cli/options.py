"""Options read from the config classes: each flag's default, type, choices and help's "(default ...)" come from the
pydantic field it sets, so the command line cannot drift from the configs."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rag_core.train.jobs import Launch

from runtime.settings import Settings


def default(model: type[BaseModel], name: str) -> Any:
    """The default of a config field: the one place each default lives."""
    return model.model_fields[name].get_default(call_default_factory=True)


def given(args: argparse.Namespace, **fields: str) -> dict[str, Any]:
    """``{field: value}`` of the flags (``field=dest``) the user gave; the others keep their config defaults."""
    return {name: getattr(args, dest) for name, dest in fields.items() if getattr(args, dest, None) is not None}


def _value_type(annotation: Any) -> tuple[Any, list | None]:
    """(argparse type, choices) of a field's annotation: a Literal gives choices, ``X | None`` gives X's type."""
    if typing.get_origin(annotation) is typing.Literal:
        return None, list(typing.get_args(annotation))
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args:
        return _value_type(args[0])
    return (annotation if annotation in (int, float, str) else None), None


def config_option(p: argparse.ArgumentParser, flag: str, model: type[BaseModel], name: str, help: str, *,
                  keep_default: bool = False, **kwargs: Any) -> argparse.Action:
    """``flag`` setting ``model``'s field ``name``; ``{default}`` in ``help`` is replaced by the field's default.

    The flag's own default is None (a flag not given leaves the config's default, see :func:`given`), or the field's
    default with ``keep_default`` for a command that reads the value from its arguments. Type and choices come from
    the field's annotation unless given.
    """
    value = default(model, name)
    kind, choices = _value_type(model.model_fields[name].annotation)
    kwargs.setdefault("type", kind)
    if choices is not None:
        kwargs.setdefault("choices", choices)
    action = p.add_argument(flag, default=value if keep_default else None, help=help.format(default=value), **kwargs)
    action.config_field = (model, name)  # read by tests/cli/test_help_defaults.py
    return action


def add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="store URL: a path, file://..., or s3://bucket/prefix (default <home>/store)")


def add_engine(p: argparse.ArgumentParser) -> None:
    """--store, --dask-address, --workers: where data lives and which Dask cluster works on it."""
    add_store(p)
    p.add_argument("--dask-address", help="scheduler of an existing Dask cluster (default: a local cluster)")
    p.add_argument("--workers", type=int, help="workers of the local Dask cluster (default: one per core, "
                   f"{default(Settings, 'workers')} here)")


# The flows' nproc default too (flows/finetune.py, flows/pipeline.py): rag_core.train.jobs.Launch.nproc.
DDP_PROCESSES = default(Launch, "nproc")


def add_nproc(p: argparse.ArgumentParser, help: str) -> None:
    """``--nproc``: torchrun's processes per node; ``{default}`` in ``help`` is DDP_PROCESSES."""
    p.add_argument("--nproc", type=int, default=DDP_PROCESSES, help=help.format(default=DDP_PROCESSES))


def data_file(value: str) -> str:
    """``--train``/``--dev``: a URL as given; a local path checked to be a file and made absolute, since training
    and evaluation read it in processes of their own (torchrun's ranks), whose working folder is not the shell's."""
    if "://" in value and not value.startswith("file://"):
        return value
    path = Path(value.removeprefix("file://")).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{value}: no such file" if not path.exists() else f"{value}: not a file")
    return str(path.resolve())


def train_layers(value: str) -> int | str:
    """``--train-layers``: a number of blocks >= 1, or ``all``."""
    if value == "all":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a number of decoder blocks >= 1, or all")
    return int(value)
