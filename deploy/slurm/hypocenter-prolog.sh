#!/bin/sh
# PrologSlurmctld for hypocenter: tell the server that a job attempt starts now, on which nodes.
#
#   slurm.conf:   PrologSlurmctld=/etc/slurm/hypocenter-prolog.sh
#   environment:  HYPOCENTER_URL (default http://127.0.0.1:4318), HYPOCENTER_TIMEOUT (seconds, default 10),
#                 HYPOCENTER_TOKEN_FILE (a file holding an ingest or admin token, if the server wants one)
#
# It sends one OTLP/HTTP log record (JSON) whose resource names the attempt (hypocenter.workload.id =
# the job id, hypocenter.workload.attempt = SLURM_RESTART_COUNT) and its scope: the allocation time as
# hypocenter.attempt.window.start and SLURM_JOB_NODELIST as hypocenter.attempt.nodes. Without it the
# server infers the window from the first record it gets, and the nodes from the records' host.name:
# a node that logged nothing before failing would be missing. The epilog's scope, when it runs, wins.
# The script always exits 0: telemetry that could not be sent must not hold a job back.
url="${HYPOCENTER_URL:-http://127.0.0.1:4318}"
timeout="${HYPOCENTER_TIMEOUT:-10}"
job="${SLURM_JOB_ID:-}"
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
fi
say() { echo "hypocenter-prolog: $*" >&2; }
if [ -z "$job" ]; then
    say "SLURM_JOB_ID is not set (run me as PrologSlurmctld)"
    exit 0
fi
case "$job" in
    *[!0-9_+]*) say "unexpected job id '$job'"; exit 0 ;;
esac
attempt="${SLURM_RESTART_COUNT:-0}"
case "$attempt" in
    ''|*[!0-9]*) say "job $job: unexpected SLURM_RESTART_COUNT '$attempt'"; exit 0 ;;
esac
nodes="${SLURM_JOB_NODELIST:-}"
case "$nodes" in
    *[!A-Za-z0-9_.,\[\]-]*) say "job $job: unexpected SLURM_JOB_NODELIST '$nodes'"; exit 0 ;;
esac
cluster="${SLURM_CLUSTER_NAME:-}"
case "$cluster" in
    *[!A-Za-z0-9_.-]*) cluster="" ;;
esac
# The job name is the user's: keep it JSON-safe (no control characters, quotes and backslashes escaped).
name=$(printf '%s' "${SLURM_JOB_NAME:-}" | tr -d '\000-\037' | sed 's/[\\"]/\\&/g')
now=$(date -u +%s)
start=$(date -u -d "@$now" +%Y-%m-%dT%H:%M:%SZ)
attr() { printf '{"key":"%s","value":{"stringValue":"%s"}},' "$1" "$2"; }
resource="$(attr hypocenter.workload.id "$job")$(attr hypocenter.workload.attempt "$attempt")"
resource="$resource$(attr hypocenter.workload.scheduler slurm)$(attr hypocenter.source slurm/prolog)"
resource="$resource$(attr hypocenter.attempt.window.start "$start")"
[ -n "$nodes" ] && resource="$resource$(attr hypocenter.attempt.nodes "$nodes")"
[ -n "$cluster" ] && resource="$resource$(attr hypocenter.workload.cluster "$cluster")"
[ -n "$name" ] && resource="$resource$(attr hypocenter.workload.name "$name")"
body="{\"resourceLogs\":[{\"resource\":{\"attributes\":[${resource%,}]},\"scopeLogs\":[{\"scope\":{\"name\":\"hypocenter-prolog\"},\"logRecords\":[{\"timeUnixNano\":\"${now}000000000\",\"severityText\":\"INFO\",\"body\":{\"stringValue\":\"job $job attempt $attempt allocated on ${nodes:-(no node list)}\"}}]}]}]}"
# The token goes to curl on stdin (a --config line), never on its command line where ps would show it.
token=""
if [ -n "${HYPOCENTER_TOKEN_FILE:-}" ]; then
    token=$(cat "$HYPOCENTER_TOKEN_FILE" 2>/dev/null) || { say "cannot read HYPOCENTER_TOKEN_FILE"; exit 0; }
fi
status=$(printf '%s\n' ${token:+"header = \"Authorization: Bearer $token\""} | curl -s -o /dev/null \
    -w '%{http_code}' --config - --max-time "$timeout" -X POST -H 'Content-Type: application/json' \
    --data-binary "$body" "$url/v1/logs") || status="no answer"
case "$status" in
    200) ;;
    *) say "job $job: $url/v1/logs answered $status" ;;
esac
exit 0
