"""The analytic models against numbers worked out by hand from the papers' formulas.

Every expected value below is hard-coded, with its arithmetic in a comment, so a wrong
formula in draftsman.theory cannot agree with itself. Where a paper prints numbers of its
own (Leviathan et al. appendix A.5, Yang et al. section 5), the test reproduces them too.

Leviathan, Kalman, Matias 2023 (shared/papers/003_*): α per-guess acceptance, γ guesses,
c draft/target cost ratio.
    E[tokens per step]  = (1 - α^(γ+1)) / (1 - α)                 (eq. 1)
    walltime speedup    = (1 - α^(γ+1)) / ((1 - α)(γc + 1))       (Theorem 3.8)
    optimal γ           = the integer γ maximising the speedup    (section 3.5)
    oracle bound        = E[n + 1] / (E[n] c + 1) with n ~ Geometric, P(n) = α^n (1 - α),
                          E[n] = α / (1 - α), so 1 / (1 - α + α c)  (section 3.5: an oracle
                          drafts exactly the n guesses the target will accept, and the target
                          still runs once per step)

Yang et al., Predictive Pipelined Decoding (shared/papers/000_*), Theorem 4.1 and eqs. 3, 5, 6.
"""

from __future__ import annotations

import pytest

from draftsman.theory import pipelined as ppd
from draftsman.theory.speculative import (
    expected_speedup,
    expected_speedup_with_verify_cost,
    expected_tokens_per_step,
    optimal_gamma,
    optimal_gamma_with_verify_cost,
    oracle_speedup,
    oracle_speedup_from_runs,
    speedup_possible,
)

# ----------------------------------------------------------------------------- eq. 1, Thm 3.8

# (α, γ, c, E[tokens per step], speedup)
HAND = [
    # 0.8^5 = 0.32768; E = (1 - 0.32768) / 0.2 = 0.67232 / 0.2 = 3.3616
    # γc + 1 = 4·0.05 + 1 = 1.2; speedup = 3.3616 / 1.2 = 2.801333...
    (0.8, 4, 0.05, 3.3616, 2.8013333333333),
    # 0.6^4 = 0.1296; E = 0.8704 / 0.4 = 2.176; γc + 1 = 1.3; 2.176 / 1.3 = 1.6738461538
    (0.6, 3, 0.1, 2.176, 1.6738461538462),
    # 0.5^2 = 0.25; E = 0.75 / 0.5 = 1.5; c = 0: speedup = E = 1.5
    (0.5, 1, 0.0, 1.5, 1.5),
    # 0.9^11 = 0.31381059609; E = 0.68618940391 / 0.1 = 6.8618940391
    # γc + 1 = 10·0.02 + 1 = 1.2; 6.8618940391 / 1.2 = 5.7182450326
    (0.9, 10, 0.02, 6.8618940391, 5.7182450326),
    # α = 1: every guess accepted, E = γ + 1 = 5 (the limit of eq. 1); 5 / (4·0.1 + 1) = 5/1.4
    (1.0, 4, 0.1, 5.0, 3.5714285714286),
    # non-integer γ (a measured mean): 0.5^3.5 = 1/(8·√2) = 0.0883883476;
    # E = 0.9116116524 / 0.5 = 1.8232233047; γc + 1 = 2.5·0.2 + 1 = 1.5; 1.8232233047 / 1.5
    (0.5, 2.5, 0.2, 1.8232233047, 1.2154822031),
]


@pytest.mark.parametrize("alpha,gamma,c,tokens,speedup", HAND)
def test_tokens_per_step_and_speedup_by_hand(alpha, gamma, c, tokens, speedup):
    assert expected_tokens_per_step(alpha, gamma) == pytest.approx(tokens, rel=1e-9)
    assert expected_speedup(alpha, gamma, c) == pytest.approx(speedup, rel=1e-9)


def test_speedup_matches_the_papers_own_figures():
    """Appendix A.5 (argmax lenience): α = 0.75, 0.75, 0.8, 0.87 give 3.3X, 3.3X, 3.9X and
    4.9X. The text copy lost c and γ; c = 0.015, γ = 8 reproduce all of them:
    γc + 1 = 1.12;
    0.75^9 = 0.0750846863, E = 0.9249153137 / 0.25 = 3.6996612549, / 1.12 = 3.3032689776
    0.8^9  = 0.134217728,  E = 0.865782272 / 0.2   = 4.32891136,   / 1.12 = 3.8650994286
    0.87^4 = 0.57289761, 0.87^8 = 0.3282116715 (its square), 0.87^9 = 0.2855441542,
           E = 0.7144558458 / 0.13 = 5.4958141981, / 1.12 = 4.9069769626"""
    for alpha, printed, hand in [(0.75, 3.3, 3.3032689776), (0.8, 3.9, 3.8650994286),
                                 (0.87, 4.9, 4.9069769626)]:
        got = expected_speedup(alpha, 8, 0.015)
        assert got == pytest.approx(hand, rel=1e-9)
        assert round(got, 1) == printed


