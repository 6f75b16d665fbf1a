#!/usr/bin/env bash
# Start the head node of a Ray cluster for bigrate.
#   HOST (default 127.0.0.1)  node address; on a real cluster the head's PRIVATE address.
#                             127.0.0.1 starts a single-machine cluster bound to loopback
#                             only (Ray's single-node mode).
#   PORT (default 6379)       GCS port; submit with --address HOST:PORT
#   NUM_CPUS (default: all)   CPUs offered to tasks
# SECURITY: the cluster requires Ray token authentication (RAY_AUTH_MODE=token): the
# token is generated into ~/.ray/auth_token here if there is none; copy it to the worker
# nodes and to the machine that submits jobs (or set RAY_AUTH_TOKEN there). The token is
# not encryption: keep Ray on a private network (or loopback), never a public interface.
set -euo pipefail
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-6379}"
args=(--head --node-ip-address "$HOST" --port "$PORT" --include-dashboard false
      --disable-usage-stats)
if [ -n "${NUM_CPUS:-}" ]; then args+=(--num-cpus "$NUM_CPUS"); fi
if [ "$HOST" = "127.0.0.1" ] || [ "$HOST" = "localhost" ]; then
  # without this Ray replaces 127.0.0.1 by the machine's network address and binds
  # every interface
  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
fi
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [ "$RAY_AUTH_MODE" = "token" ] && [ -z "${RAY_AUTH_TOKEN:-}" ]; then
  # the token is a password: readable by its owner only
  (umask 077 && ray get-auth-token --generate > /dev/null)
  token="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
  if [ -f "$token" ]; then chmod 600 "$token"; fi
fi
exec ray start "${args[@]}" "$@"
