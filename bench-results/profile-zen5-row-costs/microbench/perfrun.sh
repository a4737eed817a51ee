#!/bin/bash
# usage: perfrun.sh OUT model dtype rows n
mkdir -p /tmp/w && rm -f /tmp/w/marker
/work/main/.venv/bin/python "$(dirname "$0")/fwd.py" $2 $3 $4 $5 &
pid=$!
while [ ! -f /tmp/w/marker ]; do sleep 0.1; done
perf record -F 5000 -e cpu-clock -p $pid -o $1 -- sleep ${6:-4} 2>/dev/null >/dev/null
wait $pid
