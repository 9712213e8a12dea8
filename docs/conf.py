"""Sphinx configuration of the pymc-minibatch-mh documentation.

Build with ``bash scripts/docs.sh`` (sets up ``.venv-docs`` and runs ``sphinx-build -W``).
Environment variables read here:

``DOCS_GALLERY``
    ``full`` (default): the gallery runs the example scripts at their own (paper) sizes;
    ``reduced``: at small sizes (what CI builds); ``off``: the gallery is not executed.
``DOCS_NB_EXECUTION``
    myst-nb execution mode of the executed pages (quickstart, sample stats, ...):
    ``force`` (default, always re-run), ``cache`` or ``off``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import warnings
from pathlib import Path

import pymc_minibatch_mh

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The gallery wrappers import the example scripts as modules.
sys.path.insert(0, str(ROOT / "examples"))

# The gallery runs in this process: keep PyTensor's note about the C backend's BLAS (which
# the minibatch steps do not use; they compile with Numba) out of the examples' output.
warnings.filterwarnings("ignore", message=".*could not link to a BLAS", category=UserWarning)

# -- project ----------------------------------------------------------------------------
project = "pymc-minibatch-mh"
author = "pymc-minibatch-mh developers"
copyright = "pymc-minibatch-mh developers"
version = release = pymc_minibatch_mh.__version__

# -- general ----------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_nb",
    "sphinx_gallery.gen_gallery",
    "sphinx_copybutton",
    # MathJax shipped with the site (no CDN): pages render offline and from file://.
    "sphinx-mathjax-offline",
]
templates_path = ["_templates"]
# Cross-references that do not resolve are warnings too (hence errors with -W).
nitpicky = True
nitpick_ignore = [
    # PyMC's base classes, shown as bases of the step methods (no intersphinx: the build
    # must work without network access).
    ("py:class", "pymc.step_methods.compound.BlockedStep"),
    ("py:class", "pymc.step_methods.compound.StepMethodState"),
    # The standard library's ABC, the base of Proposal (no intersphinx, see above).
    ("py:class", "abc.ABC"),
    # NumPy's Generator, the base of BufferedGenerator (its private module path).
    ("py:class", "numpy.random._generator.Generator"),
    # PyTensor's Op, the base of UpcastDot (no intersphinx, see above).
    ("py:class", "pytensor.graph.op.Op"),
    # PyTensor's digamma and trigamma ops, the bases of CephesPsi and AS121TriGamma.
    ("py:class", "pytensor.scalar.math.Psi"),
    ("py:class", "pytensor.scalar.math.TriGamma"),
    # The private base class of the surrogate MALA and HMC proposals.
    ("py:class", "pymc_minibatch_mh.proposals.gradient._WhitenedGradientProposal"),
]
exclude_patterns = [
    "_build",
    "**.ipynb_checkpoints",
    # sphinx-gallery sources (rendered into auto_examples/) and its notebook copies.
    "gallery",
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
default_role = "code"
pygments_style = "sphinx"

# -- autodoc / autosummary / numpydoc -------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False

# -- MyST / myst-nb ------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True
nb_execution_mode = os.environ.get("DOCS_NB_EXECUTION", "force")
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_output_stderr = "remove"  # PyMC's log lines and library warnings
nb_merge_streams = True

# -- sphinx-gallery ------------------------------------------------------------------------
DOCS_GALLERY = os.environ.get("DOCS_GALLERY", "full")
if DOCS_GALLERY not in ("full", "reduced", "off"):
    raise ValueError(f"DOCS_GALLERY must be 'full', 'reduced' or 'off', got {DOCS_GALLERY!r}")
sphinx_gallery_conf = {
    "examples_dirs": ["gallery"],
    "gallery_dirs": ["auto_examples"],
    "filename_pattern": r"/plot_",
    "ignore_pattern": r"/_",
    "plot_gallery": "False" if DOCS_GALLERY == "off" else "True",
    "within_subsection_order": "FileNameSortKey",
    "remove_config_comments": True,
    "download_all_examples": False,
    "image_scrapers": ("matplotlib",),
    "reset_modules": ("matplotlib",),
    "capture_repr": (),
    "show_memory": False,
    "min_reported_time": 1,
    "write_computation_times": False,
}

# -- HTML ----------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "pymc-minibatch-mh"
html_theme_options = {
    "logo": {"text": "pymc-minibatch-mh"},
    "navbar_align": "left",
    "header_links_before_dropdown": 6,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
# No left sidebar on pages without sub-pages (it would be empty).
html_sidebars = {
    page: [] for page in ["index", "install", "quickstart", "theory", "troubleshooting"]
}
html_show_sourcelink = False
html_copy_source = False


# -- every public name must be documented ----------------------------------------------------
def _package_modules() -> list[str]:
    """Every module of the package, found by walking its folders (none is listed by hand)."""
    import pkgutil

    names = ["pymc_minibatch_mh"]
    for info in pkgutil.walk_packages(pymc_minibatch_mh.__path__, "pymc_minibatch_mh."):
        names.append(info.name)
    return sorted(names)


#: Modules whose ``__all__`` lists public names: every module of the package (a module
#: without ``__all__`` exports nothing). A name listed there but documented nowhere in the
#: API reference (under any path) is a build warning, hence an error with ``-W``.
PUBLIC_MODULES = _package_modules()
UNDOCUMENTED_OK = {"__version__"}


def _resolve(fullname: str) -> object:
    parts = fullname.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _check_public_names_documented(app, env) -> None:
    from sphinx.util import logging

    logger = logging.getLogger("pymc_minibatch_mh.docs")
    documented = set(env.get_domain("py").objects)
    ids = set()
    for name in documented:
        obj = _resolve(name)
        if inspect.isclass(obj) or inspect.isroutine(obj):
            ids.add(id(obj))
    modules = set(env.get_domain("py").modules)
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        if modname not in modules and not modname.rpartition(".")[2].startswith("_"):
            logger.warning(
                "module %s has no page in the API reference (docs/api/): add an automodule",
                modname,
            )
        for name in getattr(module, "__all__", []):
            if name in UNDOCUMENTED_OK:
                continue
            obj = getattr(module, name)
            if f"{modname}.{name}" in documented:
                continue
            if (inspect.isclass(obj) or inspect.isroutine(obj)) and id(obj) in ids:
                continue
            if any(d.rsplit(".", 1)[-1] == name and _resolve(d) is obj for d in documented):
                continue
            logger.warning(
                "public name %s.%s is not documented in the API reference (docs/api/)",
                modname,
                name,
            )


def _init_signature(app, what, name, obj, options, signature, return_annotation):
    """Show ``__init__``'s parameters for classes whose ``__new__`` hides them.

    PyMC's step methods define ``__new__(cls, *args, **kwargs)``, which autodoc would
    show as the signature of every step method.
    """
    if what != "class" or signature != "(*args, **kwargs)" or "__init__" not in vars(obj):
        return None
    sig = inspect.signature(obj.__init__)
    params = [
        p.replace(annotation=inspect.Parameter.empty) for p in list(sig.parameters.values())[1:]
    ]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty)), None


def setup(app):
    app.connect("env-check-consistency", _check_public_names_documented)
    app.connect("autodoc-process-signature", _init_signature)
    return {"parallel_read_safe": True}
