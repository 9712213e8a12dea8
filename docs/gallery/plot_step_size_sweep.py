r"""
Minibatch size against proposal step size
=========================================

Figure 6 of Seita et al. (2017): the variance of :math:`\Delta^*` grows as the square of
the proposal step, so the test needs more data for larger steps. The gallery runs the
sweep on a subset of MNIST 1s vs 7s with short chains; the script's defaults run the
paper's settings (see its docstring).

Script: ``examples/step_size_sweep.py``.
"""

# %%
# Run the script
# --------------
# The quick build of the documentation uses smaller sizes (below); the script's own
# defaults are larger. It writes a table and figures; the main figure is shown below.
import tempfile

import step_size_sweep  # examples/step_size_sweep.py

args = ["--data", "13k", "--draws", "1000"]
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--data", "13k", "--draws", "200", "--n-train", "3000"]
# sphinx_gallery_end_ignore
out_dir = tempfile.mkdtemp()
result = step_size_sweep.main([*args, "--out", out_dir])
# sphinx_gallery_start_ignore
# Show exactly the PNG the script wrote (pixel for pixel), whatever it left open.
import matplotlib.pyplot as plt  # noqa: E402

plt.close("all")
image = plt.imread(f"{out_dir}/step_size_sweep.png")
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
fig.figimage(image)
# sphinx_gallery_end_ignore

# %%
# Minibatch-size histograms per step size (log-log, same axes) and the average size
# against the step.
