#!/bin/bash
# usage: ab_tree.sh OUTDIR -- suffix branches verified as one tree (greedy), 38f9e05 at /tmp/benchwt
# against /work/main, BAAB; run directories numbered by how many logs precede them
OUT=$1; mkdir -p $OUT
for v in before after after before; do
  if [ "$v" = before ]; then src=/tmp/benchwt/src; else src=/work/main/src; fi
  n=$(ls -d $OUT/$v-* 2>/dev/null | wc -l)
  PYTHONPATH=$src /work/main/.venv/bin/draftsman bench --backend torch --dtype q4 --methods "speculative:draft=suffix,gamma=auto,branches=auto" \
    --dataset humaneval,code-edit --limit 2 --max-new-tokens 128 --no-progress --out $OUT/$v-$((n+1)) > $OUT/$v-$n.log 2>&1
done
