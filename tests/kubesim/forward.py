"""A service of this machine (moto_server on 127.0.0.1) made reachable from the simulated pods: a TCP relay on the
pod network's gateway address, the host's own side of the Docker bridge, to the loopback port."""

from __future__ import annotations

import socket
import threading


class Relay:
    def __init__(self, listen_host: str, target_port: int) -> None:
        self.target_port = target_port
        self._server = socket.create_server((listen_host, 0))
        self.address = f"{listen_host}:{self._server.getsockname()[1]}"
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="kubesim-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._server.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (sink, source):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        source.close()
