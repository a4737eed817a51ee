"""Conformance harness: prove a decoding strategy distribution-exact under sampling.

`check_exact` runs a strategy many times with seeded samplers and tests the joint
distribution of its first tokens against the target's own, computed independently
(`reference_probabilities`, float64 from the definitions); `coverage_of` counts which paths
of the verification rules the runs exercised, so a case can require them.
"""

from draftsman.testing.conformance import (
    ConformanceResult,
    check_exact,
    chi_square_pvalue,
    coverage_of,
    target_joint,
)
from draftsman.testing.reference import reference_probabilities

__all__ = ["ConformanceResult", "check_exact", "chi_square_pvalue", "coverage_of",
           "reference_probabilities", "target_joint"]
