"""Email notices: each kind of email is an :class:`EmailNotice`.

A notice has a name, an event model (pydantic) and ``prepare(event, context)``, which returns
the :class:`Mail` to send or :class:`Unreachable` (nobody can receive it). The action's payload
holds the notice's name and its event, never the message: the notice prepares the message at
enqueue time (so what cannot be sent is refused then) and again before every attempt (so a
retry never reaches a person who unsubscribed, lost the role or the address meanwhile).
"""

from __future__ import annotations

import asyncio
import enum
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from email.headerregistry import Address
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from psycopg import AsyncConnection
from pydantic import BaseModel

from outbox_core import RegistrationError

from .errors import InvalidMail, UnknownNotice
from .sync_view import SyncView

if TYPE_CHECKING:
    import pluggy

NOTICE_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")

# ASCII addresses only: the adapter does not use SMTPUTF8. No quoted local parts.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
ADDR_SPEC = re.compile(rf"^{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})+$")
_NAMED = re.compile(r"^\s*(?P<name>[^<>]*?)\s*<(?P<addr>[^<>\s]+)>\s*$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,75}$")
# Headers the adapter writes itself; a notice may not set or override them.
RESERVED_HEADERS = frozenset(
    {
        "from",
        "sender",
        "to",
        "cc",
        "bcc",
        "reply-to",
        "subject",
        "date",
        "message-id",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
        "return-path",
    }
)
MAX_RECIPIENTS = 100

EventT = TypeVar("EventT", bound=BaseModel)


class UnreachableReason(enum.StrEnum):
    """Why nobody can receive an email; each is a stop reason of ``EMAIL``."""

    UNSUBSCRIBED = "UNSUBSCRIBED"
    """The person opted out of this email."""
    NO_ADDRESS = "NO_ADDRESS"
    """The person has no (verified) address any more."""
    NOT_PERMITTED = "NOT_PERMITTED"
    """The person lost the role or access that this email is about."""
    NO_RECIPIENT = "NO_RECIPIENT"
    """Any other reason nobody can receive it (the account is gone, ...)."""


@dataclass(frozen=True, slots=True)
class Unreachable:
    """``prepare`` returns this when nobody can receive the email. At enqueue time the enqueue
    is refused (:class:`~outbox_email.NoRecipient`); at an attempt the action ends FAILED with
    ``reason`` as its stop reason and nothing is sent. ``detail`` is for logs and errors: keep
    personal data out of it."""

    reason: UnreachableReason = UnreachableReason.NO_RECIPIENT
    detail: str = ""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "reason", UnreachableReason(self.reason))
        except ValueError:
            known = ", ".join(str(reason) for reason in UnreachableReason)
            raise InvalidMail(f"Unreachable: the reason is one of {known}") from None


def checked_address(value: str | Address, what: str) -> Address:
    """``value`` as an :class:`Address` that SMTP can carry, whether a string or an Address
    built by the caller: an Address skips no check that a string passes."""
    if isinstance(value, Address):
        name = value.display_name
        if any(ord(char) < 32 or ord(char) == 127 for char in name):
            raise InvalidMail(f"{what}: a display name may not contain control characters")
        value = value.addr_spec
        checked = parse_address(value, what)
        return Address(display_name=name, username=checked.username, domain=checked.domain)
    return parse_address(value, what)


def parse_address(value: str, what: str) -> Address:
    """``"a@example.com"`` or ``"Display Name <a@example.com>"`` as an :class:`Address`;
    :class:`InvalidMail` when it is neither (messages never echo the value)."""
    if not isinstance(value, str):
        raise InvalidMail(f"{what}: expected a string address, got {type(value).__name__}")
    if "\r" in value or "\n" in value:
        raise InvalidMail(f"{what}: an address may not contain a line break")
    named = _NAMED.match(value)
    name, addr = (named["name"], named["addr"]) if named else ("", value.strip())
    if not ADDR_SPEC.match(addr) or len(addr) > 254:
        raise InvalidMail(
            f"{what}: not an ASCII address of the form local@domain.tld "
            "(optionally 'Display Name <local@domain.tld>')"
        )
    username, domain = addr.rsplit("@", 1)
    return Address(display_name=name.strip().strip('"'), username=username, domain=domain)


