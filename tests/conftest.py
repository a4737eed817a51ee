"""Test-wide settings: tiny models run single-threaded (OpenMP spin-waits make 2 threads on
microsecond-sized ops slower and erratic on a 2-core machine)."""

import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))
