"""Outputs to and from S3: launcher's sync and restore against boto3 and s3fs, on one moto_server it starts.

Two sets of outputs: one big file (a checkpoint) and many files of 16 MiB (one per rank, as
torch.distributed.checkpoint writes them). Each transfer runs in a fresh process, which reports the
seconds the transfer itself took and its peak RSS:

- launcher: a node's ``OutputsSync.sync()`` (upload, manifest included) and ``restore_newest`` (restore,
  reading the listing and the manifest);
- boto3: ``upload_file`` / ``download_file`` of each file in turn (s3transfer's defaults: 8 MiB parts and
  ranges, 10 at once; moto_server reads the whole object for each ranged GET, so its restore of one big file
  grows with the square of the size there, where launcher's, one GET up to 128 MiB and at most 8 ranges
  above, grows with the size);
- s3fs: ``put_file`` / ``get_file`` of each file in turn.

Clients are made before the clock starts (a node makes its own once); a restore's listing is timed. The
methods alternate within each repeat; medians are printed, with launcher / boto3 ratios.

    .venv/bin/python benchmarks/outputs.py [--size-mib 512] [--files 64] [--file-mib 16] [--repeat 3]

``--end-to-end``: what a user waits for instead. A real ``launcher run`` of one local node (``--nodes``) with its
work dir on the moto_server, whose rank writes ``--size-mib`` into its outputs dir and prints its last line
(with the time); measured from that line to ``launcher run``'s exit, against boto3's ``upload_file`` of a file
as big in a fresh process (the call itself, and the whole process), alternated, medians of ``--repeat``. Each
run's timeline (``launcher timeline RUN --json``) says where the seconds went: the last line to the ranks' exit,
to torchrun's exit, to the sync's end, to the final status, to ``run`` returning. The last line printed is one
JSON object with the figures.

    .venv/bin/python benchmarks/outputs.py --end-to-end [--size-mib 1024] [--repeat 3] [--nodes 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, median, scratch_dir

sys.path.insert(0, str(REPO / "tests"))
from s3server import MotoServer  # noqa: E402

MiB = 2**20
METHODS = ("launcher", "boto3", "s3fs")

CHILD = r"""
import os, re, sys, time
method, action, endpoint, url, directory = sys.argv[1:]
bucket, prefix = url[len("s3://"):].split("/", 1)
names = sorted(os.listdir(directory)) if action == "upload" else None
if method == "launcher":
    from launcher.protocol.outputs import OutputsSync, restore_newest
    from launcher.protocol.store import WorkDir
    store = WorkDir(url)
    store.list("")  # a node's clients are made early in its life (as the others' are before their clock):
    store._transfers()  # s3fs's for the small objects, s3transfer's for the outputs
    sync = OutputsSync(store, "node", directory)
    started = time.perf_counter()
    sync.sync() if action == "upload" else restore_newest([store], sync)
elif method == "boto3":
    import boto3
    client = boto3.client("s3", endpoint_url=endpoint)
    started = time.perf_counter()
    if action == "restore":
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/outputs/node/")["Contents"]
        names = [item["Key"].rsplit("/", 1)[1] for item in listed if not item["Key"].rsplit("/", 1)[1].startswith(".")]
    for name in names:
        key, path = f"{prefix}/outputs/node/{name}", os.path.join(directory, name)
        client.upload_file(path, bucket, key) if action == "upload" else client.download_file(bucket, key, path)
else:
    import s3fs
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    started = time.perf_counter()
    if action == "restore":
        names = [path.rsplit("/", 1)[1] for path in fs.ls(f"{bucket}/{prefix}/outputs/node")
                 if not path.rsplit("/", 1)[1].startswith(".")]
    for name in names:
        remote, path = f"{bucket}/{prefix}/outputs/node/{name}", os.path.join(directory, name)
        fs.put_file(path, remote) if action == "upload" else fs.get_file(remote, path)
