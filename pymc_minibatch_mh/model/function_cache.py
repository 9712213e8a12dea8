"""Compiled PyTensor functions kept on disk, so a second process skips the graph rewriting.

``pytensor.function`` spends most of a set-up's compile time rewriting the graph (0.3–2.5 s
per function on the model zoo: canonicalising the second derivatives of ``gammaln`` and
``digamma`` is the slowest), and neither PyTensor nor Numba keeps that work across
processes: PyTensor's C module cache and Numba's cache are keyed by the graph *after* the
rewrites. A compiled PyTensor ``Function`` pickles with its rewritten graph, and unpickling
one links that graph without rewriting it again (PyTensor's ``no_fgraph_prep``), so the
C modules and Numba functions come from their own caches.

:func:`cached_build` keeps such pickles under PyTensor's ``compiledir``, keyed by
:func:`graph_key`: a digest of the graph's structure (ops and types by class and
``__props__``, constants by their bytes; not the variables' names or counters, nor the
ops' own caches, which differ from process to process), the mode, PyTensor's settings
and the versions of Python, NumPy, PyTensor and Numba. A shared variable (``pm.Data``, an
estimator's expansion point, the data of the split's reference) counts by its type and
place, not its value, and its value is not stored (an empty array of its dtype stands in
for it in the pickle): a loaded function is linked on the caller's shared variables, so
``pm.set_data`` reaches it as it reaches a compiled one. A graph whose constants exceed
:data:`MAX_CONSTANT_BYTES` is compiled without the cache.

A function whose graph is *derived* from another (a gradient, a Taylor expansion's
directional derivatives) can be keyed by the graph it is derived from and the name of the
derivation (``recipe``): building the derived graph (``pytensor.grad``, 0.5–1.5 s per
set-up on the zoo's families, most of a second process's set-up) is then skipped too. The
package's own code is part of every key, since the derivation is.

A cache entry that cannot be read is deleted and the function compiled as without the
cache (logged). ``PYMC_MINIBATCH_MH_FUNCTION_CACHE=0`` turns the cache off;
:func:`cache_dir` names the folder (delete it to clear the cache), and
``PYMC_MINIBATCH_MH_FUNCTION_CACHE_DIR`` moves it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytensor
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.traversal import graph_inputs

__all__ = ["MAX_CONSTANT_BYTES", "MAX_CACHE_BYTES", "cache_dir", "cache_enabled",
           "cached_build", "drop_rewrite_state", "graph_key"]

_log = logging.getLogger("pymc_minibatch_mh")

#: Graphs whose constants hold more bytes than this are compiled without the cache (their
#: digest and pickle would cost about what the rewrites do).
MAX_CONSTANT_BYTES = 16 * 2**20
#: The folder is pruned, oldest entries first, to this size after each write.
MAX_CACHE_BYTES = 512 * 2**20
_ENV = "PYMC_MINIBATCH_MH_FUNCTION_CACHE"


def cache_enabled() -> bool:
    """Whether :func:`cached_build` reads and writes the cache.

    ``PYMC_MINIBATCH_MH_FUNCTION_CACHE`` set to ``0``, ``false``, ``no`` or ``off``
    turns it off.
    """
    return os.environ.get(_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """The cache's folder.

    ``PYMC_MINIBATCH_MH_FUNCTION_CACHE_DIR``, or one inside PyTensor's ``compiledir``.
    """
    folder = os.environ.get(_ENV + "_DIR")
    if folder:
        return Path(folder)
    return Path(pytensor.config.compiledir) / "pymc_minibatch_mh_functions"


@functools.cache
def _package_digest(root: Path | None = None) -> str:
    """A digest of this package's source files (or those under ``root``).

    A derivation (see :func:`cached_build`) is code, so a changed package must not load
    what the old one derived.
    """
    root = Path(__file__).resolve().parents[1] if root is None else root
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _environment() -> bytes:
    try:
        import numba
        numba_version = numba.__version__
    except ImportError:  # pragma: no cover - numba is a dependency of both lines
        numba_version = ""
    # PyTensor's settings, each "name (choices) Value: value" block of its printout
    # reduced to name and value (the choices are a set, printed in a per-process order)
    blocks = pytensor.config.__str__(print_doc=False).split("\n\n")
    settings = [(b.split(" ", 1)[0], b.rsplit("Value:", 1)[-1].strip())
                for b in blocks if "Value:" in b]
    return repr((sys.version, np.__version__, pytensor.__version__, numba_version,
                 settings, _package_digest())).encode()


def _shared_roots(inputs: list[Any], outs: list[Any]) -> list[Any] | None:
    """The graph's shared variables, in a traversal order that depends on its structure only.

    ``None`` when a root is neither an input, a constant nor a shared variable (a missing
    input, which ``pytensor.function`` refuses).
    """
    explicit = set(inputs)
    shared = []
    for root in graph_inputs(outs):
        if root in explicit or (isinstance(root, Constant)
                                and not isinstance(root, SharedVariable)):
            continue
        if not isinstance(root, SharedVariable):
            return None
        shared.append(root)
    return shared


def graph_key(inputs: list[Any], outputs: Any, mode: Any, recipe: str = "") -> str | None:
    """A digest of the function ``pytensor.function(inputs, outputs, mode=mode)`` would be.

    Shared variables count by their type and their place in the graph, not their value
    (:func:`cached_build` points a loaded function at the caller's). ``None`` when the
    function must not be cached: the graph's constants exceed :data:`MAX_CONSTANT_BYTES`,
    or an op does not pickle. With ``recipe``, the key is that of a function derived from
    this graph by the named derivation (see :func:`cached_build`).
    """
    return _key_and_shared(inputs, outputs, mode, recipe)[0]


def _key_and_shared(inputs: list[Any], outputs: Any, mode: Any,
                    recipe: str = "") -> tuple[str | None, list[Any]]:
    """:func:`graph_key` and the graph's shared variables (:func:`_shared_roots`)."""
    outs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    if not all(isinstance(v, Variable) for v in [*inputs, *outs]):
        return None, []  # In/Out wrappers: not this cache's case
    shared = _shared_roots(inputs, outs)
    if shared is None:
        return None, []
    stored_bytes = 0
    fg = FunctionGraph([*inputs, *shared], outs, clone=True)
    # a Merkle digest: each variable's digest is its op's and its inputs' digests, so the
    # key does not depend on the order in which independent nodes are visited (which
    # follows Python's per-process string hashing)
    digest = {v: _sha(_describe(("input", i, v.type))) for i, v in enumerate(fg.inputs)}
    try:
        for node in fg.toposort():
            for v in node.inputs:
                if v not in digest:  # a constant: the roots were checked above
                    data = np.asarray(v.data)
                    stored_bytes += data.nbytes
                    if stored_bytes > MAX_CONSTANT_BYTES:
                        return None, shared
                    digest[v] = _constant_digest(v, data)
            node_digest = _sha(_describe((node.op, [o.type for o in node.outputs])),
                               *(digest[v] for v in node.inputs))
            for i, o in enumerate(node.outputs):
                digest[o] = _sha(node_digest, str(i).encode())
        for v in fg.outputs:
            if v not in digest:  # an output that is a constant
                digest[v] = _constant_digest(v, np.asarray(v.data))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        _not_cached(f"its graph does not pickle ({type(exc).__name__}: {exc})")
        return None, shared
    head = _describe((repr(mode), isinstance(outputs, list | tuple), len(inputs), recipe))
    return _sha(_environment(), head, *(digest[v] for v in fg.outputs)).hex(), shared


def _sha(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.digest()


def _constant_digest(v: Any, data: np.ndarray) -> bytes:
    if data.dtype.hasobject:
        return _sha(_describe(("constant", v.type, v.data)))
    return _sha(_describe(("constant", v.type, data.dtype.str, data.shape)),
                np.ascontiguousarray(data).view(np.uint8).data)


def _describe(x: Any) -> bytes:
    """Bytes that tell ``x`` (an op, a type, their parameters) apart by what it means.

    Ops and types are described by their class and ``__props__``, the parameters by which
    PyTensor itself tells two of them apart, not by their pickles: an op used in an
    earlier compilation of the process carries caches (an ``All`` its ``_ufunc``) that
    would change its pickle. Anything else is pickled.
    """
    return pickle.dumps(_canonical(x))


def _canonical(x: Any) -> Any:
    if isinstance(x, str | bytes | int | float | bool | type(None)):
        return x
    if isinstance(x, type):
        return ("class", x.__module__, x.__qualname__)
    props = getattr(type(x), "__props__", None)
    if isinstance(props, tuple):
        return ("props", type(x).__module__, type(x).__qualname__,
                tuple(_canonical(getattr(x, p)) for p in props))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((repr(_canonical(k)), _canonical(v))
                                     for k, v in x.items())))
    if isinstance(x, set | frozenset):
        return ("set", tuple(sorted(repr(_canonical(e)) for e in x)))
    if isinstance(x, list | tuple):
        return (type(x).__name__, tuple(_canonical(e) for e in x))
    if isinstance(x, np.dtype | np.generic):
        return ("numpy", repr(x))
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tobytes())
    name = getattr(x, "__qualname__", None)  # a module-level function or class attribute
    if callable(x) and isinstance(name, str) and "<" not in name:  # not a lambda or closure
        return ("callable", getattr(x, "__module__", ""), name)
    return ("pickle", pickle.dumps(x))


