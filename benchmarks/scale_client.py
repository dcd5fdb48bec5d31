"""The client on a run of N nodes: `status`, `status --json`, `watch --no-follow`, `timeline` and `timeline -o x.svg`,
each timed to its first output and to its end, with its peak memory; `watch` following a run still writing, its
store requests a second counted; the ui's run page, over HTTP and drawn in headless chromium.

The finished run's work dir is a local one written by benchmarks/scale.py (every node's registration, status
record, events, log chunks and health record, by the protocol's own writers), or one it kept (--kept); the
client's run record is written here. The run that `watch` follows is written by a process of this script: each
node's status record and log shipper, a line a second. The figures are printed as one JSON line, last.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scale_client.py [--sizes 64 256 1024] [--train-seconds 5]
        [--parts commands follow ui browser] [--kept 1024=DIR]
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from common import print_table, scratch_dir

from launcher.commands.watch import follow
from launcher.protocol.logship import LogShipper
from launcher.protocol.events import batch_key
from launcher.protocol.status import STATUS_PREFIX, StatusRecord, status_key
from launcher.protocol.store import WorkDir
from launcher.runs import state

HEARTBEAT_SECONDS = 10.0  # the node's status heartbeat
PARTS = ("commands", "follow", "ui", "browser")  # the client's verbs on a finished run; `watch` following a live
# one; the ui's run page, over HTTP and (needs chromium, chromium-driver and selenium) drawn in a browser

COMMANDS = {"status": ["status"], "status --json": ["status", "--json"], "watch --no-follow": ["watch", "--no-follow"],
            "timeline": ["timeline"], "timeline -o x.svg": ["timeline", "-o", "{dir}/x.svg"]}


def make_run(nodes: int, train_seconds: float, home: Path, kept: Path | None = None) -> tuple[Path, dict]:
    """A finished run of ``nodes`` simulated nodes in a work dir under ``home`` (or the one
    `benchmarks/scale.py --keep DIR` kept: ``kept`` is that DIR, whose run is DIR/scale), with its client record
    dated from the run's records; the simulation's own figures ({} for a kept one)."""
    work_dir, simulated = kept or home / "wd", {}
    if kept is None:
        written = subprocess.run([sys.executable, str(Path(__file__).with_name("scale.py")), "--nodes", str(nodes),
                                  "--processes", "8", "--train-seconds", str(train_seconds), "--keep", str(work_dir)],
                                 check=True, stdout=subprocess.PIPE, text=True)
        simulated = json.loads(written.stdout.splitlines()[-1])
    os.environ["LAUNCHER_HOME"] = str(home)
    names = [f"node-{i}" for i in range(nodes)]
    info = state.RunInfo(run_id="scale", backend="local", work_dir=str(work_dir), nodes=names,
                         spec_file=str(home / "train.yaml"), spec_digest="0" * 12, created_at=0.0,
                         effective_spec={"kind": "distributed", "spec": {"name": "scale"}})
    info.created_at = recorded_start(info.run_url, names)
    return state.save(info), simulated


def recorded_start(url: str, names: list[str]) -> float:
    """A second before the run at ``url`` began by its records (each node's first events and its status record's
    start), for its client record: the timeline counts from it. Exits unless every node has a status record: a
    work dir that is not the run's would be measured as an empty run, every node pending and nothing to draw."""
    store = WorkDir(url)
    statuses = [store.get_record(status_key(name)) for name in names]
    missing = [name for name, status in zip(names, statuses) if not status]
    if missing:
        raise SystemExit(f"{url}/{STATUS_PREFIX} lacks {len(missing)} of {len(names)} nodes' status records "
                         f"(e.g. {missing[0]}): not a finished run of {len(names)} nodes")
    starts = [status.get("started_at") for status in statuses]
    starts += [event.get("at") for name in names for event in store.get_record(batch_key(name, 0, 0)).get("events", [])]
    return min(at for at in starts if isinstance(at, (int, float))) - 1.0


