"""Run configuration: frozen pydantic models, unknown fields forbidden, and the one way to build them.

The config is the whole recipe of a run (task, backend, position scheme, model, optimizer,
evaluation protocol, seed); its hash identifies the run in results, so two rows with the same hash
come from the same recipe. Where the run executes (device) is recorded but not hashed.

:func:`build_run_config` is the only path from user input to a :class:`RunConfig`: the
``run``, ``sweep`` and ``eval`` commands and the Python API all call it, so a setting means the
same everywhere. It starts from a preset (``lengthgen.presets``), applies dotted overrides
(``train.lr``, ``eval.max_factor``, ``arch.d_model``; the dedicated flags ``--steps`` … are
spelled that way too, see :func:`flag_overrides`), and checks everything that can be checked
before a byte is allocated: names, types, finite numbers, cross-field rules and the size limits
of ``lengthgen.limits``. Every problem is a one-line :class:`~lengthgen.errors.UserError`.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from lengthgen import limits
from lengthgen.choices import Precision, Selection
from lengthgen.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: The fields of :class:`ModelConfig` that a run config stores (its ``arch`` section). The others
#: come from elsewhere: the vocabulary from the task, the backend and position scheme from the run.
ARCH_FIELDS: tuple[str, ...] = ("n_layers", "d_model", "n_heads", "d_ff")


class ModelConfig(_Frozen):
    """The transformer: its size, and the vocabulary, backend and position scheme it runs with.

    Inside a :class:`RunConfig` (as ``arch``) only the size is set and stored; use
    :meth:`RunConfig.model` for the complete model config of a run.
    """

    vocab_size: int | None = Field(None, ge=4, description="number of tokens (from the task)")
    n_layers: int = Field(2, ge=1)
    d_model: int = Field(128, ge=8)
    n_heads: int = Field(4, ge=1)
    d_ff: int = Field(512, ge=1)
    attn: str = "softmax"
    attn_options: dict[str, Any] = Field(default_factory=dict)
    pos: str = "nape"

    @model_validator(mode="after")
    def _consistent_size(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        limits.check_at_most("model size (estimated parameters)", self.estimated_parameters(),
                             limits.MAX_PARAMS)
        return self

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def estimated_parameters(self) -> int:
        """Weights of the attention and feed-forward layers and of the embeddings (no biases)."""
        per_layer = 4 * self.d_model**2 + 2 * self.d_model * self.d_ff
        return self.n_layers * per_layer + 2 * (self.vocab_size or 0) * self.d_model


#: TrainConfig fields added after the first recorded runs, with the default they are not written at.
TRAIN_FIELDS_ADDED: dict[str, Any] = {"precision": "fp32", "keep_every": 0}


class TrainConfig(_Frozen):
    steps: int = Field(1000, ge=0, le=limits.MAX_STEPS)
    batch_size: int = Field(64, ge=1, le=limits.MAX_SAMPLES)
    lr: float = Field(1e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine floor as a fraction of lr")
    warmup_steps: int = Field(100, ge=0, le=limits.MAX_STEPS)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(1.0, gt=0)
    train_length: int = Field(64, ge=1, le=limits.MAX_LENGTH,
                              description="L: longest training length; eval at L·2^k")
    min_train_length: int | None = Field(None, ge=1, description="shortest training length (default L/2)")
    val_every: int = Field(250, ge=1)
    val_samples: int = Field(256, ge=1, le=limits.MAX_SAMPLES)
    selection: Selection = Field(
        "id", description="checkpoint selection: in-distribution validation, or the paper's 8x"
    )
    precision: Precision = Field(
        "fp32", description="training arithmetic: fp32, or bf16 autocast (faster, other numerics)"
    )
    keep_every: int = Field(0, ge=0, le=limits.MAX_STEPS, description="keep the weights every N steps "
                            "(checkpoints/step-N.pt, for `lengthgen eval --checkpoint`); 0 keeps none")

    @model_serializer(mode="wrap")
    def _unwritten_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Fields added after runs were recorded are not written at their default, so every
        recorded config keeps its text, hash and run id."""
        data = handler(self)
        for name, default in TRAIN_FIELDS_ADDED.items():
            if data.get(name) == default:
                del data[name]
        return data

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be in [0, 1), got {self.betas}")
        if self.min_train_length is not None and self.min_train_length > self.train_length:
            raise ValueError(f"min_train_length {self.min_train_length} is over train_length "
                             f"{self.train_length}")
        limits.check_at_most("batch_size × train_length", self.batch_size * self.validation_length(),
                             limits.MAX_TOKENS)
        limits.check_at_most("validation length", self.validation_length(), limits.MAX_LENGTH)
        return self

    def validation_length(self) -> int:
        """Where checkpoints are selected: the training length, or 8× it (``selection = 8x``)."""
        return self.train_length * (8 if self.selection == "8x" else 1)


