"""Every package's suite runs the shape checks of ``outbox_core.testing.shape`` on its own source
(issue 33: no import circle and no unexplained long module in any package), so a new package
cannot leave them out: ``nox -s tests`` runs each package's suite with only its own source."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = "from outbox_core.testing.shape import"


def test_every_package_runs_the_shape_checks_in_its_own_suite() -> None:
    packages = [
        path for path in sorted(REPO.glob("outbox-*")) if (path / "pyproject.toml").is_file()
    ]
    assert len(packages) >= 6, "the packages are found"
    missing = [
        package.name
        for package in packages
        if not any(
            SHAPE in test.read_text("utf-8") for test in (package / "tests").glob("test_*.py")
        )
    ]
    assert missing == []
