"""Every check of the monorepo. `nox` runs `lint` (ruff, and pylint's check for code repeated
across the packages' src/), `types` (mypy --strict on every package), `tests` (each package's
tests with only outbox-core, that package and the outbox-* packages it depends on installed)
and `e2e` (the cross-package suites under tests/: rolling updates, the quickstart, the plugin
guide, the docs' shell blocks, the benchmarks' smoke run, the ORM integrations, the dashboard,
PgBouncer (tests/pooler), executors on network namespaces (tests/hosts), and the CI-sized chaos
run, its SIGSTOP cases, its failover tests and its checker's tests). Not in the default run:
`nox -s chaos`, the full-sized chaos run of docs/reliability.md (`nox -s chaos -- --failover` on
a pg_auto_failover formation), and `nox -s bench`, the benchmarks of docs/benchmarks.md."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = sorted(
    path.name for path in ROOT.glob("outbox-*") if (path / "pyproject.toml").is_file()
)

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "types", "tests", "e2e"]
nox.options.reuse_existing_virtualenvs = False

# The core's optional extras that the e2e suite tests (tests/integrations: the ORMs;
# tests/dashboard: the dashboard in Chromium); the core's own session installs none of them,
# so the core alone is tested without them too.
CORE_E2E_EXTRAS = ("sqlalchemy", "django", "dashboard")

# Fails the session when an outbox-* distribution was installed from an index instead of this
# checkout (a published outbox-core must never stand in for the one under test).
CHECK_LOCAL = """
import json, sys
from importlib import metadata
bad = []
for dist in metadata.distributions():
    name = (dist.metadata["Name"] or "").lower()
    if not name.startswith("outbox-"):
        continue
    text = dist.read_text("direct_url.json")
    url = json.loads(text).get("url", "") if text else ""
    if not url.startswith("file://"):
        bad.append(f"{name} {dist.version} came from an index, not from this checkout")
if bad:
    sys.exit("\\n".join(bad))
print("outbox distributions from the checkout:", sorted(
    d.metadata["Name"] for d in metadata.distributions()
    if (d.metadata["Name"] or "").lower().startswith("outbox-")))
"""


def _outbox_dependencies(package: str) -> list[str]:
    """The outbox-* distributions that `package` depends on, then their own, and so on (names
    of folders of this checkout): a package's session installs them from here, never from an
    index."""
    found: list[str] = []
    pending = [package]
    while pending:
        project = tomllib.loads((ROOT / pending.pop() / "pyproject.toml").read_text())["project"]
        for requirement in project.get("dependencies", []):
            name = re.match(r"[A-Za-z0-9_.-]+", requirement)
            if name is None:
                continue
            dependency = name.group(0).lower().replace("_", "-")
            if dependency.startswith("outbox-") and dependency not in found:
                if not (ROOT / dependency / "pyproject.toml").is_file():
                    raise RuntimeError(f"{package} depends on {dependency}, not in this checkout")
                found.append(dependency)
                pending.append(dependency)
    return found


def _local(
    session: nox.Session, *packages: str, extra: str = "test", core_extras: tuple[str, ...] = ()
) -> None:
    """Installs `packages` with their test extra, and the outbox-* distributions they depend on
    (the core always) from this checkout without extras; the core also with `core_extras`."""
    wanted = [p for p in packages if p != "outbox-core"]
    dependencies = ["outbox-core"]
    for package in wanted:
        dependencies += _outbox_dependencies(package)
    core = ",".join((extra, *core_extras))
    specs = [f"./outbox-core[{core}]"] + [f"./{package}[{extra}]" for package in wanted]
    specs += sorted({f"./{d}" for d in dependencies if d not in wanted and d != "outbox-core"})
    session.install(*specs)
    session.run("python", "-c", CHECK_LOCAL)


@nox.session(python="3.11")
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package's tests with only outbox-core, that package with its test extra and the
    outbox-* packages it depends on (from this checkout) installed."""
    _local(session, package)
    session.run("pytest", f"{package}/tests", "-p", "no:cacheprovider", *session.posargs)


@nox.session(python="3.11")
def e2e(session: nox.Session) -> None:
    """The cross-package suites with every package: rolling updates, the quickstart, the plugin
    guide, the docs' shell blocks, the benchmarks' smoke run, the ORM integrations, the
    dashboard, PgBouncer's pool modes, executors on network namespaces (a partition, added
    latency), the CI-sized chaos run, the SIGSTOP cases and the failover tests (tests/chaos;
    CHAOS_SKIP=1 skips those three, not the checker's tests)."""
    _local(session, *PACKAGES, core_extras=CORE_E2E_EXTRAS)
    session.install("-r", "tests/requirements.txt")
    session.run("pytest", "tests", "-p", "no:cacheprovider", *session.posargs)


@nox.session(python="3.11")
def chaos(session: nox.Session) -> None:
    """The full-sized chaos run of docs/reliability.md (about 10 minutes on two cores): its own
    PostgreSQL cluster, `outbox run` processes killed and replaced, PostgreSQL restarted, a
    faulty provider, then the checker's verdict (exit 1 when an invariant broke). Parameters
    as options or CHAOS_<NAME> variables: `nox -s chaos -- --actions 5000 --json report.json`,
    `nox -s chaos -- --help`. `nox -s chaos -- --failover`: a pg_auto_failover formation
    (Debian's postgresql-15-auto-failover) and its failovers in place of the restarts, through
    a multi-host URL (`--replication async`, `--skew-seconds 2`: docs/reliability.md)."""
    _local(session, "outbox-core")
    session.install("-r", "tests/requirements.txt")
    session.run("python", "-m", "tests.chaos.run", *session.posargs)


# The repeated-code check of `lint` (issue 33): pylint's duplicate-code over every package's
# src/, imports, docstrings, comments and signatures left out, at 4 lines or more. At 4, main
# before issue 33 held five repeats (the action/claim fields in action.py ~ attempt.py; the draft
# and issues settings' URL check; two testing/provider pairs of draft, feedback and issues;
# feedback's send request in adapter.py ~ enqueue.py) and it fails on each; at 3 it also names two
# calls of one function with the same arguments. A repeat kept on purpose says why at its lines
# and is marked `# pylint: disable=duplicate-code` there (claimed.py: ClaimedAction's fields).
REPEAT_LINES = 4


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff, then the repeated-code check across the packages (see REPEAT_LINES)."""
    session.install("ruff==0.17.6", "pylint==4.1.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = sorted(str(path.relative_to(ROOT)) for path in ROOT.glob("outbox-*/src/outbox_*"))
    session.run(
        "pylint",
        "--disable=all",
        "--enable=duplicate-code",
        "--ignore-imports=y",
        "--ignore-docstrings=y",
        "--ignore-comments=y",
        "--ignore-signatures=y",
        f"--min-similarity-lines={REPEAT_LINES}",
        "--score=n",
        "--persistent=n",
        *sources,
    )


@nox.session(python="3.11")
def types(session: nox.Session) -> None:
    session.install(
        "mypy==2.4.1",
        *(f"./{package}[test]" for package in PACKAGES if package != "outbox-core"),
        "./outbox-core[" + ",".join(("test", *CORE_E2E_EXTRAS)) + "]",
    )
    for package in PACKAGES:
        session.run("mypy", "--strict", f"{package}/src")


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks against procrastinate and pgqueuer; writes docs/benchmarks.md and the plot.
    `nox -s bench -- --quick` for a smoke run."""
    _local(session, *PACKAGES)
    session.install("-r", "bench/requirements.txt")
    session.run("python", "bench/run_all.py", *session.posargs)