def test_speedup_with_verify_cost_by_hand():
    # tokens per step / (γ c + verify cost): 3.3616 / (4·0.05 + 1.5) = 3.3616 / 1.7 = 1.9774118
    assert expected_speedup_with_verify_cost(0.8, 4, 0.05, 1.5) == pytest.approx(
        1.9774117647059, rel=1e-9)
    # a verify that costs one target forward is Theorem 3.8: 3.3616 / 1.2
    assert expected_speedup_with_verify_cost(0.8, 4, 0.05, 1.0) == pytest.approx(
        2.8013333333333, rel=1e-9)


# ----------------------------------------------------------------------------- optimal γ

# (α, c, γ*, speedup at γ*), by brute force over γ of E(γ) / (γc + 1):
OPTIMAL = [
    # α = 0.8, c = 0.05, E(γ) = 5 (1 - 0.8^(γ+1)):
    #   γ=6: 3.951424 / 1.30 = 3.03956   γ=7: 4.1611392 / 1.35 = 3.08233
    #   γ=8: 4.32891136 / 1.40 = 3.09208  γ=9: 4.463129088 / 1.45 = 3.07802
    #   γ=10: 4.5705032704 / 1.5 = 3.04700 (and falling)
    (0.8, 0.05, 8, 3.0920795429),
    # α = 0.6, c = 0.1, E(γ) = 2.5 (1 - 0.6^(γ+1)):
    #   γ=1: 1.6 / 1.1 = 1.45455  γ=2: 1.96 / 1.2 = 1.63333  γ=3: 2.176 / 1.3 = 1.67385
    #   γ=4: 2.3056 / 1.4 = 1.64686
    (0.6, 0.1, 3, 1.6738461538),
    # α = 0.7, c = 0.1, E(γ) = (1 - 0.7^(γ+1)) / 0.3:
    #   γ=3: 2.533 / 1.3 = 1.94846  γ=4: 2.7731 / 1.4 = 1.98079  γ=5: 2.94117 / 1.5 = 1.96078
    (0.7, 0.1, 4, 1.9807857143),
    # α = 0.9, c = 0.1, E(γ) = 10 (1 - 0.9^(γ+1)):
    #   γ=9: 6.513215599 / 1.9 = 3.42801  γ=10: 6.8618940391 / 2.0 = 3.43095
    #   γ=11: 7.1757046352 / 2.1 = 3.41700
    (0.9, 0.1, 10, 3.4309470196),
    # α = 0.9, c = 0.02, E(γ) = 10 (1 - 0.9^(γ+1)):
    #   γ=17: 8.4990536470 / 1.34 = 6.34258  γ=18: 8.6491482823 / 1.36 = 6.35967
    #   γ=19: 8.7842334541 / 1.38 = 6.36539  γ=20: 8.9058101087 / 1.40 = 6.36129
    (0.9, 0.02, 19, 6.3653865610),
]


@pytest.mark.parametrize("alpha,c,gamma,speedup", OPTIMAL)
def test_optimal_gamma_by_brute_force(alpha, c, gamma, speedup):
    assert optimal_gamma(alpha, c) == gamma
    assert expected_speedup(alpha, gamma, c) == pytest.approx(speedup, rel=1e-9)


def test_no_gamma_helps_unless_alpha_exceeds_c():
    """Corollary 3.9: a speedup exists iff α > c (γ = 1 gives (1 + α) / (1 + c))."""
    # α = c = 0.5: γ=1 gives 1.5 / 1.5 = 1.0 exactly (no gain); larger γ only worse
    assert optimal_gamma(0.5, 0.5) == 0 and not speedup_possible(0.5, 0.5)
    # α = 0.3 < c = 0.5: 1.3 / 1.5 = 0.8667
    assert optimal_gamma(0.3, 0.5) == 0 and not speedup_possible(0.3, 0.5)
    # α = 0.51 > c = 0.5: 1.51 / 1.5 = 1.00667 at γ = 1; γ = 2: (1 + 0.51 + 0.2601) / 2 = 0.885
    assert optimal_gamma(0.51, 0.5) == 1 and speedup_possible(0.51, 0.5)
    # free drafts: every extra guess adds α^(γ+1) > 0, so the cap wins
    assert optimal_gamma(0.7, 0.0, max_gamma=6) == 6


