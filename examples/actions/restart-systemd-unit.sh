#!/bin/sh
# Restart a model server run as a systemd unit, then exit with systemctl's status.
#
# Usage: restart-systemd-unit.sh [--user] UNIT
#
# `systemctl restart` stops the unit's whole cgroup (every process it started, EngineCore
# included) and returns once the unit has started again, so this script needs no waiting of
# its own. The restarter's user needs the right to restart the unit (a polkit rule, or a
# sudoers line if you put `sudo` in front of systemctl here).
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
# shellcheck disable=SC2086  # $scope is empty or one word
systemctl $scope restart -- "$unit"
echo "restarted $unit ($(systemctl $scope is-active -- "$unit" || true))"
