FROM python:3.11-slim-bookworm

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY scripts/lua ./scripts/lua
COPY conf ./conf
RUN pip install --no-cache-dir ".[speedups]" && gateway check -c /app/conf/limits.yaml

EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["gateway"]
CMD ["run", "-c", "/app/conf/limits.yaml"]
