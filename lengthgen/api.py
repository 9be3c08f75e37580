"""The stable extension API: everything a plugin (a new attention backend or task) imports.

Import from here, not from the internal modules: the names below keep their meaning across
releases (``API_VERSION`` changes if one ever has to break), while the modules they live in may
move. ``docs/plugins.md`` walks from an empty file to a leaderboard row.

An attention backend
--------------------
Subclass ``AttentionBackend`` and set two class attributes and one method::

    class ReLU2(AttentionBackend):
        name = "relu2"                      # what users type after --attn
        description = "one line for `lengthgen attns`"

        def normalize(self, scores):        # (…, Nk) scores, −inf on keys a row cannot see
            ...                             # → weights of the same shape (≥ 0, 0 on −inf keys)

Optional: ``Options`` (a ``BackendOptions`` subclass: typed, validated options set with
``--attn-option key=value``), ``query_scale(x, q_pos)`` (a (B, H, Nq) multiplier of the
scores, e.g. a learned length-aware scale; use ``spec.scaled_mask()`` / ``self.scaled_heads`` to
leave NAPE's ALiBi heads alone and ``log_visible`` for log n), ``__init__(spec, options)`` for
parameters (call ``super().__init__`` first; ``spec`` is the ``LayerSpec``), and ``attend`` to
replace the execution path altogether (a fused kernel: it must then equal
``normalize(score_block(...)) @ v`` and feed ``row_diagnostics`` of the ``diagnostic_rows`` into
``stats``, which ``lengthgen.testing.check_backend`` verifies).

Two more hooks reach the engine's fused kernels (added in API version 1, without changing any
name above):

* ``cumulative_bias(x)``: increments g (B, H, N) from the layer input at *every* position; query i's
  score on key j gets Σ_{j<t≤i} g_t = c_i − c_j (a per-position generalization of ALiBi's constant
  slope; Forgetting Attention's log forget gates). The engine sums c in float64 and runs it on
  every path, the CPU flash kernel and FlexAttention included.
* ``normalizer()``: return ``SoftmaxRows()`` or ``StickBreakingRows(current=...)`` instead of the
  default (your ``normalize`` on the generic paths) to run on the engine's fused kernels.
  ``StickBreakingRows`` is an order-dependent, possibly unnormalized row: keys, nearest first, break
  off σ(z) of what the nearer keys left (Tan et al., 2025); its long-sequence path walks key tiles
  from the query outwards, carrying the reverse cumulative sum. ``normalize`` should then return
  ``self.normalizer().probs(scores)``, the definition.

What a backend gets for free: causal masking; the position schemes (NAPE, ALiBi, RoPE, NoPE);
the attention engine's materialized path for training and exact chunked path that evaluates at
1024× the training length without ever allocating n×n scores; computing only the scored query rows;
attention diagnostics (normalized entropy, support size); training, checkpoint selection,
evaluation with confidence intervals, ``results.parquet``, accuracy-vs-length plots, sweeps and
the leaderboard.

A task
------
Subclass ``Task``: ``name``, ``description``, the properties ``vocab`` (``Vocab.with_specials``),
``min_length`` and ``default_train_length``, and ``_generate(rng, n, length, split)`` returning
a ``TaskBatch`` (token ids, a loss mask, and JSON-ready source/target per sample); draw every
random number from ``rng`` so data are reproducible everywhere. ``seq2seq_view`` lays out the
usual ``bos source sep target eos`` with its loss mask; typed parameters go in a ``TaskConfig``
subclass set as ``Config`` (``--param key=value``).

What a task gets for free: argument checking, seeding (train and eval streams never share a
seed), ``lengthgen tasks --describe`` / ``lengthgen sample``, training-length ranges, and every
backend and position scheme.

Making it visible
-----------------
* an entry point in your package's ``pyproject.toml`` (groups ``lengthgen.attention`` and
  ``lengthgen.tasks``): discovered lazily, listed by ``lengthgen attns`` / ``lengthgen tasks``;
  a plugin that fails to import is listed as ``[broken plugin]`` and never breaks anything else;
  a plugin named like a built-in is ignored with a warning (built-ins win);
* no packaging: ``--attn path/to/file.py:ClassName`` or ``--attn package.module:ClassName``
  (same for ``--task``);
* in-process (a script, a notebook, a conftest): the ``register_attention()`` /
  ``register_task()`` decorators.

Test a backend with ``lengthgen.testing.check_backend(YourClass)``: the same suite every
built-in passes.
"""

from __future__ import annotations

from lengthgen.attention import ATTENTION, register_attention
from lengthgen.attention.backend import (
    AttentionBackend,
    AttentionStats,
    BackendOptions,
    LayerSpec,
    row_diagnostics,
    score_block,
)
from lengthgen.functional.positions import log_visible
from lengthgen.kernels.diagnostics import diagnostic_rows
from lengthgen.kernels.normalizers import Normalizer
from lengthgen.kernels.normalizers import Softmax as SoftmaxRows
from lengthgen.kernels.normalizers import StickBreaking as StickBreakingRows
from lengthgen.registry import PluginLoadError, PluginWarning, RegistryError, UnknownNameError
from lengthgen.tasks import TASKS, get_task, register_task
from lengthgen.tasks.base import Task, TaskBatch, TaskConfig, TaskInputError, Vocab, seq2seq_view

#: Bumped only when a name here changes meaning or disappears.
API_VERSION = 1

__all__ = [
    "API_VERSION",
    "ATTENTION",
    "AttentionBackend",
    "AttentionStats",
    "BackendOptions",
    "LayerSpec",
    "Normalizer",
    "PluginLoadError",
    "PluginWarning",
    "RegistryError",
    "SoftmaxRows",
    "StickBreakingRows",
    "TASKS",
    "Task",
    "TaskBatch",
    "TaskConfig",
    "TaskInputError",
    "UnknownNameError",
    "Vocab",
    "diagnostic_rows",
    "get_task",
    "log_visible",
    "register_attention",
    "register_task",
    "row_diagnostics",
    "score_block",
    "seq2seq_view",
]
