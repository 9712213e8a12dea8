r"""
Temperature 1 with control variates: logistic regression
========================================================

At temperature 1 with proposals as wide as the posterior, the plain minibatch estimate of
:math:`\Delta` needs most of the data at every step (:doc:`/guide/limits`). With
``control_variate="taylor"`` the step adds the full-data sum of second-order Taylor
expansions of each row's log-likelihood around the MAP in closed form and estimates only
the residuals from the minibatch, so one small minibatch decides every step. The script
samples a synthetic logistic regression with and without control variates, with the same
proposal (the Laplace covariance times :math:`2.38/\sqrt d`), and reports what the
control variates cost and save. See :doc:`/guide/control_variates`.

Script: ``examples/logistic_control_variates.py``.
"""

# %%
# Run the script
# --------------
# The script's defaults: :math:`N = 2 \times 10^5` rows, :math:`d = 5`, 10,000 steps with
# control variates and 200 without. The quick build of the documentation uses
# :math:`N = 5 \times 10^4` and 3000 steps.
import tempfile

import logistic_control_variates  # examples/logistic_control_variates.py

args = ["--n", "200000", "--draws", "10000"]
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--n", "50000", "--draws", "3000", "--plain-draws", "100"]
# sphinx_gallery_end_ignore
out_dir = tempfile.mkdtemp()
result = logistic_control_variates.main([*args, "--out", out_dir])
# sphinx_gallery_start_ignore
# Show exactly the PNG the script wrote (pixel for pixel), whatever it left open.
import matplotlib.pyplot as plt  # noqa: E402

plt.close("all")
image = plt.imread(f"{out_dir}/logistic_control_variates.png")
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
fig.figimage(image)
# sphinx_gallery_end_ignore

# %%
# Left: rows used per step. With control variates every step decides on its first
# minibatch; without, the test grows the minibatch to a large share of :math:`N` at every
# step. Right: the draws of two coefficients with the Laplace approximation's 1, 2 and 3
# standard-deviation ellipses. The set-up (MAP search, one pass for the full-data
# gradient and Hessian, compilation) is paid once, when the step is built.
