#!/usr/bin/env bash
# Verify-cost curves of one model three ways, alternated by process, ROUNDS rounds (ABC, CBA, ...):
#   logits: `draftsman profile` as before (logits on every row, nothing read);
#   read:   --greedy with DRAFTSMAN_GREEDY_HEAD=0 (the logits stored, then greedy_rows reads them:
#           a greedy verify before the greedy head);
#   head:   --greedy (the records kernel picks the tokens as it multiplies; nothing stored).
# usage: ab_curves.sh OUT ROUNDS TARGET DTYPE [LENGTHS]
set -euo pipefail
out=$1 rounds=$2 target=$3 dtype=$4 lengths=${5:-1,2,4,8,12,16}
mkdir -p "$out"
run() {
  local way=$1 round=$2
  case $way in
    logits) env=(); flag=() ;;
    read) env=(DRAFTSMAN_GREEDY_HEAD=0); flag=(--greedy) ;;
    head) env=(); flag=(--greedy) ;;
  esac
  env "${env[@]}" draftsman profile --target "$target" --dtype "$dtype" --threads 2 \
    --lengths "$lengths" --context 256 --repeats 15 --json "${flag[@]}" \
    > "$out/$target-$dtype-$way-r$round.json"
}
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then order=(logits read head); else order=(head read logits); fi
  for way in "${order[@]}"; do run "$way" "$r"; done
done
python3 - "$out" "$target" "$dtype" <<'PY'
import json, statistics, sys
from pathlib import Path
out, target, dtype = sys.argv[1:]
for way in ("logits", "read", "head"):
    runs = sorted(Path(out).glob(f"{target}-{dtype}-{way}-r*.json"))
    rows = [json.loads(p.read_text()) for p in runs]
    one = [r["latency"]["1"] * 1e3 for r in rows]
    six = [r["latency"]["16"] * 1e3 for r in rows]
    v = [r["round_ratios"]["16"][1] for r in rows]
    print(f"{target} {dtype} {way:6s} L(1) {' '.join(f'{x:.1f}' for x in one)} ms | "
          f"L(16) {' '.join(f'{x:.1f}' for x in six)} ms | v(16) round medians "
          f"{' '.join(f'{x:.3f}' for x in v)} (median {statistics.median(v):.3f})")
PY
