"""`draftsman profile` of the 0.5B q4 with its Q8_0 matrices on tiles from the measured crossing
("tiles", as shipped) or on vectors up to 16 rows ("vectors": Q8_0 taken out of
kernels/tile_rows.TILED in this process), one line a run: path, ms at each length.

    python q8_0_paths.py tiles|vectors LENGTHS
"""

import contextlib
import io
import json
import sys

import draftsman.kernels.tile_rows as tile_rows
from draftsman.cli.main import main

if sys.argv[1] == "vectors":
    tile_rows.TILED = tuple(q for q in tile_rows.TILED if q != 8)
lengths = sys.argv[2]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["profile", "--target", "qwen2.5-coder-0.5b-instruct", "--dtype", "q4", "--threads", "2",
          "--lengths", lengths, "--context", "256", "--repeats", "5", "--json"])
latency = json.loads(out.getvalue())["latency"]
print(sys.argv[1], *(round(latency[k] * 1e3, 2) for k in lengths.split(",")))
