r"""
SGLD corrected by Metropolis-Hastings tests
===========================================

Figure 8 of Korattikara, Chen and Welling (2014): stochastic gradient Langevin dynamics
(SGLD) on an L1-regularised linear regression with one coefficient. Accepting every SGLD
move (panel c) is badly biased: the Langevin noise sometimes throws the chain into the
valley left of the mode, where the gradient is huge and propels it far to the right.
Used as the *proposal* of a Metropolis-Hastings test, with the exact log ratio of the
proposal densities of the minibatch drawn
(:class:`~pymc_minibatch_mh.proposals.sgld.StochasticLangevinProposal`), the same
moves sample the posterior, whether the test uses all the data (d) or a minibatch
(AustereMH, e and f; MinibatchBarker, g).

Script: ``examples/sgld_correction.py``.
"""

# %%
# Run the script
# --------------
# The gallery runs the paper's settings (100,000 samples per panel); the quick build of
# the documentation uses 5,000. It prints a table (data used per test next to the paper's
# 14.2 % and 5 %, and the total-variation distance of each histogram from the exact
# posterior) and writes the figure shown below.
import tempfile

import sgld_correction  # examples/sgld_correction.py

args: list[str] = []
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--draws", "5000"]
# sphinx_gallery_end_ignore
out_dir = tempfile.mkdtemp()
result = sgld_correction.main([*args, "--out", out_dir])
# sphinx_gallery_start_ignore
# Show exactly the PNG the script wrote (pixel for pixel), whatever it left open.
import matplotlib.pyplot as plt  # noqa: E402

plt.close("all")
image = plt.imread(f"{out_dir}/sgld_correction.png")
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
fig.figimage(image)
# sphinx_gallery_end_ignore

# %%
# (a) the posterior density and (b) the gradient of the log posterior; (c) plain SGLD;
# (d)-(g) SGLD moves corrected by the exact, AustereMH and minibatch Barker tests, each
# with the exact density overlaid; and the data each test used.
#
# How to use it
# -------------
# Build a step with ``scaling`` equal to the SGLD step size α and no tuning, then replace
# its proposal::
#
#     from pymc_minibatch_mh import AustereMH
#     from pymc_minibatch_mh.proposals.sgld import StochasticLangevinProposal
#
#     with model:
#         step = AustereMH(batch_size=500, epsilon=0.1, scaling=5e-6, tune=False)
#         step.proposal = StochasticLangevinProposal.for_step(step, batch_size=500)
#         idata = pm.sample(step=step, tune=0)
