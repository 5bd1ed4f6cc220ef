# The streampilot image: the control plane, the worker runtime and the examples, with
# Java 17 and PySpark so the same image serves as a Spark master, Spark worker and
# executor (docker-compose.yml). bubblewrap sandboxes uploaded controllers and code checks;
# unprivileged, it needs user namespaces, which Docker's default seccomp profile denies: run
# with a profile that allows them, or the server refuses uploaded controllers and says why
# (built-ins still run). Build: docker build -t streampilot .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps bubblewrap \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY runtime ./runtime
COPY controlplane ./controlplane
COPY controllers ./controllers
COPY connectors ./connectors
COPY examples ./examples
COPY migrations ./migrations
ARG EXTRAS=all
RUN pip install ".[${EXTRAS}]"

RUN useradd --create-home --uid 1000 streampilot
USER streampilot

# 8420: REST API and console; 8421: the coordinator, which workers dial.
EXPOSE 8420 8421
HEALTHCHECK --interval=10s --timeout=3s --retries=5 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8420/healthz', timeout=2)"
CMD ["streampilot", "server", "--host", "0.0.0.0", "--port", "8420"]
