"""Payloads derived from a kind's registered variants, not from a hand list: every field of every
variant's model (nested models, lists and optional fields included) filled, each free string
with the canary, so that a new kind, notice or field is covered without a change here."""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Union

from pydantic import BaseModel

from outbox_core import ActionVariants


@dataclass(frozen=True)
class Variant:
    """One variant of a kind: its name (a tag value, a key suffix, or ``one``), the payload with
    every field filled, the key suffix it needs (or ``""``), and the dotted paths of the
    payload's free strings, each of which holds the canary."""

    name: str
    payload: dict[str, Any]
    key_suffix: str
    strings: tuple[str, ...]


def variants_of(variants: ActionVariants, canary: str) -> Iterator[Variant]:
    """Every variant the declaration names, each with a filled payload."""
    match variants.shape:
        case "tagged":
            assert variants.bodies is not None and variants.tag and variants.body
            for tag, model in sorted(variants.bodies.items()):
                strings: list[str] = []
                body = fill(model, canary, variants.body, strings)
                yield Variant(tag, {variants.tag: tag, variants.body: body}, "", tuple(strings))
        case "one" | "key_suffix":
            assert variants.model is not None
            suffixes = sorted(variants.suffixes) if variants.suffixes is not None else [""]
            for suffix in suffixes:
                strings = []
                payload = fill(variants.model, canary, "", strings)
                yield Variant(suffix or "one", payload, suffix, tuple(strings))


def fill(model: type[BaseModel], canary: str, path: str, strings: list[str]) -> dict[str, Any]:
    """A JSON object for ``model`` with every field set (optional ones too)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        alias = info.alias or name
        out[alias] = value(info.annotation, canary, f"{path}.{alias}".lstrip("."), strings)
    return out


def value(annotation: Any, canary: str, path: str, strings: list[str]) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return value(typing.get_args(annotation)[0], canary, path, strings)
    if origin in (Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return value(options[0], canary, path, strings)
    if origin is Literal:
        return _plain(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _plain(next(iter(annotation)))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return fill(annotation, canary, path, strings)
    if origin in (list, tuple, set, frozenset):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis] or [str]
        return [value(args[0], canary, f"{path}[0]", strings)]
    if origin is dict:
        return {"k": value(typing.get_args(annotation)[1], canary, f"{path}.k", strings)}
    if annotation is bool:
        return True
    if annotation is int:
        return 1
    if annotation is float:
        return 1.5
    # str and anything that validates from a string (an identifier, a name): the canary.
    strings.append(path)
    return f"{canary}.{path}"


def _plain(member: Any) -> Any:
    return member.value if isinstance(member, enum.Enum) else member


def string_values(payload: Any, strings: tuple[str, ...]) -> list[str]:
    """The values at the dotted ``strings`` paths of ``payload``."""
    found = []
    for path in strings:
        node = payload
        for part in path.replace("[0]", ".[0]").split("."):
            node = node[0] if part == "[0]" else node[part]
        found.append(node)
    return found
