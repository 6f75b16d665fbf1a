#!/usr/bin/env bash
# Join this machine to a Ray cluster as a worker node.
#   HEAD (required)           head address, e.g. 10.0.0.5:6379
#   HOST                      this node's private address (default: Ray picks it)
#   NUM_CPUS (default: all)
# The head's token must be here: ~/.ray/auth_token copied from the head, or RAY_AUTH_TOKEN.
set -euo pipefail
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
: "${HEAD:?set HEAD, e.g. 10.0.0.5:6379}"
args=(--address "$HEAD" --disable-usage-stats)
if [ -n "${HOST:-}" ]; then args+=(--node-ip-address "$HOST"); fi
if [ -n "${NUM_CPUS:-}" ]; then args+=(--num-cpus "$NUM_CPUS"); fi
exec ray start "${args[@]}" "$@"
