"""Test-wide settings: tiny models run single-threaded (OpenMP spin-waits make 2 threads on
microsecond-sized ops slower and erratic on a 2-core machine); forward-cost profiles go to
a folder of the session's own (curves measured under the suite's load, with short contexts
and few repeats, once replaced the machine's real ones, which the cost model then read);
packed weights are not kept on disk."""

import os
import sys
import tempfile
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("DRAFTSMAN_PROFILES", tempfile.mkdtemp(prefix="draftsman-profiles-"))
# no packed-weight entries from the suite: its many (model, format, length, vocabulary) loads
# would each write a GB-sized entry few later loads read (tests/test_packed_cache.py turns
# it on for its own folder)
os.environ.setdefault("DRAFTSMAN_PACKED_CACHE", "0")
