"""Task registry: built-in synthetic tasks plus those added through ``lengthgen.tasks`` entry points."""

from __future__ import annotations

import inspect
from typing import Any

from lengthgen.registry import Registry
from lengthgen.tasks.base import Task, TaskBatch, TaskConfig, TaskInputError, Vocab


def _validate_task(obj: object) -> None:
    if not (inspect.isclass(obj) and issubclass(obj, Task)):
        raise TypeError(f"{obj!r} is not a subclass of lengthgen.tasks.Task")
    if inspect.isabstract(obj):
        raise TypeError(f"task class {obj.__name__} is abstract (missing {sorted(obj.__abstractmethods__)})")


def _load_builtins() -> None:
    # Importing the modules runs their @register decorators.
    from lengthgen.tasks import flip_flop, max_retrieval, mqmtar, sequence  # noqa: F401


TASKS: Registry[type[Task]] = Registry(
    "task", "lengthgen.tasks", validate=_validate_task, builtin_loader=_load_builtins
)
register_task = TASKS.register


def get_task(name: str, **params: Any) -> Task:
    """Instantiate a task by registered name (or ``file.py:Class`` / ``module:Class``)."""
    return TASKS.get(name)(**params)


__all__ = [
    "TASKS",
    "Task",
    "TaskBatch",
    "TaskConfig",
    "TaskInputError",
    "Vocab",
    "get_task",
    "register_task",
]
