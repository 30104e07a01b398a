#!/usr/bin/env bash
# cluster-generic submit command: start the job script as a detached process whose working and
# temporary directory is a fresh scratch directory, and print its process id as the job id.
# Snakemake learns the job's end from the marker files its job script writes. A job that succeeds
# removes its scratch directory; a failed one leaves it, with job.log.
set -euo pipefail
jobscript="${!#}"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/specdec-job.XXXXXX")"
cd "$scratch"
TMPDIR="$scratch" nohup bash -c 'bash "$1" > "$2/job.log" 2>&1 && rm -rf "$2"' _ "$jobscript" "$scratch" \
    > /dev/null 2>&1 < /dev/null &
echo "$!"
