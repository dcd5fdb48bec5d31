"""Start the ``ui``'s server: bind, say where (with the secret), open the browser, serve until Ctrl-C."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import webbrowser
from typing import TextIO

from launcher.errors import BadInput
from launcher.ui.access import LOCAL_NAMES, Access
from launcher.ui.routes import create_app


class Server:
    """The app on a threaded WSGI server bound to ``host``:``port`` (0: any free port)."""

    def __init__(self, host: str, port: int):
        from werkzeug.serving import make_server

        import launcher.protocol.store  # noqa: F401 - imported now, not by a request that Ctrl-C's exit may cut short

        self.access = Access(host)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request: the page polls
        try:  # bound here: Werkzeug's own bind exits the process on an error, with advice for its own CLI
            listening = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as exc:
            raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        with listening:  # the server works on its own copy of the socket
            self.wsgi = make_server(host, port, create_app(self.access), threaded=True, fd=listening.fileno())
        self.access.port = self.wsgi.port

    def serve(self) -> None:
        self.wsgi.serve_forever()

    def stop(self) -> None:
        self.wsgi.shutdown()

    def close(self) -> None:
        self.wsgi.server_close()


def serve(host: str, port: int, *, open_browser: bool, out: TextIO = sys.stdout) -> None:
    """Serve until interrupted; the URL printed holds the secret every request needs."""
    if host not in LOCAL_NAMES:
        sys.stderr.write(f"warning: listening on {host}: anyone who can reach it and learns the token can see and "
                         "cancel your runs; the traffic is not encrypted\n")
    server = Server(host, port)
    url = server.access.url()
    out.write(f"launcher ui: {url}\n(Ctrl-C stops it)\n")
    out.flush()
    if open_browser:
        webbrowser.open(url)
    # Ctrl-C is how it ends: the first one asks the loop to stop (from a thread: shutdown waits for the loop), any
    # later one is ignored, so it always ends the same way, whichever instruction the signal interrupted
    def stop(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        threading.Thread(target=server.stop, daemon=True).start()

    previous = signal.signal(signal.SIGINT, stop)
    try:
        server.serve()
    finally:
        server.close()
        if signal.getsignal(signal.SIGINT) is stop:  # it ended otherwise: Ctrl-C is the caller's again
            signal.signal(signal.SIGINT, previous)
    out.write("launcher ui: stopped\n")
