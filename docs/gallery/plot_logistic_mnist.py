r"""
Logistic regression on MNIST 1s vs 7s
=====================================

Section 6.2 of Seita et al. (2017): a flat prior on 784 weights, labels :math:`\pm 1`,
temperature 100, proposal sd 0.05, :math:`m = 100`, chains from :math:`\theta = 0`, and
the temperature schedule of their Figure 3 (right). The gallery runs MinibatchBarker on a
subset of the digits with a short chain; the script's defaults and flags run the paper's
sizes and all four methods (see its docstring).

Script: ``examples/logistic_mnist.py``.
"""

# %%
# Run the script
# --------------
# The quick build of the documentation uses smaller sizes (below); the script's own
# defaults are larger. It writes a table and figures; the main figure is shown below.
import tempfile

import logistic_mnist  # examples/logistic_mnist.py

args = ["--methods", "barker", "--trials", "1", "--draws", "1000", "--schedule-switch", "400"]
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--methods", "barker", "--trials", "1", "--draws", "300", "--n-train", "3000"]
    args += ["--schedule-switch", "150"]
# sphinx_gallery_end_ignore
out_dir = tempfile.mkdtemp()
result = logistic_mnist.main([*args, "--out", out_dir])
# sphinx_gallery_start_ignore
# Show exactly the PNG the script wrote (pixel for pixel), whatever it left open.
import matplotlib.pyplot as plt  # noqa: E402

plt.close("all")
image = plt.imread(f"{out_dir}/logistic_mnist_13k_figure3.png")
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
fig.figimage(image)
# sphinx_gallery_end_ignore

# %%
# Test accuracy and test log-likelihood against the cumulative number of digits the
# tests consumed, and the run with the temperature schedule.
