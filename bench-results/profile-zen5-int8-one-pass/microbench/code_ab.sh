#!/bin/bash
# usage: code_ab.sh ROUNDS OUT ARGS...   alternates /tmp/base (HEAD) and the working tree
cd /work/main
ROUNDS=$1; OUT=$2; shift 2
for i in $(seq 1 $ROUNDS); do
  for e in base new; do
    echo "=== round $i $e $(date +%T)" >> $OUT
    if [ $e = base ]; then PYTHONPATH=/tmp/base/src .venv/bin/python /tmp/base/scripts/q4_step_breakdown.py "$@" >> $OUT 2>&1
    else .venv/bin/python scripts/q4_step_breakdown.py "$@" >> $OUT 2>&1; fi
  done
done
echo DONE >> $OUT