def test_optimal_gamma_under_a_measured_verify_curve_by_hand():
    # α = 0.8, c = 0.3, v(n) = 1 + 0.1 (n - 1) (a verify that grows 10% a row):
    #   γ=1: 1.8 / (0.3 + 1.1) = 1.28571   γ=2: 2.44 / (0.6 + 1.2) = 1.35556
    #   γ=3: 2.952 / (0.9 + 1.3) = 1.34182  γ=4: 3.3616 / (1.2 + 1.4) = 1.29292
    def steep(n):
        return 1 + 0.1 * (n - 1)

    gamma, speedup = optimal_gamma_with_verify_cost(0.8, 0.3, steep)
    assert gamma == 2 and speedup == pytest.approx(1.3555555556, rel=1e-9)
    # a flat curve (v = 1) is Theorem 3.8's optimum (OPTIMAL above: α 0.6, c 0.1 -> γ 3)
    assert optimal_gamma_with_verify_cost(0.6, 0.1, lambda n: 1.0) == (
        3, pytest.approx(1.6738461538, rel=1e-9))
    # a verify that costs n forwards: γ=1 gives 1.8 / (0.3 + 2) < 1, no γ pays
    assert optimal_gamma_with_verify_cost(0.8, 0.3, float) == (0, 1.0)


