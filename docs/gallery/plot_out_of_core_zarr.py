r"""
Data bigger than memory: logistic regression from Zarr
======================================================

The script writes a logistic regression with :math:`d = 10` to two Zarr arrays chunk by
chunk (the data never exist in memory), builds the model on the first 1,000 rows and samples
it with ``MinibatchBarker(control_variate="taylor", data={"X": X, "y": y})``. It prints the
peak resident memory of the set-up and sampling, the set-up time and passes over the data,
the time per step and the ESS per second. See :doc:`/guide/out_of_core`.

Script: ``examples/out_of_core_zarr.py``. Its default is :math:`N = 10^8` (16 GB of disk,
several minutes); this page runs it at :math:`N = 10^6` (the quick build of the
documentation at :math:`N = 2 \times 10^4`).
"""

# %%
# Run the script
# --------------
import out_of_core_zarr  # examples/out_of_core_zarr.py

args = ["--n", "1000000", "--draws", "5000"]
# sphinx_gallery_start_ignore
import os  # noqa: E402

if os.environ.get("DOCS_GALLERY") == "reduced":
    args = ["--n", "20000", "--chunk", "5000", "--draws", "1000", "--tune", "200"]
# sphinx_gallery_end_ignore
result = out_of_core_zarr.main(args)

# %%
# The set-up makes a few passes over the data: one to copy the Zarr arrays to a local
# uncompressed file (from which each step reads its ~100 random rows), the MAP search and
# the control variates' sums at the MAP, and the chain's start-point check. After that a
# step costs what it costs in memory.
