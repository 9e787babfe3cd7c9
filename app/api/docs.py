"""/docs (Swagger UI) and /redoc (ReDoc), with every file they load served by the app itself from
the fastapi-offline package: the pages work with no internet. FastAPI's own pages load their
scripts from a CDN (and a blank page is all a newcomer without one sees).

Who may see them is decided at the edge (app.edge: MEMORY_DOCS_PUBLIC, MEMORY_API_KEYS), for
the pages, their files and /openapi.json alike."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from starlette.exceptions import HTTPException

ASSETS = Path(str(files("fastapi_offline").joinpath("static")))
ASSETS_PATH = "/docs/assets"
# The files the pages load, with their content types; nothing else is served from ASSETS.
ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
OPENAPI_PATH = "/openapi.json"
DOCS_PATHS = frozenset({"/docs", "/redoc", OPENAPI_PATH, *(f"{ASSETS_PATH}/{name}" for name in ASSET_TYPES)})

router = APIRouter(include_in_schema=False)


def _root(request: Request) -> str:
    """The prefix a proxy serves the app under (ASGI root_path), so the pages' links still work."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=root + OPENAPI_PATH,
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
        oauth2_redirect_url=None,  # the API has no OAuth2
        # Swagger UI would otherwise show a badge fetched from validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_redoc_html(
        openapi_url=root + OPENAPI_PATH,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
        with_google_fonts=False,
    )


@router.get(ASSETS_PATH + "/{name}")
async def docs_asset(name: str) -> FileResponse:
    media_type = ASSET_TYPES.get(name)
    if media_type is None:
        raise HTTPException(status_code=404)
    # The files change only with the package: let browsers keep them a day (ETag revalidates).
    return FileResponse(
        ASSETS / name, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"}
    )
