"""The executor: the only caller of ``ActionAdapter.execute``."""

from .engine import Executor

__all__ = ["Executor"]
