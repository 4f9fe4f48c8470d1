#!/bin/sh
# Entry point of the gorge image.
#   docker run IMAGE gorge-webhook [service options]   -> twistd runs that daemon
#   docker run IMAGE healthcheck                       -> probe the running daemon
#   docker run IMAGE <any other command>               -> run it as given
set -eu

SERVICES="gorge-webhook gorge-mailer gorge-taskqueue gorge-worker"

usage() {
    echo "usage: docker run IMAGE {gorge-webhook|gorge-mailer|gorge-taskqueue|gorge-worker} [options]" >&2
    echo "       docker run IMAGE <command> [args...]" >&2
}

# HEALTHCHECK: find which daemon PID 1 runs, then ask its own port. The port
# follows --listen / GORGE_LISTEN_ADDR, so the probe can never point at a
# port nobody listens on. Exit 0 = healthy, 1 = unhealthy (Docker's contract).
healthcheck() {
    exec python3 - <<'PY'
import os
import sys
import urllib.request

PROBES = {
    "gorge-webhook": (8160, "/readyz"),
    "gorge-mailer": (8110, "/readyz"),
    "gorge-taskqueue": (8090, "/readyz"),
    "gorge-worker": (8170, "/healthz"),
}

try:
    with open("/proc/1/cmdline", "rb") as f:
        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
except OSError:
    argv = []
service = next((a for a in argv if a in PROBES), None)
if service is None:
    sys.exit(0)  # not one of the four daemons: nothing of ours to probe
port, path = PROBES[service]

listen = os.environ.get("GORGE_LISTEN_ADDR", "")
for i, arg in enumerate(argv):
    if arg == "--listen" and i + 1 < len(argv):
        listen = argv[i + 1]
    elif arg.startswith("--listen="):
        listen = arg.split("=", 1)[1]

host = "127.0.0.1"
if listen:
    listen_host, _, listen_port = listen.rpartition(":")
    listen_host = listen_host.strip("[]")
    if listen_port.isdigit():
        port = int(listen_port)
    if listen_host in ("::", "::0"):
        host = "[::1]"
    elif ":" in listen_host:
        host = f"[{listen_host}]"
    elif listen_host not in ("", "0.0.0.0"):
        host = listen_host

# GORGE_TLS_CERT: the daemon speaks HTTPS. The probe asks its own port on
# this host, so it checks that the daemon answers, not who it is (the
# certificate names the host others reach, seldom 127.0.0.1); a listener
# with GORGE_TLS_CLIENT_CA is shown the daemon's own certificate, which must
# then be one that CA signed for client use too.
scheme, context = "http", None
if os.environ.get("GORGE_TLS_CERT"):
    import ssl

    scheme = "https"
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if os.environ.get("GORGE_TLS_CLIENT_CA"):
        context.load_cert_chain(os.environ["GORGE_TLS_CERT"], os.environ.get("GORGE_TLS_KEY"))

try:
    url = f"{scheme}://{host}:{port}{path}"
    with urllib.request.urlopen(url, timeout=2.5, context=context) as response:
        sys.exit(0 if response.status == 200 else 1)
except Exception as e:  # noqa: BLE001 - any failure means unhealthy
    print(f"{service} {path}: {e}", file=sys.stderr)
    sys.exit(1)
PY
}

if [ "$#" -eq 0 ]; then
    usage
    exit 2
fi

case "$1" in
    healthcheck)
        healthcheck
        ;;
    gorge-*)
        for service in $SERVICES; do
            if [ "$1" = "$service" ]; then
                shift
                exec twistd --nodaemon --pidfile= "$service" "$@"
            fi
        done
        echo "unknown service: $1" >&2
        usage
        exit 2
        ;;
    *)
        exec "$@"
        ;;
esac
