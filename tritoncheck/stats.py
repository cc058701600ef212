"""Statistical tests of random masks (dropout), shared by the families that draw them.

A statistical check fails a correct implementation with a small probability; each
declares it per example (``Check(..., false_alarm=)``) and the report adds them up over
a run (a union bound). The tests here are Chernoff bounds: rigorous for any sample
size, so small samples lose power, never validity.
"""
from __future__ import annotations

import math

# Per example, the probability that a statistical check of a keep mask fails a correct
# kernel. 1e-8 keeps the union bound over a run below 1e-4 in every profile: the nightly
# profile runs up to 1000 examples x 3 dtypes of each check; norms' keep_fraction_binomial
# (1e-8) and seed_reproducible (3 COINCIDENCE) and attention's dropout checks (1.1e-8 in
# all, properties/attention_dropout.py) add up to 2.4e-8 per example, 7.2e-5 a nightly run
# (1e-6, the old rate, gave 3e-3 for norms alone). A smaller rate widens the Chernoff test
# only logarithmically: n KL > log(2 / 1e-8) = 19.1 instead of 14.5.
FALSE_ALARM = 1e-8
COINCIDENCE = 1e-9  # probability of each coincidence that a seed check rules out


def binomial_tail_bound(k: int, n: int, q: float) -> float:
    """Chernoff bound on P(K as far from n q as k, on k's side), K ~ Binomial(n, q):
    exp(-n KL(k/n || q)); exact zero probability where k is impossible (q in {0, 1})."""
    a = k / n

    def term(s, t):
        if s == 0:
            return 0.0
        return math.inf if t == 0 else s * math.log(s / t)

    kl = term(a, q) + term(1 - a, 1 - q)
    return math.exp(-n * kl) if math.isfinite(kl) else 0.0


def agreement(p: float) -> float:
    """The probability that two independent keep draws at drop rate p agree: p^2 + (1-p)^2."""
    return p * p + (1 - p) * (1 - p)