def cached_build(inputs: list[Any], outputs: Any, mode: Any,
                 build: Callable[[], tuple[Any, ...]], recipe: str = "") -> tuple[Any, ...]:
    """``build()``, or what it returned for the same graph and mode in an earlier process.

    ``build`` compiles ``pytensor.function(inputs, outputs, mode=mode, ...)`` and returns
    a tuple whose first item is that function (the rest must pickle). The entry holds the
    function's ``FunctionMaker`` (its rewritten graph) and input storage; a loaded one is
    linked once (``FunctionMaker.create``) with the caller's shared variables' containers
    as its storage, so it reads their values at every call as the compiled one would.

    With ``recipe`` (a name), ``build`` compiles a function *derived* from the graph of
    ``inputs`` and ``outputs`` (for example its gradient, built inside ``build``), and the
    graph is the key: ``build`` must derive the same function from the same graph
    whenever ``recipe`` is the same (the package's code is part of the key), and the
    function's shared variables must be among the graph's (a function with others is
    not stored).
    """
    if not cache_enabled():
        return build()
    key, shared = _key_and_shared(inputs, outputs, mode, recipe)
    if key is None:
        return build()
    path = cache_dir() / f"{key}.pkl"
    if path.exists():
        try:
            with path.open("rb") as f:
                (maker, storage, trust_input), rest, places = pickle.load(f)
            # Linked once, on the caller's shared variables: their containers are the
            # function's storage, as in a function compiled here.
            for k, i in enumerate(places):
                if i is not None:
                    storage[i] = shared[k].container
            fn = maker.create(storage)
            fn.trust_input = trust_input
            os.utime(path)
            _log.debug("Function cache: loaded %s.", path.name)
            return (fn, *rest)
        except Exception as exc:  # noqa: BLE001 - any unreadable entry is dropped
            _log.info("Function cache: %s could not be read (%s: %s); it is deleted and "
                      "the function compiled again.", path, type(exc).__name__, exc)
            path.unlink(missing_ok=True)
    built = build()
    # where each shared variable sits among the compiled function's inputs
    variables = [i.variable for i in built[0].maker.inputs]
    places = [next((j for j, v in enumerate(variables) if v is s), None) for s in shared]
    others = [v.name for v in variables
              if isinstance(v, SharedVariable) and not any(v is s for s in shared)]
    if others:  # a derivation's own shared variable: a loaded copy would not follow it
        _log.debug("Function cache: not stored (shared variables %s are not in the key's "
                   "graph).", others)
        return built
    fn = built[0]
    drop_rewrite_state(fn.maker.fgraph)
    entry = ((fn.maker, list(fn.input_storage), fn.trust_input), built[1:], places)
    _store(path, entry, [s for s, i in zip(shared, places, strict=True) if i is not None])
    return built


