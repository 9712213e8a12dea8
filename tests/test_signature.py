"""Every step method's keywords are explicit, typed, defaulted and documented.

The public step methods list each keyword on their own ``__init__`` (no ``**kwargs``),
document each in their docstring (every value of ``control_variate`` and of
``proposal``'s names), and the guide's settings page lists ``MinibatchBarker``'s with
the same defaults.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from pymc_minibatch_mh import AustereMH, ExactMH, MHSubLhd, MinibatchBarker, MinibatchGibbs
from pymc_minibatch_mh.estimators.registry import CONTROL_VARIATE_SETTINGS
from pymc_minibatch_mh.proposals.registry import PROPOSALS
from pymc_minibatch_mh.transition.settings import (
    MoveSettings,
    StepSettings,
    document_parameters,
    documented_parameters,
    signature_parameters,
)

STEPS = [MinibatchBarker, AustereMH, MHSubLhd, ExactMH, MinibatchGibbs]
SETTINGS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "settings.md"


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step.__name__)
def test_every_keyword_is_explicit_typed_defaulted_and_documented(step):
    parameters = signature_parameters(step)
    documented = documented_parameters(step.__doc__)
    for name, parameter in parameters.items():
        assert parameter.kind is not inspect.Parameter.VAR_KEYWORD, name
        assert parameter.annotation is not inspect.Parameter.empty, name
        assert parameter.default is not inspect.Parameter.empty, name
        assert name in documented, f"{step.__name__} does not document {name!r}"
    assert documented <= set(parameters), documented - set(parameters)
    assert "{shared_parameters}" not in step.__doc__


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step.__name__)
def test_every_keyword_reaches_the_settings_it_names(step):
    """The keywords the bases read are taken by name: none is lost on the way."""
    names = set(signature_parameters(step))
    shared = {f for f in StepSettings.__dataclass_fields__} | set(MoveSettings.__dataclass_fields__)
    own = names - shared - {"vars"}
    # The step's own keywords are read by its own __init__ (its source names each).
    source = inspect.getsource(step.__init__)
    for name in own:
        assert re.search(rf"\b{name}\b", source.split(") -> None:", 1)[1]), name


def _entry(doc, name):
    """The docstring entry of ``name``: its line and the indented lines below it."""
    match = re.search(rf"^{name} : .*\n((?:    .*\n|\n)*)", doc, flags=re.MULTILINE)
    return match.group(0)


def test_every_value_of_control_variate_and_proposal_is_documented():
    doc = MinibatchBarker.__doc__
    entry = _entry(doc, "control_variate")
    for value in CONTROL_VARIATE_SETTINGS:
        assert f'"{value}"' in entry, value
    assert "None" in entry
    entry = _entry(doc, "proposal")
    for name in PROPOSALS:
        assert f'"{name}"' in entry, name


def test_the_settings_page_lists_every_keyword_with_its_default():
    text = SETTINGS_PAGE.read_text()
    rows = re.findall(r"^\| `(\w+)`[^|]*\| `([^`]*)`", text, flags=re.MULTILINE)
    page = dict(rows)
    parameters = signature_parameters(MinibatchBarker)
    assert set(page) == set(parameters) - {"vars"}
    for name, default in page.items():
        expected = repr(parameters[name].default).replace("'", '"')
        assert default == expected, (name, default, expected)


def test_a_hidden_or_undocumented_keyword_is_refused():
    class Hidden:
        """A step.

        Parameters
        ----------
        a : int
            A.
        {shared_parameters}
        """

        def __init__(self, a: int = 1, **kwargs: int) -> None: ...

    with pytest.raises(TypeError, match="takes \\*\\*kwargs"):
        document_parameters(Hidden)

    class Undocumented:
        """A step.

        Parameters
        ----------
        {shared_parameters}
        """

        def __init__(self, a: int = 1, temperature: float = 1.0) -> None: ...

    with pytest.raises(TypeError, match="does not document 'a'"):
        document_parameters(Undocumented)

    class Shared:
        """A step.

        Parameters
        ----------
        a : int
            A.
        {shared_parameters}
        """

        def __init__(self, a: int = 1, temperature: float = 1.0) -> None: ...

    assert documented_parameters(document_parameters(Shared).__doc__) == {"a", "temperature"}
