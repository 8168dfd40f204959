#!/bin/sh
# Restart a model server that runs as a plain process group: stop the whole group, start the
# server again in a new session, and exit.
#
# Usage: restart-process-group.sh PIDFILE LOGFILE COMMAND [ARG...]
#
# PIDFILE holds the process group's id: the pid of a server started with `setsid`, which makes
# it the leader of a group of its own (this script writes it when it starts the server). The
# whole group gets SIGTERM, then SIGKILL after STOP_GRACE_SECONDS (default 30): vLLM's
# EngineCore is a child process, and one left behind keeps the GPU's memory. A wedged server
# often ignores SIGTERM; the output then says "ignored SIGTERM: SIGKILL after N s". A group
# that SIGKILL has not ended 10 s later (a process stuck in the kernel, in a GPU driver call)
# is a failure, and no second server is started beside it. So the stop takes at most
# STOP_GRACE_SECONDS + 10 s: keep the target's action_timeout above that plus the start.
#
# The new server runs under `setsid` with its output in LOGFILE and stdin from /dev/null, so it
# neither holds the restarter's pipe open nor lives in this script's process group (the
# restarter kills what a command leaves in its own group when the command exits).
set -eu
if [ $# -lt 3 ]; then
    echo "usage: $0 PIDFILE LOGFILE COMMAND [ARG...]" >&2
    exit 64
fi
pidfile=$1
logfile=$2
shift 2
grace=${STOP_GRACE_SECONDS:-30}
case $grace in
    '' | *[!0-9]*) echo "STOP_GRACE_SECONDS is not a whole number of seconds: $grace" >&2; exit 64 ;;
esac
kill_wait=10

group_alive() {
    kill -0 "-$1" 2>/dev/null
}

# wait_gone PGID SECONDS: until the group has no process left, or SECONDS have passed.
wait_gone() {
    ticks=$(($2 * 10))
    while group_alive "$1" && [ "$ticks" -gt 0 ]; do
        sleep 0.1
        ticks=$((ticks - 1))
    done
}

if [ -s "$pidfile" ]; then
    pgid=$(cat "$pidfile")
    case $pgid in
        '' | *[!0-9]* | 0 | 1) echo "$pidfile does not hold a process group id: $pgid"; exit 1 ;;
    esac
    if group_alive "$pgid"; then
        kill -TERM "-$pgid" 2>/dev/null || true
        wait_gone "$pgid" "$grace"
        if group_alive "$pgid"; then
            kill -KILL "-$pgid" 2>/dev/null || true
            echo "process group $pgid ignored SIGTERM: SIGKILL after $grace s"
            wait_gone "$pgid" "$kill_wait"
            if group_alive "$pgid"; then
                echo "process group $pgid still there $kill_wait s after SIGKILL (stuck in the kernel?): no new server started"
                exit 1
            fi
        else
            echo "process group $pgid stopped on SIGTERM"
        fi
    fi
fi
setsid "$@" </dev/null >>"$logfile" 2>&1 &
server=$!
# Until setsid has run, the new server is still in this script's process group, which the
# restarter kills when the script exits: wait until it leads a group of its own.
ticks=50
while [ "$(ps -o pgid= -p "$server" | tr -d ' ')" != "$server" ]; do
    ticks=$((ticks - 1))
    if [ "$ticks" -le 0 ] || ! kill -0 "$server" 2>/dev/null; then
        echo "$1 did not start in a session of its own (see $logfile)"
        exit 1
    fi
    sleep 0.1
done
echo "$server" >"$pidfile"
echo "started $1 as process group $server"