@dataclass(frozen=True, slots=True)
class Mail:
    """The message a notice prepares: recipients, subject, text, optional HTML and headers.

    ``to`` takes one address or several (``"a@example.com"`` or ``"Name <a@example.com>"``).
    The adapter adds From, Date and the stable Message-ID; ``headers`` may add others (such as
    ``List-Unsubscribe``) but not those. Constructing an invalid Mail raises
    :class:`~outbox_email.InvalidMail`.
    """

    to: tuple[Address, ...]
    subject: str
    text: str
    html: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    reply_to: Address | None = None

    def __init__(
        self,
        to: str | Address | Sequence[str | Address],
        subject: str,
        text: str,
        html: str | None = None,
        headers: Mapping[str, str] | None = None,
        reply_to: str | Address | None = None,
    ) -> None:
        items = [to] if isinstance(to, str | Address) else list(to)
        if not items:
            raise InvalidMail("to: name at least one recipient")
        if len(items) > MAX_RECIPIENTS:
            raise InvalidMail(f"to: at most {MAX_RECIPIENTS} recipients per email")
        recipients = tuple(
            checked_address(item, f"to[{index}]") for index, item in enumerate(items)
        )
        if not isinstance(subject, str) or "\r" in subject or "\n" in subject:
            raise InvalidMail("subject: a single line of text")
        if not subject.strip():
            raise InvalidMail("subject: may not be empty")
        if len(subject) > 900:
            raise InvalidMail("subject: at most 900 characters")
        if not isinstance(text, str) or not text.strip():
            raise InvalidMail("text: every email has a plain-text body")
        if html is not None and not isinstance(html, str):
            raise InvalidMail("html: a string or None")
        extra = dict(headers or {})
        for name, value in extra.items():
            if not isinstance(name, str) or not _HEADER_NAME.match(name):
                raise InvalidMail(f"headers: {name!r} is not a header name")
            if name.lower() in RESERVED_HEADERS:
                raise InvalidMail(f"headers: {name} is written by the adapter; leave it out")
            if not isinstance(value, str) or "\r" in value or "\n" in value:
                raise InvalidMail(f"headers: the value of {name} must be one line of text")
            # A header line may not exceed 998 characters (RFC 5322), and a run without spaces
            # cannot be folded: a relay refuses the email, or splits the header.
            if len(value) > 900 or any(len(word) > 900 - len(name) for word in value.split()):
                raise InvalidMail(f"headers: the value of {name} is longer than 900 characters")
        reply = None if reply_to is None else checked_address(reply_to, "reply_to")
        object.__setattr__(self, "to", recipients)
        object.__setattr__(self, "subject", subject)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "html", html)
        object.__setattr__(self, "headers", extra)
        object.__setattr__(self, "reply_to", reply)

    @property
    def recipients(self) -> list[str]:
        """The envelope recipients (RCPT TO), in order and without duplicates."""
        return list(dict.fromkeys(address.addr_spec for address in self.to))


Prepared = Mail | Unreachable


@dataclass(frozen=True, slots=True)
class NoticeContext:
    """What ``prepare`` knows besides the event.

    ``stage`` is ``"enqueue"`` (inside the caller's transaction: ``connection`` is the caller's
    connection, so rows the transaction wrote are visible: a psycopg ``Connection`` for
    ``enqueue_email``; for ``aenqueue_email`` an ``AsyncConnection`` in ``aprepare`` and, in a
    sync ``prepare``, a sync view of it that answers as a ``Connection`` does) or ``"attempt"``
    (in the executor, before every attempt: ``connection`` is None; read committed state
    yourself).
    """

    stage: Literal["enqueue", "attempt"]
    idempotency_key: str
    workspace_id: str | None = None
    subject_account_id: str | None = None
    attempt: int | None = None
    connection: Any = None


