"""The penalty test (``MinibatchBarker(acceptance="penalty")``).

Fast: the acceptance function satisfies detailed balance and its closed-form derivatives
match finite differences; the decisions given Δ (all rows) and given a minibatch (Δ*, s²)
accept with the closed-form probabilities, to binomial error; the chain recovers a known
posterior's mean and variance, and the same chain without the penalty σ²/2 (a noisy
Metropolis test) has 1.48 times the posterior's variance and fails the same check (its
settings are refused in test_step_barker.py).
Slow: on skewed data the audit resolves the test's bias and its error estimate is not
optimistic (a deliberately optimistic one fails).
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from test_audit import _exponential_model, _not_optimistic

from pymc_minibatch_mh import MinibatchBarker, audit_summary
from pymc_minibatch_mh.core.barker import barker_decision
from pymc_minibatch_mh.core.correction import CorrectionDistribution
from pymc_minibatch_mh.core.penalty import (
    PenaltyCorrection,
    penalty_derivative,
    penalty_given_minibatch,
    penalty_probability,
)
from pymc_minibatch_mh.model.compat import posterior, sample_stats
from pymc_minibatch_mh.proposals import CrankNicolsonProposal
from pymc_minibatch_mh.proposals.crank_nicolson import MIN_RHO


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.5])
def test_detailed_balance_and_derivatives(sigma):
    for delta in np.linspace(-6.0, 6.0, 25):
        assert penalty_probability(delta, sigma) == pytest.approx(
            math.exp(delta) * penalty_probability(-delta, sigma), rel=1e-12, abs=1e-15)
        h = 1e-3
        f = [penalty_probability(delta + k * h, sigma) for k in (-2, -1, 0, 1, 2)]
        assert penalty_derivative(delta, sigma, 1) == pytest.approx(
            (f[3] - f[1]) / (2 * h), abs=1e-6)
        assert penalty_derivative(delta, sigma, 2) == pytest.approx(
            (f[3] - 2 * f[2] + f[1]) / h**2, abs=1e-4)
        assert penalty_derivative(delta, sigma, 3) == pytest.approx(
            (f[4] - 2 * f[3] + 2 * f[1] - f[0]) / (2 * h**3), abs=1e-3)
    assert penalty_probability(0.0, sigma) == pytest.approx(
        2.0 * 0.5 * math.erfc(sigma / 2 / math.sqrt(2.0)))  # 2Φ(−σ/2)


def _frequency(decide, count=40_000, seed=0):
    rng = np.random.default_rng(seed)
    return np.mean([decide(rng) for _ in range(count)]), count


@pytest.mark.parametrize(("delta_star", "variance", "full_data"),
                         [(0.3, 0.0, True), (-1.2, 0.0, True), (0.3, 0.6, False),
                          (-0.8, 0.2, False), (2.0, 0.9, False)])
def test_decisions_accept_with_the_closed_form_probability(delta_star, variance, full_data):
    correction = PenaltyCorrection(1.0)
    p = correction.accept_probability(delta_star, variance, exact=full_data)
    assert p == pytest.approx(penalty_given_minibatch(
        delta_star, 1.0 - (0.0 if full_data else variance), 1.0))
    freq, count = _frequency(lambda rng: barker_decision(
        rng, delta_star, variance, correction, full_data=full_data))
    assert abs(freq - p) < 4.0 * math.sqrt(p * (1 - p) / count)
    if full_data:
        assert p == pytest.approx(penalty_probability(delta_star, 1.0))


class _NoPenalty(PenaltyCorrection):
    """A broken correction: the exponential without its shift −σ²/2 (noisy Metropolis)."""

    def sample(self, rng):
        return float(rng.standard_exponential())


def test_a_correction_without_the_penalty_fails_the_decision_check():
    freq, count = _frequency(lambda rng: barker_decision(
        rng, 0.3, 0.6, _NoPenalty(1.0), full_data=False))
    p = PenaltyCorrection(1.0).accept_probability(0.3, 0.6, exact=False)
    assert abs(freq - p) > 4.0 * math.sqrt(p * (1 - p) / count)


def _normal_chain(correction=None):
    """A normal mean with known sd (N = 2,000, flat prior): the posterior is
    N(ȳ, 1/N). Random-walk steps of 0.3 posterior sds (the minibatch then grows to
    about 200 rows until s² < σ² = 1; wider steps need every row), ten transitions per
    draw, two chains of 3,000 draws."""
    y = np.random.default_rng(3).normal(0.5, 1.0, size=2000)
    sd = 1.0 / math.sqrt(y.size)
    with pm.Model():
        mu = pm.Flat("mu")
        pm.Normal("y", mu, 1.0, observed=y)
        step = MinibatchBarker(acceptance="penalty", batch_size=50, S=[0.3 * sd],
                               tune=False, steps_per_draw=10)
        if correction is not None:
            step.correction = correction
            step._update_kernel_settings()
        idata = pm.sample(draws=3000, tune=0, step=step, chains=2, cores=1,
                          initvals={"mu": float(y.mean())}, **sample_kwargs(random_seed=4))
    draws = np.asarray(posterior(idata)["mu"])
    return draws, float(y.mean()), sd, idata


def _variance_within(draws, var, z=4.0):
    """The draws' variance agrees with ``var`` within z Monte Carlo errors (the variance of
    the centred squares, with their ESS)."""
    import arviz as az

    centred = (draws - draws.mean()) ** 2
    ess = float(az.ess(centred))
    se = centred.std() / math.sqrt(ess)
    return abs(centred.mean() - var) <= z * se, centred.mean() / var


def test_the_chain_recovers_a_known_posterior():
    import arviz as az

    draws, mean, sd, idata = _normal_chain()
    mcse = float(np.ravel(az.mcse(draws, method="mean"))[0])
    assert abs(draws.mean() - mean) <= 4.0 * mcse
    within, ratio = _variance_within(draws, sd**2)
    assert within, ratio
    stats = sample_stats(idata)
    # It accepts more than Barker's test could: h_1(0) = 0.62 is its ceiling, g(0) = 0.5.
    assert float(stats["accepted"].mean()) > 0.3
    # The minibatches did not grow to N (batch_size sums a draw's ten transitions).
    assert float(stats["batch_size"].mean()) / 10 < 0.25 * 2000


def test_the_chain_without_the_penalty_fails_the_same_check():
    draws, _, sd, _ = _normal_chain(_NoPenalty(1.0))
    within, ratio = _variance_within(draws, sd**2)
    assert not within and ratio > 1.1, ratio


def test_sigma_above_barkers_range_is_allowed_and_sets_the_tuning_target():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=np.zeros(10))
        step = MinibatchBarker(acceptance="penalty", sigma=2.0, control_variate=None)
        barker = MinibatchBarker(control_variate=None)
    assert step.tuner.target == pytest.approx(
        barker.tuner.target * penalty_probability(0.0, 2.0) / 0.5)


@pytest.mark.slow
@pytest.mark.newest_line
def test_penalty_estimate_is_not_optimistic_on_a_skewed_model():
    n, b = 20_000, 50
    model, y = _exponential_model(n, seed=11)
    step_sd = 1.6 * math.sqrt(b) / (n * y.std())  # as the Barker test's audit test
    with model:
        step = MinibatchBarker(batch_size=b, S=[step_sd], tune=False, audit_every=1,
                               acceptance="penalty", control_variate=None)
        idata = pm.sample(draws=6000, tune=0, step=step, chains=1, cores=1,
                          initvals={"lam": 1.0 / y.mean()}, **sample_kwargs(random_seed=5))
    row = audit_summary(idata).loc["all"]
    assert row["aligned_error_low"] > 0.0  # the bias is resolved: the check has power
    assert _not_optimistic(row)
    assert not _not_optimistic(row, scale=0.3)


# ------------------------------------------------------------- acceptance="auto"
def _logistic(n=5_000, d=4, seed=2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(x @ np.full(d, 0.5)))))
    model = pm.Model()
    with model:
        b = pm.Normal("b", 0.0, 5.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=y)
    return model


def test_auto_runs_the_penalty_test_with_crank_nicolson_and_surrogate_nuts_only():
    with _logistic():
        zero_config = MinibatchBarker(control_variate="taylor")
        plain = MinibatchBarker(control_variate=None)
        skewed = MinibatchBarker(control_variate="taylor", skew_correction=True)
        nuts = MinibatchBarker(control_variate="taylor", proposal="surrogate_nuts")
    assert zero_config.acceptance == "penalty" and zero_config.sigma == 0.5
    assert zero_config.steps_per_draw == 3  # at σ = 0.5 as with Barker's test
    assert isinstance(zero_config.correction, PenaltyCorrection)
    # NUTS on the surrogate starts with the penalty test too, and keeps its four transitions.
    assert nuts.acceptance == "penalty" and nuts.steps_per_draw == 4
    for step in (plain, skewed):
        assert step.acceptance == "barker" and step.sigma == 1.0


def _option(sigma, rows, error, within, steps=1, per_round=None, rho=0.0):
    from pymc_minibatch_mh.core.batch_budget import RowsChoice
    from pymc_minibatch_mh.step_methods.auto_choices import AcceptanceOption
    from pymc_minibatch_mh.step_methods.barker_checks import barker_correction

    choice = RowsChoice(per_round or rows, error, float(rows), within, 50, 1.0)
    if sigma is None:
        return AcceptanceOption(barker_correction(1.0, None), choice, steps, rho)
    return AcceptanceOption(PenaltyCorrection(sigma), choice, steps, rho)


def test_choose_test():
    from pymc_minibatch_mh.step_methods.auto_choices import choose_test, perfect_accept

    # All within the budget: the least work per effective sample. With a few rows the
    # smallest σ wins (0.96 of perfect proposals accepted); Barker's test at 3 per draw
    # costs 10.3 transitions per effective sample against 6.5.
    ladder = [_option(0.5, 2, 1e-4, True), _option(0.25, 3, 1e-4, True),
              _option(0.1, 6, 1e-4, True), _option(None, 2, 1e-4, True, steps=3)]
    assert choose_test(ladder).correction.sigma == 0.1
    # Rows cost too: 0.004 of a transition each. σ = 0.1 at 300 rows per transition
    # (7.8 transitions per effective sample) loses to σ = 0.25 at 5 (7.4).
    ladder[1:3] = [_option(0.25, 5, 1e-4, True), _option(0.1, 300, 1e-4, True)]
    assert choose_test(ladder).correction.sigma == 0.25
    # Growth rounds cost too (0.7 of a transition each after the first): σ = 0.1 at 250
    # rows in one round (7.6 per effective sample) beats σ = 0.25 at 100 (7.8); in 5
    # rounds of 50 (10.6) it does not.
    assert choose_test([_option(0.25, 100, 1e-4, True),
                        _option(0.1, 250, 1e-4, True)]).correction.sigma == 0.1
    assert choose_test([_option(0.25, 100, 1e-4, True),
                        _option(0.1, 250, 1e-4, True, per_round=50)]).correction.sigma == 0.25
    # Over-relaxed moves count: a draw's lag-one autocorrelation 1 − 0.96·1.5 = −0.44
    # gives σ = 0.1 at 300 rows 2.8 transitions per effective sample, against 7.4 for
    # σ = 0.25 at 5 rows with a proposal that does not over-relax.
    assert choose_test([_option(0.25, 5, 1e-4, True),
                        _option(0.1, 300, 1e-4, True, rho=-0.5)]).correction.sigma == 0.1
    r = 1 - perfect_accept(PenaltyCorrection(0.1)) * 1.5
    assert _option(0.1, 300, 1e-4, True, rho=-0.5).cost == pytest.approx(
        (5 + 1 + 0.004 * 300) * (1 + r) / (1 - r))
    # A test that may over-relax is two options; the over-relaxed one's records are scaled
    # up (ErrorBudget.choose), and where that takes it out of the budget the same σ
    # without over-relaxation is taken.
    assert choose_test([_option(0.5, 10, 1e-4, True, steps=3),
                        _option(0.25, 100, 2e-3, False, rho=-0.5),
                        _option(0.25, 60, 1e-4, True)]).rho == 0.0
    # Barker's test only where the penalty tests need far more rows.
    costly = [_option(0.5, 1000, 1e-4, True), _option(None, 100, 1e-4, True, steps=3)]
    assert choose_test(costly).acceptance == "barker"
    # Outside the budget an option is not taken; with none within, the smallest error.
    over = [_option(0.5, 100, 2e-3, False, steps=3), _option(None, 100, 9e-4, True, steps=3)]
    assert choose_test(over).acceptance == "barker"
    assert choose_test([_option(0.5, 100, 3e-3, False, steps=3),
                        _option(None, 100, 2e-3, False, steps=3)]).acceptance == "barker"
    assert choose_test([_option(0.5, 100, 2e-3, False, steps=3),
                        _option(None, 100, 3e-3, False, steps=3)]).acceptance == "penalty"
    # There a smaller σ is left out, though its minibatch grows to a smaller error, and so
    # is one transition per draw, though its larger cap (here 300 rows per round) does too.
    assert choose_test([_option(0.5, 100, 3e-3, False, steps=3),
                        _option(0.1, 750, 1e-3, False, steps=3),
                        _option(None, 100, 2e-3, False, steps=3)]).acceptance == "barker"
    fallback = choose_test([_option(0.5, 100, 3e-3, False, steps=3),
                            _option(0.25, 300, 1e-3, False), _option(0.25, 100, 4e-3, False,
                                                                     steps=3),
                            _option(None, 300, 1.5e-3, False),
                            _option(None, 100, 2e-3, False, steps=3)])
    assert fallback.acceptance == "barker" and fallback.steps == 3


@pytest.mark.parametrize("pilot", [False, True])
def test_auto_leaves_the_penalty_test_when_barkers_error_is_smaller(monkeypatch, pilot):
    """A chain whose penalty test is over the budget runs Barker's test from its first
    choice of m on (after 50 tuning transitions without the error budget's pilot, at its
    first transition with it) when Barker's predicted error is smaller (here forced: the
    choice is the code under test), with Barker's default tuning target; the next chain
    starts again with the penalty test; the stat says which test each draw used."""
    from pymc_minibatch_mh.core import batch_budget
    from pymc_minibatch_mh.core.penalty import BARKER

    if not pilot:
        monkeypatch.setattr(MinibatchBarker, "_measure_pilot", lambda self: None)

    choose = batch_budget.ErrorBudget.choose

    def over_budget(self, n_total, *, sigma=None, table_error=None, kind=None, rho=None):
        choice = choose(self, n_total, sigma=sigma, table_error=table_error, kind=kind,
                        rho=rho)
        penalty = (self.kind if kind is None else kind) != BARKER
        return batch_budget.RowsChoice(choice.rows, 0.5 if penalty else 0.1,
                                       choice.predicted_rows, False, choice.records,
                                       choice.skew)

    monkeypatch.setattr(batch_budget.ErrorBudget, "choose", over_budget)
    with _logistic():
        step = MinibatchBarker(control_variate="taylor")
        assert step.tuner.target == pytest.approx(0.4 * penalty_probability(0.0, 0.5) / 0.5)
        idata = pm.sample(draws=50, tune=100, step=step, chains=2, cores=1,
                          discard_tuned_samples=False, **sample_kwargs(random_seed=2))
    warm = np.asarray(idata.warmup_sample_stats["penalty_test"])
    draws = np.asarray(sample_stats(idata)["penalty_test"])
    # Each chain starts with the penalty test (3 transitions per draw: the 50th transition
    # is the second of draw 16, and the choice is made before the third's test, which a
    # draw's stat reports) and leaves it at its first choice; with the pilot's records
    # that is before the first transition's test.
    last_penalty = 0 if pilot else 16
    assert warm[:, :last_penalty].all() and not warm[:, last_penalty:].any()
    assert not draws.any()
    assert step.acceptance == "barker" and step.steps_per_draw == 3
    assert isinstance(step.correction, CorrectionDistribution)
    assert step.rows_choice.predicted_error == 0.1
    assert step.tuner.target == pytest.approx(0.4)


def test_auto_chooses_the_penalty_tests_sigma_and_says_which():
    """Zero-config picks σ from PENALTY_SIGMAS by predicted work per effective sample:
    with control variates the residuals are small, and σ = 0.1 accepts about 0.96 of a
    near-perfect proposal (σ = 0.5 at most 0.80, so an acceptance rate above 0.85 fails
    without the choice); the test_sigma stat is the σ each draw's test used."""
    from pymc_minibatch_mh.step_methods.auto_choices import PENALTY_SIGMAS

    with _logistic(n=20_000):
        step = MinibatchBarker(control_variate="taylor")
        idata = pm.sample(draws=300, tune=300, step=step, chains=1, cores=1,
                          discard_tuned_samples=False, **sample_kwargs(random_seed=4))
    warm = np.asarray(idata.warmup_sample_stats["test_sigma"]).ravel()
    stats = sample_stats(idata)
    sigmas = np.asarray(stats["test_sigma"]).ravel()
    # The first choice, from the error budget's pilot, is made at the first transition.
    assert set(warm.tolist()) <= set(PENALTY_SIGMAS) and warm[0] == step.sigma
    assert step.acceptance == "penalty" and np.all(sigmas == step.sigma)
    assert step.sigma < PENALTY_SIGMAS[0] and step.steps_per_draw == 1
    assert float(np.mean(stats["accepted"])) > 0.85
    # A test that accepts at least OVERRELAX_ACCEPT of perfect proposals over-relaxes
    # Crank–Nicolson (ρ down to MIN_RHO, where the tuner ends on a good fit); σ = 0.5 does
    # not (ρ ≥ 0 in the tuning draws that ran it).
    rho = np.asarray(stats["rho"]).ravel()
    assert np.all(rho == MIN_RHO)
    warm_rho = np.asarray(idata.warmup_sample_stats["rho"]).ravel()
    assert np.all(warm_rho[warm == PENALTY_SIGMAS[0]] >= 0)
    # The chain is antithetic: negative lag-one autocorrelation of every coefficient
    # (about −0.44 = 0.96·(−0.5) + 0.04 at the fit; 0.04 with ρ = 0; sd of the estimate
    # about 1/√300).
    draws = np.asarray(posterior(idata)["b"])[0]
    z = draws - draws.mean(axis=0)
    lag1 = np.sum(z[1:] * z[:-1], axis=0) / np.sum(z * z, axis=0)
    assert np.all(lag1 < -0.2), lag1


def test_overrelaxation_follows_the_test_and_leaves_a_given_proposal_alone():
    """Barker's test (1/2 of perfect proposals) keeps Crank–Nicolson's ρ ≥ 0; a
    Crank–Nicolson proposal given by the user keeps its own ``min_rho``."""
    with _logistic():
        barker = MinibatchBarker(control_variate="taylor", acceptance="barker")
        given = MinibatchBarker(
            control_variate="taylor", acceptance="barker",
            proposal=lambda step: CrankNicolsonProposal(step.surrogate_posterior().laplace,
                                                        min_rho=-0.3))
        for step, least in ((barker, 0.0), (given, -0.3)):
            idata = pm.sample(draws=200, tune=200, step=step, chains=1, cores=1,
                              **sample_kwargs(random_seed=5))
            rho = np.asarray(sample_stats(idata)["rho"]).ravel()
            assert step.proposal.min_rho == least
            assert np.all(rho >= least) and np.min(rho) < least + 0.2, (least, rho.min())
