"""Fast tier: the release's records (``m1000_sim.record.NamedTuple``, without typing or collections) behave as
``typing.NamedTuple`` classes of the same fields."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING
from typing import NamedTuple as TypingNamedTuple

import pytest

if TYPE_CHECKING:  # as the release's modules import it: type checkers see typing's
    from typing import NamedTuple
else:
    from simulator.runtime.record import NamedTuple


class Light(NamedTuple):
    """A record."""

    name: str
    key: str = ""
    n: int = 3

    def label(self) -> str:
        return f"{self.name}:{self.key}"


class Typed(TypingNamedTuple):
    name: str
    key: str = ""
    n: int = 3


def test_same_shape_as_typing_named_tuple() -> None:
    a, b = Light("x", n=5), Typed("x", n=5)
    assert tuple(a) == tuple(b) and a == b and hash(a) == hash(b) and isinstance(a, tuple)
    assert repr(a) == repr(b).replace("Typed", "Light")
    assert (a.name, a.key, a.n) == (b.name, b.key, b.n) and a[2] == 5 and a.label() == "x:"
    assert Light._fields == Typed._fields and Light._field_defaults == Typed._field_defaults
    assert a._replace(key="k") == b._replace(key="k") and a._asdict() == b._asdict()
    assert Light._make(["y", "z", 1]) == Typed._make(["y", "z", 1])
    assert pickle.loads(pickle.dumps(a)) == a and type(pickle.loads(pickle.dumps(a))) is Light
    assert Light.__qualname__ == "Light" and Light.__doc__ == "A record."
    assert Light.__match_args__ == Typed.__match_args__
    with pytest.raises(AttributeError):
        a.name = "y"  # type: ignore[misc]  # the refusal is the point
    with pytest.raises(AttributeError):
        a.other = 1  # type: ignore[attr-defined]  # the refusal is the point


@pytest.mark.parametrize(("args", "kwargs"), [((), {}), (("a", "b", 1, 2), {}), (("a",), {"nope": 1})])
def test_wrong_arguments_are_type_errors_as_typing_s(args: tuple, kwargs: dict) -> None:
    for cls in (Light, Typed):
        with pytest.raises(TypeError):
            cls(*args, **kwargs)
    for rec in (Light("a"), Typed("a")):
        with pytest.raises(ValueError, match="unexpected field names"):
            rec._replace(nope=1)  # type: ignore[call-arg]  # the unknown name is the point
        with pytest.raises(TypeError):
            type(rec)._make(["a"])