class EvalConfig(_Frozen):
    max_factor: int = Field(1024, ge=1, le=limits.MAX_LENGTH,
                            description="evaluate at L·{1, 2, 4, …, max_factor}")
    samples: int = Field(256, ge=1, le=limits.MAX_SAMPLES, description="samples per length (the most)")
    min_samples: int = Field(16, ge=1, description="samples per length (the fewest, at long lengths)")
    token_budget: int = Field(500_000, ge=1, description="sample tokens per length between the two")
    batch_tokens: int = Field(32_768, ge=1, le=limits.MAX_TOKENS, description="tokens per forward pass")

    @model_validator(mode="after")
    def _consistent(self) -> EvalConfig:
        if not limits.is_power_of_two(self.max_factor):
            raise ValueError(f"max_factor must be a power of two, got {self.max_factor}")
        if self.min_samples > self.samples:
            raise ValueError(f"min_samples {self.min_samples} is over samples {self.samples}")
        return self

    def factors(self) -> list[int]:
        out, f = [], 1
        while f <= self.max_factor:
            out.append(f)
            f *= 2
        return out

    def samples_at(self, sequence_tokens: int) -> int:
        """Fewer samples at long lengths, within [min_samples, samples]."""
        by_budget = self.token_budget // max(1, sequence_tokens)
        return max(min(self.min_samples, self.samples), min(self.samples, by_budget))


class RunConfig(_Frozen):
    task: str
    task_params: dict[str, Any] = Field(default_factory=dict)
    attn: str = "softmax"
    attn_options: dict[str, Any] = Field(default_factory=dict)
    pos: str = "nape"
    preset: str = "quick"
    seed: int = Field(0, ge=0, le=limits.MAX_SEED)
    arch: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()

    @field_validator("task_params")
    @classmethod
    def _first_stream_unwritten(cls, params: dict[str, Any]) -> dict[str, Any]:
        """Stream 1 is what a config without ``stream`` means (it predates stream versions), so
        it is never written: ``stream = 1`` given explicitly gives the recorded config and hash."""
        if type(params.get("stream")) is int and params["stream"] == 1:
            return {k: v for k, v in params.items() if k != "stream"}
        return params

    @field_validator("arch", mode="before")
    @classmethod
    def _size_only(cls, value: Any) -> Any:
        """``arch`` holds the model size; the rest of the model config belongs to the run."""
        if isinstance(value, ModelConfig):
            default = ModelConfig()
            value = {k: v for k, v in value if k in ARCH_FIELDS or v != getattr(default, k)}
        if isinstance(value, Mapping):
            others = sorted(set(value) - set(ARCH_FIELDS))
            known = [k for k in others if k in ModelConfig.model_fields]
            if known:
                raise ValueError(f"{', '.join(known)} cannot be set in arch (the task sets the vocabulary, "
                                 f"the run the backend and position scheme); arch fields: "
                                 f"{', '.join(ARCH_FIELDS)}")
        return value

    @field_serializer("arch")
    def _dump_size(self, arch: ModelConfig) -> dict[str, Any]:
        return {name: getattr(arch, name) for name in ARCH_FIELDS}

    @model_validator(mode="after")
    def _sizes_within_limits(self) -> RunConfig:
        longest = self.train.train_length * self.eval.max_factor
        limits.check_at_most("longest evaluation length (train_length × max_factor)", longest,
                             limits.MAX_LENGTH, "lower max_factor or train_length")
        for factor in self.eval.factors():
            length = self.train.train_length * factor
            # a sample has at least `length` tokens, so this is the most samples a cell can get
            n = self.eval.samples_at(length)
            limits.check_at_most(f"samples × length at {factor}x ({n:,} × {length:,})", n * length,
                                 limits.MAX_TOKENS, "lower eval.samples, eval.min_samples or max_factor")
        return self

    def model(self, vocab_size: int) -> ModelConfig:
        """The complete model config: this run's size, backend and position scheme, the task's
        vocabulary."""
        return ModelConfig(vocab_size=vocab_size, attn=self.attn, attn_options=self.attn_options,
                           pos=self.pos, **{name: getattr(self.arch, name) for name in ARCH_FIELDS})

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def config_hash(self) -> str:
        """The hash of :meth:`canonical_json`, which names the run (``harness.storage.identity``)."""
        return config_hash_of(self.canonical_json())


