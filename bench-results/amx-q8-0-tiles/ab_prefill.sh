#!/bin/bash
# usage: ab_prefill.sh OUT ROUNDS TOKENS MODEL: ms of 3 prefills of a TOKENS-long random prompt
# on MODEL's q4 (../prefill-zen5-causal/prefill.py), before (a worktree at /tmp/benchwt) and
# after (/work/main), alternated in ABBA order
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$1; R=$2; N=$3; M=$4
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    if [ "$v" = before ]; then src=/tmp/benchwt/src; else src=/work/main/src; fi
    ms=$(PYTHONPATH=$src /work/main/.venv/bin/python "$HERE/../prefill-zen5-causal/prefill.py" "$N" 3 "$M" \
      2>/dev/null | awk '{print $2}' | tr '\n' ' ')
    echo "$i $v $ms" >> "$OUT"
  done
done
