# The gateway on Debian bookworm-slim, with Debian's Python, run as a non-root user.
#
#   podman build --format docker -t gateway .      (docker build -t gateway . works the same;
#                                                    --format docker keeps the HEALTHCHECK)
#   podman run -e GATEWAY_UPSTREAM=10.0.0.5:8000 -p 8080:8080 gateway
#
# The config is /etc/gateway/limits.yaml (conf/container.yaml; mount your own over it).
# Bans are kept in /var/lib/gateway (state_dir in that file: set it in yours too); mount a volume
# there to keep them across containers: -v gateway-state:/var/lib/gateway
# GATEWAY_UPSTREAM=host:port[,host:port] replaces the servers of upstream "app".
# Behind a TLS-intercepting proxy, mount its CA bundle into the build and name it:
#   podman build -v /etc/ssl/certs/ca-certificates.crt:/host-ca.crt:ro --build-arg PIP_CERT=/host-ca.crt ...
FROM docker.io/library/debian:bookworm-slim

ARG PIP_CERT=

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-log-init --home-dir /var/lib/gateway --create-home --shell /usr/sbin/nologin gateway \
 && install -d -o gateway -g gateway -m 0700 /run/gateway \
 && ln -s /etc/gateway /var/lib/gateway/conf

COPY pyproject.toml README.md /src/
COPY gateway /src/gateway
COPY scripts/lua /src/scripts/lua
RUN if [ -z "$PIP_CERT" ]; then unset PIP_CERT; fi \
 && python3 -m venv /opt/gateway \
 && /opt/gateway/bin/pip install --no-cache-dir --disable-pip-version-check "/src[speedups]" \
 && rm -rf /src

COPY conf/container.yaml /etc/gateway/limits.yaml
COPY conf/container.yaml /usr/share/gateway/container.yaml
COPY scripts/container-entrypoint /usr/local/bin/gateway-entrypoint
RUN /opt/gateway/bin/gateway check -c /etc/gateway/limits.yaml

# The generated admin token goes to $XDG_RUNTIME_DIR/gateway/admin-<port>.token (a directory of
# the gateway user's own): `podman exec <container> cat /run/gateway/gateway/admin-9180.token`.
ENV PATH=/opt/gateway/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    XDG_RUNTIME_DIR=/run/gateway \
    GATEWAY_HEALTHZ=http://127.0.0.1:9180/healthz
USER gateway
WORKDIR /var/lib/gateway
EXPOSE 8080
# The admin API listens on the container's loopback: the check runs inside the container.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['GATEWAY_HEALTHZ'], timeout=2)"]
# The entrypoint execs the gateway: it is PID 1 and `podman stop`'s SIGTERM starts its graceful drain.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/gateway-entrypoint"]
CMD ["run"]