print(time.perf_counter() - started, int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read())[1]) / 1024)
"""


def write_files(directory: Path, count: int, size: int) -> None:
    directory.mkdir(parents=True)
    block = os.urandom(MiB)
    for index in range(count):
        with open(directory / f"file-{index:03d}.pt", "wb") as out:
            for offset in range(0, size, MiB):
                out.write(((offset // MiB + index * 100_000).to_bytes(8, "big") + block[8:])[:size - offset])


def transfer(method: str, action: str, endpoint: str, url: str, directory: Path, env: dict) -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, method, action, endpoint, url, str(directory)], env=env,
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{method} {action} failed:\n{done.stderr[-3000:]}")
    seconds, peak = map(float, done.stdout.split())
    return seconds, peak


def measure(name: str, slug: str, source: Path, moto: MotoServer, scratch: Path, repeat: int, env: dict) -> None:
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for attempt in range(repeat):
        for method in METHODS:
            bucket = f"bench-{slug}-{method}-{attempt}"
            moto.make_bucket(bucket)
            url = f"s3://{bucket}/wd/run"
            results.setdefault((method, "upload"), []).append(transfer(method, "upload", moto.endpoint, url, source,
                                                                       env))
            target = scratch / f"{slug}-{method}-{attempt}"
            target.mkdir()
            results.setdefault((method, "restore"), []).append(transfer(method, "restore", moto.endpoint, url,
                                                                        target, env))
            subprocess.run(["rm", "-rf", str(target)], check=True)
    print(f"\n{name}: median of {repeat} (seconds of the transfer itself; peak RSS of its process)")
    print("| method | upload | upload peak | restore | restore peak |")
    print("|---|---|---|---|---|")
    medians = {}
    for method in METHODS:
        row = []
        for action in ("upload", "restore"):
            seconds = median([s for s, _ in results[(method, action)]])
            peak = median([p for _, p in results[(method, action)]])
            medians[(method, action)] = seconds
            row += [f"{seconds:.2f} s", f"{peak:.0f} MiB"]
        print(f"| {method} | " + " | ".join(row) + " |")
    for action in ("upload", "restore"):
        runs = ", ".join(f"{s:.2f}" for s, _ in results[("launcher", action)])
        base = ", ".join(f"{s:.2f}" for s, _ in results[("boto3", action)])
        print(f"launcher / boto3 {action}: {medians[('launcher', action)] / medians[('boto3', action)]:.2f}x "
              f"(launcher {runs}; boto3 {base})")


RANK = r"""
import os, sys, time
size = int(sys.argv[1]) * 2**20
block = os.urandom(2**20)
with open(os.path.join(os.environ["LAUNCHER_OUTPUTS_DIR"], "checkpoint.pt"), "wb") as out:
    for offset in range(0, size, 2**20):
        out.write((offset // 2**20).to_bytes(8, "big") + block[8:])
print(f"last line at {time.time():.6f}", flush=True)
"""

BOTO3 = r"""
import sys, time
import boto3
endpoint, path, bucket, key = sys.argv[1:]
client = boto3.client("s3", endpoint_url=endpoint)
started = time.perf_counter()
client.upload_file(path, bucket, key)
print(time.perf_counter() - started)
"""

# where a run's end goes, from its timeline: (name, the phase that ends it)
END_PHASES = (("ranks exited", "rank-exited"), ("torchrun exited", "exited"), ("synced", "synced"),
              ("status recorded", "recorded"))


def end_to_end_run(project: Path, env: dict, bucket: str) -> tuple[float, dict[str, float]]:
    """One ``launcher run``: (last line -> its exit, the same to each of END_PHASES, per node the latest)."""
    binary = str(Path(sys.executable).with_name("launcher"))
    done = subprocess.run([binary, "run", "-f", "train.yaml", "--set", f"spec.cluster.spec.workDir=s3://{bucket}/wd"],
                          cwd=project, env=env, capture_output=True, text=True)
    returned = time.time()
    if done.returncode:
        raise RuntimeError(f"launcher run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    last_line = max(float(line.rsplit(" ", 1)[1]) for line in (done.stdout + done.stderr).splitlines()
                    if "last line at " in line)
    run_id = next(line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("run "))
    found = json.loads(subprocess.run([binary, "timeline", run_id, "--json"], env=env, capture_output=True,
                                      text=True, check=True).stdout)
    phases = {name: max(event["at"] for event in found["events"] if event["phase"] == phase) - last_line
              for name, phase in END_PHASES}
    return returned - last_line, phases


def boto3_upload(moto: MotoServer, env: dict, path: Path, bucket: str) -> tuple[float, float]:
    """boto3's ``upload_file`` in a fresh process: (the call itself, the whole process)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", BOTO3, moto.endpoint, str(path), bucket, "wd/checkpoint.pt"],
                          env=env, capture_output=True, text=True, check=True)
    return float(done.stdout), time.perf_counter() - started


def empty_bucket(moto: MotoServer, bucket: str) -> None:
    """moto_server holds every object in memory: each measurement's go once it is taken."""
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=moto.endpoint, skip_instance_cache=True)
    fs.rm(bucket, recursive=True)


