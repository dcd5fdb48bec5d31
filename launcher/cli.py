"""The ``launcher`` command line. Parses arguments and dispatches; heavy modules load per verb."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Callable, Sequence

from launcher import __version__, backend_names
from launcher.commands import CANCEL_GRACE_SECONDS
from launcher.errors import EXIT_BACKEND, LauncherError, SpecError

if TYPE_CHECKING:
    from launcher.spec import Overrides

BACKENDS = tuple(backend_names.BACKENDS)


def _spec_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", required=True, metavar="FILE", help="the spec YAML file")


def _run_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", nargs="?", metavar="RUN",
                        help="run id, path to an info.yaml, or nothing for the latest run")


def _override_args(parser: argparse.ArgumentParser) -> None:
    """The spec's command-line overrides (launcher.spec.overrides), the same for every verb that takes them:
    ``--set``, ``--env``, ``--nodes``, and ``-- ARGS`` (split off in :func:`main`); read by :func:`_overrides`."""
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                        help="override any spec field (the value is YAML), e.g. "
                        "--set spec.cluster.spec.worker.replicas=3; list items by number: env[0].value or "
                        "env.0.value (repeatable)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="add or replace an environment variable of every node (repeatable)")
    parser.add_argument("--nodes", type=_positive_int, metavar="N", help="total number of nodes (main + workers)")
    parser.epilog = ("Arguments after -- replace the spec's runtime args and kwargs: "
                     f"{parser.prog} -f train.yaml -- --epochs 3")
    parser.set_defaults(takes_overrides=True)


def _overrides(args: argparse.Namespace) -> Overrides:
    """What :func:`_override_args` parsed (with the arguments after ``--``), as ``launcher.spec.Overrides``."""
    from launcher.spec import Overrides

    return Overrides(sets=tuple(args.set), env=tuple(args.env), nodes=args.nodes,
                     args=None if args.trailing is None else tuple(args.trailing))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launcher", description="Declarative launcher for distributed PyTorch "
                                     "training: one YAML spec runs on local processes, Docker/compose, Slurm, "
                                     "Kubernetes or OCI Data Science Jobs.")
    parser.add_argument("--version", action="version", version=f"launcher {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug output and tracebacks")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser("init", help="write train.yaml, an example train.py and the image artifacts")
    p.add_argument("--framework", required=True, help="only 'pytorch' for now")
    p.add_argument("--dir", default=".", help="directory to write into (default: current directory)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(handler=_init)

    p = verbs.add_parser("validate", help="check a spec and report every problem at once")
    _spec_arg(p)
    p.set_defaults(handler=_validate)

    p = verbs.add_parser("run", help="launch a run (or print exactly what would be sent, with --dry-run)")
    _spec_arg(p)
    p.add_argument("--backend", choices=BACKENDS, help="override the backend implied by infrastructure.type")
    p.add_argument("--dry-run", action="store_true", help="print the requests and node configs; touch nothing")
    p.add_argument("--output", choices=("text", "json", "yaml", "pytorchjob"), default="text",
                   help="dry-run output format (pytorchjob: the run as a Kubeflow PyTorchJob, with --backend "
                   "kubernetes; an export, not submitted)")
    p.add_argument("--detach", action="store_true", help="return after submission instead of following the logs")
    p.add_argument("--keep", action="store_true", help="docker: keep the containers after the run ends "
                   "(for docker logs / inspect); they are removed otherwise")
    p.add_argument("--resume-from", metavar="RUN", help="restore the outputs (checkpoints) of an earlier run first")
    p.add_argument("--run-id", help="use this run id instead of a new one (it must not have been used before)")
    _override_args(p)
    p.set_defaults(handler=_run)

    p = verbs.add_parser("build", help="build the node image (\"@image\" in the spec) with the Docker engine")
    _spec_arg(p)
    p.add_argument("--tag", "-t", help="image name and tag (default: launcher/NAME:CONTENT-DIGEST); "
                   "include a registry host to --push")
    p.add_argument("--push", action="store_true", help="push the image and record its digest")
    p.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE",
                   help="a Dockerfile ARG, e.g. BASE_IMAGE=... or TORCH_SPEC=... (repeatable)")
    p.add_argument("--no-cache", action="store_true", help="build every step again")
    p.set_defaults(handler=_build)

    p = verbs.add_parser("compose", help="write a docker-compose file running the same cluster locally")
    _spec_arg(p)
    p.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    _override_args(p)
    p.set_defaults(handler=_compose)

    p = verbs.add_parser("watch", help="follow the merged log of every node until the run ends")
    _run_arg(p)
    p.add_argument("--node", action="append", help="only this node (repeatable)")
    p.add_argument("--since", metavar="WHEN", help="only lines newer than this: seconds ago (e.g. 90), "
                   "with unit (5m, 2h) or an ISO time")
    p.add_argument("--tail", type=int, metavar="N", help="start with only the last N lines already written")
    p.add_argument("--no-follow", action="store_true", help="print what is there and stop")
    p.set_defaults(handler=_watch)

    p = verbs.add_parser("status", help="per-node state, rank, address and exit code")
    _run_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_status)

    p = verbs.add_parser("top", help="live CPU, memory, GPU use and steps/s of every node and rank, refreshed every "
                         "2 s until the run ends; the slowest rank and stragglers marked",
                         epilog="CPU is in percent of one core; WORK/STEP is a rank's own work per step (its CPU "
                         "time and waits for data, not its waits for the other ranks) over the last minute; a "
                         "straggler works at least 1.3x the median. Nodes sample every 5 s "
                         "(LAUNCHER_HEALTH_SAMPLE). More: docs/health.md.")
    _run_arg(p)
    p.add_argument("--once", action="store_true", help="print one table and exit 0 (for scripts); otherwise the "
                   "exit status is the run's, as watch's")
    p.add_argument("--wide", action="store_true", help="every column whole, however wide the terminal; "
                   "otherwise the table fits it (COLUMNS, else the terminal's width, else 80 when not a terminal): "
                   "long cells are cut and the least needed columns left out, as a line below it says")
    p.set_defaults(handler=_top)

    p = verbs.add_parser("show-config", help="the elected main, MASTER_ADDR/PORT, node ranks and world size")
    _run_arg(p)
    p.set_defaults(handler=_show_config)

    p = verbs.add_parser("cancel", help="stop every node: graceful first, then forced")
    _run_arg(p)
    p.add_argument("--grace", type=_non_negative_seconds, default=CANCEL_GRACE_SECONDS,
                   help=f"seconds to wait before forcing (default {CANCEL_GRACE_SECONDS:g})")
    p.set_defaults(handler=_cancel)

    p = verbs.add_parser("clean", help="remove old (or the named) runs' records, local temporary outputs and "
                         "leftover containers")
    p.add_argument("runs", nargs="*", metavar="RUN", help="these runs (ended), whatever their age")
    p.add_argument("--older-than", default="7d", metavar="AGE", help="runs created longer ago than this "
                   "(default 7d; seconds or a number with s, m, h, d)")
    p.add_argument("--work-dir", action="store_true", help="also delete their data in the work dir "
                   "(logs, statuses, outputs)")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p.add_argument("--force", action="store_true", help="also remove local outputs that never reached the work dir")
    p.set_defaults(handler=_clean)

    p = verbs.add_parser("scale", help="grow or shrink an elastic run to N nodes (within minNodes..maxNodes) "
                         "while it trains")
    _run_arg(p)
    p.add_argument("--nodes", type=_positive_int, required=True, metavar="N", help="total number of nodes wanted")
    p.set_defaults(handler=_scale)

    p = verbs.add_parser("data", help="progress of each epoch's shards (launcher.data.ElasticSampler): "
                         "done, in flight, left")
    _run_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_data)

    p = verbs.add_parser("timeline", help="when each phase of each node happened (seconds from submit); "
                         "-o run.html or run.svg draws it")
    _run_arg(p)
    p.add_argument("-o", "--output", metavar="FILE", help="also write the picture: FILE.html (a page with the "
                   "table) or FILE.svg; self-contained, opens offline")
    p.add_argument("--json", action="store_true", help="every event, and each node's health series the picture "
                   "draws, machine-readable")
    p.add_argument("--all-nodes", action="store_true", help="a column (and a lane in the picture) for every node; "
                   "a large run otherwise shows the nodes that stand out on their own and sums up the others")
    p.set_defaults(handler=_timeline)

    p = verbs.add_parser("list", help="recent runs")
    p.add_argument("-n", type=_positive_int, default=20, help="how many (default 20)")
    p.set_defaults(handler=_list)

    p = verbs.add_parser("ui", help="every run in a local web page: nodes, failures, live logs, cancel")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                   "only; another is warned about)")
    p.add_argument("--port", type=_port, default=0, help="port to listen on (default 0: any free port, printed)")
    p.add_argument("--no-browser", action="store_true", help="print the address only; do not open a browser")
    p.set_defaults(handler=_ui)
    helps = {action.dest: action.help for action in verbs._choices_actions}  # argparse lists them nowhere public
    for name, verb in verbs.choices.items():
        verb.description = verb.description or helps.get(name)  # `launcher VERB --help` says what VERB does
        # -v works after the verb too (default: the global flag's value)
        verb.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                          help="debug output and tracebacks")
    return parser


def _at_least(convert: Callable[[str], float], minimum: float, what: str) -> Callable[[str], float]:
    """An argparse type: ``convert`` the text and refuse values below ``minimum`` (or infinite)."""
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not minimum <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r}: must be at least {minimum:g}")
        return value
    return parse


_positive_int = _at_least(int, 1, "a whole number")


def _port(text: str) -> int:
    """An argparse type: a TCP port number, or 0 for any free port."""
    port = int(_at_least(int, 0, "a port number")(text))
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is at most 65535")
    return port
_non_negative_seconds = _at_least(float, 0, "a number of seconds")


def _init(args: argparse.Namespace) -> int:
    from launcher.scaffold import init

    return init(args.framework, args.dir, force=args.force)


def _validate(args: argparse.Namespace) -> int:
    from launcher.spec import load_spec
    from launcher.wording import plural

    spec = load_spec(args.file)
    for warning in spec.warnings:
        print(f"{args.file}: warning: {warning}", file=sys.stderr)
    nodes = spec.cluster.node_count
    print(f"{args.file}: valid ({plural(nodes, 'node')}, infrastructure {spec.infra_type})")
    if spec.infra_type == "dataScienceJob":  # what recovery means there depends on the launch mode; no SDK is imported
        from launcher.backends.oci.notes import recovery_notes

        for note in recovery_notes(spec):
            print(f"note: {note}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from launcher.commands.run import run

    return run(args.file, backend=args.backend, dry_run=args.dry_run, output=args.output, detach=args.detach,
               resume_from=args.resume_from, run_id=args.run_id, verbose=args.verbose, overrides=_overrides(args),
               keep=args.keep)


def _build(args: argparse.Namespace) -> int:
    from launcher.commands.build import build

    return build(args.file, tag=args.tag, push=args.push, build_args=args.build_arg, no_cache=args.no_cache,
                 verbose=args.verbose)


def _compose(args: argparse.Namespace) -> int:
    from launcher.commands.compose import write_compose

    return write_compose(args.file, args.output, force=args.force, overrides=_overrides(args))


def _watch(args: argparse.Namespace) -> int:
    from launcher.commands.watch import watch

    return watch(args.run, nodes=args.node, since=args.since, tail=args.tail, follow_logs=not args.no_follow,
                 verbose=args.verbose)


def _status(args: argparse.Namespace) -> int:
    from launcher.commands.inspect import status

    return status(args.run, as_json=args.json)


def _top(args: argparse.Namespace) -> int:
    from launcher.commands.top import top

    return top(args.run, once=args.once, wide=args.wide)


def _show_config(args: argparse.Namespace) -> int:
    from launcher.commands.inspect import show_config

    return show_config(args.run)


def _cancel(args: argparse.Namespace) -> int:
    from launcher.commands.cancel import cancel

    return cancel(args.run, grace=args.grace)


def _clean(args: argparse.Namespace) -> int:
    from launcher.commands.clean import clean

    return clean(args.older_than, work_dir=args.work_dir, dry_run=args.dry_run, runs=args.runs, force=args.force)


def _scale(args: argparse.Namespace) -> int:
    from launcher.commands.scale import scale

    return scale(args.run, args.nodes)


def _data(args: argparse.Namespace) -> int:
    from launcher.commands.data import data_progress

    return data_progress(args.run, as_json=args.json)


def _timeline(args: argparse.Namespace) -> int:
    from launcher.commands.timeline import timeline

    return timeline(args.run, output=args.output, as_json=args.json, all_nodes=args.all_nodes)


def _list(args: argparse.Namespace) -> int:
    from launcher.commands.inspect import list_runs

    return list_runs(args.n)


def _ui(args: argparse.Namespace) -> int:
    from launcher.commands.ui import ui

    return ui(host=args.host, port=args.port, open_browser=not args.no_browser)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    trailing = None
    if "--" in argv:  # everything after it is the training script's own arguments
        split = argv.index("--")
        argv, trailing = argv[:split], argv[split + 1:]
    args = parser.parse_args(argv)
    if trailing is not None and not getattr(args, "takes_overrides", False):
        parser.error(f"arguments after -- are only for launcher run and launcher compose, not {args.verb}")
    args.trailing = trailing
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except LauncherError as exc:
        # Spec problems are already FILE:LINE:COL: lines; anything else gets an "error:" prefix.
        print(str(exc) if isinstance(exc, SpecError) else f"error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the goodbye short
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug or an environment problem we did not foresee: no traceback unless asked
        if args.verbose:
            raise
        print(f"error: unexpected {type(exc).__name__}: {exc} (run with --verbose for a traceback)", file=sys.stderr)
        return EXIT_BACKEND



