r"""
Variable selection with minibatch Gibbs updates
===============================================

Section 5.3 and Figure 13 of Korattikara, Chen and Welling (2014): the marginal inclusion
probabilities of a spike-and-slab logistic regression on tall (generated) data, with the
indicators updated by :class:`~pymc_minibatch_mh.MinibatchGibbs` (the sequential t-test
and the minibatch Barker test) against the exact full-data Gibbs update, and the data
each indicator update used. The coefficients are sampled by NUTS in every run, so the
runs differ only in the test of the indicator updates.

Script: ``examples/variable_selection.py``.
"""

# %%
# Run the script
# --------------
# The quick build of the documentation uses smaller sizes (below); the script's own
# defaults (N = 100,000, two chains of 1000 draws) are larger.
import tempfile

import variable_selection  # examples/variable_selection.py

args = ["--n", "20000", "--draws", "300", "--tune", "100"]
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--n", "5000", "--draws", "200", "--tune", "100", "--chains", "1"]
# sphinx_gallery_end_ignore
out_dir = tempfile.mkdtemp()
result = variable_selection.main([*args, "--out", out_dir])
# sphinx_gallery_start_ignore
# Show exactly the PNG the script wrote (pixel for pixel), whatever it left open.
import matplotlib.pyplot as plt  # noqa: E402

plt.close("all")
image = plt.imread(f"{out_dir}/variable_selection.png")
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
fig.figimage(image)
# sphinx_gallery_end_ignore

# %%
# Inclusion probabilities per feature (true coefficient under each name; bars ± 2 MCSE)
# and the share of the data each indicator update used.
