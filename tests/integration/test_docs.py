"""/docs and /redoc work with no internet: every file the pages load comes from the app."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.integration.conftest import App, AppFactory

ACME = "acme-key-0123456789abcdef"
# Where an HTML page names another resource: attributes, Swagger UI's `url: '...'` and any
# absolute URL anywhere in the page (inline scripts included).
REFERENCES = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|\burl:\s*["']([^"']+)["']""")
ABSOLUTE = re.compile(r"""(?:https?:)?//[^\s"'<>)]+""")
CONTENT_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".json": "application/json",
}


def referenced(html: str) -> list[str]:
    return [a or b for a, b in REFERENCES.findall(html)]


@pytest.mark.parametrize(("page", "needs"), [("/docs", "SwaggerUIBundle"), ("/redoc", "Redoc")])
async def test_docs_pages_load_every_file_from_the_app(api: App, page: str, needs: str) -> None:
    response = await api.client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert ABSOLUTE.findall(html) == [], "the page must not reach another host"
    urls = referenced(html)
    assert "/openapi.json" in urls
    assert any(url.endswith(".js") for url in urls) and any(url.endswith(".png") for url in urls)
    scripts = b""
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = await api.client.get(url)
        assert asset.status_code == 200, url
        suffix = url[url.rindex(".") :]
        assert asset.headers["content-type"].startswith(CONTENT_TYPES[suffix]), (url, asset.headers)
        if suffix == ".js":
            scripts += asset.content
    assert needs.encode() in scripts and len(scripts) > 500_000  # the real library, not a stub


async def test_swagger_ui_asks_no_online_validator(api: App) -> None:
    html = (await api.client.get("/docs")).text
    assert '"validatorUrl": null' in html


async def test_only_the_packaged_files_are_served(api: App) -> None:
    paths = ("/docs/assets/core.py", "/docs/assets/..%2Fcore.py", "/docs/assets/", "/docs/oauth2-redirect")
    for path in paths:
        response = await api.client.get(path)
        assert response.status_code == 404, path
        assert response.json()["code"] == "not_found"


async def test_the_pages_follow_a_proxy_prefix(api: App) -> None:
    """Served under /memory by a proxy (ASGI root_path): the pages' links carry the prefix."""
    transport = httpx.ASGITransport(app=api.app, root_path="/memory")
    async with httpx.AsyncClient(transport=transport, base_url="http://memory.test") as client:
        for page in ("/memory/docs", "/memory/redoc"):
            urls = referenced((await client.get(page)).text)
            assert urls and all(url.startswith("/memory/") for url in urls), urls
            for url in urls:
                assert (await client.get(url)).status_code == 200, url


@pytest.mark.parametrize(
    ("keys", "docs_public", "anonymous", "with_key"),
    [(False, None, 200, 200), (True, None, 401, 200), (True, True, 200, 200), (False, False, 404, 404)],
)
async def test_the_files_follow_the_docs_setting(
    make_app: AppFactory, keys: bool, docs_public: bool | None, anonymous: int, with_key: int
) -> None:
    overrides: dict[str, object] = {"MEMORY_DOCS_PUBLIC": docs_public}
    if keys:
        overrides["MEMORY_API_KEYS"] = f"acme:{ACME}"
    api = await make_app(**overrides)
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"):
        path = f"/docs/assets/{name}"
        assert (await api.client.get(path)).status_code == anonymous, path
        assert (await api.client.get(path, headers={"X-API-Key": ACME})).status_code == with_key, path
