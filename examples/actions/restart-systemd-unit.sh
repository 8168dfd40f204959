#!/bin/sh
# Restart a model server run as a systemd unit, then exit with systemctl's status.
#
# Usage: restart-systemd-unit.sh [--user] UNIT
#
# `systemctl restart` stops the unit's whole cgroup (every process it started, EngineCore
# included) and returns once the unit has started again, so this script needs no waiting of
# its own. The stop is SIGTERM, then SIGKILL after the unit's TimeoutStopSec (with
# KillMode=control-group and SendSIGKILL=yes, as in examples/systemd/vllm@.service): the
# output states that bound, and says "ignored SIGTERM: SIGKILL after ..." when the unit's
# journal shows systemd had to kill (if this user may read it). The restarter's user needs the
# right to restart the unit (a polkit rule, or a sudoers line if you put `sudo` in front of
# systemctl here).
set -eu
scope=
if [ "${1-}" = --user ]; then
    scope=--user
    shift
fi
if [ $# -ne 1 ]; then
    echo "usage: $0 [--user] UNIT" >&2
    exit 64
fi
unit=$1
case $unit in
    -*) echo "a unit name cannot start with '-': $unit" >&2; exit 64 ;;
esac
since=$(date +%s)
# shellcheck disable=SC2086  # $scope is empty or one word
systemctl $scope restart -- "$unit"
# shellcheck disable=SC2086
state=$(systemctl $scope is-active -- "$unit" || true)
# shellcheck disable=SC2086
props=$(systemctl $scope show -p TimeoutStopUSec -p KillMode -p SendSIGKILL -- "$unit" || true)
timeout=$(printf '%s\n' "$props" | sed -n 's/^TimeoutStopUSec=//p')
kill_mode=$(printf '%s\n' "$props" | sed -n 's/^KillMode=//p')
send_kill=$(printf '%s\n' "$props" | sed -n 's/^SendSIGKILL=//p')
case $send_kill/$timeout in
    no/*) bound="SIGTERM, never SIGKILL (SendSIGKILL=no): set SendSIGKILL=yes" ;;
    */infinity) bound="SIGTERM, never SIGKILL (TimeoutStopSec=infinity): set a bound" ;;
    *) bound="SIGTERM to the ${kill_mode:-control-group}, SIGKILL after ${timeout:-TimeoutStopSec}" ;;
esac
case $kill_mode in
    process | none) bound="$bound; KillMode=$kill_mode leaves its other processes (EngineCore) running: use control-group" ;;
esac
# systemd logs "State 'stop-sigterm' timed out. Killing." when the stop escalated.
# shellcheck disable=SC2086
if journalctl $scope --unit "$unit" --since "@$since" --output cat --no-pager --quiet 2>/dev/null |
    grep -q "timed out. Killing"; then
    echo "restarted $unit ($state): it ignored SIGTERM: SIGKILL after $timeout"
else
    echo "restarted $unit ($state); its stop: $bound"
fi
