# syntax=docker/dockerfile:1
# Build stage: uv installs exactly what uv.lock pins, without the dev group or the `embedded`
# extra (the image always talks to a PostgreSQL named by DATABASE_URL), then the project itself
# as a wheel (--no-editable): the code, alembic.ini and the migrations all end up in the venv.
# tests/integration/test_image.py repeats these steps in a fresh virtualenv.
FROM python:3.11-slim AS build
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/memory-service
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv uv sync --frozen --no-dev --no-install-project
COPY alembic.ini ./
COPY migrations ./migrations
COPY app ./app
RUN --mount=type=cache,target=/root/.cache/uv uv sync --frozen --no-dev --no-editable

# Runtime stage: the same base image (the venv links to its python), no build tools. The venv
# is owned by root and read-only for the service, which runs as an unprivileged user.
FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent memory
COPY --from=build /opt/memory-service /opt/memory-service
ENV PATH="/opt/memory-service/bin:$PATH" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Settings come from the environment (docker compose: env_file) and from secret files in
# /run/secrets, one per setting, named after it (e.g. /run/secrets/DATABASE_URL).
WORKDIR /opt/memory-service
USER 10001:10001
EXPOSE 8000
# Ready = the database answers and is migrated to this code's head (GET /readyz).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"]
# `serve` waits for the database (DATABASE_STARTUP_WAIT_SECONDS), applies the migrations
# (alembic upgrade head) and serves; a database it cannot use is one line on stderr, exit 1.
CMD ["memory-service", "serve", "--host", "0.0.0.0", "--port", "8000"]
