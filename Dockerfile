# kv-sidecar image: slim Python, non-root, no build tools in the final stage.
# Build: docker build -t kv-sidecar:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
# Wheels for the sidecar and its dependencies (binary wheels: no compiler needed), exact token counts included.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[tokens]'

FROM python:3.11-slim
RUN groupadd --system --gid 10001 kv \
    && useradd --system --uid 10001 --gid kv --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kv
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1
USER 10001:10001
EXPOSE 9000 9090
ENTRYPOINT ["kv-sidecar"]
CMD ["run", "--help"]
