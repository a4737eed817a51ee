#!/bin/bash
# usage: env_ab.sh ROUNDS OUT "VAR=val ..." ARGS...  ("base" = none)
cd /work/main
ROUNDS=$1; OUT=$2; ENVS=$3; shift 3
for i in $(seq 1 $ROUNDS); do
  for e in $ENVS; do
    echo "=== round $i $e $(date +%T)" >> $OUT
    if [ $e = base ]; then .venv/bin/python scripts/q4_step_breakdown.py "$@" >> $OUT 2>&1
    else env $e .venv/bin/python scripts/q4_step_breakdown.py "$@" >> $OUT 2>&1; fi
  done
done
echo DONE >> $OUT
