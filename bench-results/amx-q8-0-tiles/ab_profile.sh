#!/bin/bash
# usage: ab_profile.sh OUT ROUNDS TARGET DTYPE LENGTHS: `draftsman profile` at LENGTHS (comma
# separated, the first 1) before (a worktree at /tmp/benchwt) and after (/work/main),
# alternated in ABBA order; one line a run: build, then ms at each length
OUT=$1; R=$2; T=$3; D=$4; L=$5
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    if [ "$v" = before ]; then src=/tmp/benchwt/src; else src=/work/main/src; fi
    PYTHONPATH=$src /work/main/.venv/bin/draftsman profile --target "$T" --dtype "$D" --threads 2 \
      --lengths "$L" --context 256 --repeats 5 --json > /tmp/abp.json 2>/dev/null
    /work/main/.venv/bin/python -c "import json; d=json.load(open('/tmp/abp.json'))['latency']; print('$v', *(round(d[k]*1e3,2) for k in '$L'.split(',')))" >> "$OUT"
  done
done
