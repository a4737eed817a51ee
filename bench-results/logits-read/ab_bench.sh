#!/bin/bash
# usage: ab_bench.sh OUTDIR ROUNDS -- before (/tmp/benchwt) and after (/work/main), alternated ABBA;
# each run: draftsman bench, torch q4, default + autoregressive, 2 HumanEval + 2 code-edit prompts;
# EXTRA (environment): more bench options, e.g. EXTRA="--temperature 0.7 --top-p 0.9 --seed 1"
OUT=$1; R=$2; mkdir -p $OUT
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    if [ "$v" = before ]; then src=/tmp/benchwt/src; else src=/work/main/src; fi
    PYTHONPATH=$src /work/main/.venv/bin/draftsman bench --backend torch --dtype q4 --methods default $EXTRA \
      --dataset humaneval,code-edit --limit 2 --max-new-tokens 128 --no-progress --out $OUT/$v-$i > $OUT/$v-$i.log 2>&1
    echo "$v $i done" >> $OUT/progress
  done
done
