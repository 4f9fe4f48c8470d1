# One image for the four daemons; the command picks the service:
#   docker run IMAGE gorge-webhook      (or gorge-mailer, gorge-taskqueue, gorge-worker)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /tmp/gorge-src
COPY pyproject.toml README.md ./
COPY gorge ./gorge
COPY twisted ./twisted
# twistd reads the plugin list from dropin.cache; build it now, as root, since
# the unprivileged runtime user cannot write site-packages. The second
# command fails the build if the four plugins are not found.
RUN pip install . \
 && cd / \
 && rm -rf /tmp/gorge-src \
 && python -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))" \
 && python -c "from twisted.application.service import IServiceMaker; from twisted.plugin import getPlugins; \
names = {p.tapname for p in getPlugins(IServiceMaker)}; \
missing = {'gorge-webhook', 'gorge-mailer', 'gorge-taskqueue', 'gorge-worker'} - names; \
assert not missing, missing"

COPY conf/ /opt/gorge/conf/
# The Phorge library and its PHP executor script. The image has no PHP: to run
# PHP tasks in local executors, build on it with php-cli and a Phorge
# checkout, and set GORGE_WORKER_PHORGE_ROOT (docs/worker.md).
COPY phorge/ /opt/gorge/phorge/
ENV GORGE_WORKER_PHP_EXECUTOR=/opt/gorge/phorge/scripts/gorge-executor.php
COPY conf/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh \
 && groupadd --system --gid 10001 gorge \
 && useradd --system --uid 10001 --gid gorge --home-dir /var/lib/gorge --create-home \
        --shell /usr/sbin/nologin gorge

# Relative paths (e.g. the embedded SQLite queue file) land here.
WORKDIR /var/lib/gorge
USER 10001:10001

# webhook, mailer, taskqueue, worker
EXPOSE 8160 8110 8090 8170

# Probes the port of the daemon this container runs: /readyz for webhook,
# mailer and taskqueue, /healthz for the worker (see docker-entrypoint.sh).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["docker-entrypoint.sh", "healthcheck"]

# twistd re-raises SIGTERM after a clean drain; give it time (compose:
# stop_grace_period) above the longest drain budget.
STOPSIGNAL SIGTERM
# No default service: without a command the entry point prints its usage.
ENTRYPOINT ["docker-entrypoint.sh"]
