"""The ``ui``'s pages and the JSON they read, as a Flask app; every request passes :class:`Access` first."""

from __future__ import annotations

import html
import sys
import threading
from importlib import resources
from typing import Any, Mapping
from urllib.parse import urlencode

from flask import Flask, Response, abort, jsonify, redirect, request
from werkzeug.exceptions import HTTPException

from launcher.backends.base import Backend
from launcher.commands import CANCEL_GRACE_SECONDS
from launcher.commands.cancel import force_stop, request_stop
from launcher.errors import BadInput, LauncherError
from launcher.runs import timeline as tl
from launcher.runs.health import HealthReader
from launcher.runs.state import RunInfo, recorded_run
from launcher.ui.access import HEADER, TOKEN_PARAMETER, Access
from launcher.ui.catalog import Query, RunCatalog
from launcher.ui.logpage import MAX_LINES, read_log
from launcher.ui.runpage import run_page

SECURITY_HEADERS = {
    # nothing from elsewhere, no inline script, never inside another site's frame
    "Content-Security-Policy": "default-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
MAX_QUESTION_BYTES = 8 << 20  # a log question's body: a cursor of ~100,000 nodes; larger is refused (413)
REFUSED = "forbidden: open the address `launcher ui` printed, with its token"
ERROR_PAGE = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>launcher: {text}</title>"
              "<link rel=\"icon\" href=\"/static/favicon.svg\"><link rel=\"stylesheet\" href=\"/static/ui.css\">"
              "</head>\n<body><h1>launcher</h1><p class=\"problem\">{text}</p><p><a href=\"/\">all runs</a></p>"
              "</body></html>\n")


def create_app(access: Access) -> Flask:
    """The app for one server. What it keeps is server-wide, never per page: the list's records and ended rows, and
    when it last read each node's health record."""
    app = Flask(__name__, static_folder="static", static_url_path="/static")
    app.config["MAX_CONTENT_LENGTH"] = MAX_QUESTION_BYTES
    catalog = RunCatalog()
    health = HealthReader()  # each node's health record read at most once per sample interval

    @app.before_request
    def guard() -> Response | None:
        if not access.host_allowed(request.headers.get("Host")):
            return _refused(f"forbidden: Host {request.headers.get('Host')!r} is not this server's address")
        offered = request.args.get(TOKEN_PARAMETER)
        if offered is not None:
            if not access.holds_secret(offered) or request.method != "GET":
                return _refused(REFUSED)
            # the secret leaves the address (history, what a link would pass on) for a cookie only this server gets
            others = urlencode([(key, value) for key, value in request.args.items(multi=True)
                                if key != TOKEN_PARAMETER])
            answer = redirect(request.path + (f"?{others}" if others else ""), code=303)
            answer.set_cookie(access.cookie, access.secret, httponly=True, samesite="Strict", path="/")
            return answer
        if not access.holds_secret(request.cookies.get(access.cookie)):
            return _refused(REFUSED)
        if request.method not in ("GET", "HEAD") and not access.holds_secret(request.headers.get(HEADER)):
            return _refused(f"forbidden: a change needs the {HEADER} header")
        return None

    @app.after_request
    def headers(answer: Response) -> Response:
        answer.headers.update(SECURITY_HEADERS)
        return answer

    @app.errorhandler(LauncherError)
    def launcher_error(exc: LauncherError) -> tuple[Response, int]:
        return jsonify(error=str(exc)), 400

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        if request.path.startswith("/api/"):  # the pages' scripts read why
            return jsonify(error=exc.description), exc.code or 500
        return _error_page(exc), exc.code or 500  # a person typed or followed the address: a page that says why

    @app.get("/")
    def runs_page() -> Response:
        return _page("runs.html", access)

    @app.get("/runs/<run_id>")
    def one_run_page(run_id: str) -> Response:
        _recorded(run_id)
        return _page("run.html", access)

    @app.get("/api/runs")
    def runs() -> Response:
        query = Query(text=request.args.get("q", ""), state=request.args.get("state", ""),
                      backend=request.args.get("backend", ""), page=_number(request.args, "page", 1),
                      per_page=_number(request.args, "per_page", 50))
        return jsonify(catalog.page(query))

    @app.get("/api/runs/<run_id>")
    def one_run(run_id: str) -> Response:
        return jsonify(run_page(_recorded(run_id), health))

    @app.route("/api/runs/<run_id>/log", methods=["GET", "POST"])
    def log(run_id: str) -> Response:
        """GET: the question in the address; POST (the page's): in a JSON body, as the cursor names every node of
        the run (~70 bytes each), more than an address holds at about 900 nodes."""
        info = _recorded(run_id)
        asked = request.args if request.method == "GET" else _json_body()
        return jsonify(read_log(info, after=_text(asked, "after"), rank=_text(asked, "rank") or None,
                                limit=_number(asked, "limit", MAX_LINES), final=str(asked.get("final")) == "1"))

    @app.get("/api/runs/<run_id>/timeline.svg")
    def timeline(run_id: str) -> Response | tuple[Response, int]:
        from launcher import timeline_svg

        found = tl.read_timeline(_recorded(run_id))
        if not found.events:
            return jsonify(error="nothing recorded yet"), 404
        return Response(timeline_svg.svg(found), mimetype="image/svg+xml")

    @app.post("/api/runs/<run_id>/cancel")
    def cancel_run(run_id: str) -> tuple[Response, int]:
        info = _recorded(run_id)
        said: list[str] = []
        # asked at once (a work dir that refuses it: the page hears why); forcing what remains takes the grace
        backend = request_stop(info, grace=CANCEL_GRACE_SECONDS, say=said.append)
        if backend is not None:
            threading.Thread(target=_force_stop, args=(info, backend), name=f"cancel {run_id}").start()
        return jsonify(message=" ".join(said)), 200 if backend is None else 202

    return app


def _recorded(run_id: str) -> RunInfo:
    """The run a URL names: a run id recorded here, checked as the CLI checks ``--run-id`` (no path, no prefix)."""
    try:
        return recorded_run(run_id)
    except BadInput as exc:
        abort(404, str(exc))


def _error_page(exc: HTTPException) -> Response:
    text = f"{exc.code} {exc.name}: {exc.description}"
    return Response(ERROR_PAGE.format(text=html.escape(text)), mimetype="text/html")


def _refused(why: str) -> Response:
    return Response(why + "\n", status=403, mimetype="text/plain")


def _json_body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise BadInput("the question: not a JSON object")
    return body


def _text(asked: Mapping[str, Any], name: str) -> str | None:
    value = asked.get(name)
    if value is not None and not isinstance(value, str):
        raise BadInput(f"{name}: not text")
    return value


def _number(asked: Mapping[str, Any], name: str, default: int) -> int:
    text = asked.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except (TypeError, ValueError):
        raise BadInput(f"{name}={text!r}: not a whole number") from None


def _page(name: str, access: Access) -> Response:
    """A page of the package, with the secret the page's script sends in the header of a change."""
    text = resources.files("launcher.ui").joinpath("static", name).read_text(encoding="utf-8")
    return Response(text.replace("{{token}}", html.escape(access.secret)), mimetype="text/html")


def _force_stop(info: RunInfo, backend: Backend) -> None:
    """In the background, as ``launcher cancel`` goes on after its request; the page sees the run end as it polls."""
    try:
        force_stop(info, backend, grace=CANCEL_GRACE_SECONDS, say=_say)
    except LauncherError as exc:
        _say(f"run {info.run_id}: forcing the cancel failed: {exc}")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
