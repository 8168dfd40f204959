#!/bin/sh
# Restart a container through the Docker Engine API on its Unix socket, with curl alone.
#
# Usage: restart-docker-container.sh CONTAINER [STOP_TIMEOUT_SECONDS]
#
# Docker stops the container (SIGTERM, then SIGKILL after STOP_TIMEOUT_SECONDS, default 30)
# and starts it again before it answers: every process in the container goes, so a stopped
# EngineCore cannot keep the GPU's memory. A wedged server often ignores SIGTERM: the engine's
# event log then shows the SIGKILL, and the output says "ignored SIGTERM: SIGKILL after N s".
# So the stop takes at most STOP_TIMEOUT_SECONDS: keep the target's action_timeout above that
# plus the start. DOCKER_SOCKET overrides /var/run/docker.sock.
# Access to the socket is root-equivalent: give it to the restarter's user knowingly.
set -eu
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 CONTAINER [STOP_TIMEOUT_SECONDS]" >&2
    exit 64
fi
container=$1
stop_timeout=${2:-30}
socket=${DOCKER_SOCKET:-/var/run/docker.sock}
case $container in
    '' | -* | *[!A-Za-z0-9_.-]*) echo "not a container name: $container" >&2; exit 64 ;;
esac
case $stop_timeout in
    '' | *[!0-9]*) echo "not a number of seconds: $stop_timeout" >&2; exit 64 ;;
esac
since=$(date +%s)
answer=$(curl --silent --show-error --unix-socket "$socket" \
    --max-time $((stop_timeout + 60)) --write-out '\n%{http_code}' \
    --request POST "http://localhost/containers/$container/restart?t=$stop_timeout")
code=$(printf '%s\n' "$answer" | tail -n 1)
body=$(printf '%s\n' "$answer" | sed '$d')
case $code in
    204) ;;
    *) echo "docker answered $code for $container: $body"; exit 1 ;;
esac
# Docker logs a `kill` event for each signal it sends, and both Docker and podman a `die`
# event with the exit code (137: SIGKILL). One event per line; no `filters` (podman 4 answers
# none with one), so the container's own lines are picked here. Unreadable events (a socket
# proxy that hides them) claim no kill.
events=$(curl --silent --unix-socket "$socket" --max-time 5 \
    "http://localhost/events?since=$since&until=$(($(date +%s) + 1))" || true)
name_pattern=$(printf '"name": *"%s"' "$container" | sed 's/\./\\./g')
if printf '%s\n' "$events" | grep -E "$name_pattern" |
    grep -Eq '"signal": *"(9|SIGKILL)"|"(exitCode|containerExitCode)": *"137"'; then
    echo "restarted container $container: it ignored SIGTERM: SIGKILL after $stop_timeout s"
else
    echo "restarted container $container (SIGKILL after $stop_timeout s if SIGTERM did not stop it)"
fi