def test_theory_cli_reads_a_verify_profile(tmp_path, capsys):
    import json

    from draftsman.cli.main import main

    profile = tmp_path / "target-q4-t2.json"
    profile.write_text(json.dumps({"latency": {"1": 0.1, "5": 0.14}}))  # v(n) = 1 + 0.1 (n - 1)
    assert main(["theory", "speculative", "--alpha", "0.8", "--c", "0.3,0.6", "--gamma", "1,2",
                 "--verify-profile", str(profile), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    best = [r for r in rows if "optimal_gamma" in r]
    assert [(r["c"], r["optimal_gamma"]) for r in best] == [(0.3, 2), (0.6, 1)]
    assert best[0]["best_speedup"] == pytest.approx(1.3555555556, rel=1e-9)
    # γ = 1 at c = 0.6: 1.8 / (0.6 + 1.1) = 1.05882
    assert best[1]["best_speedup"] == pytest.approx(1.0588235294, rel=1e-9)
    assert rows[0]["verify_cost"] == pytest.approx(1.1)
    for name, text in (("notes.txt", "x"), ("other.json", '{"rows": 3}'), ("cut.json", "{")):
        bad = tmp_path / name
        bad.write_text(text)
        assert main(["theory", "speculative", "--alpha", "0.8", "--c", "0.3",
                     "--verify-profile", str(bad)]) != 0
        assert "not a profile JSON" in capsys.readouterr().err


# ----------------------------------------------------------------------------- oracle bound


def test_oracle_bound_by_hand():
    # 1 / (1 - 0.8 + 0.8·0.05) = 1 / 0.24 = 4.1666667 (vs 3.0921 at the best fixed γ = 8)
    assert oracle_speedup(0.8, 0.05) == pytest.approx(4.1666666667, rel=1e-9)
    # 1 / (1 - 0.9 + 0.09) = 1 / 0.19 = 5.2631579; the best fixed γ (10) gives 3.4309, so
    # the oracle is 5.2631579 / 3.4309470 = 1.534x: the paper's "up to 60% higher"
    assert oracle_speedup(0.9, 0.1) == pytest.approx(5.2631578947, rel=1e-9)
    assert oracle_speedup(0.9, 0.1) / expected_speedup(0.9, 10, 0.1) == pytest.approx(
        1.5340, abs=1e-4)
    # c = 0: E[n + 1] = 1 / (1 - α) = 2 for α = 0.5
    assert oracle_speedup(0.5, 0.0) == pytest.approx(2.0, rel=1e-12)
    # a draft as dear as the target gains nothing even with an oracle: 1 / (0.4 + 0.6) = 1
    assert oracle_speedup(0.6, 1.0) == pytest.approx(1.0, rel=1e-12)
    for alpha, c, gamma, _ in OPTIMAL:  # an upper bound on every fixed γ
        assert oracle_speedup(alpha, c) > expected_speedup(alpha, gamma, c)


def test_oracle_from_runs_by_hand():
    # runs 0, 2, 5 at c = 0.1: tokens 1 + 3 + 6 = 10; cost (0 + 1) + (0.2 + 1) + (0.5 + 1) = 3.7
    assert oracle_speedup_from_runs([0, 2, 5], 0.1) == pytest.approx(10 / 3.7, rel=1e-12)
    assert oracle_speedup_from_runs([], 0.1) == 1.0
    # the bound depends on the mean run n̄ only: (n̄ + 1) / (n̄ c + 1); n̄ = α / (1 - α) gives
    # the closed form. Runs 0, 2 (n̄ = 1, α = 0.5): 4 / 2.2 = 1.8181818 = 1 / (0.5 + 0.05)
    assert oracle_speedup_from_runs([0, 2], 0.1) == pytest.approx(oracle_speedup(0.5, 0.1))
    # runs 1, 3, 5 (n̄ = 3, α = 0.75): 12 / 3.9 = 3.0769231 = 1 / (0.25 + 0.075)
    assert oracle_speedup_from_runs([1, 3, 5], 0.1) == pytest.approx(3.0769230769, rel=1e-9)
    assert oracle_speedup(0.75, 0.1) == pytest.approx(3.0769230769, rel=1e-9)


# ----------------------------------------------------------------------------- pipelined


def test_ppd_theorem_4_1_by_hand():
    # d = 40, d̄ = 20, ℓ = 16, p = 0.7415: latency 40·16 - 20·15·0.7415 = 640 - 222.45
    assert ppd.expected_latency(40, 20, 16, 0.7415) == pytest.approx(417.55, rel=1e-12)
    # compute adds k (d - d̄) ℓ = 5·20·16 = 1600
    assert ppd.expected_compute(40, 20, 16, 0.7415, 5) == pytest.approx(2017.55, rel=1e-12)
    # d̄ > d/2: d = 12, d̄ = 8, ℓ = 10, p = 0.5: 120 - 4·9·0.5 = 102; + 3·4·10 = 222
    assert ppd.expected_latency(12, 8, 10, 0.5) == pytest.approx(102.0, rel=1e-12)
    assert ppd.expected_compute(12, 8, 10, 0.5, 3) == pytest.approx(222.0, rel=1e-12)


def test_ppd_per_token_forms_match_the_papers_figures():
    """Section 5 (Figure 3 from eqs. 3 and 5, p̂ at layer 20 of 40 from Table 2): latency per
    token from 0.629 (SQUAD, trained head, k = 5: p̂ = 0.7415) to 0.892 (WMT, k = 1:
    p̂ = 0.2163), compute from 1.561 to 4.973 times.
      1 - 0.7415/2 = 0.62925    (5 + 2 - 0.7415) / (2 - 0.7415) = 6.2585 / 1.2585 = 4.97298
      1 - 0.2163/2 = 0.89185    (1 + 2 - 0.2163) / (2 - 0.2163) = 2.7837 / 1.7837 = 1.56063"""
    for p, k, latency, compute in [(0.7415, 5, 0.629, 4.973), (0.2163, 1, 0.892, 1.561)]:
        assert ppd.latency_per_token(p) == pytest.approx(latency, abs=5e-4)
        assert ppd.compute_per_time(p, k) == pytest.approx(compute, abs=5e-4)
        # eq. 6 = eq. 3 × eq. 5 = (2 + k - p) / 2
        assert ppd.compute_per_token(p, k) == pytest.approx((2 + k - p) / 2, rel=1e-12)
    # d̄ = 2d/3 (s = 1 - d̄/d = 1/3), p = 0.5, k = 3: latency 1 - 0.5/3 = 0.8333333;
    # compute per time 1 + 3·(1/3) / (1 - 0.5/3) = 1 + 1 / (5/6) = 2.2;
    # compute per token 1 - 0.5/3 + 3/3 = 1.8333333 (= 0.8333333 × 2.2)
    assert ppd.latency_per_token(0.5, 2 / 3) == pytest.approx(0.8333333333, rel=1e-9)
    assert ppd.compute_per_time(0.5, 3, 2 / 3) == pytest.approx(2.2, rel=1e-12)
    assert ppd.compute_per_token(0.5, 3, 2 / 3) == pytest.approx(1.8333333333, rel=1e-9)


def test_ppd_simulator_by_hand():
    # Figure 2: one run of X = 3 tokens, k = 3, p = 1: latency d + 2d̄; four workers busy for
    # 3 (d - d̄) units, one for the rest. d = 8, d̄ = 5: latency 8 + 10 = 18;
    # compute (18 - 9) + 4·9 = 45
    sim = ppd.simulate([False, True, True], 8, 5, 3)
    assert (sim.latency, sim.compute, sim.runs) == (18, 45, [3])
    # runs of 2 and 3, k = 1: latency T_2 + T_3 = (8 + 5) + (8 + 10) = 31; per run the proof's
    # (d̄ + k (d - d̄)) X + (d - d̄) = 8X + 3: 19 + 27 = 46
    sim = ppd.simulate([False, True, False, True, True], 8, 5, 1)
    assert (sim.latency, sim.compute, sim.runs) == (31, 46, [2, 3])