def end_to_end(args: argparse.Namespace, moto: MotoServer, env: dict) -> None:
    import yaml

    root = scratch_dir("outputs-e2e-")
    project = root / "project"
    project.mkdir()
    (project / "job.py").write_text(RANK)
    spec = {"kind": "distributed", "apiVersion": "v1.0", "spec": {
        "name": "outputs", "infrastructure": {"kind": "infrastructure", "type": "local"},
        "cluster": {"kind": "pytorch", "spec": {"workDir": "./wd", "main": {"replicas": 1},
                                                "worker": {"replicas": args.nodes - 1}}},
        "runtime": {"kind": "python", "spec": {"entryPoint": "job.py", "args": [str(args.size_mib)]}}}}
    (project / "train.yaml").write_text(yaml.safe_dump(spec))
    env = {**env, "LAUNCHER_HOME": str(root / "home")}
    write_files(root / "source", 1, args.size_mib * MiB)
    source = root / "source" / "file-000.pt"
    ours, theirs, theirs_process, ends = [], [], [], []
    for attempt in range(args.repeat):
        bucket = f"e2e-launcher-{attempt}"
        moto.make_bucket(bucket)
        wall, phases = end_to_end_run(project, env, bucket)
        empty_bucket(moto, bucket)
        bucket = f"e2e-boto3-{attempt}"
        moto.make_bucket(bucket)
        call, process = boto3_upload(moto, env, source, bucket)
        empty_bucket(moto, bucket)
        ours.append(wall)
        ends.append(phases)
        theirs.append(call)
        theirs_process.append(process)
        print(f"launcher {wall:.2f} s (" + ", ".join(f"{name} +{at:.2f}" for name, at in phases.items())
              + f"); boto3 upload_file {call:.2f} s (process {process:.2f} s); load {os.getloadavg()[0]:.1f}",
              file=sys.stderr)
    budget = 1.2 * median(theirs) + 0.5
    result = {"benchmark": "outputs-end-to-end", "size_mib": args.size_mib, "nodes": args.nodes,
              "repeat": args.repeat, "launcher_s": round(median(ours), 2), "boto3_s": round(median(theirs), 2),
              "boto3_process_s": round(median(theirs_process), 2),
              "ratio": round(median(ours) / median(theirs), 2), "budget_s": round(budget, 2),
              "met": median(ours) <= budget,
              "end_s": {name: round(median([phases[name] for phases in ends]), 2) for name, _ in END_PHASES},
              "launcher_runs_s": [round(value, 2) for value in ours], "boto3_runs_s": [round(v, 2) for v in theirs],
              "load": round(os.getloadavg()[0], 2)}
    print(f"\n{args.size_mib} MiB of outputs, {args.nodes} node(s): rank's last line -> `launcher run` exit, median "
          f"of {args.repeat}: {result['launcher_s']} s; boto3 upload_file {result['boto3_s']} s (its process "
          f"{result['boto3_process_s']} s): {result['ratio']}x, budget 1.2x + 0.5 s = {result['budget_s']} s "
          f"({'met' if result['met'] else 'not met'}); load average {result['load']}")
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=512, help="the big file")
    parser.add_argument("--files", type=int, default=64, help="how many files in the second set")
    parser.add_argument("--file-mib", type=int, default=16, help="size of each of them")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--end-to-end", action="store_true", help="a whole `launcher run` against boto3")
    parser.add_argument("--nodes", type=int, default=1, help="with --end-to-end: the run's local nodes")
    args = parser.parse_args()
    moto = MotoServer()
    env = {**os.environ, **moto.env(), "PYTHONPATH": str(REPO)}
    try:
        if args.end_to_end:
            return end_to_end(args, moto, env)
        with tempfile.TemporaryDirectory(prefix="outputs-bench-") as tmp:
            root = Path(tmp)
            write_files(root / "big", 1, args.size_mib * MiB)
            write_files(root / "many", args.files, args.file_mib * MiB)
            measure(f"1 file of {args.size_mib} MiB", "big", root / "big", moto, root, args.repeat, env)
            measure(f"{args.files} files of {args.file_mib} MiB", "many", root / "many", moto, root, args.repeat, env)
    finally:
        moto.proc.kill()  # it holds gigabytes, and may take longer than MotoServer.stop waits to let them go
        moto.proc.wait()


if __name__ == "__main__":
    main()
