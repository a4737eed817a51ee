#!/bin/bash
# usage: ab_tree.sh ROUNDS OUT MODEL DTYPE ROWS REPEATS: fwd_rows.py on /tmp/base/src (0) and
# /work/main/src (1), ABBA order, a line a run
cd /work/main
R=$1; OUT=$2; M=$3; D=$4; ROWS=$5; REPS=$6
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="0 1"; else order="1 0"; fi
  for v in $order; do
    if [ "$v" = 0 ]; then src=/tmp/base/src; else src=/work/main/src; fi
    echo "$i $v $(PYTHONPATH=$src .venv/bin/python bench-results/profile-zen5-row-costs/microbench/fwd_rows.py "$M" "$D" "$ROWS" "$REPS" 2>/dev/null)" >> "$OUT"
  done
done
echo DONE >> "$OUT"
