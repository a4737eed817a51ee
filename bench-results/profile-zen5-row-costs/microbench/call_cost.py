"""us a call of the records kernel on N distinct random Q4_K matrices of one shape, taken in
turn (more than the caches hold: each call streams its weights, as in a forward), per row
count: python call_cost.py OUT,IN MATRICES ROWS,... (run from the repository root)."""

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from kernel_curves import q4k_blocks  # noqa: E402

from draftsman.kernels.native import kquant_records  # noqa: E402
from draftsman.models.quant_linear import KQuantRecordsMatrix  # noqa: E402


def main() -> None:
    out, inner = (int(v) for v in sys.argv[1].split(","))
    count, row_counts = int(sys.argv[2]), [int(r) for r in sys.argv[3].split(",")]
    if not kquant_records():
        sys.exit("no K-quant records on this CPU or build")
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    mats = [KQuantRecordsMatrix([q4k_blocks(out, inner, rng)]) for _ in range(count)]
    with torch.inference_mode():
        for rows in row_counts:
            x = torch.randn(rows, inner, dtype=torch.bfloat16)
            for m in mats:
                m(x)
            sweeps = []
            for _ in range(30):
                start = time.perf_counter()
                for m in mats:
                    m(x)
                sweeps.append((time.perf_counter() - start) / count)
            print(f"{out}x{inner}, {count} matrices, {rows} rows: "
                  f"{statistics.median(sweeps) * 1e6:.1f} us a call")


if __name__ == "__main__":
    main()
