"""A real S3-protocol server (moto_server) on loopback, and a fault-injecting proxy in front of it."""

from __future__ import annotations

import http.client
import http.server
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from launcher.node.torchrun.childproc import die_with_parent

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_listening(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)  # nothing to wait on but the port itself
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


class MotoServer:
    def __init__(self) -> None:
        executable = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        self.port = free_port()
        self.proc = subprocess.Popen([executable, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=die_with_parent())  # gone with a session killed before teardown
        wait_until_listening(self.port)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """Environment that points s3fs (through fsspec's config variables) at this server."""
        return {**S3_ENV, "FSSPEC_S3_ENDPOINT_URL": endpoint or self.endpoint}

    def make_bucket(self, name: str) -> None:
        import s3fs

        fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=self.endpoint,
                               skip_instance_cache=True)
        fs.mkdir(name)

    def pause(self) -> None:
        """An outage: the server stops (SIGSTOP) with its port open, so requests are accepted and never answered."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()  # a stopped process would take SIGTERM only once resumed
        self.proc.terminate()
        self.proc.wait(timeout=10)


class FaultyProxy:
    """Forwards HTTP to ``upstream_port``, answering a share of requests with 503 SlowDown instead; records each
    request (method, path, Range header). A slow link: ``bytes_per_second`` paces the bodies of answers;
    ``cut_after`` bytes into the first answer with a bigger body, the connection is closed (a dropped download)."""

    def __init__(self, upstream_port: int, failure_rate: float, seed: int = 0, *,
                 bytes_per_second: float | None = None, cut_after: int | None = None):
        self.upstream_port = upstream_port
        self.failure_rate = failure_rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.forwarded = 0
        self.failed = 0
        self.requests: list[tuple[str, str, str]] = []
        self.bytes_per_second = bytes_per_second
        self.cut_after = cut_after
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    fail = proxy.rng.random() < proxy.failure_rate
                    proxy.failed += fail
                    proxy.forwarded += not fail
                    proxy.requests.append((self.command, self.path, self.headers.get("Range", "")))
                if fail:
                    payload = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                payload = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # a HEAD's length is the object's, as the store said
                self.send_header("Content-Length", response.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self._send(payload)
                upstream.close()

            def _send(self, payload: bytes) -> None:
                with proxy.lock:
                    cut = proxy.cut_after if proxy.cut_after is not None and proxy.cut_after < len(payload) else None
                    if cut is not None:
                        proxy.cut_after = None  # once
                end = len(payload) if cut is None else cut
                step = 256 * 1024
                for start in range(0, end, step):
                    self.wfile.write(payload[start:min(start + step, end)])
                    if proxy.bytes_per_second:
                        self.wfile.flush()
                        time.sleep(step / proxy.bytes_per_second)  # the link's pace, not a wait for an event
                if cut is not None:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


class StallingEndpoint:
    """Accepts connections and reads requests but never answers: a store that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.held: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)  # kept open, never answered

    def stop(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()
