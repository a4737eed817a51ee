#!/bin/bash
# usage: ab_env_abba.sh VAR ROUNDS OUT MODEL DTYPE ROWS REPEATS: values 0 and 1 of VAR, ABBA order
cd /work/main
VAR=$1; R=$2; OUT=$3; M=$4; D=$5; ROWS=$6; REPS=$7
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="0 1"; else order="1 0"; fi
  for v in $order; do
    echo "$i $v $(env "$VAR=$v" .venv/bin/python bench-results/profile-zen5-row-costs/microbench/fwd_rows.py "$M" "$D" "$ROWS" "$REPS" 2>/dev/null)" >> "$OUT"
  done
done
echo DONE >> "$OUT"
