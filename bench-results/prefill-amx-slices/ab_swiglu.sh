#!/bin/bash
# usage: ab_swiglu.sh OUT ROUNDS TOKENS: prefills of /work/main with the SwiGLU epilogue on (1) and
# off (0, silu_mul after the gate/up product: DRAFTSMAN_SWIGLU_EPILOGUE), in ABBA order
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$1; R=$2; N=$3
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) -eq 1 ]; then order="0 1"; else order="1 0"; fi
  for v in $order; do
    ms=$(DRAFTSMAN_SWIGLU_EPILOGUE=$v PYTHONPATH=/work/main/src /work/main/.venv/bin/python \
      "$HERE/../prefill-zen5-causal/prefill.py" "$N" 3 2>/dev/null | awk '{print $2}' | tr '\n' ' ')
    echo "$i epilogue=$v $ms" >> "$OUT"
  done
done
