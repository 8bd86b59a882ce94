"""The kinds this build serves: adapter classes registered by plugins, checked on the way in."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .adapter import KIND_NAME, ActionAdapter, adapter_class_problems, has_own
from .errors import RegistrationError, UnknownKind
from .results import StopReason
from .variants import ActionVariants


@dataclass(frozen=True)
class RegisteredKind:
    """A kind, its adapter class, who registered it and what it decodes."""

    adapter: type[ActionAdapter]
    variants: ActionVariants
    distribution: str
    version: str

    @property
    def kind(self) -> str:
        return self.adapter.kind

    @cached_property
    def json_path(self) -> str | None:
        return self.variants.json_path()

    @cached_property
    def key_pattern(self) -> str | None:
        return self.variants.key_pattern()

    @cached_property
    def checks_enqueue(self) -> bool:
        """Whether the adapter has an enqueue check of its own (``check_enqueue`` or its
        async twin): the enqueue paths call none for a kind without one."""
        return has_own(self.adapter, "acheck_enqueue")

    @cached_property
    def stop_reasons(self) -> frozenset[str]:
        return StopReason.core() | self.adapter.stop_reasons

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "adapter": f"{self.adapter.__module__}.{self.adapter.__qualname__}",
            "at_most_once": self.adapter.at_most_once,
            "instance_level": self.adapter.instance_level,
            "retained": self.adapter.retained,
            "writes_outside": self.adapter.writes_outside,
            "variants": self.variants.describe(),
        }


@dataclass(frozen=True, slots=True)
class KindFilter:
    """Aligned arrays for the claim functions' ``decodable_v1``."""

    kinds: list[str]
    paths: list[str | None]
    suffixes: list[str | None]

    @property
    def filtered(self) -> list[str]:
        """The kinds whose rows decodable_v1 must test one by one (a path into the payload or
        a key suffix); a row of any other of :attr:`kinds` is decoded by its kind's name alone
        (``backlog_counts`` reads a million live actions so)."""
        return [
            kind
            for kind, path, suffix in zip(self.kinds, self.paths, self.suffixes, strict=True)
            if path is not None or suffix is not None
        ]

    def params(self) -> dict[str, Any]:
        """The filter as the queries take it: ``kinds``, ``paths``, ``suffixes`` (the arrays of
        ``decodable_v1``) and ``filtered`` (``backlog_counts``)."""
        return {
            "kinds": self.kinds,
            "paths": self.paths,
            "suffixes": self.suffixes,
            "filtered": self.filtered,
        }


class KindRegistry:
    """Kind name -> :class:`RegisteredKind`. A duplicate kind names both registrants."""

    def __init__(self) -> None:
        self._kinds: dict[str, RegisteredKind] = {}

    def register(
        self,
        adapter: type[ActionAdapter],
        *,
        distribution: str = "(application)",
        version: str = "",
    ) -> RegisteredKind:
        where = f"{distribution} {version}".strip()
        if not (isinstance(adapter, type) and issubclass(adapter, ActionAdapter)):
            raise RegistrationError(
                f"{where}: register() takes an ActionAdapter subclass, got {adapter!r}"
            )
        kind = getattr(adapter, "kind", None)
        if not isinstance(kind, str) or not KIND_NAME.match(kind):
            raise RegistrationError(
                f"{where}: {adapter.__qualname__}.kind must be an upper-case name such as "
                f"'SLACK_POST', got {kind!r}"
            )
        problems = adapter_class_problems(adapter)
        if problems:
            raise RegistrationError(f"{where}: " + "; ".join(problems))
        variants = adapter.variants()  # raises RegistrationError when not declared
        if not isinstance(variants, ActionVariants):
            raise RegistrationError(
                f"{where}: {adapter.__qualname__}.variants() returned {variants!r}, "
                "not ActionVariants"
            )
        if adapter.at_most_once and not adapter.writes_outside:
            raise RegistrationError(
                f"{where}: {adapter.__qualname__} declares at_most_once and writes_outside = "
                "False: a kind that writes nothing outside has no write to send at most once; "
                "drop one of the two"
            )
        existing = self._kinds.get(kind)
        if existing is not None and existing.adapter is not adapter:
            raise RegistrationError(
                f"kind {kind} is registered twice: by {existing.adapter.__qualname__} from "
                f"{existing.distribution} {existing.version} and by {adapter.__qualname__} from "
                f"{where}; each kind has exactly one adapter"
            )
        entry = RegisteredKind(adapter, variants, distribution, version)
        try:
            # Derived now, not at the first claim: a name the claim's jsonpath or regular
            # expression cannot hold would make every claim of every kind fail.
            entry.json_path, entry.key_pattern  # noqa: B018
        except (TypeError, ValueError) as exc:
            raise RegistrationError(f"{where}: {adapter.__qualname__}.variants(): {exc}") from None
        self._kinds[kind] = entry
        return entry

    def unregister(self, kind: str) -> None:
        self._kinds.pop(kind, None)

    def get(self, kind: str) -> RegisteredKind:
        try:
            return self._kinds[kind]
        except KeyError:
            installed = ", ".join(sorted(self._kinds)) or "none"
            raise UnknownKind(
                f"{kind}: no installed plugin registers it; installed kinds: {installed}"
            ) from None

    def __contains__(self, kind: object) -> bool:
        return kind in self._kinds

    def __iter__(self) -> Iterator[RegisteredKind]:
        return iter(sorted(self._kinds.values(), key=lambda entry: entry.kind))

    def __len__(self) -> int:
        return len(self._kinds)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._kinds)

    def copy(self) -> KindRegistry:
        clone = KindRegistry()
        clone._kinds = dict(self._kinds)
        return clone

    def filter(self, kinds: Collection[str] | None = None) -> KindFilter:
        """The claim filter for the named kinds (all registered kinds when None): one entry per
        kind, as decodable_v1 expects (it reads the first entry of a kind)."""
        chosen = (
            [self.get(kind) for kind in sorted(set(kinds))] if kinds is not None else list(self)
        )
        return KindFilter(
            kinds=[entry.kind for entry in chosen],
            paths=[entry.json_path for entry in chosen],
            suffixes=[entry.key_pattern for entry in chosen],
        )
