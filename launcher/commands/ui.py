"""``launcher ui``: every recorded run in a local web page (:mod:`launcher.ui`)."""

from __future__ import annotations

from launcher.errors import EXIT_OK


def ui(*, host: str, port: int, open_browser: bool) -> int:
    from launcher.ui.server import serve

    serve(host, port, open_browser=open_browser)
    return EXIT_OK
