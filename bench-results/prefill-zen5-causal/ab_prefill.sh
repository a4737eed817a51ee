#!/bin/bash
# usage: ab_prefill.sh OUT ROUNDS TOKENS: ms of prefills of a TOKENS-long prompt, b392608 (a
# worktree at /tmp/benchwt: before) and /work/main (after), alternated in ABBA order
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$1; R=$2; N=$3
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    if [ "$v" = before ]; then src=/tmp/benchwt/src; else src=/work/main/src; fi
    ms=$(PYTHONPATH=$src /work/main/.venv/bin/python "$HERE/prefill.py" "$N" 3 2>/dev/null | awk '{print $2}' | tr '\n' ' ')
    echo "$i $v $ms" >> "$OUT"
  done
done