def ask_ui(nodes: int, repeat: int) -> list[dict]:
    """The ui's run page of the run recorded in LAUNCHER_HOME, over HTTP from a server in this process: the page and
    the JSON it loads every 2 s, each on a fresh server (cold) and again (warm), the median of ``repeat``; seconds to
    the first byte and to the whole answer, its bytes, and the growth of this process's peak memory (MiB)."""
    from launcher.ui.server import Server

    times: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    grown = 0.0
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        server = Server("127.0.0.1", 0)  # a fresh one: its first answer reads every record
        serving = threading.Thread(target=server.serve, daemon=True)
        serving.start()
        for asked, path in (("page", "/runs/scale"), ("page JSON", "/api/runs/scale")):
            for round_name in ("cold", "warm"):
                times.setdefault((asked, round_name), []).append(_ask(server.access.port, server.access.secret, path))
        server.stop()
        serving.join()
        server.close()
        grown = max(grown, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
    rows = []
    for (asked, round_name), found in times.items():
        first, whole, size = sorted(found)[len(found) // 2]
        rows.append({"nodes": nodes, "asked": f"{asked} ({round_name})", "first_byte_s": round(first, 3),
                     "whole_s": round(whole, 3), "bytes": size, "peak_rss_growth_mib": round(grown, 1),
                     "load_average": [round(load, 2) for load in os.getloadavg()]})
    return rows


def draw_ui(nodes: int) -> dict:
    """The ui's run page of the run recorded in LAUNCHER_HOME in headless chromium (Selenium): milliseconds from
    navigation to the nodes' table drawn, the rows drawn in the nodes' and the figures' tables, the page's elements
    and its script's heap (MiB) once drawn."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    from launcher.ui.server import Server

    server = Server("127.0.0.1", 0)
    serving = threading.Thread(target=server.serve, daemon=True)
    serving.start()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--enable-precise-memory-info",
                     f"--user-data-dir={scratch_dir('chromium-')}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(server.access.url().replace("/?", "/runs/scale?"))
        WebDriverWait(driver, 300, poll_frequency=0.05).until(
            lambda d: d.execute_script("return document.querySelector('#nodes tbody tr') !== null"))
        drawn = driver.execute_script(
            "return [performance.now(), document.querySelectorAll('#nodes tbody tr').length, "
            "document.querySelectorAll('#health tbody tr').length, document.getElementsByTagName('*').length, "
            "performance.memory.usedJSHeapSize]")
    finally:
        driver.quit()
        server.stop()
        serving.join()
        server.close()
    return {"nodes": nodes, "drawn_ms": round(drawn[0]), "node_rows": drawn[1], "figure_rows": drawn[2],
            "elements": drawn[3], "heap_mib": round(drawn[4] / 2 ** 20, 1),
            "load_average": [round(load, 2) for load in os.getloadavg()]}


def _ask(port: int, secret: str, path: str) -> tuple[float, float, int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started = time.perf_counter()
    connection.request("GET", path, headers={"Cookie": f"launcher_ui_{port}={secret}"})
    answer = connection.getresponse()
    first = time.perf_counter() - started
    body = answer.read()
    whole = time.perf_counter() - started
    connection.close()
    assert answer.status == 200, body[:200]
    return first, whole, len(body)


def time_command(argv: list[str], env: dict[str, str], repeat: int) -> dict:
    """:func:`time_once` ``repeat`` times: the run with the median time to the end (a busy machine's outliers)."""
    runs = sorted((time_once(argv, env) for _ in range(repeat)), key=lambda run: run["total_s"])
    return runs[len(runs) // 2]


def time_once(argv: list[str], env: dict[str, str]) -> dict:
    """Seconds to the first byte of output and to the end, CPU seconds (user + system: on a busy machine the wall
    times mostly measure the others), peak RSS (MiB), bytes written, exit status, the load average at its end."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    first = proc.stdout.read(1)
    first_at = time.perf_counter() - started
    rest = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"first_output_s": round(first_at, 3), "total_s": round(time.perf_counter() - started, 3),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "output_bytes": len(first) + len(rest),
            "exit": proc.returncode, "load_average": [round(load, 2) for load in os.getloadavg()]}


def write_live(url: str, nodes: int, seconds: float) -> None:
    """The nodes of a running run as the follower sees them: each node's status record (running, heartbeats) and
    its log shipper with a line a second, for ``seconds``; then each node's final status. Prints the lines shipped."""
    store = WorkDir(url)
    names = [f"node-{i}" for i in range(nodes)]
    statuses = [StatusRecord(store, name, "live") for name in names]
    for rank, status in enumerate(statuses):
        status.update(state="running", rank=rank)
    shippers = [LogShipper(store, name).start() for name in names]
    print("ready", flush=True)
    ends = time.monotonic() + seconds
    next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
    lines = 0
    while time.monotonic() < ends:
        started = time.monotonic()
        for rank, shipper in enumerate(shippers):
            shipper.add_many([("out", f"step {lines // nodes + 1} at {time.time():.3f}", rank)])
            lines += 1
        if started >= next_heartbeat:
            for status in statuses:
                status.heartbeat()
            next_heartbeat = started + HEARTBEAT_SECONDS
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    for shipper in shippers:
        shipper.close()
    for status in statuses:
        status.update(state="succeeded", exit_code=0)
    print(json.dumps({"lines": lines}), flush=True)


class _Shown(io.TextIOBase):
    """The follower's output, not kept: the lines shown, those out of order for their node, and each line's delay
    after it was written (its text carries its time)."""

    LINE = re.compile(r"^\[(\S+)\s*r\d+\] step (\d+) at (\S+)$")

    def __init__(self) -> None:
        self.lines = 0
        self.out_of_order = 0
        self.delays: list[float] = []
        self._last: dict[str, int] = {}

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        now = time.time()
        for line in text.splitlines():
            found = self.LINE.match(line)
            if found:
                node, step, at = found.group(1), int(found.group(2)), float(found.group(3))
                self.out_of_order += step <= self._last.get(node, 0)
                self._last[node] = step
                self.lines += 1
                self.delays.append(now - at)
        return len(text)


def follow_rate(nodes: int, seconds: float, home: Path) -> dict:
    """`watch` following a run of ``nodes`` nodes that write a line a second each: the store operations the follower
    makes per second, by kind (counted in this process, where it runs; the nodes write from another), its CPU
    seconds, whether every line came once and in order, and the lines' delays."""
    work_dir = home / "live"
    names = [f"node-{i}" for i in range(nodes)]
    os.environ["LAUNCHER_HOME"] = str(home)
    info = state.RunInfo(run_id="live", backend="local", work_dir=str(work_dir), nodes=names,
                         spec_file=str(home / "train.yaml"), spec_digest="0" * 12, created_at=time.time(),
                         effective_spec={"kind": "distributed", "spec": {"name": "live"}})
    state.save(info)
    writer = subprocess.Popen([sys.executable, __file__, "--write", info.run_url, str(nodes), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    if writer.stdout.readline().strip() != "ready":
        raise SystemExit("the writer did not start")
    counts: Counter[tuple[int, str]] = Counter()
    started = time.monotonic()
    counted = WorkDir._call_heard

    def counting(self, what, action, key=None):  # every store operation of this process: the follower's
        op, _, key_ = what.partition(" ")  # e.g. "get status": the operation and the record kind
        counts[(int(time.monotonic() - started), f"{op} {key_.split('/', 1)[0]}")] += 1
        return counted(self, what, action, key)

    shown = _Shown()
    WorkDir._call_heard = counting
    try:
        cpu = time.thread_time()
        follow(info, out=shown)
        cpu = time.thread_time() - cpu
    finally:
        WorkDir._call_heard = counted
    lines = json.loads(writer.stdout.read().splitlines()[-1])["lines"]
    writer.wait()
    window = range(2, int(seconds) - 1)  # whole seconds while every node writes, past the first listing
    by_kind = Counter(kind for (second, kind), n in counts.items() if second in window for _ in range(n))
    delays = sorted(shown.delays)
    return {"nodes": nodes, "seconds": seconds, "requests_per_s": round(sum(by_kind.values()) / len(window), 1),
            "by_kind_per_s": {kind: round(n / len(window), 1) for kind, n in sorted(by_kind.items())},
            "follower_cpu_s": round(cpu, 2), "lines_written": lines, "lines_shown": shown.lines,
            "out_of_order": shown.out_of_order, "delay_s": {"median": round(statistics.median(delays), 2),
                                                           "p95": round(delays[int(len(delays) * 0.95)], 2),
                                                           "max": round(delays[-1], 2)},
            "load_average": [round(load, 2) for load in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--train-seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command; the median is kept")
    parser.add_argument("--follow-seconds", type=float, default=20.0, help="how long `watch` follows a live run")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    parser.add_argument("--kept", nargs="+", default=[], metavar="NODES=DIR",
                        help="DIR of a finished run that `scale.py --nodes NODES --keep DIR` made (the run: DIR/scale)")
    parser.add_argument("--write", nargs=3, metavar=("URL", "NODES", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        write_live(args.write[0], int(args.write[1]), float(args.write[2]))
        return
    kept = {int(nodes): Path(path) for nodes, path in (pair.split("=", 1) for pair in args.kept)}
    rows, follows, pages, drawings = [], [], [], []
    for nodes in args.sizes:
        if "follow" in args.parts:
            followed = follow_rate(nodes, args.follow_seconds, scratch_dir(f"scale-follow-{nodes}-"))
            follows.append(followed)
            print(json.dumps(followed), flush=True)
        if not {"commands", "ui", "browser"} & set(args.parts):
            continue
        home = scratch_dir(f"scale-client-{nodes}-")
        info, simulated = make_run(nodes, args.train_seconds, home, kept.get(nodes))
        print(json.dumps(simulated), flush=True)
        if "ui" in args.parts:
            pages += ask_ui(nodes, args.repeat)
            print(json.dumps(pages[-4:]), flush=True)
        if "browser" in args.parts:
            drawings.append(draw_ui(nodes))
            print(json.dumps(drawings[-1]), flush=True)
        env = {**os.environ, "LAUNCHER_HOME": str(home), "COLUMNS": "160"}
        for label, verb in COMMANDS.items() if "commands" in args.parts else ():
            argv = [sys.executable, "-m", "launcher", *[part.format(dir=home) for part in verb], str(info)]
            row = {"nodes": nodes, "command": label, **time_command(argv, env, args.repeat)}
            if "-o" in verb:  # the picture it wrote, besides the table it printed
                row["picture_bytes"] = (home / "x.svg").stat().st_size
            rows.append(row)
            print(json.dumps(row), flush=True)
    print_table(["nodes", "command", "first output", "total", "CPU", "peak RSS", "output"],
                [[row["nodes"], f"`{row['command']}`", f"{row['first_output_s']:.2f} s", f"{row['total_s']:.2f} s",
                  f"{row['cpu_s']:.2f} s", f"{row['peak_rss_mib']:.0f} MiB",
                  f"{row['output_bytes']} B (exit {row['exit']})"
                  + (f", picture {row['picture_bytes']} B" if "picture_bytes" in row else "")] for row in rows])
    print_table(["nodes", "requests/s following", "by kind", "follower CPU", "lines shown / written",
                 "delay median, p95"],
                [[row["nodes"], row["requests_per_s"],
                  ", ".join(f"{kind} {n}" for kind, n in row["by_kind_per_s"].items()),
                  f"{row['follower_cpu_s']:.1f} s in {row['seconds']:.0f} s",
                  f"{row['lines_shown']} / {row['lines_written']}",
                  f"{row['delay_s']['median']:.2f} s, {row['delay_s']['p95']:.2f} s"] for row in follows])
    print_table(["nodes", "ui's run page", "first byte", "whole", "bytes", "server peak memory growth"],
                [[row["nodes"], row["asked"], f"{row['first_byte_s']:.3f} s", f"{row['whole_s']:.3f} s", row["bytes"],
                  f"{row['peak_rss_growth_mib']:.0f} MiB"] for row in pages])
    print_table(["nodes", "run page drawn", "node rows", "figure rows", "page elements", "script heap"],
                [[row["nodes"], f"{row['drawn_ms']} ms", row["node_rows"], row["figure_rows"], row["elements"],
                  f"{row['heap_mib']} MiB"] for row in drawings])
    print(json.dumps({"client": rows, "follow": follows, "ui": pages, "browser": drawings}))


if __name__ == "__main__":
    main()
