r"""
The worst case: temperature 1, posterior-sized steps
====================================================

Seita et al. (2017, section 2.2, Lemma 1) show that for data :math:`x_i \sim \mathcal
N(\theta, 1)` with a flat prior and random-walk proposals as wide as the posterior
(standard deviation :math:`1/\sqrt N`), AustereMH and MHSubLhd must consume all
:math:`N` observations in a fixed fraction :math:`c \approx 0.0085` of the steps, because
their tests must separate two nearly equal numbers.

The minibatch Barker test has no such event, but it is not free either: it needs
:math:`s^2(\Delta^*) < \sigma^2`, and here :math:`s^2 \approx (N/b)\,(\text{step} /
\text{posterior sd})^2`, so with posterior-sized steps at temperature 1 it needs a large
share of the data at every step. The script runs the three tests side by side and then
the minibatch Barker test with small steps, and at a high temperature, where it becomes
cheap. See :doc:`/guide/limits`.

Script: ``examples/worst_case_gaussian.py``.
"""

# %%
# Run the script
# --------------
# The script's defaults: :math:`N = 10^5`, 2000 steps per configuration. The quick build
# of the documentation uses :math:`N = 2 \times 10^4` and 500 steps. The script prints a
# table and writes a figure, shown below.
import tempfile

import worst_case_gaussian  # examples/worst_case_gaussian.py

args = ["--n", "100000", "--draws", "2000"]
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--n", "20000", "--draws", "500"]
# sphinx_gallery_end_ignore
out_dir = tempfile.mkdtemp()
rows = worst_case_gaussian.main([*args, "--out", out_dir])
# sphinx_gallery_start_ignore
# Show exactly the PNG the script wrote (pixel for pixel), whatever it left open.
import matplotlib.pyplot as plt  # noqa: E402

plt.close("all")
image = plt.imread(f"{out_dir}/worst_case_gaussian.png")
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
fig.figimage(image)
# sphinx_gallery_end_ignore

# %%
# Left: how many rows each step's test used, per method. Right: the fraction of steps
# that used the whole data set, against Lemma 1's constant (dashed). MHSubLhd reaches
# :math:`N` in most steps (and pays a full pass per step for its range bound, counted
# in ``extra_evaluations``); AustereMH's count depends on its per-test threshold ε; the
# minibatch Barker test never reaches :math:`N` here but, with the same proposal, uses
# about a third of the data per step. Smaller steps or a higher temperature bring it
# down to about one minibatch.
