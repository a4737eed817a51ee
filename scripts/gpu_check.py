#!/usr/bin/env python3
"""`make gpu-check`: check and time the GPU path on a lent GPU machine, in one command.

    scripts/gpu_check.py [--carry .gpu-carry] [--out DIR] [--stages a,b,...] [--dry-run]

Runs on a machine that has PyTorch with CUDA, transformers and triton and nothing else of
ours, without network: it installs the project beside its torch (never touching it), then
runs the stages in order, each in a process of its own with a time limit, so a stage that
breaks or hangs costs only itself:
  env       nvidia-smi, versions, measured copy bandwidth and bf16 matrix rate
  test-gpu  `pytest -m gpu` (what `make test-gpu` runs)
  host-cpu  the host CPU at 2 threads, a 2-core machine's share (lent hosts have had AMX,
            which no development machine may have): lscpu, the CPU kernel tests on every
            path it runs (AMX tiles there), every matrix kernel's cost curve
            (scripts/kernel_curves.py) and the default pair's q4/q8 forward curves with
            random blocks of their GGUFs' types (bench/quant_curves.py)
  random    random-weight folders of the default pair's shapes (1.5B, 0.5B; config and
            tokenizer carried, see gpu_carry.py); their forward cost over 1..64 rows, eager
            and static; an interleaved bench: our AR eager, --static (CUDA graphs) and
            --static --compile (engine=torch-bf16+compiled),
            speculative with the 0.5B (fixed and cost-model γ), transformers eager and
            static cache + torch.compile. Every row says weights: random.
  batched   the batched path at 1 / 4 / 8 requests at once on the random 1.5B
            (bench/batch_rates.py: Engine.generate_many, no server)
  breakdown one static 1.5B step's kernels by device time (bench/step_breakdown.py)
  real      SmolLM2-135M from GGUF parts carried beside the tree (joined, hash-checked):
            its cost curve and an interleaved bench of every single-model method against
            transformers. Skipped when its parts did not all arrive.
  report    summary.md (bench/gpu_report.py), with the real pair's speedups predicted from
            the CPU's acceptance and this GPU's cost curve, labelled as predictions.
Everything lands in WORK as it comes; after every stage WORK is packed into
OUT/gpu-check.tar.gz beside OUT/summary.md and OUT/log.txt, so a check cut off keeps what
it measured. `--dry-run` runs the same stages on the CPU with tiny random models in seconds
(the test suite does), so the check keeps working where there is no GPU.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("env", "test-gpu", "host-cpu", "random", "batched", "breakdown", "real", "report")
# sized for one device call (at most 600 s) in a session of 15 device minutes: the H200
# runs of 2026-11-26 took env 12-14 s, test-gpu 20 s warm, random 252 s (--quick 271 s with
# its compiles), batched 96 s; a fresh machine's first test-gpu 100-130 s (cold caches);
# breakdown 28 s a plain run, 66 s a compiled one
TIMEOUTS = {"env": 40, "test-gpu": 150, "host-cpu": 360, "random": 330, "batched": 120,
            "breakdown": 240, "real": 240, "report": 30}
PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
SMALL = "smollm2-135m-instruct"
ACCEPTANCE = ROOT / "bench-results" / "speculative-bf16-avx512"
ROWS = "1,2,4,8,16,32,64"
# the CPU kernels' tests: the tile paths run where the host has AMX
HOST_TESTS = ("test_kquant_kernel.py", "test_q8_records.py", "test_int8_onednn.py",
              "test_decode_ops.py", "test_fused_cpu_step.py", "test_quant.py", "test_q4_draft.py")


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry = args.dry_run
        self.work = args.work.resolve()
        self.out = args.out.resolve()
        self.carry = args.carry.resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = self.out / "log.txt"
        self.env = dict(os.environ, PYTHONUNBUFFERED="1",
                        DRAFTSMAN_HOME=str(self.work / "home"))
        self.device = "cpu" if self.dry else "cuda"
        if self.dry:
            self.share_kernels()
        self.status: dict[str, str] = {}
        self.limits = parse_limits(args.limits)

    def share_kernels(self) -> None:
        """A dry run loads the CPU kernels the caller's store already built (WORK/home is
        a fresh store: compiling them again would cost the suite a minute)."""
        home = os.environ.get("DRAFTSMAN_HOME") or str(Path.home() / ".cache" / "draftsman")
        mine, theirs = self.work / "home" / "kernels", Path(home).expanduser() / "kernels"
        if theirs.is_dir() and not mine.exists():
            mine.parent.mkdir(parents=True, exist_ok=True)
            mine.symlink_to(theirs.resolve(), target_is_directory=True)

    # ---- plumbing ---------------------------------------------------------------------
    def log(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        with open(self.log_path, "a") as f:
            f.write(line + "\n")

    def run(self, argv: list[str], name: str, timeout: float,
            env: dict[str, str] | None = None) -> bool:
        """Run `argv`, its output into WORK/<name>.log; False on failure or time-out."""
        self.log(f"$ {' '.join(map(str, argv))}")
        path = self.work / f"{name}.log"
        with open(path, "a") as f:
            try:
                rc = subprocess.run([str(a) for a in argv], stdout=f, stderr=subprocess.STDOUT,
                                    env=env or self.env, cwd=ROOT,
                                    timeout=max(timeout, 1)).returncode
            except subprocess.TimeoutExpired:
                self.log(f"  timed out after {timeout:.0f} s")
                return False
        if rc != 0:
            tail = path.read_text(errors="replace").splitlines()[-15:]
            self.log(f"  exit {rc}; last lines of {path.name}:\n    " + "\n    ".join(tail))
        return rc == 0

    def draftsman(self, *args: object, name: str, timeout: float) -> bool:
        return self.run([sys.executable, "-m", "draftsman", *args], name, timeout)

    @staticmethod
    def is_result(path: Path) -> bool:
        """What the pack carries back; weights, wheels and the store stay behind."""
        return path.name.startswith("bench-") or path.suffix in (".json", ".jsonl", ".log",
                                                                  ".md")

    def set_aside_other_results(self, commit: str) -> None:
        """Results in WORK from another commit (an earlier session's lease on the same host
        left breakdowns of a 2-layer model in /tmp: compiled-batched) move to WORK/earlier/,
        out of the pack; a later call at the same commit keeps and packs the earlier ones."""
        stamp = self.work / "commit.txt"
        if stamp.is_file() and stamp.read_text().strip() == commit:
            return
        stale = [p for p in self.work.iterdir() if self.is_result(p)]
        if stale:
            aside = self.work / "earlier"
            shutil.rmtree(aside, ignore_errors=True)
            aside.mkdir()
            for path in stale:
                path.rename(aside / path.name)
            self.log(f"  {len(stale)} result(s) of another commit moved to {aside}, not packed")
        stamp.write_text(commit + "\n")

    def pack(self) -> None:
        with tarfile.open(self.out / "gpu-check.tar.gz", "w:gz") as tar:
            for path in sorted(self.work.iterdir()):
                if self.is_result(path):
                    tar.add(path, arcname=path.name)
        summary = self.work / "summary.md"
        if summary.is_file():
            shutil.copy2(summary, self.out / "summary.md")

    # ---- install --------------------------------------------------------------------
    def install(self) -> None:
        """Carried wheels and the project into WORK/site; the machine's torch untouched."""
        site = self.work / "site"
        wheels = sorted((self.carry / "base" / "wheels").glob("*.whl"))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
               "--no-compile", "--target", str(site)]
        if wheels and not self.run([*pip, *wheels], "install", 300):
            self.log("  carried wheels did not install")
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src"), str(site), self.env.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    # ---- stages -----------------------------------------------------------------------
    def stage_env(self, budget: float) -> bool:
        if not self.dry:
            self.run(["nvidia-smi"], "env", 30)
        self.run([sys.executable, "-c", "import torch, transformers, sys; print(sys.version); "
                  "print('torch', torch.__version__, 'cuda', torch.version.cuda, "
                  "torch.cuda.is_available()); print('transformers', transformers.__version__)"
                  ], "env", 60)
        small = ["--copy-mib", "16", "--matmul-n", "256"] if self.dry else []
        return self.run([sys.executable, "-m", "draftsman.bench.device_ceilings", "--device",
                         self.device, "--out", self.work / "ceilings.json", *small], "env",
                        budget)

    def stage_test_gpu(self, budget: float) -> bool:
        if self.dry:  # the suite runs this script; it must not run the suite again
            (self.work / "test-gpu.log").write_text("dry run: pytest -m gpu not run\n")
            return True
        # only the files that hold CUDA tests: the others may import what this machine
        # lacks (fastapi, llama.cpp); a file that still fails to import costs only itself
        files = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").glob("test_*.py")
                       if "devices()" in f.read_text() or "mark.gpu" in f.read_text())
        # one hung test must not take the whole stage: pytest-timeout where the machine has it
        per_test = ["--timeout", "90"] if importlib.util.find_spec("pytest_timeout") else []
        return self.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p",
                         "no:cacheprovider", "-o", "addopts=", "-rfE",
                         "--continue-on-collection-errors", *per_test, *files],
                        "test-gpu", budget)

    def stage_host_cpu(self, budget: float) -> bool:
        """The host CPU as a 2-core machine would run the CPU path: its flags, the kernels
        built for it, their tests, the kernel curves and the pair's quantised forward curves
        (random weights; q8 also forced onto the records, which AMX hosts do not choose)."""
        end = time.monotonic() + budget
        env = dict(self.env, OMP_NUM_THREADS="2")
        self.run(["lscpu"], "host-cpu", 10)
        ok = self.run([sys.executable, "-c", "from draftsman.kernels.native import build, "
                       "kquant_amx, kquant_isa, kquant_records; print(build(True)); "
                       "print('isa', kquant_isa(), 'records', kquant_records(), "
                       "'amx', kquant_amx())"], "host-cpu", 240)
        if not self.dry:  # the suite runs this script; it must not run these tests again
            per_test = ["--timeout", "120"] if importlib.util.find_spec("pytest_timeout") else []
            # a test that crashes the process costs only its worker where xdist is there
            # (a bad shape once crashed Python there: host-amx-h200)
            workers = ["-n", "4"] if importlib.util.find_spec("xdist") else []
            ok &= self.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-o", "addopts=", "-rfEs", "--continue-on-collection-errors",
                            *per_test, *workers,
                            *(f"tests/{t}" for t in HOST_TESTS)], "host-cpu-tests",
                           min(150, end - time.monotonic()), env)
        small = ["--shape", "512x256", "--matrices", "2", "--repeats", "1", "--rows", "1,2"]
        curves = self.work / "host-kernels.jsonl"
        curves.unlink(missing_ok=True)
        ok &= self.run([sys.executable, ROOT / "scripts" / "kernel_curves.py", "--threads", "2",
                        *(small if self.dry else ["--matrices", "24", "--repeats", "5"]),
                        "--out", curves], "host-cpu", min(150, end - time.monotonic()), env)
        self.pack()
        runs = ((PAIR[0], "q4,q8,q8@records"), (PAIR[1], "q4-draft,q4,q8,q8@records"))
        if self.dry:  # one process, both tiny models (the suite runs this)
            runs = ((f"{PAIR[0]},{PAIR[1]}", "q4,q8"),)
        for i, (names, contestants) in enumerate(runs):
            left = (end - time.monotonic()) / (len(runs) - i)
            likes = ",".join(str(self.like(name)) for name in names.split(","))
            ok &= self.run([sys.executable, "-m", "draftsman.bench.quant_curves", "--like",
                            likes, "--contestants", contestants, "--threads", "2",
                            "--build-threads", str(os.cpu_count() or 2),
                            "--rounds", "1" if self.dry else "8",
                            "--lengths", "1,2" if self.dry else "1,2,4,8,16", "--out",
                            self.work / f"host-curves-{names.split(',')[0]}.json"],
                           "host-cpu", left, env)
        return ok

    def like(self, name: str) -> Path:
        """The carried config + tokenizer of `name` (tokenizer.json travels gzipped),
        copied afresh when WORK holds another config under that name."""
        folder = self.work / "like" / name
        src = self.carry / "base" / "like" / name
        if folder.is_dir() and not same_config(folder, src):
            shutil.rmtree(folder)
        if not folder.is_dir():
            shutil.copytree(src, folder)
            for gz in folder.glob("*.gz"):
                gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
                gz.unlink()
        return folder

    def datasets(self) -> list[str]:
        if self.dry:
            return [str(self.carry / "base" / "tiny.jsonl")]
        home = self.work / "home" / "datasets"
        home.mkdir(parents=True, exist_ok=True)
        for path in (self.carry / "base" / "datasets").glob("*"):
            shutil.copy2(path, home / path.name)
        return ["humaneval,mt-bench"]

    def profile(self, folder: Path, model: str, budget: float, rows: str = ROWS) -> None:
        modes = (("static", ["--static"]),) if self.args.quick else \
            (("static", ["--static"]), ("eager", []))
        for mode, extra in modes:
            out = self.work / f"profile-{model}-{mode}.json"
            ok = self.draftsman("profile", "--target", folder, "--device", self.device,
                                "--dtype", "bf16", "--lengths", rows, "--context", "512",
                                "--repeats", "5", "--json", *extra, name=f"profile-{model}",
                                timeout=budget / 2)
            if ok:  # the JSON is the log's last line
                lines = (self.work / f"profile-{model}.log").read_text().splitlines()
                out.write_text(next(x for x in reversed(lines) if x.startswith("{")) + "\n")

    def bench(self, name: str, target: Path, draft: Path | None, methods: list[str],
              peers: str, limit: int, budget: float) -> bool:
        tokens = "16" if self.dry else "128"
        draft_args = ["--draft", draft] if draft else []
        return self.draftsman(
            "bench", "--target", target, *draft_args, "--device", self.device, "--static",
            "--dtype", "bf16", "--methods", ";".join(methods), "--peer", peers,
            "--dataset", *self.datasets(), "--limit", limit, "--max-new-tokens", tokens,
            "--warmup-tokens", "16", "--no-progress", "--out", self.work / f"bench-{name}",
            "--resume", name=f"bench-{name}", timeout=budget)

    def random_folder(self, name: str, like: Path, seed: int) -> Path:
        """WORK/models/random-NAME with LIKE's shapes, drawn unless one of the same config is
        there (a warm machine keeps WORK: a folder left by a run over other configs, the
        dry run's tiny ones say, must not be timed as this one)."""
        folder = self.work / "models" / f"random-{name}"
        if folder.is_dir() and not same_config(folder, like):
            self.log(f"  {folder.name}: config differs from {like.name}'s; drawn again")
            shutil.rmtree(folder)
        if not folder.is_dir():
            self.draftsman("models", "random", like, folder, "--device", self.device,
                           "--seed", seed, name="models", timeout=300)
        return folder

    def stage_random(self, budget: float) -> bool:
        end = time.monotonic() + budget
        target = self.random_folder("1.5b", self.like(PAIR[0]), 0)
        draft = self.random_folder("0.5b", self.like(PAIR[1]), 1)
        if not (target.is_dir() and draft.is_dir()):
            return False
        self.profile(target, "1.5b", min(90, (end - time.monotonic()) / 4))
        self.profile(draft, "0.5b", min(40, (end - time.monotonic()) / 4), rows="1,2,4,8")
        self.pack()
        tokens = "random" if self.dry else ROOT / "src/draftsman/assets/prompt_tokens" / PAIR[0]
        # the compiled AR row: its step fused by torch.compile (one bucket, one compile)
        methods = ["autoregressive", "autoregressive:engine=torch-bf16",
                   "autoregressive:engine=torch-bf16+compiled",
                   "speculative:gamma=4", "speculative:gamma=auto",
                   "speculative:draft=prompt-lookup,gamma=auto",
                   "staged:subdraft=ngram,gamma=4",
                   f"parallel-prompt:prompt_tokens={tokens},tree_size=auto",
                   "big-little:fallback=0.5"]
        peers = "hf:plain,compiled"
        if self.dry:  # inductor takes minutes on a CPU; the suite checks --compile apart
            methods = [m for m in methods if not m.endswith("+compiled")]
        if self.args.quick:  # our AR (static, compiled, eager) and cost-model speculation
            # against transformers compiled and eager: every AR goal in one short run
            quick = ("autoregressive", "autoregressive:engine=torch-bf16+compiled",
                     "autoregressive:engine=torch-bf16", "speculative:gamma=auto")
            methods = [m for m in methods if m in quick]
        return self.bench("random", target, draft, methods, peers, 1, end - time.monotonic())

    def stage_batched(self, budget: float) -> bool:
        """The batched path (one shared forward per step) at 1, 4 and 8 requests at once, on
        the random 1.5B: Engine.generate_many, as the server's scheduler runs it."""
        target = self.random_folder("1.5b", self.like(PAIR[0]), 0)
        return self.run([sys.executable, "-m", "draftsman.bench.batch_rates", "--target", target,
                         "--device", self.device, "--parallel", "1,4,8", "--dataset",
                         ",".join(self.datasets()), "--limit", "1" if self.dry else "4",
                         "--max-new-tokens", "8" if self.dry else "64", "--out",
                         self.work / "batch-rates.json"], "batched", budget)

    def stage_breakdown(self, budget: float) -> bool:
        """One row's static step as graphs replay it, the same step compiled, and the
        one-sequence decode loop beside bare forwards, eager and over compiled static steps
        (what the host adds per token). Each run may use what the ones before left."""
        end = time.monotonic() + budget
        target = self.work / "models" / "random-1.5b"
        runs = [("1", []), ("1-compiled", ["--compile"]), ("loop", ["--loop"]),
                ("loop-compiled", ["--loop", "--compile"])]
        if self.dry:  # inductor takes a while on a CPU; the suite checks --compile apart
            runs = [r for r in runs if "--compile" not in r[1]]
        return all(self.run([sys.executable, "-m", "draftsman.bench.step_breakdown", "--target",
                             target, "--device", self.device, "--rows", "1", *extra, "--out",
                             self.work / f"breakdown-1.5b-{name}.md"], "breakdown",
                            end - time.monotonic())
                   for name, extra in runs)

    def small_model(self) -> Path | None:
        """SmolLM2's converted folder: in the store from joined parts (a dry run: tiny)."""
        if self.dry:
            return self.random_folder("small", self.like(SMALL), 2)
        manifest = next(self.carry.glob(f"part*/{SMALL}.gguf.parts.json"), None)
        if manifest is None:
            self.log(f"  {SMALL}: its parts did not all arrive (no manifest): skipped")
            return None
        joined = self.work / "gguf"
        joined.mkdir(exist_ok=True)
        for part in self.carry.glob(f"part*/{SMALL}.gguf.*"):
            dest = joined / part.name
            if not dest.exists():
                dest.symlink_to(part)
        gguf = joined / f"{SMALL}.gguf"
        if not gguf.is_file() and not self.run(
                [sys.executable, ROOT / "scripts" / "join_gguf.py", joined / manifest.name],
                "real", 120):
            return None
        if not self.draftsman("models", "pull", SMALL, "--from-gguf", gguf, name="real",
                              timeout=300):
            return None
        return self.work / "home" / "models" / SMALL

    def stage_real(self, budget: float) -> bool:
        end = time.monotonic() + budget
        folder = self.small_model()
        if folder is None:
            return False
        self.profile(folder, "smollm2", min(60, (end - time.monotonic()) / 4))
        self.pack()
        methods = ["autoregressive", "autoregressive:engine=torch-bf16",
                   "speculative:draft=prompt-lookup,gamma=auto",
                   "speculative:draft=suffix,gamma=auto",
                   "speculative:draft=prompt-lookup,gamma=8",
                   "speculative:draft=prompt-lookup,gamma=auto,branches=auto",
                   f"big-little:early_exit={1 if self.dry else 15},engine=torch-bf16"]
        return self.bench("smollm2", folder, None, methods, "hf:plain,prompt-lookup,compiled",
                          1 if self.dry else 3, end - time.monotonic())

    def stage_report(self, budget: float) -> bool:
        return self.run([sys.executable, "-m", "draftsman.bench.gpu_report", self.work,
                         "--acceptance", ACCEPTANCE], "report", budget)

    def main(self) -> int:
        stages = [s for s in self.args.stages.split(",") if s]
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            print(f"gpu_check: unknown stage(s) {', '.join(unknown)}; the stages are "
                  f"{', '.join(STAGES)}", file=sys.stderr)
            return 2
        self.log(f"gpu-check: stages {', '.join(stages)} ({'dry run' if self.dry else 'GPU'})")
        end = time.monotonic() + self.args.budget
        self.set_aside_other_results(head_commit())
        self.install()
        for stage in stages:
            t0 = time.monotonic()
            # the report is quick and always written; the others leave it 30 s
            budget = max(30, end - t0) if stage == "report" else end - t0 - 30
            budget = min(self.limits.get(stage, TIMEOUTS[stage]), budget)
            if budget < 10:
                self.log(f"{stage}: skipped (the check's --budget is spent)")
                self.status[stage] = "skipped"
                continue
            try:
                ok = getattr(self, "stage_" + stage.replace("-", "_"))(budget)
            except Exception as exc:  # a broken stage is reported, the next still runs
                self.log(f"  {stage}: {type(exc).__name__}: {exc}")
                ok = False
            self.status[stage] = "ok" if ok else "failed"
            self.log(f"{stage}: {self.status[stage]} ({time.monotonic() - t0:.0f} s)")
            (self.work / "status.json").write_text(json.dumps(self.status, indent=2) + "\n")
            self.pack()
        return 0 if all(v == "ok" for v in self.status.values()) else 1


