"""What an adapter decodes, and the one JSON path per kind derived from it.

An adapter declares ``variants()``; there is no default. From the declared pydantic models
the core derives a SQL/JSON path predicate (``payload @@ path``) that accepts a payload
exactly when every enum, ``Literal`` and tag value in it is one this build knows, and a
pattern for the idempotency key's last segment when the variant is chosen by key suffix.
Claims, reclaims, the reaper and the backlog gauges select only rows that match, so a row
written by a newer build is never fetched, let alone failed, by an older one.
"""

from __future__ import annotations

import enum
import functools
import itertools
import json
import math
import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import InvalidRequest, UndecodableAction
from .requests import key_segment, text_problem

KEY_SEGMENT_SEPARATOR = ":"
# A value with the shape of a name in code (a notice's ``email_changed``, a tag's ``v2``):
# lower case, digits, underscores and dots, at most 64 characters. An error may name such a
# tag value; a value of any other shape may be data and is never repeated (tests/security).
CODE_NAME = re.compile(r"[a-z][a-z0-9_.]{0,63}")
_REGEX_SPECIALS = set(".^$*+?()[]{}|\\")


@dataclass(frozen=True, slots=True)
class ActionVariants:
    """The payloads an adapter decodes. Build it with :meth:`one`, :meth:`tagged` or
    :meth:`key_suffix`."""

    shape: Literal["one", "tagged", "key_suffix"]
    model: type[BaseModel] | None = None
    tag: str | None = None
    body: str | None = None
    bodies: Mapping[str, type[BaseModel]] | None = None
    suffixes: frozenset[str] | None = None
    placeholder: str | None = None

    @classmethod
    def one(cls, model: type[BaseModel]) -> ActionVariants:
        """The payload names no variant; its enum and Literal components are still checked."""
        _require_model(model, "one(model)")
        return cls(shape="one", model=model)

    @classmethod
    def tagged(
        cls,
        tag: str,
        body: str,
        bodies: Mapping[str, type[BaseModel]],
        *,
        placeholder: str | None = None,
    ) -> ActionVariants:
        """The string property ``tag`` selects the variant; the property ``body`` holds it, one
        model per tag value: ``{"notice": "welcome", "event": {...}}``. ``placeholder`` names
        the one tag value declared while nothing is registered (its body model decodes nothing,
        so this build claims no row of the kind): an error never offers it as registered."""
        if not bodies:
            raise ValueError("tagged(): declare at least one tag value and its body model")
        if placeholder is not None and placeholder not in bodies:
            raise ValueError("tagged(): the placeholder is one of the declared tag values")
        if tag == body:
            raise ValueError("tagged(): the tag and the body are two different properties")
        for value, model in bodies.items():
            if not isinstance(value, str) or not value:
                raise ValueError(f"tagged(): tag values are non-empty strings, not {value!r}")
            _require_model(model, f"tagged(): the body of {value!r}")
        return cls(shape="tagged", tag=tag, body=body, bodies=dict(bodies), placeholder=placeholder)

    @classmethod
    def key_suffix(cls, values: Iterable[str], model: type[BaseModel]) -> ActionVariants:
        """The last ``:``-separated segment of the idempotency key selects the variant;
        ``model`` is the payload of every variant."""
        suffixes = frozenset(values)
        if not suffixes:
            raise ValueError("key_suffix(): declare at least one suffix")
        for value in suffixes:
            if not isinstance(value, str) or not value or KEY_SEGMENT_SEPARATOR in value:
                raise ValueError(f"key_suffix(): {value!r} is not one key segment")
            problem = text_problem(value, limit=None)
            if problem is not None:
                raise ValueError(f"key_suffix(): {value!r} {problem}")
        _require_model(model, "key_suffix(model)")
        return cls(shape="key_suffix", model=model, suffixes=suffixes)

    # -- derived ---------------------------------------------------------------------------

    def json_path(self) -> str | None:
        """The SQL/JSON path predicate for ``payload @@ path``; None when nothing is checked."""
        match self.shape:
            case "one" | "key_suffix":
                assert self.model is not None
                return _joined(_model_predicates(self.model, "$"))
            case "tagged":
                assert self.bodies is not None and self.tag is not None and self.body is not None
                options = []
                for value, model in sorted(self.bodies.items()):
                    parts = [f"{_key('$', self.tag)} == {_literal(value)}"]
                    parts.extend(_model_predicates(model, _key("$", self.body)))
                    options.append(" && ".join(parts))
                return " || ".join(f"({option})" for option in options)
        raise AssertionError(self.shape)  # pragma: no cover

    def key_pattern(self) -> str | None:
        """A PostgreSQL regular expression for the key's last segment, for key_suffix."""
        if self.suffixes is None:
            return None
        options = "|".join(_regex_escape(value) for value in sorted(self.suffixes))
        return f"(^|{KEY_SEGMENT_SEPARATOR})({options})$"

    def describe(self) -> dict[str, Any]:
        """For ``outbox plugins``: the declaration and the derived filters."""
        out: dict[str, Any] = {"shape": self.shape}
        if self.model is not None:
            out["model"] = self.model.__qualname__
        if self.bodies is not None:
            out["tag"], out["body"] = self.tag, self.body
            out["bodies"] = {tag: model.__qualname__ for tag, model in sorted(self.bodies.items())}
        if self.suffixes is not None:
            out["suffixes"] = sorted(self.suffixes)
        out["json_path"] = self.json_path()
        out["key_pattern"] = self.key_pattern()
        return out

    # -- decoding --------------------------------------------------------------------------

    def decode(self, payload: Any, idempotency_key: str, *, kind: str) -> BaseModel:
        """The payload as its model; :class:`InvalidRequest` (field ``payload`` or
        ``idempotency_key``) when it does not fit. Messages never echo input values."""
        self.check_key(idempotency_key, kind=kind)
        if self.shape == "tagged":
            assert self.bodies is not None and self.tag is not None and self.body is not None
            if not isinstance(payload, Mapping):
                raise InvalidRequest("payload", f"{kind} expects a JSON object")
            tag = payload.get(self.tag)
            if tag not in self.bodies:
                raise InvalidRequest(f"payload.{self.tag}", self.unregistered(tag, kind=kind))
            extra = set(payload) - {self.tag, self.body}
            if extra:
                raise InvalidRequest("payload", f"{kind} has no properties {sorted(extra)}")
            model = self.bodies[str(tag)]
            return _validate(model, payload.get(self.body), f"payload.{self.body}", kind)
        assert self.model is not None
        return _validate(self.model, payload, "payload", kind)

    def decode_many(
        self, payloads: Sequence[Any], idempotency_keys: Sequence[str], *, kind: str
    ) -> list[BaseModel]:
        """:meth:`decode` of each payload, in one validator call where the shape allows (a
        batch's validation is then one pass in pydantic's core, not one Python call each); the
        first payload that does not fit raises as :meth:`decode` would."""
        chunks = self._chunks(payloads, idempotency_keys, kind=kind, size=len(payloads))
        return list(itertools.chain.from_iterable(chunks))

    def check_many(
        self, payloads: Sequence[Any], idempotency_keys: Sequence[str], *, kind: str
    ) -> None:
        """:meth:`decode_many` for a caller that needs no model: the same checks, in the same
        order, raising the same error, but the models are made ``CHECK_CHUNK`` payloads at a
        time and each chunk's are dropped before the next is made."""
        for _ in self._chunks(payloads, idempotency_keys, kind=kind, size=CHECK_CHUNK):
            pass

    def _chunks(
        self, payloads: Sequence[Any], idempotency_keys: Sequence[str], *, kind: str, size: int
    ) -> Iterator[list[BaseModel]]:
        """The payloads' models, ``size`` at a time (one at a time for tagged variants, which
        :meth:`decode` picks payload by payload). Key-suffix variants check every key first; a
        chunk that does not fit raises as :meth:`decode` would for its first misfit."""
        if self.shape == "tagged" or len(payloads) < 2:
            for payload, key in zip(payloads, idempotency_keys, strict=True):
                yield [self.decode(payload, key, kind=kind)]
            return
        assert self.model is not None
        if self.suffixes is not None:
            for key in idempotency_keys:
                self.check_key(key, kind=kind)
        validate = _many(self.model).validate_python
        for start in range(0, len(payloads), size):
            try:
                models = validate(payloads[start : start + size])
            except ValidationError:
                # Find the first culprit and name it as decode() does.
                for payload, key in zip(payloads, idempotency_keys, strict=True):
                    self.decode(payload, key, kind=kind)
                raise  # pragma: no cover (a batch that fails has a member that fails)
            yield models

    def unregistered(self, value: Any, *, kind: str) -> str:
        """What to say when a payload's tag names no registered variant: which are registered,
        the nearest of them, and the usual cause (the registering module not loaded here). The
        value is named only when it has the shape of a name in code (:data:`CODE_NAME`: a
        notice's name, ``email_changed``): a variant's tag is the application's identifier, not
        its data. Any other value is not repeated, since it may be data put in the wrong place,
        and no payload data is ever in an error (tests/security); the caller has it."""
        from .settings_section import nearest

        assert self.bodies is not None and self.tag is not None
        known = [name for name in sorted(self.bodies) if name != self.placeholder]
        if not isinstance(value, str) or not value:
            named = f"the payload names no {self.tag} (its {self.tag!r} property)"
        else:
            which = f" {value!r}" if CODE_NAME.fullmatch(value) else ""
            named = f"no {self.tag}{which} is registered for {kind}{nearest(value, known)}"
        return (
            f"{named}; registered ones are {', '.join(known) or 'none'}; is "
            "OUTBOX_APP_PLUGINS set in this process? (the modules that register them in code "
            "are loaded from it, beside the installed plugins)"
        )

    def check_key(self, idempotency_key: str, *, kind: str) -> None:
        """:class:`InvalidRequest` when the key's last segment names a variant this build lacks
        (key-suffix variants only; other shapes accept every key)."""
        if self.suffixes is None:
            return
        suffix = idempotency_key.rsplit(KEY_SEGMENT_SEPARATOR, 1)[-1]
        if suffix not in self.suffixes:
            raise InvalidRequest(
                "idempotency_key",
                f"{kind} selects its variant by the key's last segment; {suffix!r} is not one "
                f"of {sorted(self.suffixes)}",
            )

    def decode_or_raise(self, payload: Any, idempotency_key: str, *, kind: str) -> BaseModel | None:
        """Like :meth:`decode` for a row already stored: :class:`UndecodableAction`. A row
        without a payload (an ended action) decodes to None, but only when its key names a
        variant this build knows: for key-suffix variants the key outlives the payload."""
        try:
            if payload is None:
                self.check_key(idempotency_key, kind=kind)
                return None
            return self.decode(payload, idempotency_key, kind=kind)
        except InvalidRequest as exc:
            raise UndecodableAction(f"this build cannot decode a {kind} action: {exc}") from None

    def encode(self, value: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
        """A payload for the table from a model (or a plain mapping, returned as a dict)."""
        if isinstance(value, BaseModel):
            if self.shape == "tagged":
                assert self.bodies is not None and self.tag is not None and self.body is not None
                for tag, model in self.bodies.items():
                    if type(value) is model:
                        return {self.tag: tag, self.body: value.model_dump(mode="json")}
                raise InvalidRequest(
                    "payload", f"{type(value).__qualname__} is not one of the declared bodies"
                )
            return value.model_dump(mode="json")
        if not isinstance(value, Mapping):
            # dict() would take a list of pairs as an object, and fail on others obscurely.
            raise InvalidRequest(
                "payload",
                f"must be a JSON object (a mapping) or a model of the kind's variants, not a "
                f"{type(value).__name__}",
            )
        return dict(value)


def _require_model(model: Any, where: str) -> None:
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{where}: expected a pydantic model class, got {model!r}")


CHECK_CHUNK = 128
"""How many payloads :meth:`ActionVariants.check_many` validates at a time: few enough that
their models (a model, its ``__dict__`` and its set of fields set: three objects the garbage
collector tracks) are dropped before the collector's youngest generation fills (700 objects
by default). A batch's 10,000 models kept at once outlived it instead, and the collector's full
passes then walked every object the process holds: a third of a bulk enqueue's time in Python
(docs/benchmarks.md, issue 23)."""


@functools.cache
def _many(model: type[BaseModel]) -> TypeAdapter[list[BaseModel]]:
    """The validator of a list of ``model``s, built once per model."""
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def _validate(model: type[BaseModel], value: Any, field: str, kind: str) -> BaseModel:
    try:
        # model_validate() with its defaults, without its Python wrapper (half of its cost for
        # a small payload: every enqueue validates one).
        return model.__pydantic_validator__.validate_python(value)  # type: ignore[no-any-return]
    except ValidationError as exc:
        problems = "; ".join(
            f"{field}{''.join(key_segment(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors(include_input=False, include_url=False)
        )
        raise InvalidRequest(field, f"{kind} refuses it: {problems}") from None


# -- path derivation ---------------------------------------------------------------------------


def _path_text(value: str, what: str) -> str:
    """``value`` as a JSON path string literal: quoted and escaped, or ValueError for text that
    PostgreSQL's jsonpath refuses (a NUL character, a lone surrogate), which would make every
    claim of every kind fail."""
    problem = text_problem(value, limit=None)
    if problem is not None:
        raise ValueError(f"the {what} {value!r} {problem}")
    return json.dumps(value)


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{_path_text(name, 'property name')}"


def _literal(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return _path_text(value, "value")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"cannot put {value!r} in a JSON path")
    if isinstance(value, bool) or value is None or isinstance(value, int | float):
        return json.dumps(value)
    raise TypeError(f"cannot put {value!r} in a JSON path")


def _joined(predicates: list[str]) -> str | None:
    return " && ".join(predicates) if predicates else None


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None was allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            return args[0], nullable
        return Union[tuple(args)], nullable  # noqa: UP007
    if origin is typing.Annotated:
        return _strip_optional(typing.get_args(annotation)[0])
    return annotation, False


def _allowed_values(annotation: Any) -> list[Any] | None:
    """The closed set of values of an enum or Literal annotation (None: not a closed set)."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [member.value for member in annotation]
    if typing.get_origin(annotation) is Literal:
        return [_plain(arg) for arg in typing.get_args(annotation)]
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        values: list[Any] = []
        for arg in typing.get_args(annotation):
            sub = _allowed_values(arg)
            if sub is None:
                return None
            values.extend(sub)
        return values
    return None


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _one_of(target: str, values: list[Any]) -> str:
    return "(" + " || ".join(f"{target} == {_literal(value)}" for value in values) + ")"


def _field_predicate(
    annotation: Any, path: str, enclosing: tuple[type[BaseModel], ...]
) -> str | None:
    inner, _ = _strip_optional(annotation)
    values = _allowed_values(inner)
    if values is not None:
        return _one_of(path, values)
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return _joined(_model_predicates(inner, path, enclosing))
    origin = typing.get_origin(inner)
    if origin in (list, tuple, set, frozenset):
        args = [arg for arg in typing.get_args(inner) if arg is not Ellipsis]
        if len(args) == 1:
            element_values = _allowed_values(_strip_optional(args[0])[0])
            if element_values is not None:
                # No element outside the closed set (an empty list passes).
                unknown = " && ".join(f"@ != {_literal(value)}" for value in element_values)
                return f"!(exists({path}[*] ? ({unknown})))"
    return None


def _model_predicates(
    model: type[BaseModel], prefix: str, enclosing: tuple[type[BaseModel], ...] = ()
) -> list[str]:
    """The model's predicates at ``prefix``, every level of nesting included. A model that
    contains itself (directly or through others) is checked above its first repetition: from
    there down, decoding at the attempt checks it, and defers a row it cannot decode instead
    of failing it."""
    if model in enclosing:
        return []
    enclosing = (*enclosing, model)
    predicates: list[str] = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        path = _key(prefix, alias)
        predicate = _field_predicate(field.annotation, path, enclosing)
        if predicate is None:
            continue
        _, nullable = _strip_optional(field.annotation)
        escapes = []
        if not field.is_required():
            escapes.append(f"!(exists({path}))")
        if nullable:
            escapes.append(f"{path} == null")
        if escapes:
            predicate = "(" + " || ".join([*escapes, predicate]) + ")"
        predicates.append(predicate)
    return predicates


def _regex_escape(value: str) -> str:
    return "".join(f"\\{char}" if char in _REGEX_SPECIALS else char for char in value)
