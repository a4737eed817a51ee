"""Start the servers of the load benchmark, run `draftsman loadtest` against them, stop them.

    .venv/bin/python scripts/load_bench.py --out bench-results/load-amx

Contestants, each on the same GGUF (the target's Q4_K file) and the same threads:
- ours, batched: `draftsman serve --dtype q4 --parallel P` with no --method, so requests
  get what `serve` runs by default on this machine (the fastest exact method its last
  `bench --preset cpu` recorded; the servers' /v1/models cards, saved in `servers.json`,
  say which), timed as it is (`+default`), with prompt lookup asked per request
  (`+lookup`, gamma=auto), with speculation off (`+plain`) and, with --trees, with
  prompt-lookup trees (`branches=auto`); the load-adaptive controller is on throughout;
- ours, batched under a row budget: with --max-step-rows N, one more server per N with
  `serve --max-step-rows N` (every shared step at most N rows), default and lookup;
- ours as before batching: the same with `--no-batch` (one worker thread per request);
- ours on the llama.cpp backend, batched (one llama_decode per step), prompt lookup;
- llama.cpp's `llama-server -np P` from the same vendored source (built by
  `scripts/build_llama_cpp.sh .venv llama-server`), skipped with a line if not built.
P is the largest concurrency, so every level has a slot per client. Servers idle while
another is timed; nothing else should run on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
GGUF_HOME = Path(os.environ.get("DRAFTSMAN_HOME", Path.home() / ".cache" / "draftsman")) / "gguf"


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server at {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"server at {url} not healthy after {timeout} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--rate", default=None, help="also Poisson arrivals (requests/s)")
    p.add_argument("--limit", type=int, default=3, help="prompts per dataset")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--only", default=None,
                   help="run only these servers, comma separated (ours-batched, ours-no-batch, "
                        "ours-llama.cpp, llama-server; default: all)")
    p.add_argument("--prefill-stall", default="2.0",
                   help="our batched server's --prefill-stall; several (comma separated) start "
                        "one batched server each, labelled by the value (default 2.0)")
    p.add_argument("--bound-guesses", action="store_true",
                   help="each batched server also bounds its shared steps' guesses at its "
                        "--prefill-stall value (serve --max-step-cost)")
    p.add_argument("--max-step-cost", default=None,
                   help="per batched server, in --prefill-stall's order: its serve "
                        "--max-step-cost, or off (e.g. off,1.5,1.3 with --prefill-stall "
                        "2.0,1.5,1.3)")
    p.add_argument("--max-step-rows", default=None,
                   help="also one batched server per value (comma separated) with that serve "
                        "--max-step-rows, labelled ours-batched@rowsN")
    p.add_argument("--trees", action="store_true",
                   help="also time tree requests on our batched server (prompt lookup, "
                        "branches=auto: their trees share the batched forward)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    stalls = [s.strip() for s in args.prefill_stall.split(",") if s.strip()]
    if args.max_step_cost is not None and args.bound_guesses:
        raise SystemExit("--max-step-cost and --bound-guesses: give one of them")
    bounds = ([b.strip() for b in args.max_step_cost.split(",")] if args.max_step_cost
              else [v if args.bound_guesses else "off" for v in stalls])
    if len(bounds) != len(stalls):
        raise SystemExit(f"--max-step-cost: {len(bounds)} values for {len(stalls)} "
                         "--prefill-stall values")
    parallel = max(int(c) for c in args.concurrency.split(","))
    serve = [str(VENV / "bin" / "draftsman"), "serve", "--target", args.target, "--backend",
             "torch", "--dtype", "q4", "--threads", str(args.threads), "--parallel",
             str(parallel), "--max-queue", "64", "--log-level", "warning",
             # every round repeats the same prompts: the suffix drafter's memory of earlier
             # replies would draft them whole from the second round on (distinct users'
             # prompts are not all repeats); as llama-server's prompt cache is off below
             "--history-tokens", "0"]
    on_llama = list(serve)
    on_llama[on_llama.index("torch")] = "llama.cpp"
    del on_llama[on_llama.index("--dtype"):on_llama.index("--dtype") + 2]
    def stall(i: int) -> list[str]:
        bound = bounds[i]
        return ["--prefill-stall", stalls[i]] + ([] if bound == "off" else
                                                 ["--max-step-cost", bound])

    def label(i: int) -> str:
        return f"ours-batched@stall{stalls[i]}" + ("" if bounds[i] == "off" else
                                                  f",step{bounds[i]}")

    commands = {
        "ours-batched": (8101, serve + ["--port", "8101", *stall(0)]),
        **{label(i): (8110 + i, serve + ["--port", str(8110 + i), *stall(i)])
           for i in range(1, len(stalls))},
        **{f"ours-batched@rows{n}": (8120 + i, serve + ["--port", str(8120 + i),
                                                        "--max-step-rows", n])
           for i, n in enumerate(v.strip() for v in (args.max_step_rows or "").split(",")
                                 if v.strip())},
        "ours-no-batch": (8102, serve + ["--port", "8102", "--no-batch"]),
        "ours-llama.cpp": (8104, on_llama + ["--port", "8104"]),
    }
    llama_server = VENV / "llama.cpp" / "bin" / "llama-server"
    if llama_server.exists():
        commands["llama-server"] = (8103, [
            str(llama_server), "-m", str(GGUF_HOME / f"{args.target}.gguf"), "-t",
            str(args.threads), "-tb", str(args.threads), "-np", str(parallel), "-c",
            str(2048 * parallel), "--port", "8103", "--jinja"])
    else:
        print(f"llama-server not built ({llama_server}); run scripts/build_llama_cpp.sh "
              ".venv llama-server to include it", file=sys.stderr)
    if args.only:
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        wanted |= {name for name in commands if name.startswith("ours-batched@")
                   and "ours-batched" in wanted}
        unknown = wanted - set(commands) - {"llama-server"}
        if unknown:
            raise SystemExit(f"--only: unknown server(s) {', '.join(sorted(unknown))}")
        commands = {name: c for name, c in commands.items() if name in wanted}
    env = {**os.environ, "LD_LIBRARY_PATH": str(VENV / "llama.cpp" / "lib")}
    procs = {}
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        for name, (_, cmd) in commands.items():
            with open(logs / f"{name}.log", "w") as log:  # the child keeps its own handle
                procs[name] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                               stderr=log)
        for name, (port, _) in commands.items():
            wait_healthy(f"http://127.0.0.1:{port}", procs[name])
        off = json.dumps({"draftsman": {"method": "autoregressive"}})
        lookup = json.dumps({"draftsman": {"method": "speculative", "draft": "prompt-lookup",
                                           "gamma": "auto"}})
        trees = json.dumps({"draftsman": {"method": "speculative", "draft": "prompt-lookup",
                                          "gamma": "auto", "branches": "auto"}})
        urls = {"ours-batched": ["ours-batched+default=http://127.0.0.1:8101",
                                 f"ours-batched+lookup=http://127.0.0.1:8101#{lookup}",
                                 f"ours-batched+plain=http://127.0.0.1:8101#{off}",
                                 *([f"ours-batched+trees=http://127.0.0.1:8101#{trees}"]
                                   if args.trees else [])],
                "ours-no-batch": [f"ours-no-batch+lookup=http://127.0.0.1:8102#{lookup}"],
                "ours-llama.cpp": [
                    f"ours-llama.cpp-batched+lookup=http://127.0.0.1:8104#{lookup}"]}
        for name, (port, _) in commands.items():
            if name.startswith("ours-batched@"):
                urls[name] = [f"{name}+default=http://127.0.0.1:{port}",
                              f"{name}+lookup=http://127.0.0.1:{port}#{lookup}"]
        args.out.mkdir(parents=True, exist_ok=True)
        cards = {}
        for name, (port, _) in commands.items():
            if name != "llama-server":  # what each of ours runs when a request names nothing
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models") as r:
                    cards[name] = json.load(r)["data"][0].get("draftsman")
        (args.out / "servers.json").write_text(json.dumps(cards, indent=1) + "\n")
        servers = [url for name in commands for url in urls.get(name, [])]
        if "llama-server" in commands:
            # every round repeats the prompts: llama-server's prompt cache would skip their
            # prefill from the second round on, which distinct users never get (ours has none)
            servers.append('llama-server=http://127.0.0.1:8103#{"cache_prompt": false}')
        cmd = [str(VENV / "bin" / "draftsman"), "loadtest", "--concurrency",
               args.concurrency, "--limit", str(args.limit), "--max-tokens",
               str(args.max_tokens), "--rounds", str(args.rounds), "--out", str(args.out)]
        if args.rate:
            cmd += ["--rate", args.rate]
        for s in servers:
            cmd += ["--server", s]
        (args.out / "command.txt").write_text(" ".join(sys.argv) + "\n" + " ".join(cmd) + "\n"
                                              + json.dumps({k: c for k, (_, c) in
                                                            commands.items()}, indent=1))
        return subprocess.run(cmd, env=env).returncode
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(30)


if __name__ == "__main__":
    raise SystemExit(main())
