"""``outbox dashboard``: a small web application for operators (extra
``outbox-core[dashboard]``: Starlette, Jinja, uvicorn).

Server-rendered pages of what an operator reviews (the backlog by kind and state, the oldest due
action, blocked lanes with their heads, UNCERTAIN actions, recent failures, the last hour's
throughput, the installed kinds), kept live by server-sent events that the server sends when
the outbox's channel is notified (LISTEN) and every few seconds; a little JavaScript of its own,
nothing fetched from elsewhere. Two operator actions, through the same core functions as the
command line (:mod:`outbox_core.operator`): cancel an action that has not started, and run a due
lane head now. A search of actions (:mod:`outbox_core.search`), each id linking to its action's
page. Never a payload. ``docs/dashboard.md`` tells how to run it safely.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
