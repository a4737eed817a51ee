#!/bin/bash
cd /work/main
OUT=$1; R=$2
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="free bound"; else order="bound free"; fi
  for v in $order; do
    if [ $v = bound ]; then
      r=$(OMP_PROC_BIND=close OMP_PLACES=cores .venv/bin/python bench-results/profile-zen5-row-costs/microbench/fwd_rows.py qwen2.5-coder-1.5b-instruct q4 1,8,16 30 2>/dev/null)
    else
      r=$(.venv/bin/python bench-results/profile-zen5-row-costs/microbench/fwd_rows.py qwen2.5-coder-1.5b-instruct q4 1,8,16 30 2>/dev/null)
    fi
    echo "$i $v $r" >> "$OUT"
  done
done
echo DONE >> "$OUT"
