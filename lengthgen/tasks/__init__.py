"""Tasks: the interface (``base``), the registry, and the built-in tasks, one file per family.

A built-in task is a ``Task`` subclass decorated with ``@register_task()`` in a module of this
package: the registry imports every module here on its first lookup. Plugins add tasks through
the ``lengthgen.tasks`` entry-point group (``lengthgen.registry``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lengthgen.registry import Registry
from lengthgen.tasks.base import STREAM, Task, TaskBatch, TaskConfig, TaskInputError, Vocab


def validate_task(obj: object) -> None:
    """A ``TypeError`` saying why ``obj`` cannot be registered as a task (nothing when it can)."""
    if not (inspect.isclass(obj) and issubclass(obj, Task)):
        raise TypeError(f"{obj!r} is not a subclass of lengthgen.tasks.Task")
    if inspect.isabstract(obj):
        raise TypeError(f"task class {obj.__name__} is abstract (missing {sorted(obj.__abstractmethods__)})")


TASKS: Registry[type[Task]] = Registry("task", "lengthgen.tasks", validate=validate_task, builtins=__name__)
register_task = TASKS.register


def get_task(name: str, **params: Any) -> Task:
    """Instantiate a task by registered name (or ``file.py:Class`` / ``module:Class``).

    The parameters are taken as given: without ``stream``, stream 1, as a recorded config means.
    """
    return TASKS.get(name)(**params)


def new_task_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` for new data: the task's latest stream unless ``stream`` is given. Everything that
    makes data from user input (a run config, ``lengthgen sample``) goes through here, and nothing
    that reads a recorded config does, so recorded runs keep the stream they were made with."""
    latest = TASKS.get(name).latest_stream
    if STREAM in params or latest == 1:
        return dict(params)
    return {**params, STREAM: latest}


__all__ = [
    "TASKS",
    "Task",
    "TaskBatch",
    "TaskConfig",
    "TaskInputError",
    "Vocab",
    "get_task",
    "new_task_params",
    "register_task",
    "validate_task",
]
