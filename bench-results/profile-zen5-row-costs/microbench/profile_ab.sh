#!/bin/bash
# usage: profile_ab.sh ROUNDS OUT: alternates a worktree of the base commit at /tmp/base and
# the working tree on draftsman profile (0.5B q8, 1.5B q8, 1.5B q4), a latency line a run
cd /work/main
ROUNDS=$1; OUT=$2
for i in $(seq 1 $ROUNDS); do
  for m in "qwen2.5-coder-0.5b-instruct q8" "qwen2.5-coder-1.5b-instruct q8" "qwen2.5-coder-1.5b-instruct q4"; do
    set -- $m
    for e in base new; do
      if [ $e = base ]; then P=/tmp/base/src; else P=/work/main/src; fi
      PYTHONPATH=$P .venv/bin/python -c "import sys; from draftsman.cli.main import main; sys.argv=['draftsman']+sys.argv[1:]; sys.exit(main())" profile --target $1 --dtype $2 --threads 2 --lengths 1,2,4,6,8,12,16 --repeats 9 --json 2>/dev/null | .venv/bin/python -c "
import json,sys; d=json.load(sys.stdin)['latency']; print('$i $e $1 $2', ' '.join('%s:%.2f' % (k, v*1e3) for k, v in d.items()), ' v8 %.2f v16 %.2f' % (d['8']/d['1'], d['16']/d['1']))" >> $OUT
    done
  done
done
