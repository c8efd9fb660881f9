"""The chat page at `GET /`: static files shipped in the package (bmoe_edge/serve/ui/, in the wheel and so in
every board bundle), hand-written, with no build step and nothing fetched from another host. The page is the
same origin as the API, so it passes the gate (gate.py lets a same-origin Origin in) and sends the API key the
user typed (kept in the browser's localStorage only) as the bearer; the files themselves are public (they hold
no secret), every API call still needs the key. `serve --no-ui` leaves these routes out (GET / is a 404).

Every file is answered with a Content-Security-Policy that allows scripts, styles and connections from this
origin only (no inline script, no eval, no frames), so even a renderer bug that let model text become markup
could not run a script; docs/serve.md ("The chat page")."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

PACKAGE = "bmoe_edge.serve"
FOLDER = "ui"
PREFIX = "/ui/"   # where the page's files are served (index.html links them relative to /)
INDEX = "index.html"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
CSP = "; ".join((
    "default-src 'self'",
    "script-src 'self'",          # files of this origin only: no inline script, no eval
    "style-src 'self'",           # no inline style sheets or style attributes (CSSOM from the script is fine)
    "img-src 'self'",
    "connect-src 'self'",         # fetch reaches this server's API only
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",     # never inside another site's frame (clickjacking)
))
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def files() -> dict[str, tuple[bytes, str]]:
    """The page's files by name: their bytes and media type (read once, when the app is made)."""
    out = {}
    for entry in resources.files(PACKAGE).joinpath(FOLDER).iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in MEDIA_TYPES:
            out[entry.name] = (entry.read_bytes(), MEDIA_TYPES[suffix])
    return out


def _answer(body: bytes, media_type: str) -> Response:
    return Response(body, media_type=media_type, headers=HEADERS)


def routes() -> list[Route]:
    """GET / (the page) and GET /ui/NAME for each of its files: fixed routes, no path from the request reaches
    the file system."""
    found = files()

    def serving(name: str) -> Route:
        body, media_type = found[name]

        async def endpoint(request: Request) -> Response:
            return _answer(body, media_type)

        return Route("/" if name == INDEX else PREFIX + name, endpoint, methods=["GET"])

    return [serving(name) for name in sorted(found)]