class EmailNotice(Generic[EventT]):
    """One kind of email. Subclass it, set ``name`` and ``event``, implement ``prepare``::

        class PasswordChanged(EmailNotice[AccountEvent]):
            name = "password_changed"
            event = AccountEvent

            def prepare(self, event: AccountEvent, context: NoticeContext) -> Mail | Unreachable:
                account = accounts.get(event.account_id)
                if account is None or account.email is None:
                    return Unreachable(UnreachableReason.NO_ADDRESS)
                return Mail(to=account.email, subject="Your password changed", text="...")

    ``prepare`` must not send anything: it only decides. The executor calls :meth:`aprepare`,
    which runs ``prepare`` in a worker thread; override ``aprepare`` when your lookups are
    async, or to run a pure ``prepare`` inline.
    """

    name: ClassVar[str]
    """Stable name, stored in every payload: ``[a-z][a-z0-9_.-]*``. Renaming one is a new
    notice (rows of the old name need a build that still knows it)."""
    event: ClassVar[type[BaseModel]]
    """The pydantic model of the event. Keep it to identifiers; add fields as optional only
    (a replica of the previous build must still decode new rows)."""

    def prepare(self, event: EventT, context: NoticeContext) -> Prepared:
        """The message to send now, or why nobody can receive it."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement prepare()")

    async def aprepare(self, event: EventT, context: NoticeContext) -> Prepared:
        """The async form the executor and the async enqueues call; by default ``prepare`` in a
        worker thread. Called by an async enqueue, that ``prepare`` gets a sync view of the
        caller's ``AsyncConnection`` as ``context.connection`` (:mod:`outbox_email.sync_view`):
        it reads the caller's transaction as it does from a sync enqueue."""
        if isinstance(context.connection, AsyncConnection):
            loop = asyncio.get_running_loop()
            context = replace(context, connection=SyncView(context.connection, loop))
        return await asyncio.to_thread(self.prepare, event, context)

    def __repr__(self) -> str:
        return f"<EmailNotice {getattr(self, 'name', '?')!r} ({type(self).__qualname__})>"


@dataclass(frozen=True, slots=True)
class _Entry:
    notice: EmailNotice[Any]
    source: str


class NoticeRegistry:
    """Notice name -> notice. A second notice with a taken name names both registrants."""

    def __init__(self, notices: Iterable[EmailNotice[Any]] = (), *, source: str = "(application)"):
        self._entries: dict[str, _Entry] = {}
        for notice in notices:
            self.register(notice, source=source)

    def register(self, notice: EmailNotice[Any], *, source: str = "(application)") -> None:
        if isinstance(notice, type):
            raise RegistrationError(
                f"{source}: register an instance of the notice, register({notice.__qualname__}()), "
                "not the class"
            )
        if not isinstance(notice, EmailNotice):
            raise RegistrationError(f"{source}: register() takes an EmailNotice, got {notice!r}")
        label = type(notice).__qualname__
        name = getattr(notice, "name", None)
        if not isinstance(name, str) or not NOTICE_NAME.match(name):
            raise RegistrationError(
                f"{source}: {label}.name must be a short lower-case name such as "
                f"'password_changed' ([a-z][a-z0-9_.-]*), got {name!r}"
            )
        model = getattr(notice, "event", None)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise RegistrationError(
                f"{source}: {label}.event must be a pydantic model class, got {model!r}"
            )
        if type(notice).prepare is EmailNotice.prepare and (
            type(notice).aprepare is EmailNotice.aprepare
        ):
            raise RegistrationError(
                f"{source}: {label} implements neither prepare() nor aprepare()"
            )
        existing = self._entries.get(name)
        if existing is not None and existing.notice is not notice:
            raise RegistrationError(
                f"email notice {name!r} is registered twice: by "
                f"{type(existing.notice).__qualname__} from {existing.source} and by {label} "
                f"from {source}; each notice name has exactly one notice"
            )
        self._entries[name] = _Entry(notice, source)

    def get(self, name: str) -> EmailNotice[Any]:
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self._entries)) or "none"
            raise UnknownNotice(
                "payload.notice",
                f"no notice {name!r} is registered; registered ones are {known}; is "
                "OUTBOX_APP_PLUGINS set in this process? (a notice is registered by the "
                "outbox_register_email_notices hook of an installed plugin or of a module "
                "named there)",
            )
        return entry.notice

    def source(self, name: str) -> str:
        return self._entries[name].source

    @property
    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[EmailNotice[Any]]:
        return iter(self._entries[name].notice for name in self.names)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"NoticeRegistry({self.names})"


def collect_notices(pluginmanager: pluggy.PluginManager) -> NoticeRegistry:
    """Call ``outbox_register_email_notices`` plugin by plugin, in registration order, so that
    an error names the plugin that caused it."""
    from outbox_core import PluginLoadError

    registry = NoticeRegistry()
    hook = getattr(pluginmanager.hook, "outbox_register_email_notices", None)
    if hook is None:
        return registry
    for impl in hook.get_hookimpls():
        source = f"plugin {impl.plugin_name!r}"

        def register(notice: EmailNotice[Any], *, _source: str = source) -> None:
            registry.register(notice, source=_source)

        try:
            impl.function(**{name: register for name in impl.argnames if name == "register"})
        except RegistrationError:
            raise
        except Exception as exc:
            raise PluginLoadError(
                f"{source} failed in outbox_register_email_notices: {type(exc).__name__}: {exc}"
            ) from exc
    return registry
