#!/usr/bin/env bash
# Start a Dask scheduler for bigrate jobs.
#   HOST (default 127.0.0.1)  address to bind: keep it on a private network interface
#   PORT (default 8786)       scheduler port; 0 picks a free one
#   DASHBOARD (default 8787)  dashboard port, bound to HOST; "none" for no dashboard
#   TLS_DIR                   if set, require TLS with ca.pem, scheduler.pem, scheduler-key.pem
#                             from that folder (make them with make-tls-certs.sh)
# Submit with: bigrate run JOB.toml --engine dask --address tcp://HOST:PORT (tls:// with TLS)
set -euo pipefail
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8786}"
DASHBOARD="${DASHBOARD:-8787}"
args=(--host "$HOST" --port "$PORT")
if [ "$DASHBOARD" = "none" ]; then
  args+=(--no-dashboard --dashboard-address "$HOST:0")  # its HTTP endpoints stay on HOST
else
  args+=(--dashboard-address "$HOST:$DASHBOARD")
fi
if [ -n "${TLS_DIR:-}" ]; then
  args+=(--protocol tls --tls-ca-file "$TLS_DIR/ca.pem" --tls-cert "$TLS_DIR/scheduler.pem"
         --tls-key "$TLS_DIR/scheduler-key.pem")
fi
exec dask scheduler "${args[@]}" "$@"
