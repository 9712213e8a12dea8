r"""
Austerity: data used and wrong decisions on MNIST 7s vs 9s
==========================================================

Section 5.1 of Korattikara, Chen and Welling (2014), Fig. 2: logistic regression on the 7s
and 9s of MNIST (12,214 training and 2,037 test digits), the pixels reduced to 50
dimensions by PCA, a Gaussian prior and a random-walk proposal. For exact
Metropolis–Hastings (:class:`~pymc_minibatch_mh.ExactMH`, :math:`\varepsilon = 0`) and the
sequential t-test :class:`~pymc_minibatch_mh.AustereMH` at several :math:`\varepsilon`,
and, beyond the paper, the minibatch Barker test with the same random walk and the
zero-config step ``MinibatchBarker(control_variate="taylor")``: the share of the data
used per step and the share of wrong decisions, measured by the exact audit
(``audit_every=1``, see :doc:`/guide/how_wrong`). Figs 3 and 4 (risk against wall-clock
time) are on the next page,
:ref:`sphx_glr_auto_examples_plot_austerity_logistic_risk.py`.

Script: ``examples/austerity_logistic.py --part decisions`` (its docstring lists the
flags).

**Where the figure differs from the paper's, and why.**

- *Settings the paper does not give.* Its text names a Gaussian prior and a random walk
  but not their scales, nor the minibatch size: here :math:`N(0, 1)`,
  :math:`\sigma_{RW} = 0.01` (exact MH then accepts about half of the moves) and
  :math:`m = 500`. No intercept, labels :math:`\pm 1`.
- *Wrong decisions.* The audit counts a decision as wrong when the exact test, with the
  same uniform, decides otherwise. With this random walk at temperature 1 many
  proposals sit close to the threshold, and the audited rates are higher than the
  paper's Fig. 2 suggests: at full size (1,500 audited steps from the posterior mean)
  0.4% at ε = 0.001, 2.8% at ε = 0.01, 12.5% at ε = 0.05 and 27.8% at ε = 0.2, with
  86%, 72%, 47% and 15% of the data per step. The Barker tests have no ε: they are
  horizontal lines, and their error panel shows the audit's aligned bias (the
  disagreement with the exact Barker test is not an error rate): 0.2% [−0.8%, 1.2%] for
  the random walk with 65% of the data per step, 2.1% [1.2%, 3.1%] for the zero-config
  step with 5%.
- *Size.* The quick documentation build uses 3,000 training digits and fewer audited
  steps and ε; the numbers above are the script's defaults.
"""

# %%
# Run the script
# --------------
# The quick build of the documentation uses smaller sizes (below).
import tempfile

import austerity_logistic  # examples/austerity_logistic.py

args = ["--part", "decisions", "--audit-draws", "600", "--nuts-draws", "1000",
        "--nuts-tune", "500", "--nuts-chains", "2",
        "--fig2-epsilons", "0.005", "0.01", "0.05", "0.1", "0.2"]
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--part", "decisions", "--n-train", "3000", "--n-test", "500",
            "--audit-draws", "150", "--nuts-draws", "250", "--nuts-tune", "250",
            "--nuts-chains", "2", "--fig2-epsilons", "0.01", "0.05", "0.2",
            "--taylor-tune", "200"]
# sphinx_gallery_end_ignore
out_dir = tempfile.mkdtemp()
result = austerity_logistic.main([*args, "--out", out_dir])
# sphinx_gallery_start_ignore
import matplotlib.pyplot as plt  # noqa: E402

plt.close("all")
image = plt.imread(f"{out_dir}/austerity_logistic_figure2.png")
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
fig.figimage(image)
# sphinx_gallery_end_ignore

# %%
# Fig. 2: a larger :math:`\varepsilon` reads less of the data per step and makes more
# wrong decisions (the audit's rate with its 95% Wilson interval); exact MH reads all of
# it and makes none.
print(result["table"])
