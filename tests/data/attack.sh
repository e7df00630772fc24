#!/bin/sh
# A hostile workload for tests: it tries every way a workload could reach the fleet's secrets or its
# workers, and prints what it got as one JSON line (the objective, "found", counts the secrets it saw).
#   attack.sh MODE PORT NEEDLES FILE...
# MODE: "hostile" also kills what it can and leaves a process behind; "gentle" only looks (for a run with no
# sandbox, where a kill would reach other tests' processes). PORT: the database's, on loopback. NEEDLES: a
# file of the strings to look for (the database and broker URLs), one a line: in its arguments, its own
# command line would hold them. FILE: files that hold them on the node.
mode="$1"
port="$2"
needles="$3"
shift 3
found=0
scratch="${TMPDIR:-.}"
has_secret() { grep -q -F -f "$needles" "$1" 2>/dev/null; }

# Every process's environment and command line that it can see, and its own.
procs=0
for place in /proc/[0-9]*; do
    procs=$((procs + 1))
    for part in environ cmdline; do
        tr '\0' '\n' <"$place/$part" >"$scratch/.p" 2>/dev/null || continue
        has_secret "$scratch/.p" && found=$((found + 1))
    done
done
env >"$scratch/.e"; has_secret "$scratch/.e" && found=$((found + 1))

# The files that hold the secrets on the node, and the fleet's own state.
for file in "$@"; do
    [ -r "$file" ] && has_secret "$file" && found=$((found + 1))
done

if [ "$mode" = hostile ]; then
    # Kill everything it may: sibling workers, if it could see them.
    kill -9 -1 2>/dev/null
    # Leave a process behind, in a session of its own: it must die with the trial.
    setsid sleep 300.75 >/dev/null 2>&1 &
fi

# The network: the broker is on loopback.
net=0
if command -v python3 >/dev/null; then
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2)' "$port" \
        >/dev/null 2>&1 && net=1
fi

echo "{\"found\": $found, \"procs\": $procs, \"network\": $net}"
