"""`draftsman pipelined-worker`: one sub-worker of `--method pipelined` with
`--option transport=distributed`, on this machine or another, torchrun-style.

Every rank runs with the same RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT variables that
torchrun sets: rank 0 is the `draftsman generate` (or serve, bench) process, ranks 1..k run
this command with the same model, and each takes the rank-th best early guess. It serves
requests until rank 0 stops it, and exits with a one-line error if rank 0 never comes.
"""

from __future__ import annotations

import argparse
import os

from draftsman.device import DEVICE_HELP
from draftsman.errors import InvalidArgumentError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "pipelined-worker", help="a pipelined decoding sub-worker over torch.distributed",
        description=__doc__.split("\n\n")[0].replace("`", ""))
    p.add_argument("--target", required=True, help="the same model rank 0 runs")
    p.add_argument("--dtype", default="bf16", help="the same dtype rank 0 runs (bf16, fp32)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for rank 0 to join and to answer (default 600)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from draftsman.engine import load_bundle
    from draftsman.strategies.pipelined_dist import init_group, serve, torchrun_env

    if not torchrun_env():
        raise InvalidArgumentError("pipelined-worker needs RANK and WORLD_SIZE (and "
                                   "MASTER_ADDR / MASTER_PORT) as torchrun sets them")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not 1 <= rank < world:
        raise InvalidArgumentError(f"pipelined-worker runs ranks 1..{world - 1}; rank 0 is "
                                   "the generating process")
    device = args.device
    if device in ("auto", "cuda") and "LOCAL_RANK" in os.environ:
        import torch

        if torch.cuda.is_available():  # one GPU per rank of a machine, as torchrun places them
            device = f"cuda:{int(os.environ['LOCAL_RANK']) % torch.cuda.device_count()}"
    model = load_bundle(args.target, args.dtype, device=device).model
    init_group(rank, world, model.device, args.timeout)
    import torch.distributed as dist

    try:
        serve(model, rank, args.timeout)
    finally:
        dist.destroy_process_group()
    return 0
