"""Swagger UI at /docs and ReDoc at /redoc, with their assets served by the app itself.

The JavaScript and CSS come from the `fastapi-offline` package (the Swagger UI and ReDoc
bundles, kept up to date there), so the pages work where no CDN can be reached. This is
FastAPI's "self-hosting JavaScript and CSS for docs" recipe with the files from that package.
"""

from __future__ import annotations

from importlib.resources import files
from typing import TypedDict

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_URL = "/static-offline-docs"


class _CdnPagesOff(TypedDict):  # typed, so mypy checks the keys against FastAPI's own
    docs_url: None
    redoc_url: None


# FastAPI's own pages load their assets from a CDN: the app is built with these, then
# install_docs serves the same two pages with assets of its own.
CDN_PAGES_OFF: _CdnPagesOff = {"docs_url": None, "redoc_url": None}


def install_docs(app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Serve the docs pages and their assets; build `app` with `**CDN_PAGES_OFF`."""
    assert app.docs_url is None and app.redoc_url is None, "FastAPI's CDN-backed pages are still on"
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"
    static_dir = files("fastapi_offline") / "static"
    app.mount(STATIC_URL, StaticFiles(directory=str(static_dir)), name="static-offline-docs")

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=_under_root(request, openapi_url),
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=_under_root(request, oauth2_redirect_url),
            swagger_js_url=_asset(request, "swagger-ui-bundle.js"),
            swagger_css_url=_asset(request, "swagger-ui.css"),
            swagger_favicon_url=_asset(request, "favicon.png"),
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(oauth2_redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(redoc_url, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=_under_root(request, openapi_url),
            title=f"{app.title} - ReDoc",
            redoc_js_url=_asset(request, "redoc.standalone.js"),
            redoc_favicon_url=_asset(request, "favicon.png"),
            with_google_fonts=False,
        )


def _under_root(request: Request, path: str) -> str:
    """`path` as the browser must ask for it: behind a proxy that strips a prefix (the app's
    root_path), the pages' links carry that prefix again."""
    return f"{request.scope.get('root_path', '')}{path}"


def _asset(request: Request, name: str) -> str:
    return _under_root(request, f"{STATIC_URL}/{name}")
