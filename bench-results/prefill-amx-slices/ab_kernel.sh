#!/bin/bash
# usage: ab_kernel.sh OUT ROUNDS QTYPE SHAPE ROWS: records_kernel_time.py before (a worktree at
# /tmp/benchwt: the kernel without slices) and after (/work/main), alternated in ABBA order
OUT=$1; R=$2; Q=$3; SHAPE=$4; ROWS=$5
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    if [ "$v" = before ]; then src=/tmp/benchwt/src; else src=/work/main/src; fi
    echo "## round $i $v $Q $SHAPE" >> "$OUT"
    PYTHONPATH=$src /work/main/.venv/bin/python /work/main/scripts/records_kernel_time.py \
      --qtype "$Q" --shape "$SHAPE" --rows "$ROWS" --repeats 3 >> "$OUT" 2>&1
  done
done
