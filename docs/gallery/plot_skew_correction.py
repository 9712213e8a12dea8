r"""
The skew-corrected test: acceptance error against the batch size
=================================================================

The minibatch Barker test treats its estimate :math:`\Delta^*` as normal. On skewed
per-row ratios its acceptance probability differs from Barker's :math:`g(\Delta)` by
about :math:`(\kappa_3/6 - \operatorname{cov}(\Delta^*, s^2)/2)\, g'''(\Delta)`, a term of
order :math:`\text{skew}/\sqrt b`. With ``skew_correction=True`` the test draws its top-up
noise from a shifted gamma distribution whose third cumulant cancels that term
(:mod:`pymc_minibatch_mh.core.skew`). This example measures both tests, with the
package's own test code, on lognormal ratios (skewness about 6) and on Student-t ratios
with :math:`\nu = 3` (symmetric, heavy tails), scaled so that
:math:`\operatorname{Var}(\Delta^*) = 0.25` at :math:`b` rows, and plots the largest error
over :math:`\Delta \in [-3, 3]` against :math:`b` (see
:func:`~pymc_minibatch_mh.core.calibration.barker_acceptance_error` for the estimator).

Script: ``examples/skew_correction.py``.
"""

# %%
# Run the script
# --------------
# The gallery runs 40,000 minibatches per point at five batch sizes (about half an hour);
# the quick build of the documentation 3,000 at three, on a smaller population, so its
# Monte Carlo error bars are wide. It prints the table and writes the figure below.
import tempfile

import skew_correction  # examples/skew_correction.py

args: list[str] = []
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--n", "20000", "--replications", "3000", "--batch-sizes", "100,300,1000"]
# sphinx_gallery_end_ignore
out_dir = tempfile.mkdtemp()
result = skew_correction.main([*args, "--out", out_dir])
# sphinx_gallery_start_ignore
# Show exactly the PNG the script wrote (pixel for pixel), whatever it left open.
import matplotlib.pyplot as plt  # noqa: E402

plt.close("all")
image = plt.imread(f"{out_dir}/skew_correction.png")
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
fig.figimage(image)
# sphinx_gallery_end_ignore

# %%
# On lognormal ratios the plain test's error falls like :math:`b^{-1/2}`, the first
# Edgeworth term; the skew-corrected test's falls faster once that term dominates (from
# about :math:`b = 1000` here), down to the Monte Carlo noise. At small :math:`b` the
# higher-order terms and the stopping rule (the minibatch grows when :math:`s^2 \ge
# \sigma^2`, which selects against batches holding an outlier) dominate, and the
# correction does not help. On symmetric Student-t ratios there is no first-order term to
# remove. The measured numbers at full size are in the guide's calibration page.
#
# How to use it
# -------------
# ::
#
#     with model:
#         step = MinibatchBarker(skew_correction=True)
#         idata = pm.sample(step=step)
#     sample_stats(idata)["skew_fallback"].mean()  # steps without room for it
