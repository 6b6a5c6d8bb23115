#!/bin/sh
# EpilogSlurmctld for hypocenter: ask the server to scope the job that just ended and analyse it.
#
#   slurm.conf:   EpilogSlurmctld=/etc/slurm/hypocenter-epilog.sh
#   environment:  HYPOCENTER_URL (default http://127.0.0.1:4318), HYPOCENTER_TIMEOUT (seconds, default 10),
#                 HYPOCENTER_TOKEN_FILE (a file holding an admin token, if the server wants one)
#
# slurmctld sets SLURM_JOB_ID (for array tasks SLURM_ARRAY_JOB_ID/SLURM_ARRAY_TASK_ID). The script
# always exits 0: a diagnosis that could not be requested must not fail the epilog.
url="${HYPOCENTER_URL:-http://127.0.0.1:4318}"
timeout="${HYPOCENTER_TIMEOUT:-10}"
job="${SLURM_JOB_ID:-}"
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
fi
if [ -z "$job" ]; then
    echo "hypocenter-epilog: SLURM_JOB_ID is not set (run me as EpilogSlurmctld)" >&2
    exit 0
fi
case "$job" in
    *[!0-9_+]*) echo "hypocenter-epilog: unexpected job id '$job'" >&2; exit 0 ;;
esac
# The token goes to curl on stdin (a --config line), never on its command line where ps would show it.
token=""
if [ -n "${HYPOCENTER_TOKEN_FILE:-}" ]; then
    token=$(cat "$HYPOCENTER_TOKEN_FILE" 2>/dev/null) || { echo "hypocenter-epilog: cannot read HYPOCENTER_TOKEN_FILE" >&2; exit 0; }
fi
status=$(printf '%s\n' ${token:+"header = \"Authorization: Bearer $token\""} | curl -s -o /dev/null \
    -w '%{http_code}' --config - --max-time "$timeout" -X POST \
    -H 'Content-Type: application/json' -d "{\"slurm\": \"$job\"}" "$url/v1/scopes") || status="no answer"
case "$status" in
    200) ;;
    *) echo "hypocenter-epilog: job $job: $url/v1/scopes answered $status" >&2 ;;
esac
exit 0
