"""Routes of the console: six pages and their two static files."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from hub.console.pages import PAGES, render

#: The pages run only our own script and style: no inline code, nothing from elsewhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


def mount_console(app: FastAPI) -> None:
    """Add the console's pages and static files to `app`."""
    for page in PAGES:
        app.add_api_route(
            page.path,
            _page_handler(page.key),
            methods=["GET"],
            include_in_schema=False,
            response_class=HTMLResponse,
        )

    @app.get("/console/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        media = _STATIC.get(name)
        if media is None:
            return Response("not found", status_code=404, media_type="text/plain")
        body = resources.files("hub.console").joinpath("static", name).read_bytes()
        return Response(body, media_type=media, headers=SECURITY_HEADERS)


def _page_handler(key: str) -> Callable[[], Awaitable[HTMLResponse]]:
    async def handler() -> HTMLResponse:
        return HTMLResponse(render(key), headers=SECURITY_HEADERS)

    handler.__name__ = f"console_{key}"
    return handler
