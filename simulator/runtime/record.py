"""``typing.NamedTuple``'s class syntax for the release's records, without importing typing or collections.

``class Knobs(NamedTuple): speed: Speed = Speed()`` makes a tuple subclass with named fields, defaults,
``_replace``, ``_asdict``, ``_make``, ``_fields`` and the same repr, equality and hash as
``typing.NamedTuple`` (which builds on ``collections.namedtuple``). Importing ``typing`` costs ~3 ms of CPU at
every start of the release's interpreters (~8 ms with the ``re`` it imports), ``collections`` ~2 ms and a
compiled ``__new__`` per class ~0.1 ms: generate and precompile start on every module at the start of a run,
100 cheap modules at once on 2 cores. Type checkers see ``typing.NamedTuple`` (the modules that use this import
it under ``TYPE_CHECKING``). Standard library only.
Kept by decision record docs/adr/0005-simulator-stand-ins.md (typing measured beside it).
"""

from __future__ import annotations

from _operator import itemgetter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


class _Record(tuple):
    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _field_defaults: dict[str, Any] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} positional arguments but {len(args)} were given")
        values = list(args)
        for name in fields[len(args):]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._field_defaults:
                values.append(cls._field_defaults[name])
            else:
                raise TypeError(f"{cls.__name__}() missing required argument: {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return tuple.__new__(cls, values)

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> Any:
        result = tuple.__new__(cls, iterable)
        if len(result) != len(cls._fields):
            raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(result)}")
        return result

    def _replace(self, **kwargs: Any) -> Any:
        result = self._make([kwargs.pop(name, value) for name, value in zip(self._fields, self, strict=True)])
        if kwargs:
            raise ValueError(f"Got unexpected field names: {list(kwargs)!r}")
        return result

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self, strict=True))
        return f"{self.__class__.__name__}({inner})"

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)


class _NamedTupleMeta(type):
    _reserved = frozenset({"__module__", "__qualname__", "__annotations__", "__orig_bases__", "__slots__"})

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> type:
        if not bases:  # NamedTuple itself
            return super().__new__(mcs, name, bases, ns)
        fields = tuple(ns.get("__annotations__", {}))
        body: dict[str, Any] = {k: v for k, v in ns.items() if k not in fields and k not in mcs._reserved}
        for i, field in enumerate(fields):
            body[field] = property(itemgetter(i), doc=f"Alias for field number {i}")
        body.update(__slots__=(), __module__=ns["__module__"], __qualname__=ns.get("__qualname__", name),
                    __match_args__=fields, _fields=fields,
                    _field_defaults={f: ns[f] for f in fields if f in ns})
        return type(name, (_Record,), body)


class NamedTuple(metaclass=_NamedTupleMeta):
    """Base of the release's records: ``class R(NamedTuple): field: type = default`` (see the module)."""
