"""``wikirag services up|down|status|env``: the real engines of a deployment on 127.0.0.1 (runtime/services.py
starts, stops and probes them)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from runtime import services
from runtime.service_credentials import ServiceCredentials, ServicesError
from runtime.service_specs import ServicePorts, spec
from runtime.settings import Settings

log = logging.getLogger("wikirag.services")


def cmd_services(args: argparse.Namespace, settings: Settings) -> int:
    home = settings.home
    ports = ServicePorts()
    if args.names and args.action != "up":
        raise ServicesError(f"`wikirag services {args.action}` takes no service names (only `up` does)")
    if args.action == "up":
        repo = Path(services.__file__).resolve().parents[1]
        names = services.with_needs(tuple(spec(n).name for n in args.names) or services.ORDER)
        wanted = {source for name in names for source in spec(name).credentials.values()}
        creds = ServiceCredentials.from_environment(tuple(n for n in ServiceCredentials.NAMES if n in wanted))
        services.up(home, ports, creds, repo, names=names)
        print(services.export_lines(ports, home))
        log.info("services of %s are up; `eval \"$(wikirag services env)\"` points commands at them", home)
    elif args.action == "down":
        if not services.down(home):
            log.info("no service of %s was running", home)
    elif args.action == "env":
        print(services.export_lines(ports, home))
    else:
        for row in services.status(home):
            print("\t".join(str(row.get(k, "")) for k in ("name", "state", "pid", "url", "log")))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``wikirag services up|down|status|env``."""
    defaults = ServicePorts.model_fields
    p = sub.add_parser(
        "services", help="up|down|status|env: the real engines on 127.0.0.1 (S3, MLflow, Prefect + worker, Dask)",
        description=services.__doc__.split("\n\n")[0].replace("``", "") + " Ports: " + ", ".join(
            f"WIKIRAG_{k.upper()} (default {v.default})" for k, v in defaults.items()) + ".")
    p.add_argument("action", choices=["up", "down", "status", "env"],
                   help="up: start what is not running; down: stop them; status: what runs where; "
                        "env: the exports that point wikirag commands at them")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"up only these services and those they need ({', '.join(services.ORDER)}; default all)")
    p.set_defaults(func=cmd_services)
