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
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, median

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=512, help="the big file")
    parser.add_argument("--files", type=int, default=64, help="how many files in the second set")
    parser.add_argument("--file-mib", type=int, default=16, help="size of each of them")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    moto = MotoServer()
    env = {**os.environ, **moto.env(), "PYTHONPATH": str(REPO)}
    try:
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
