#!/bin/bash
# usage: ab_env.sh VAR ROUNDS OUT MODEL DTYPE ROWS REPEATS VALUES...: fwd_rows.py alternated
# over the values of the environment variable VAR (a patch's switch), a line a run
cd /work/main
VAR=$1; R=$2; OUT=$3; M=$4; D=$5; ROWS=$6; REPS=$7; shift 7
for i in $(seq 1 "$R"); do
  for v in "$@"; do
    echo "$i $v $(env "$VAR=$v" .venv/bin/python "$(dirname "$0")/fwd_rows.py" "$M" "$D" "$ROWS" "$REPS" 2>/dev/null)" >> "$OUT"
  done
done
echo DONE >> "$OUT"
