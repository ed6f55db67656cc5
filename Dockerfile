# trainsentry daemon: log roots mounted read-only at /logs, state in a volume.
FROM python:3.11-slim

RUN useradd --system --uid 10001 --home-dir /var/lib/trainsentry trainsentry \
    && mkdir -p /var/lib/trainsentry && chown trainsentry /var/lib/trainsentry

WORKDIR /src
COPY pyproject.toml README.md ./
COPY daemon ./daemon
COPY probe ./probe
COPY rules ./rules
RUN pip install --no-cache-dir . && rm -rf /src

USER trainsentry
ENV TRAINSENTRY_STATE_DIR=/var/lib/trainsentry
VOLUME ["/var/lib/trainsentry"]
# Most clusters keep logs on NFS/Lustre, where inotify sees no writes from other hosts.
# /healthz answers 200 only while the main loop completes cycles.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:9465/healthz', timeout=4)"]
ENTRYPOINT ["trainsentry"]
CMD ["run", "/logs"]
