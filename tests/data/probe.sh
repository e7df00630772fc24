#!/bin/sh
# A hostile workload for tests: looks for the given secrets everywhere a workload could read them (its own
# environment, its parent's, every process's, the files named after the secrets) and prints how often it
# found one, and how many of the places it could read at all.
db="$1"
broker="$2"
shift 2
found=0
readable=0
for place in /proc/self/environ "/proc/$PPID/environ" /proc/[0-9]*/environ "$@"; do
    cat "$place" >/dev/null 2>&1 || continue
    readable=$((readable + 1))
    if tr '\0' '\n' <"$place" 2>/dev/null | grep -q -F -e "$db" -e "$broker"; then
        found=$((found + 1))
    fi
done
echo "{\"score\": $found, \"readable\": $readable}"
