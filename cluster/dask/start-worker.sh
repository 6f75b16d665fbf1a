#!/usr/bin/env bash
# Start Dask workers for bigrate on this machine and connect them to a scheduler.
#   SCHEDULER (required)      e.g. tcp://10.0.0.5:8786 (tls://... with TLS)
#   HOST (default 127.0.0.1)  address the workers bind to (the node's private address)
#   NWORKERS (default 1)      worker processes; bigrate's SGD kernels are single-threaded,
#                             so use one single-threaded worker a core
#   MEMORY_LIMIT (default 4GiB) per worker; bigrate keeps a quarter of it for cached
#                             row groups and sizes its sampling buffers to stay under it
#   TLS_DIR                   if set, ca.pem, worker.pem, worker-key.pem from that folder
# Workers read the dataset path themselves: give them the same path (shared file system)
# or an fsspec URL (s3://, gs://, ...) in the job file.
set -euo pipefail
: "${SCHEDULER:?set SCHEDULER, e.g. tcp://10.0.0.5:8786}"
HOST="${HOST:-127.0.0.1}"
NWORKERS="${NWORKERS:-1}"
MEMORY_LIMIT="${MEMORY_LIMIT:-4GiB}"
# no pause at 80% of the limit (as bigrate's embedded cluster): bigrate's tasks bound their
# own memory, and a worker paused with memory its allocator keeps never resumes, so a fit
# would wait forever; the nanny still restarts a worker past 95% and its task runs again
export DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE="${DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE:-False}"
args=("$SCHEDULER" --host "$HOST" --nworkers "$NWORKERS" --nthreads 1
      --memory-limit "$MEMORY_LIMIT" --no-dashboard --dashboard-address "$HOST:0")
if [ -n "${TLS_DIR:-}" ]; then
  args+=(--tls-ca-file "$TLS_DIR/ca.pem" --tls-cert "$TLS_DIR/worker.pem"
         --tls-key "$TLS_DIR/worker-key.pem")
fi
exec dask worker "${args[@]}" "$@"
