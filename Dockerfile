# syntax=docker/dockerfile:1
# Build stage: uv resolves exactly what uv.lock pins, without dev dependencies.
FROM python:3.11-slim AS build
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
WORKDIR /app
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv uv sync --frozen --no-dev --no-install-project
COPY alembic.ini ./
COPY migrations ./migrations
COPY app ./app
RUN --mount=type=cache,target=/root/.cache/uv uv sync --frozen --no-dev

# Runtime stage: same base image (the venv links to its python), no build tools, non-root.
FROM python:3.11-slim
RUN useradd --create-home --uid 10001 memory
WORKDIR /app
COPY --from=build --chown=memory:memory /app /app
ENV PATH="/app/.venv/bin:$PATH" PYTHONUNBUFFERED=1
USER memory
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
# `serve` applies migrations (alembic upgrade head) before it starts listening.
CMD ["memory-service", "serve", "--host", "0.0.0.0", "--port", "8000"]
