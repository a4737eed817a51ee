#!/bin/bash
# usage: ab_prefill.sh OUT ROUNDS TOKENS: ms of 3 prefills of a TOKENS-long prompt a run, before (a worktree of 8740976 at /tmp/benchwt) and after (/work/main), in ABBA order
OUT=$1; R=$2; N=$3
P=/work/main/bench-results/prefill-zen5-causal/prefill.py
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    if [ "$v" = before ]; then src=/tmp/benchwt/src; else src=/work/main/src; fi
    ms=$(PYTHONPATH=$src /work/main/.venv/bin/python "$P" "$N" 3 2>/dev/null | awk '{print $2}' | tr '\n' ' ')
    echo "$i $v $ms" >> "$OUT"
  done
done