def config_hash_of(config_json: str) -> str:
    """The hash a run records for its config: the first 16 hex digits of SHA-256 of the JSON text
    (a recorded text, which a newer lengthgen may not write the same way, keeps its own hash)."""
    return hashlib.sha256(config_json.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# -- from user input to a config -------------------------------------------------------------------
#: The config sections an override can address (``SECTION.FIELD``).
SECTIONS: tuple[str, ...] = ("train", "eval", "arch")


def parse_json(text: str, what: str = "the value") -> Any:
    """``text`` as JSON, where ``NaN`` and ``Infinity`` are not numbers: ValueError for them, as for
    any text that is not JSON; a one-line UserError for data nested deeper than
    ``limits.MAX_NESTING`` (the parser would run out of recursion on 100,000 brackets)."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        value = json.loads(text, parse_constant=refuse)
    except RecursionError:
        raise limits.too_deep(what) from None
    limits.check_nesting(what, value)
    return value


def parse_toml(text: str, what: str) -> dict[str, Any]:
    """A TOML document someone else may have written (a plan, ``source.toml``): its tables, or a
    one-line UserError naming ``what`` (not TOML, nested too deep)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{what}: not a valid TOML file ({exc})") from None
    except RecursionError:
        raise limits.too_deep(what) from None
    limits.check_nesting(what, data)
    return data


def parse_value(raw: str, what: str = "the value") -> Any:
    """A value typed on the command line: JSON when it is JSON (numbers, true/false, null, lists,
    objects), else the text itself. ``NaN`` and ``Infinity`` stay text; the config then refuses
    them with a one-line error instead of training on them."""
    try:
        return parse_json(raw, what)
    except ValueError:
        return raw


def parse_assignments(pairs: Iterable[str] | None, flag: str = "--param",
                      parse: Callable[[str], Any] = parse_value) -> dict[str, Any]:
    """``key=value`` strings (``--param``, ``--attn-option``, ``--set``) → {key: parsed value};
    ``parse`` reads a value (a sweep reads a list of values with ``sweeps.parse_choices``)."""
    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, eq, raw = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UserError(f"bad {flag} {pair!r}: expected key=value")
        if key in out:
            raise UserError(f"{flag} sets {key!r} twice")
        try:
            out[key] = parse(raw)
        except UserError as exc:  # e.g. nested too deep: name the flag and field
            raise UserError(f"{flag} {key}: {exc}") from None
    return out


def flag_overrides(
    *,
    steps: int | None = None,
    max_factor: int | None = None,
    train_length: int | None = None,
    eval_samples: int | None = None,
    selection: str | None = None,
) -> dict[str, Any]:
    """The dedicated flags as the dotted overrides they stand for (flags not given are left out)."""
    named = {"train.steps": steps, "eval.max_factor": max_factor, "train.train_length": train_length,
             "eval.samples": eval_samples, "train.selection": selection}
    return {key: value for key, value in named.items() if value is not None}


#: Keyword names the Python API accepts for the dedicated flags.
FLAG_NAMES: tuple[str, ...] = ("steps", "max_factor", "train_length", "eval_samples", "selection")


def combine_overrides(*sources: Mapping[str, Any]) -> dict[str, Any]:
    """Merge override dicts (dedicated flags, ``--set``); one key set to two values is an error."""
    out: dict[str, Any] = {}
    for source in sources:
        for key, value in source.items():
            if key in out and out[key] != value:
                raise UserError(f"{key} is set twice, to {out[key]!r} and to {value!r}")
            out[key] = value
    return out


def _by_section(overrides: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for key, value in overrides.items():
        section, dot, name = str(key).partition(".")
        if not dot or not name or section not in SECTIONS:
            raise UserError(f"bad setting {key!r}: expected SECTION.FIELD with SECTION one of "
                            f"{', '.join(SECTIONS)} (e.g. train.lr=5e-4)")
        out[section][name] = value
    return out


def check_finite(values: Mapping[str, Any], what: str) -> None:
    """Every number in ``values`` (nested lists and dicts included) must be finite."""

    def walk(key: str, value: Any) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{what} {key}={value}: must be a finite number")
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{key}.{k}", v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(key, v)

    for key, value in values.items():
        walk(str(key), value)


def validation_message(exc: ValidationError, prefix: str = "invalid settings") -> str:
    """A pydantic error in one line: ``prefix: field.path: message; …``."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg'].removeprefix('Value error, ')}"
        for err in exc.errors()
    )
    return f"{prefix}: {problems}"


def build_run_config(
    task: str,
    attn: str,
    *,
    pos: str = "nape",
    preset: str = "quick",
    seed: int = 0,
    task_params: Mapping[str, Any] | None = None,
    attn_options: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    start: RunConfig | None = None,
) -> RunConfig:
    """The preset for (task, preset) with the caller's settings, fully checked.

    ``overrides`` maps ``SECTION.FIELD`` to a value (``{"train.lr": 5e-4, "eval.max_factor": 8}``).
    Two fields follow a changed neighbour unless set themselves: ``eval.min_samples`` never
    exceeds a lowered ``eval.samples``, and a preset's ``train.min_train_length`` above a lowered
    ``train.train_length`` falls back to the default (L/2). ``start``: a recorded run's config
    whose sections replace the preset's (``lengthgen eval`` changes a few fields of a trained
    run). Raises :class:`UserError`.
    """
    from lengthgen.attention import ATTENTION
    from lengthgen.attention.positions import POSITION_SCHEMES, get_position_scheme
    from lengthgen.presets import PRESET_NAMES, preset_sections
    from lengthgen.tasks import TASKS, get_task, new_task_params

    names = {"task": (task, TASKS.names), "attn": (attn, ATTENTION.names),
             "pos": (pos, lambda: list(POSITION_SCHEMES)), "preset": (preset, lambda: list(PRESET_NAMES))}
    for what, (value, valid) in names.items():
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{what} must be a name (text), got {value!r}; valid: {', '.join(valid())}")
    mappings = {"task_params": task_params, "attn_options": attn_options, "overrides": overrides}
    for what, given in mappings.items():
        limits.check_nesting(what, given)  # a notebook can pass a list nested 100,000 deep
        if given is not None and not (isinstance(given, Mapping) and all(isinstance(k, str) for k in given)):
            raise UserError(f"{what} must be a mapping of names to values (a dict), got {given!r}")
    preset_values = preset_sections(task, preset)  # checks the preset's name in either case
    sections = preset_values if start is None else _sections(start)
    given = _by_section(overrides or {})
    values = {name: {**sections.get(name, {}), **given[name]} for name in SECTIONS}
    preset_eval, preset_train = sections.get("eval", {}), sections.get("train", {})
    samples = given["eval"].get("samples")
    if isinstance(samples, int) and "min_samples" not in given["eval"]:
        values["eval"]["min_samples"] = min(samples, preset_eval.get("min_samples",
                                                                     EvalConfig().min_samples))
    length, preset_min = given["train"].get("train_length"), preset_train.get("min_train_length")
    if (isinstance(length, int) and isinstance(preset_min, int) and preset_min > length
            and "min_train_length" not in given["train"]):
        values["train"]["min_train_length"] = None
    params = {**sections.get("task_params", {}), **(task_params or {})}
    check_finite(params, "task parameter")
    if start is None:
        params = new_task_params(task, params)  # a recorded config (start) keeps its stream
    check_finite(attn_options or {}, "attention option")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UserError(f"seed must be an integer, got {seed!r}")
    limits.check_seed(seed)
    try:
        task_obj = get_task(task, **params)
    except ValidationError as exc:
        raise UserError(validation_message(exc, f"invalid parameters of task {task!r}")) from None
    backend = ATTENTION.get(attn)
    get_position_scheme(pos)
    valid_options = list(backend.Options.model_fields)
    for key in attn_options or {}:
        if key not in valid_options:
            raise UserError(f"unknown attention option {key!r} of {attn!r}; valid options: "
                            f"{', '.join(valid_options) or '(none)'}")
    try:
        options = backend.Options(**(attn_options or {})).recorded()
    except ValidationError as exc:
        raise UserError(validation_message(exc, f"invalid options of attention backend {attn!r}")) from None
    check_finite(options, "attention option")
    try:
        config = RunConfig(
            task=task if ":" in task else task_obj.name, task_params=params, attn=attn,
            attn_options=options, pos=pos, preset=preset, seed=seed,
            arch=values["arch"], train=values["train"], eval=values["eval"],
        )
        config.model(task_obj.vocab.size)
    except ValidationError as exc:
        raise UserError(validation_message(exc)) from None
    minimum = task_obj.min_length
    for name in ("train_length", "min_train_length"):
        value = getattr(config.train, name)
        if value is not None and value < minimum:
            raise UserError(f"train.{name} {value} is under the minimum of task {task_obj.name!r} "
                            f"({minimum} {task_obj.length_unit})")
    return config


def config_from_flags(task: str, attn: str, *, pos: str = "nape", preset: str = "quick", seed: int = 0,
                      param: Iterable[str] | None = None, attn_option: Iterable[str] | None = None,
                      override: Iterable[str] | None = None, **dedicated: Any) -> RunConfig:
    """The config ``lengthgen run`` flags name: ``key=value`` assignments as typed (``--param``,
    ``--attn-option``, ``--set``) and the dedicated flags (:func:`flag_overrides`)."""
    return build_run_config(task, attn, pos=pos, preset=preset, seed=seed,
                            task_params=parse_assignments(param, "--param"),
                            attn_options=parse_assignments(attn_option, "--attn-option"),
                            overrides=combine_overrides(flag_overrides(**dedicated),
                                                        parse_assignments(override, "--set")))


def _sections(config: RunConfig) -> dict[str, dict[str, Any]]:
    """The config's sections and task parameters, as a preset gives them."""
    dumped = config.model_dump(mode="json")
    return {**{section: dumped[section] for section in SECTIONS}, "task_params": dumped["task_params"]}


def dotted(config: RunConfig) -> dict[str, Any]:
    """Every field of the config's sections as ``SECTION.FIELD`` overrides: with the config's
    task, backend, position, preset and seed, :func:`build_run_config` gives the config back."""
    dumped = config.model_dump(mode="json")
    return {f"{section}.{key}": value for section in SECTIONS for key, value in dumped[section].items()}
