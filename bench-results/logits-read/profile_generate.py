"""cProfile of one 128-token `generate` with the default (torch q4) after a warm-up: the
functions with the most own time. usage: profile_generate.py greedy|sampling (T 0.7, top-p 0.9)"""
import cProfile
import pstats
import sys
import time

from draftsman import engine

PROMPT = ("Write a Python function that parses an ISO 8601 date string and returns a "
          "datetime, with tests.")
sampled = sys.argv[1] == "sampling"
options = {"temperature": 0.7, "top_p": 0.9, "seed": 1} if sampled else {}
e = engine.load(backend="torch", dtype="q4")
e.generate("warm up", max_new_tokens=16, **options)
profile = cProfile.Profile()
start = time.perf_counter()
profile.enable()
e.generate(PROMPT, max_new_tokens=128, **options)
profile.disable()
print("total s", round(time.perf_counter() - start, 3))
pstats.Stats(profile).sort_stats("tottime").print_stats(8)