def head_commit() -> str:
    """The commit this check runs at (HEAD, or DRAFTSMAN_COMMIT where the machine's git does
    not hold it; a new session's calls are on a new one)."""
    if os.environ.get("DRAFTSMAN_COMMIT"):
        return os.environ["DRAFTSMAN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30).stdout.strip() or "no-git"
    except (OSError, subprocess.TimeoutExpired):
        return "no-git"


SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "model_type")


def same_config(a: Path, b: Path) -> bool:
    """Whether two model folders' config.json agree on every shape that timing depends on."""
    try:
        ca, cb = (json.loads((f / "config.json").read_text()) for f in (a, b))
    except (OSError, ValueError):
        return False
    return all(ca.get(k) == cb.get(k) for k in SHAPE_KEYS)


def parse_limits(text: str) -> dict[str, float]:
    """`random=300,test-gpu=120` -> {stage: seconds}; a clear error for anything else."""
    limits: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        stage, _, seconds = item.partition("=")
        if stage not in STAGES or not seconds.replace(".", "", 1).isdigit():
            raise SystemExit(f"gpu_check: --limits wants STAGE=SECONDS items with a stage of "
                             f"{', '.join(STAGES)}; got {item!r}")
        limits[stage] = float(seconds)
    return limits


def dry_carry(carry: Path) -> None:
    """A carry folder for --dry-run: tiny configs and tokenizer, a tiny dataset. Refuses a
    folder that holds a real carry (its wheels): tiny configs written over the real ones
    would have the GPU time models of the wrong shapes."""
    if (carry / "base" / "wheels").is_dir():
        raise SystemExit(f"gpu_check: {carry} holds a real carry (base/wheels); give the dry "
                         f"run another --carry (its default is WORK/dry-carry)")
    sys.path.insert(0, str(ROOT / "src"))
    from draftsman.testing.tiny_models import tiny_config_folder, tiny_dataset

    for i, name in enumerate((*PAIR, SMALL)):
        tiny_config_folder(carry / "base" / "like" / name, layers=2 + (i == 0))
    tiny_dataset(carry / "base" / "tiny.jsonl")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--carry", type=Path, default=None,
                   help="what scripts/gpu_carry.py prepared (default: .gpu-carry; with "
                        "--dry-run: WORK/dry-carry, made on the spot)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")),
                   help="where the packed results go (default: $OUT, else gpu-check-out)")
    p.add_argument("--work", type=Path, default=Path("/tmp/draftsman-gpu-check"),
                   help="working folder (models, logs, results)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"of {', '.join(STAGES)}")
    p.add_argument("--budget", type=float, default=540,
                   help="seconds for all stages; a stage gets what is left (default 540: one "
                        "device call runs at most 600 s)")
    p.add_argument("--limits", default="",
                   help="per-stage caps in seconds, e.g. random=300,test-gpu=120 (default: "
                        + ", ".join(f"{k} {v}" for k, v in TIMEOUTS.items()) + ")")
    p.add_argument("--quick", action="store_true",
                   help="random stage: static profiles only; our AR (static, compiled, "
                        "eager), cost-model speculation and transformers (compiled, eager) "
                        "only (a re-check after a fix)")
    p.add_argument("--dry-run", action="store_true",
                   help="on the CPU with tiny random models (seconds): keeps the check working")
    args = p.parse_args(argv)
    if args.carry is None:
        args.carry = args.work / "dry-carry" if args.dry_run else ROOT / ".gpu-carry"
    if args.dry_run and not (args.carry / "base" / "tiny.jsonl").is_file():
        dry_carry(args.carry)
    return Check(args).main()


if __name__ == "__main__":
    sys.exit(main())