def drop_rewrite_state(fgraph: FunctionGraph) -> None:
    """Drop from a compiled function's graph what only its rewriting used.

    Rewriting leaves behind the graph's shape and merge features (symbolic shapes and
    signatures of every variable the rewrites ever made) and, in the graph's and the
    destroy handler's client maps, an empty entry for every variable a rewrite removed,
    each keeping that variable, its ancestors and their stack traces alive. A stored
    function pickled all of it: 2–8 MB for a 60-node function of the zoo's negative
    binomial (0.3–0.5 s to load), 0.4–1.0 MB without. The function runs as before: its
    thunks are made, the remaining nodes and their clients are unchanged, and the
    destroy handler, which orders in-place operations, is kept.
    """
    for name in ("shape_feature", "merge_feature"):
        feature = getattr(fgraph, name, None)
        if feature is not None:
            fgraph.remove_feature(feature)
            if getattr(fgraph, name, None) is feature:  # no on_detach of its own
                delattr(fgraph, name)
    live = fgraph.variables
    fgraph.clients = {v: c for v, c in fgraph.clients.items() if c or v in live}
    handler = getattr(fgraph, "destroy_handler", None)
    if handler is not None:
        handler.clients = {v: c for v, c in handler.clients.items() if c or v in live}


def _not_cached(why: str) -> None:
    """Warn that a compiled function is not stored in the cache, and why."""
    warnings.warn(
        f"Function cache: a compiled function is not stored, so a new process compiles "
        f"it again (a slower set-up): {why}.", RuntimeWarning, stacklevel=3,
    )


def _store(path: Path, built: Any, swapped: list[Any]) -> None:
    """Pickle ``built`` to ``path``, the values of the ``swapped`` shared variables left out.

    A loaded function is linked on the caller's shared variables, so their values in
    the pickle would never be read: an empty array of each one's dtype stands in for it
    while pickling (the data of the split's reference are hundreds of MB at N = 10⁶).
    """
    cells = [s.container.storage for s in swapped]
    values = [cell[0] for cell in cells]
    try:
        for cell, value in zip(cells, values, strict=True):
            if isinstance(value, np.ndarray):
                cell[0] = np.empty((0,) * value.ndim, dtype=value.dtype)
        data = pickle.dumps(built, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - not cached, warned
        _not_cached(f"it does not pickle ({type(exc).__name__}: {exc})")
        return
    finally:
        for cell, value in zip(cells, values, strict=True):
            cell[0] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        _log.info("Function cache: %s could not be written (%s).", path, exc)
        Path(tmp).unlink(missing_ok=True)
        return
    _prune(path.parent)


def _prune(folder: Path) -> None:
    entries = []
    for p in folder.glob("*.pkl"):
        try:
            st = p.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= MAX_CACHE_BYTES:
            break
        p.unlink(missing_ok=True)
        total -= size
