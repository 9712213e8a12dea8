r"""Minibatch tests for Gibbs updates of discrete variables (Korattikara et al. 2014, App. F).

A Gibbs update of a binary variable ``x_j`` draws its new value from
``P(x_j | x_{−j})``. Written as a *flip* of the current value (``x′`` is ``x`` with
coordinate ``j`` changed, a deterministic proposal with log-q ratio 0), the update moves
to the other value with probability

.. math:: P(x′_j \mid x_{−j}) = \frac{π(x′)}{π(x) + π(x′)} = g(Δ), \qquad
          g(s) = \frac{1}{1 + e^{−s}}, \quad Δ = \log π(x′) − \log π(x),

which is Barker's acceptance function. So a Gibbs update is a Barker flip, and the
minibatch tests of the log-odds ``Δ = c + Σ_i l_i`` apply unchanged:

- the minibatch Barker test (:class:`~pymc_minibatch_mh.core.barker.BarkerTest`: accept
  iff ``Δ* + X_nc + X_corr > 0``) approximates it directly;
- the sequential t-test of AustereMH decides ``μ > μ0`` as for Metropolis–Hastings, but
  with the Gibbs threshold ``μ0 = (logit u − c)/N`` (Appendix F, eq. 41: accept iff
  ``u < g(Δ)``, i.e. ``logit u < Δ``) instead of ``(log u − c)/N``:
  :func:`gibbs_t_test`.

With ``K > 2`` categories, the proposal is a uniformly random *other* category
(symmetric, log-q ratio 0) and the same test accepts with ``π(x′)/(π(x) + π(x′))``, a
Barker (not a Gibbs) update; :func:`propose_category` draws it.
"""

from __future__ import annotations

import math

import numpy as np

from pymc_minibatch_mh.core.austere import AustereOutcome, threshold_t_test
from pymc_minibatch_mh.core.common import draw_uniform
from pymc_minibatch_mh.core.source import MinibatchSource

__all__ = ["gibbs_t_test", "logit_threshold", "propose_category"]


def logit_threshold(
    rng: np.random.Generator, data_free: float, n_total: int
) -> tuple[float, float]:
    """Draw ``u`` and return ``(logit u, (logit u − c) / N)``, the Gibbs threshold.

    The exact Gibbs (Barker) update accepts the flip iff ``u < g(Δ)``, i.e. iff
    ``logit u < Δ = N μ + c``, i.e. iff ``μ > (logit u − c)/N`` (Korattikara et al. 2014,
    Appendix F, eq. 41).

    Parameters
    ----------
    rng : numpy.random.Generator
        The test's generator (one ``random()`` call, as for the Metropolis threshold).
    data_free : float
        The data-free part ``c`` (prior difference; the flip's log-q ratio is 0).
    n_total : int
        Population size N.

    Returns
    -------
    tuple of float
        ``(logit_u, mu0)``; both finite (``u`` is kept inside ``(0, 1)``).

    Examples
    --------
    >>> import numpy as np
    >>> logit_u, mu0 = logit_threshold(np.random.default_rng(0), 0.5, 10)
    >>> bool(np.isclose(mu0, (logit_u - 0.5) / 10))
    True

    """
    u = draw_uniform(rng)  # (0, 1]
    if u >= 1.0:
        u = math.nextafter(1.0, 0.0)
    logit_u = math.log(u) - math.log1p(-u)
    return logit_u, (logit_u - data_free) / n_total


def gibbs_t_test(rng: np.random.Generator, source: MinibatchSource, data_free: float, *,
                 batch_size: int, epsilon: float) -> AustereOutcome:
    """The sequential t-test of AustereMH with the Gibbs threshold (Appendix F).

    Parameters
    ----------
    rng, source, data_free, batch_size, epsilon
        As for :func:`~pymc_minibatch_mh.core.austere.austere_test`, for the flip of one
        variable: ``u`` (drawn first, :func:`logit_threshold`) sets the Gibbs threshold,
        ``source`` gives the flip's ratios ``l_i`` on new rows (the caller has opened the
        step) and ``data_free`` is the data-free part ``c`` of its log-odds. The paper's
        Appendix F.1 uses ``batch_size=500``; ``epsilon=0`` is the exact update.

    Returns
    -------
    AustereOutcome
        As :func:`~pymc_minibatch_mh.core.austere.austere_test`; ``mu0`` is the Gibbs
        threshold and ``accepted`` whether the variable takes the proposed value.

    Notes
    -----
    Identical to :func:`~pymc_minibatch_mh.core.austere.austere_test` except for the
    threshold: ``μ0 = (logit u − c)/N`` makes the exact decision (at ``n = N``) a draw from
    the conditional, ``P(accept) = g(Δ)``, where ``(log u − c)/N`` gives Metropolis'
    ``min(1, e^Δ)``. A ``−inf`` data-free part or ratio rejects; NaN or ``+inf`` rejects
    and sets ``nonfinite``.

    References
    ----------
    .. [1] Korattikara, A., Chen, Y., Welling, M. (2014). Austerity in MCMC Land: Cutting
       the Metropolis-Hastings Budget. ICML 2014, Appendix F.

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_minibatch_mh.core.source import ArraySource
    >>> source = ArraySource(np.full(1000, 0.001), rng=np.random.default_rng(0))
    >>> source.start_step()
    >>> out = gibbs_t_test(np.random.default_rng(1), source, 0.0, batch_size=1000, epsilon=0.05)
    >>> _, mu0 = logit_threshold(np.random.default_rng(1), 0.0, 1000)  # the same u
    >>> out.full_data, out.mu0 == mu0, out.accepted == (out.mean > mu0)
    (True, True, True)

    """
    return threshold_t_test(logit_threshold, rng, source, data_free, batch_size, epsilon)


def propose_category(rng: np.random.Generator, current: int, categories: int) -> int:
    """A uniformly random category other than ``current`` (a symmetric proposal).

    Parameters
    ----------
    rng : numpy.random.Generator
        One ``integers`` draw when ``categories > 2``; none for a binary variable.
    current : int
        The current category, in ``0 .. categories − 1``.
    categories : int
        K ≥ 2.

    Returns
    -------
    int
        The proposed category; ``1 − current`` when K = 2 (the flip).

    Examples
    --------
    >>> import numpy as np
    >>> propose_category(np.random.default_rng(0), 1, 2)
    0
    >>> rng = np.random.default_rng(0)
    >>> sorted({propose_category(rng, 2, 4) for _ in range(50)})
    [0, 1, 3]

    """
    if categories == 2:
        return 1 - current
    return (current + 1 + int(rng.integers(categories - 1))) % categories
