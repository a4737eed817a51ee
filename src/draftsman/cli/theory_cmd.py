"""`draftsman theory ...`: what the analytic models predict, before anything is timed.

    theory speculative   Leviathan et al.: expected tokens per step, speedup, optimal γ
    theory pipelined     Yang et al., Theorem 4.1 and eqs. 3/5/6, checked against the
                         timeline simulator; trade-off plots from measured p̂_correct
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from draftsman.analysis.match_rate import TASK_LABELS
from draftsman.cli.common import add_group, float_list
from draftsman.errors import InvalidArgumentError
from draftsman.profiling import interpolate, load_profile
from draftsman.theory import pipelined as pt
from draftsman.theory import speculative as theory


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = add_group(
        subparsers, "theory", "METHOD",
        help="analytic speedup models (speculative, pipelined)",
        description="Expected speedups and costs from the papers' analyses.")

    s = sub.add_parser("speculative", help="tokens per step, speedup and optimal γ",
                       description="Leviathan et al., eq. 1, Theorem 3.8, Corollary 3.9.")
    s.add_argument("--alpha", required=True, help="acceptance rate(s), comma separated")
    s.add_argument("--c", required=True,
                   help="cost of a draft forward relative to a target forward (several, "
                        "comma separated, to see how cheap a draft must be)")
    s.add_argument("--gamma", default="1,2,3,4,5,6,7,8", help="γ values to tabulate")
    s.add_argument("--verify-profile", type=Path, default=None, metavar="PROFILE",
                   help="a forward-cost profile of the target (the JSON `draftsman profile` "
                        "writes): verifying γ+1 tokens then costs v(γ+1) = L(γ+1) / L(1) "
                        "target forwards as measured, not 1 as in the paper")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=run_speculative)

    p = sub.add_parser(
        "pipelined", help="latency / compute of predictive pipelined decoding",
        description="Theorem 4.1 (expected latency and compute in layer-time units), the "
                    "approximations of eqs. 3, 5 and 6, and a Monte Carlo run of the "
                    "timeline simulator on i.i.d. matches; --from plots Figures 3 and 4 "
                    "from the p̂ measured by `draftsman analyze match-rate`.")
    p.add_argument("--d", type=int, default=40, help="layers (default 40, Vicuna-13B)")
    p.add_argument("--d-bar", type=int, default=None, help="early layer (default d/2)")
    p.add_argument("--length", type=int, default=128, help="tokens generated (ℓ)")
    p.add_argument("--p", default="0.216,0.321,0.389",
                   help="p_correct value(s) (default: the paper's k=1 shared-head rates)")
    p.add_argument("--k", default="1,3,5", help="sub-worker counts")
    p.add_argument("--simulate", type=int, default=2000,
                   help="Monte Carlo trials of the simulator per row (0: skip)")
    p.add_argument("--from", dest="source", type=Path, default=None,
                   help="match_rate.json from `analyze match-rate`: plot Figures 3-4")
    p.add_argument("--plot", type=Path, default=None, help="output PNG path prefix")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_pipelined)


def run_speculative(args: argparse.Namespace) -> int:
    gammas = [int(g) for g in float_list(args.gamma, "gamma")]
    costs = float_list(args.c, "c")
    if any(c < 0 for c in costs):
        raise InvalidArgumentError(f"--c must be >= 0, got {args.c}")
    verify = None if args.verify_profile is None else verify_curve(args.verify_profile)
    rows = []
    for a in float_list(args.alpha, "alpha"):
        if not 0 <= a <= 1:
            raise InvalidArgumentError(f"alpha must be in [0, 1], got {a}")
        for c in costs:
            rows.extend(speculative_rows(a, c, gammas, verify))
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'alpha':>6} {'c':>5} {'gamma':>6} {'tokens/step':>12} {'v(γ+1)':>7} {'speedup':>8}")
    for r in rows:
        if "gamma" in r:
            print(f"{r['alpha']:>6.2f} {r['c']:>5.2f} {r['gamma']:>6} "
                  f"{r['tokens_per_step']:>12.3f} {r['verify_cost']:>7.2f} {r['speedup']:>8.3f}")
        else:
            print(f"{r['alpha']:>6.2f} {r['c']:>5.2f} optimal γ = {r['optimal_gamma']}, speedup "
                  f"{r['best_speedup']:.3f} (speedup possible: {r['speedup_possible']})")
    return 0


def verify_curve(path: Path) -> Callable[[int], float]:
    """v(n) = L(n) / L(1) from a saved forward-cost profile (piecewise linear between the
    measured lengths, linear past the last)."""
    try:
        latency = load_profile(path, any_build=True) if path.suffix == ".json" else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        latency = None  # unreadable, not JSON, or JSON of another shape
    if not latency:
        raise InvalidArgumentError(f"--verify-profile {path}: not a profile JSON "
                                   "(`draftsman profile` writes them)")
    one = interpolate(latency, 1)
    return lambda n: interpolate(latency, n) / one


def speculative_rows(alpha: float, c: float, gammas: list[int],
                     verify: Callable[[int], float] | None) -> list[dict]:
    """One row per γ, then the optimum: with `verify`, each step's verify costs v(γ+1)
    target forwards (expected_speedup_with_verify_cost); without, 1 (Theorem 3.8)."""
    rows = []
    for g in gammas:
        v = 1.0 if verify is None else verify(g + 1)
        rows.append({"alpha": alpha, "c": c, "gamma": g, "verify_cost": v,
                     "tokens_per_step": theory.expected_tokens_per_step(alpha, g),
                     "speedup": theory.expected_speedup_with_verify_cost(alpha, g, c, v)})
    if verify is None:
        best = theory.optimal_gamma(alpha, c)
        speedup = theory.expected_speedup(alpha, best, c) if best else 1.0
    else:
        best, speedup = theory.optimal_gamma_with_verify_cost(alpha, c, verify)
    rows.append({"alpha": alpha, "c": c, "optimal_gamma": best, "best_speedup": speedup,
                 "speedup_possible": best > 0})
    return rows


def run_pipelined(args: argparse.Namespace) -> int:
    d = args.d
    d_bar = d // 2 if args.d_bar is None else args.d_bar
    pt.check(d, d_bar)
    ell = args.length
    if ell < 1:
        raise InvalidArgumentError("--length must be >= 1")
    ks = [int(k) for k in float_list(args.k, "k")]
    frac = d_bar / d
    rows = []
    for p in float_list(args.p, "p"):
        if not 0 <= p <= 1:
            raise InvalidArgumentError(f"p must be in [0, 1], got {p}")
        for k in ks:
            lat = pt.expected_latency(d, d_bar, ell, p)
            comp = pt.expected_compute(d, d_bar, ell, p, k)
            row = {"p": p, "k": k, "latency": lat, "compute": comp,
                   "latency_ratio": lat / (d * ell), "compute_ratio": comp / (d * ell),
                   "eq3_latency_per_token": pt.latency_per_token(p, frac),
                   "eq5_compute_per_time": pt.compute_per_time(p, k, frac),
                   "eq6_compute_per_token": pt.compute_per_token(p, k, frac)}
            if args.simulate:
                sl, sc = pt.monte_carlo(d, d_bar, ell, p, k, args.simulate)
                row.update(sim_latency=sl, sim_compute=sc)
            rows.append(row)
    written = []
    if args.source is not None:
        written = plot_from_match_rate(args.source, args.plot)
    if args.json:
        print(json.dumps({"d": d, "d_bar": d_bar, "length": ell, "rows": rows,
                          "plots": [str(w) for w in written]}))
        return 0
    print(f"d = {d}, d̄ = {d_bar}, ℓ = {ell} (layer-time units; greedy = dℓ = {d * ell})")
    head = (f"{'p':>6} {'k':>3} {'E[latency]':>11} {'sim':>9} {'/greedy':>8} {'E[compute]':>11} "
            f"{'sim':>9} {'/greedy':>8} {'eq3':>6} {'eq5':>6} {'eq6':>6}")
    print(head)
    for r in rows:
        print(f"{r['p']:>6.3f} {r['k']:>3} {r['latency']:>11.1f} "
              f"{r.get('sim_latency', float('nan')):>9.1f} {r['latency_ratio']:>8.3f} "
              f"{r['compute']:>11.1f} {r.get('sim_compute', float('nan')):>9.1f} "
              f"{r['compute_ratio']:>8.3f} {r['eq3_latency_per_token']:>6.3f} "
              f"{r['eq5_compute_per_time']:>6.3f} {r['eq6_compute_per_token']:>6.3f}")
    print("eq3: latency per token / d; eq5: busy compute units per time unit; "
          "eq6: compute per token / d (ℓ >> 1)")
    for w in written:
        print(f"wrote {w}")
    return 0


def plot_from_match_rate(source: Path, plot: Path | None) -> list[Path]:
    """Figures 3-4 from a match_rate.json (p̂ at d̄ = d/2, every task, N and Y)."""
    data = json.loads(Path(source).read_text())
    depth = data["depth"]
    half = str(depth // 2)
    p_fig: dict[str, dict[int, float]] = {}
    for task, by_layer in data["summary"].get("greedy", {}).items():
        for k, by_head in by_layer.get(half, {}).items():
            for flag, cell in by_head.items():
                label = TASK_LABELS.get(task, task) + (" tr" if flag == "Y" else "")
                p_fig.setdefault(label, {})[int(k)] = cell["rate"]
    if not p_fig:
        raise InvalidArgumentError(f"{source} has no greedy match rates at layer {half}")
    out = plot or Path(source).with_name("tradeoff.png")
    return pt.plot_tradeoff(p_fig, out, data.get("model", ""), d_bar_fraction=int(half) / depth)
