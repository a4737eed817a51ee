#!/bin/bash
# usage: ab_bench.sh OUTDIR ROUNDS -- the greedy head off (DRAFTSMAN_GREEDY_HEAD=0: logits stored, then
# greedy_rows reads them) and on, one tree, alternated ABBA; each run: draftsman bench, torch q4,
# default + autoregressive, 2 HumanEval + 2 code-edit prompts, greedy; EXTRA (environment): more options
OUT=$1; R=$2; mkdir -p $OUT
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="off on"; else order="on off"; fi
  for v in $order; do
    if [ "$v" = off ]; then head=0; else head=1; fi
    DRAFTSMAN_GREEDY_HEAD=$head /work/main/.venv/bin/draftsman bench --backend torch --dtype q4 --methods default $EXTRA \
      --dataset humaneval,code-edit --limit 2 --max-new-tokens 128 --no-progress --out $OUT/$v-$i > $OUT/$v-$i.log 2>&1
    echo "$v $i done" >> $OUT/progress
  done
done
