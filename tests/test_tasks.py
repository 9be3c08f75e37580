"""Task generators against independent, deliberately plain checkers.

Each checker recomputes the target from the structured ``source`` straight from the task's
definition (loops, no numpy), checks the properties the generator promises (unique maximum, keys
unique, first write / last read, ...), and checks that the model view (decoded token strings and
the loss mask) says the same thing as ``source`` / ``target``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lengthgen.limits import MAX_SEED
from lengthgen.tasks import TASKS, Task, TaskInputError, get_task, new_task_params

BUILTINS = ["copy", "sort", "reverse", "max_retrieval", "mqmtar", "flip_flop"]
SPECIALS = ["<pad>", "<bos>", "<sep>", "<eos>"]


# --------------------------------------------------------------------------------------------
# Independent checkers: each returns the positions whose next-token prediction must be scored.
# --------------------------------------------------------------------------------------------
def check_symbols(task: Task, source: Any, target: Any, length: int, tokens: list[str]) -> list[int]:
    size = task.config.vocab_size
    assert len(source) == length
    for s in source:
        assert isinstance(s, int) and 0 <= s < size
    if task.name == "copy":
        expected = list(source)
    elif task.name == "reverse":
        expected = [source[length - 1 - i] for i in range(length)]
    else:  # sort: counting sort, from the definition (each value as often as it occurs)
        counts = [0] * size
        for s in source:
            counts[s] += 1
        expected = [value for value in range(size) for _ in range(counts[value])]
    assert target == expected
    assert tokens == ["<bos>", *map(str, source), "<sep>", *map(str, target), "<eos>"]
    return list(range(length + 1, length + 1 + len(target)))


def check_max_retrieval(task: Task, source: Any, target: Any, length: int, tokens: list[str]) -> list[int]:
    cfg = task.config
    assert len(source) == length
    for item in source:
        assert len(item) == 2
        p, c = item
        assert 0 <= p < cfg.n_priorities and 0 <= c < cfg.n_classes
    priorities = [p for p, _ in source]
    top = max(priorities)
    assert top >= 1
    assert priorities.count(top) == 1, "the maximum must be unique"
    assert priorities.count(top - 1) >= 1, "a near-maximal distractor must exist"
    answer = source[priorities.index(top)][1]
    assert target == [answer]
    assert tokens == ["<bos>", *[f"p{p}c{c}" for p, c in source], "<sep>", f"c{answer}", "<eos>"]
    return [length + 1]


def check_mqmtar(task: Task, source: Any, target: Any, length: int, tokens: list[str]) -> list[int]:
    cfg = task.config
    k, v, q, a = cfg.key_len, cfg.value_len, cfg.n_queries, cfg.alphabet
    block = k + v
    pairs, queries = source["pairs"], source["queries"]
    grown = math.floor(Fraction(repr(cfg.pair_fraction)) * length / block)  # exact decimal arithmetic
    assert len(pairs) == min(max(q, grown), a**k)
    for key, value in pairs:
        assert len(key) == k and len(value) == v
        assert all(0 <= x < a for x in key + value)
    keys = [tuple(key) for key, _ in pairs]
    assert len(set(keys)) == len(keys), "keys must be unique within a sample"
    assert len(queries) == q
    assert len({tuple(x) for x in queries}) == q, "queries must be distinct"
    lookup = {tuple(key): value for key, value in pairs}
    for x in queries:
        assert tuple(x) in lookup, "every query must be a key present in the context"
    assert target == [lookup[tuple(x)] for x in queries]

    # Parse the model view: context of filler and pair blocks, sep, queries with values, eos.
    assert tokens[0] == "<bos>" and tokens[length + 1] == "<sep>" and tokens[-1] == "<eos>"
    context = tokens[1 : length + 1]
    parsed, i = [], 0
    while i < length:
        if context[i] == ".":
            i += 1
            continue
        key_toks, value_toks = context[i : i + k], context[i + k : i + block]
        assert all(t[0] == "k" for t in key_toks) and all(t[0] == "v" for t in value_toks)
        parsed.append([[int(t[1:]) for t in key_toks], [int(t[1:]) for t in value_toks]])
        i += block
    assert i == length, "a pair block runs past the context"
    assert parsed == pairs
    tail = tokens[length + 2 : -1]
    assert len(tail) == q * block
    for j in range(q):
        assert tail[j * block : j * block + k] == [f"k{x}" for x in queries[j]]
        assert tail[j * block + k : (j + 1) * block] == [f"v{x}" for x in target[j]]
    return [length + 2 + j * block + t - 1 for j in range(q) for t in range(k, block)]


def check_flip_flop(task: Task, source: Any, target: Any, length: int, tokens: list[str]) -> list[int]:
    assert len(source) == length
    for op, bit in source:
        assert op in ("w", "i", "r") and bit in (0, 1)
    assert source[0][0] == "w", "the first instruction must be a write"
    assert source[-1][0] == "r", "the last instruction must be a read"
    memory, expected = None, []
    for op, bit in source:
        if op == "w":
            memory = bit
        elif op == "r":
            assert bit == memory, "the bit after a read is the last written bit"
            expected.append(memory)
    assert target == expected
    view = ["<bos>"]
    for op, bit in source:
        view += [op, str(bit)]
    assert tokens == [*view, "<eos>"]
    return [1 + 2 * j for j, (op, _) in enumerate(source) if op == "r"]


CHECKERS = {
    "copy": check_symbols,
    "sort": check_symbols,
    "reverse": check_symbols,
    "max_retrieval": check_max_retrieval,
    "mqmtar": check_mqmtar,
    "flip_flop": check_flip_flop,
}


def check_batch(task: Task, n: int, length: int, seed: int, split: str) -> None:
    batch = task.sample(n, length, seed=seed, split=split)
    assert batch.input_ids.dtype == np.int64 and batch.loss_mask.dtype == np.bool_
    assert batch.input_ids.shape == batch.loss_mask.shape and batch.input_ids.shape[0] == n
    assert len(batch.source) == len(batch.target) == n
    vocab = task.vocab.tokens
    assert batch.input_ids.min() >= 0 and batch.input_ids.max() < len(vocab)
    for i in range(n):
        tokens = [vocab[t] for t in batch.input_ids[i].tolist()]
        scored = CHECKERS[task.name](task, batch.source[i], batch.target[i], length, tokens)
        assert np.flatnonzero(batch.loss_mask[i]).tolist() == scored
        json.dumps(batch.source[i]), json.dumps(batch.target[i])  # plain Python, JSON-ready


# --------------------------------------------------------------------------------------------
def test_builtins_registered() -> None:
    assert set(BUILTINS) <= set(TASKS.names())
    for name in BUILTINS:
        task = get_task(name)
        assert task.name == name and task.description and "\n" not in task.description
        assert task.vocab.tokens[:4] == tuple(SPECIALS)
        assert len(set(task.vocab.tokens)) == task.vocab.size


def test_vocab_layouts() -> None:
    """The vocabularies the checkers decode with, written out from the task definitions."""
    assert get_task("flip_flop").vocab.tokens == (*SPECIALS, "w", "i", "r", "0", "1")
    mr = get_task("max_retrieval", n_priorities=3, n_classes=2).vocab.tokens
    assert mr == (*SPECIALS, "p0c0", "p0c1", "p1c0", "p1c1", "p2c0", "p2c1", "c0", "c1")
    mq = get_task("mqmtar", alphabet=3).vocab.tokens
    assert mq == (*SPECIALS, "k0", "k1", "k2", "v0", "v1", "v2", ".")
    assert get_task("copy", vocab_size=3).vocab.tokens == (*SPECIALS, "0", "1", "2")


def test_units_and_sep() -> None:
    assert get_task("max_retrieval").length_unit == "items"
    assert get_task("flip_flop").length_unit == "instructions"
    assert get_task("mqmtar").length_unit == "context tokens"
    assert get_task("flip_flop").has_sep is False
    assert get_task("mqmtar").has_sep and get_task("max_retrieval").has_sep
    assert get_task("mqmtar").min_length == 16 and get_task("max_retrieval").min_length == 2
    assert get_task("flip_flop").min_length == 2


@pytest.mark.parametrize("name", BUILTINS)
@pytest.mark.parametrize("split", ["train", "eval"])
def test_checker_lengths(name: str, split: str) -> None:
    task = get_task(name)
    for length, n in [(task.min_length, 8), (16, 4), (17, 4), (100, 3), (1000, 2), (4096, 1)]:
        check_batch(task, n, max(length, task.min_length), seed=length, split=split)


@pytest.mark.parametrize("name", ["max_retrieval", "mqmtar", "flip_flop", "sort"])
def test_checker_65536(name: str) -> None:
    check_batch(get_task(name), 1, 65536, seed=7, split="eval")


@pytest.mark.parametrize(
    ("name", "params", "length"),
    [
        ("max_retrieval", {"n_priorities": 2, "n_classes": 3}, 50),  # max always 1, distractors 0
        ("max_retrieval", {"n_priorities": 1000, "n_classes": 2}, 300),
        ("mqmtar", {"alphabet": 4096, "key_len": 3}, 2000),  # sparse key space: rejection path
        ("mqmtar", {"alphabet": 2, "key_len": 2}, 400),  # pairs capped at all 4 keys
        ("mqmtar", {"key_len": 1, "value_len": 3, "n_queries": 2, "pair_fraction": 1.0}, 64),
        ("mqmtar", {"alphabet": 256, "n_queries": 7, "pair_fraction": 0.1}, 1000),
        ("mqmtar", {"key_len": 1, "pair_fraction": 0.57}, 100),  # 0.57 * 100 is 56.99... in floats
        ("flip_flop", {"p_ignore": 0.0}, 200),
        ("flip_flop", {"p_ignore": 1.0}, 200),
        ("flip_flop", {"eval_variant": "sparse"}, 500),
        ("copy", {"vocab_size": 2}, 33),
    ],
)
def test_checker_configs(name: str, params: dict[str, Any], length: int) -> None:
    task = get_task(name, **params)
    for split in ("train", "eval"):
        check_batch(task, 3, length, seed=1, split=split)


@settings(max_examples=40, deadline=None, database=None)
@given(
    name=st.sampled_from(BUILTINS),
    length=st.integers(1, 300),
    seed=st.integers(0, MAX_SEED),
    n=st.integers(1, 4),
    split=st.sampled_from(["train", "eval"]),
)
def test_checker_property(name: str, length: int, seed: int, n: int, split: str) -> None:
    task = get_task(name)
    check_batch(task, n, max(length, task.min_length), seed=seed, split=split)


@pytest.mark.parametrize(
    ("variant", "split", "expected"),
    [
        ("same", "train", 0.8),
        ("same", "eval", 0.8),
        ("sparse", "train", 0.8),
        ("sparse", "eval", 0.98),
        ("dense", "eval", 0.1),
    ],
)
def test_flip_flop_variants(variant: str, split: str, expected: float) -> None:
    """p(ignore) follows the variant on eval only; writes and reads share the rest equally."""
    batch = get_task("flip_flop", eval_variant=variant).sample(4, 4096, seed=0, split=split)
    ops = [op for sample in batch.source for op, _ in sample[1:-1]]
    frac = {o: ops.count(o) / len(ops) for o in "wir"}
    assert abs(frac["i"] - expected) < 0.02
    assert abs(frac["w"] - frac["r"]) < 0.03


def test_max_retrieval_spread() -> None:
    """The maximum priority and its position vary (not stuck at an edge)."""
    batch = get_task("max_retrieval").sample(200, 50, seed=0)
    tops = [max(p for p, _ in s) for s in batch.source]
    where = [[p for p, _ in s].index(max(p for p, _ in s)) for s in batch.source]
    assert min(tops) <= 5 and max(tops) >= 27
    assert min(where) <= 5 and max(where) >= 44


def test_mqmtar_pairs_grow_with_length() -> None:
    task = get_task("mqmtar")
    counts = [len(task.sample(1, length).source[0]["pairs"]) for length in (16, 64, 256, 1024)]
    assert counts == [4, 8, 32, 128]
    assert task.n_pairs(65536) == 32**2  # capped by the key space


# --------------------------------------------------------------------------------------------
# Golden hashes: any change to what a seed produces must be deliberate (update these then).
# --------------------------------------------------------------------------------------------
GOLDEN = {
    ("copy", 37, 3, "train"): "08ee0cb3269886fa8b04f1418684ee0a23163ac34492eae81ccf57a1af1757ce",
    ("sort", 37, 3, "train"): "0a0c049be37ef8fc324f1d22d06ccb3672a8f0200f4de31585bd3e5ae9f51f94",
    ("reverse", 300, 11, "eval"): "4d41cbb5c110c9105eecd539dea1014e512dc09ad10a1a3092ec050ed61e1032",
    ("max_retrieval", 37, 3, "train"): "1978b4ef8233c4108383328f487c579deb85631e2b0305149be739dbd383a0a0",
    ("max_retrieval", 300, 11, "eval"): "1af77733c84d63df34c8528a3b931c01333ddf897bc62a45e7ccef30d34ada4a",
    ("mqmtar", 37, 3, "train"): "d00d1c1723865f4454f5eff03fc64fef4a3281479a4e42a600441acfdff1f8ef",
    ("mqmtar", 300, 11, "eval"): "71b5127b1e4564778cd8eaf1834801a6a5abbe951befee4bdc15ba2a8229f198",
    ("flip_flop", 37, 3, "train"): "0751c3943d66e3f4dc55a8fc1aa719a3193990d77750974a4f01df06f04129f9",
    ("flip_flop", 300, 11, "eval"): "7db460f294f808882c82d5b5abc070dbef518f8a0fe59e7443afb202722542e5",
}


#: MQMTAR at the paper's parameters, per stream: stream 1 made the published board's data.
PAPER_MQMTAR = {"alphabet": 256, "key_len": 2, "value_len": 2, "n_queries": 4, "pair_fraction": 8 / 15}
GOLDEN_STREAMS = {
    (1, 64, (0, 5), "train"): "9bd027b2486c5c77ddffa2b6801fd2e5f35e7d804eb1fcb1f6a3048de339511b",
    (1, 4096, 0, "eval"): "81dd2a2fd9847626052f2d92813e78d714f2497be0b46f05ab8ca1ea4534c83a",
    (2, 64, (0, 5), "train"): "654ae32cb6a4239d7d5fdf4be54daadaade8be96d858eb5d7f434f826c21e5e4",
    (2, 4096, 0, "eval"): "7e48b0150fbb8b09551c1f68af86bcd88117017b6c1cf9889c83ed2ef876a148",
}


def batch_digest(name: str, length: int, seed: Any, split: str, **params: Any) -> str:
    batch = get_task(name, **params).sample(3, length, seed=seed, split=split)
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(batch.input_ids, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(batch.loss_mask, dtype=np.uint8).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("key", list(GOLDEN), ids=lambda k: "-".join(map(str, k)))
def test_golden_hashes(key: tuple[str, int, int, str]) -> None:
    assert batch_digest(*key) == GOLDEN[key]


# --------------------------------------------------------------------------------------------
def lengthgen_cmd() -> list[str]:
    exe = shutil.which("lengthgen")
    return [exe] if exe else [sys.executable, "-m", "lengthgen.cli"]


@pytest.mark.parametrize("name", BUILTINS)
def test_determinism_across_processes(name: str) -> None:
    """Same arguments, different PYTHONHASHSEED: byte-identical output, equal to in-process data
    (of the task's latest stream, which `lengthgen sample` draws from)."""
    task = get_task(name, **new_task_params(name, {}))
    length = max(task.min_length, 40)
    args = [
        *lengthgen_cmd(),
        "sample",
        "--task",
        name,
        "--length",
        str(length),
        "--seed",
        "5",
        "--n",
        "3",
        "--split",
        "eval",
    ]
    outputs = []
    for hash_seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outputs.append(subprocess.run(args, env=env, capture_output=True, check=True, timeout=60).stdout)
    assert outputs[0] == outputs[1]
    batch = task.sample(3, length, seed=5, split="eval")
    records = [json.loads(line) for line in outputs[0].decode().splitlines()]
    assert [r["input_ids"] for r in records] == batch.input_ids.tolist()
    assert [r["source"] for r in records] == batch.source


@pytest.mark.parametrize("name", BUILTINS)
def test_seeds_and_splits_differ(name: str) -> None:
    task = get_task(name)
    length = max(task.min_length, 64)
    base = task.sample(4, length, seed=0, split="train")
    same = task.sample(4, length, seed=0, split="train")
    assert np.array_equal(base.input_ids, same.input_ids) and base.source == same.source
    for other in (
        task.sample(4, length, seed=1, split="train"),
        task.sample(4, length, seed=0, split="eval"),
        task.sample(4, length, seed=[0, 1], split="train"),
    ):
        assert not np.array_equal(base.input_ids, other.input_ids)
    # samples within a batch differ too
    assert len({tuple(row) for row in base.input_ids.tolist()}) == 4


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BUILTINS)
def test_config_rejects_unknown_field(name: str) -> None:
    with pytest.raises(ValidationError, match="bogus"):
        get_task(name, bogus=1)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("max_retrieval", {"n_priorities": 1}, "n_priorities"),
        ("max_retrieval", {"n_classes": 0}, "n_classes"),
        ("max_retrieval", {"n_priorities": 65536, "n_classes": 4096}, "item tokens"),
        ("mqmtar", {"alphabet": 2, "key_len": 2, "n_queries": 5}, "distinct keys"),
        ("mqmtar", {"alphabet": 4096, "key_len": 16}, "2\\*\\*62"),
        ("mqmtar", {"pair_fraction": 0.0}, "pair_fraction"),
        ("mqmtar", {"key_len": 0}, "key_len"),
        ("flip_flop", {"p_ignore": 1.5}, "p_ignore"),
        ("flip_flop", {"eval_variant": "medium"}, "eval_variant"),
    ],
)
def test_config_rejects_impossible(name: str, params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        get_task(name, **params)


def test_config_frozen() -> None:
    task = get_task("flip_flop")
    with pytest.raises(ValidationError):
        task.config.p_ignore = 0.5  # type: ignore[misc]


@pytest.mark.parametrize("name", BUILTINS)
def test_bad_sample_arguments(name: str) -> None:
    task = get_task(name)
    with pytest.raises(TaskInputError, match="n must be positive"):
        task.sample(0, 64)
    with pytest.raises(TaskInputError, match="length must be positive"):
        task.sample(1, 0)
    with pytest.raises(TaskInputError, match="unknown split"):
        task.sample(1, 64, split="test")
    if task.min_length > 1:
        with pytest.raises(TaskInputError, match="minimum"):
            task.sample(1, task.min_length - 1)


def test_gc_restored_after_sampling() -> None:
    """Sampling pauses the cyclic GC while building lists; it must come back on."""
    import gc

    assert gc.isenabled()
    for name in BUILTINS:
        get_task(name).sample(2, 64)
    assert gc.isenabled()


@pytest.mark.parametrize("name", ["max_retrieval", "flip_flop"])
def test_cli_sample_65536_checked(name: str) -> None:
    """What a user sees from ``lengthgen sample`` at 65,536 passes the independent checker."""
    from typer.testing import CliRunner

    from lengthgen.cli import app

    result = CliRunner().invoke(app, ["sample", "--task", name, "--length", "65536", "--seed", "9"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    task = get_task(name)
    tokens = [task.vocab.tokens[t] for t in record["input_ids"]]
    scored = CHECKERS[name](task, record["source"], record["target"], 65536, tokens)
    assert [i for i, m in enumerate(record["loss_mask"]) if m] == scored


def _roles_by_brute_force(task: Task, ids: np.ndarray, row: int) -> dict[int, str]:
    """Each position's role for the answer at ``row``, from the token strings alone: a pair is any
    run of K key tokens followed by V value tokens (key tokens occur nowhere else in the context)."""
    c = task.config
    names = task.vocab.decode(ids)
    length = len(ids) - 3 - c.n_queries * (c.key_len + c.value_len)
    block = c.key_len + c.value_len
    query_start = length + 2 + ((row - length - 2) // block) * block
    query = names[query_start:query_start + c.key_len]
    roles = {p: ("filler" if names[p] == "." else "") for p in range(1, length + 1)}
    for start in range(1, length + 1):
        window = names[start:start + block]
        pair = (len(window) == block and all(t.startswith("k") for t in window[:c.key_len])
                and all(t.startswith("v") for t in window[c.key_len:])
                and not names[start - 1].startswith("k"))
        if pair:
            same = [i + 1 for i in range(c.key_len) if window[i] == query[i]]
            role = ("matching pair" if len(same) == c.key_len else
                    f"pair sharing key token {', '.join(map(str, same))}" if same else "other pair")
            roles.update({p: role for p in range(start, start + block)})
    roles.update({p: "start, separator or queries" for p in [0, *range(length + 1, len(ids))]})
    assert all(roles.values())  # every context position is filler or in a pair
    return roles


@pytest.mark.parametrize(("params", "length"), [
    ({"alphabet": 3}, 64),  # a tiny alphabet: near misses everywhere
    ({"alphabet": 4, "key_len": 3, "value_len": 1, "n_queries": 2, "pair_fraction": 1.0}, 48),
    ({}, 200),
])
def test_mqmtar_names_each_positions_role_for_an_answer(params: dict[str, Any], length: int) -> None:
    task = get_task("mqmtar", **params)
    batch = task.sample(6, length, seed=3, split="eval")
    seen = set()
    for ids, mask in zip(batch.input_ids, batch.loss_mask, strict=True):
        for row in np.flatnonzero(mask):
            expected = _roles_by_brute_force(task, ids, int(row))
            got = {p: task.key_role(ids, int(row), p) for p in range(len(ids))}
            assert got == expected
            seen.update(got.values())
    assert {"matching pair", "other pair"} <= seen and ("filler" in seen) == (task.config.pair_fraction < 1)
    assert any(role.startswith("pair sharing key token") for role in seen)


@pytest.mark.parametrize(("params", "length", "token"), [
    ({"alphabet": 256, "pair_fraction": 8 / 15, "near_misses": 8}, 512, 2),  # 256x's count, at 8x
    ({"alphabet": 256, "pair_fraction": 8 / 15, "near_misses": 16, "near_miss_token": 1}, 512, 1),
    ({"alphabet": 4, "key_len": 3, "n_queries": 2, "near_misses": 3, "near_miss_token": 2}, 128, 2),
    ({"alphabet": 3, "n_queries": 1, "near_misses": 2}, 24, 2),  # both candidates, every time
])
def test_mqmtar_plants_near_misses(params: dict[str, Any], length: int, token: int) -> None:
    """Every queried key has at least ``near_misses`` other keys equal to it at ``token`` only,
    counted from the samples' pairs; the samples stay valid MQMTAR samples."""
    task = get_task("mqmtar", **params)
    batch = task.sample(16, length, seed=5, split="eval")
    check_batch(task, 16, length, seed=5, split="eval")
    for source in batch.source:
        keys = [key for key, _ in source["pairs"]]
        for query in source["queries"]:
            pattern = [i == token - 1 for i in range(len(query))]
            only = [key for key in keys if [a == b for a, b in zip(key, query, strict=True)] == pattern]
            assert len(only) >= params["near_misses"]


def test_mqmtar_near_misses_leave_other_parameters_data_alone() -> None:
    """0 near misses is the task as drawn: the same bytes as without the parameter."""
    plain = get_task("mqmtar").sample(3, 300, seed=11, split="eval")
    zero = get_task("mqmtar", near_misses=0, near_miss_token=1).sample(3, 300, seed=11, split="eval")
    assert np.array_equal(plain.input_ids, zero.input_ids)


@pytest.mark.parametrize(("params", "length", "expected"), [
    ({"near_misses": 1, "key_len": 1}, 64, "key_len >= 2"),
    ({"near_misses": 1, "near_miss_token": 3}, 64, "near_miss_token <= key_len"),
    ({"near_misses": 2, "alphabet": 3, "n_queries": 2}, 64, "allow 2"),
    ({"near_misses": 4}, 64, "needs 20 pairs"),
    # all 9 keys present: the two candidates are taken by pairs that stay, so none can be planted
    ({"near_misses": 2, "alphabet": 3, "n_queries": 1, "pair_fraction": 1.0}, 36, "could not plant"),
])
def test_mqmtar_near_misses_refused(params: dict[str, Any], length: int, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        get_task("mqmtar", **params).sample(2, length, seed=0)


def _copy_role(source: list[int], k: int, j: int) -> str:
    """Copy's role of source symbol ``j`` for the answer copying symbol ``k``, from the symbol list:
    the longest run of equal symbols just before both, found by comparing slices."""
    if j == k:
        return "the symbol to copy"
    if abs(j - k) == 1:
        return "a neighbour of the symbol to copy"
    shared = max(m for m in range(min(j, k) + 1) if source[j - m:j] == source[k - m:k])
    return ("a symbol after the same 2+ symbols" if shared >= 2 else
            "a symbol after the same symbol" if shared == 1 else "another source symbol")


@pytest.mark.parametrize(("vocab_size", "length"), [(2, 12), (3, 40), (32, 200)])
def test_copy_names_each_positions_role_for_an_answer(vocab_size: int, length: int) -> None:
    task = get_task("copy", vocab_size=vocab_size)
    batch = task.sample(4, length, seed=7, split="eval")
    seen = set()
    for ids, mask, source in zip(batch.input_ids, batch.loss_mask, batch.source, strict=True):
        for k, row in enumerate(np.flatnonzero(mask)):
            expected = {p: "start, separator or output" for p in [0, *range(length + 1, len(ids))]}
            expected.update({1 + j: _copy_role(source, k, j) for j in range(length)})
            got = {p: task.key_role(ids, int(row), p) for p in range(len(ids))}
            assert got == expected
            seen.update(got.values())
    assert len(seen) == 6 if vocab_size < 32 else {"the symbol to copy", "another source symbol"} <= seen


@pytest.mark.parametrize(("vocab_size", "length"), [(2, 5), (4, 17), (32, 512), (32, 1025)])
def test_copy_with_distinct_pairs_never_repeats_a_pair(vocab_size: int, length: int) -> None:
    """Every adjacent pair of a source occurs once, counted from the samples' symbol lists, up to
    the longest length that allows it (vocab_size**2 + 1 symbols); the samples stay copy samples."""
    task = get_task("copy", vocab_size=vocab_size, distinct_pairs=True)
    batch = task.sample(8, length, seed=4, split="eval")
    check_batch(task, 8, length, seed=4, split="eval")
    for source, target in zip(batch.source, batch.target, strict=True):
        assert source == target and set(source) <= set(range(vocab_size))
        assert max(Counter(zip(source[:-1], source[1:], strict=True)).values()) == 1
    assert np.array_equal(batch.input_ids, task.sample(8, length, seed=4, split="eval").input_ids)


def test_copy_without_distinct_pairs_is_the_task_as_drawn() -> None:
    plain = get_task("copy").sample(3, 300, seed=11, split="eval")
    off = get_task("copy", distinct_pairs=False).sample(3, 300, seed=11, split="eval")
    assert np.array_equal(plain.input_ids, off.input_ids)


def test_copy_with_distinct_pairs_refuses_a_length_with_too_few_pairs() -> None:
    with pytest.raises(ValueError, match="5 adjacent pairs cannot be distinct over vocab_size 2"):
        get_task("copy", vocab_size=2, distinct_pairs=True).sample(1, 6, seed=0)


@pytest.mark.parametrize(("params", "length"),
                         [({}, 16), ({"n_priorities": 3, "n_classes": 2}, 40), ({}, 300)])
def test_max_retrieval_names_each_positions_role_for_the_answer(params: dict[str, Any], length: int) -> None:
    """Roles from the samples' (priority, class) lists: the maximum, items one priority below it or
    lower, and on which side of the maximum they sit."""
    task = get_task("max_retrieval", **params)
    batch = task.sample(6, length, seed=9, split="eval")
    seen = set()
    for ids, mask, source in zip(batch.input_ids, batch.loss_mask, batch.source, strict=True):
        (row,) = np.flatnonzero(mask)
        top = max(p for p, _ in source)
        at = [p for p, _ in source].index(top)
        expected = {p: "start or separator" for p in [0, *range(length + 1, len(ids))]}
        for j, (priority, _) in enumerate(source):
            kind = "an item one below the maximum" if priority == top - 1 else "a lower item"
            expected[1 + j] = "the maximum" if j == at else f"{kind}, {'after' if j > at else 'before'} it"
        got = {p: task.key_role(ids, int(row), p) for p in range(len(ids))}
        assert got == expected
        seen.update(got.values())
    assert "the maximum" in seen and any(role.startswith("an item one below") for role in seen)


def test_tasks_without_roles_name_none() -> None:
    task = get_task("sort")
    batch = task.sample(1, 8, split="eval")
    assert task.key_role(batch.input_ids[0], int(np.flatnonzero(batch.loss_mask[0])[0]), 1) is None


@pytest.mark.parametrize("key", list(GOLDEN_STREAMS), ids=lambda k: "-".join(map(str, k)))
def test_golden_hashes_of_mqmtar_streams(key: tuple[int, int, Any, str]) -> None:
    """Stream 1 stays what the board's runs were made with; stream 2 is a stream of its own."""
    stream, length, seed, split = key
    assert batch_digest("mqmtar", length, seed, split, **PAPER_MQMTAR, stream=stream) == GOLDEN_STREAMS[key]


@pytest.mark.parametrize(
    ("params", "length"),
    [(PAPER_MQMTAR, 64), (PAPER_MQMTAR, 40), (PAPER_MQMTAR, 4096), ({"alphabet": 16}, 300),
     ({"alphabet": 2, "key_len": 2}, 400), ({**PAPER_MQMTAR, "near_misses": 1}, 64)],
)
def test_mqmtar_stream_2_passes_the_checker(params: dict[str, Any], length: int) -> None:
    task = get_task("mqmtar", **params, stream=2)
    for split in ("train", "eval"):
        check_batch(task, 5, length, seed=3, split=split)


def test_mqmtar_streams_draw_the_same_distribution() -> None:
    """Both streams draw each sample's keys as a uniform ordered subset of the key space: every key
    as often in every context slot (a chi-square test over 256 keys), never twice in a sample."""
    from scipy.stats import chisquare

    params = {"alphabet": 16, "key_len": 2, "n_queries": 4, "pair_fraction": 0.5}
    for stream in (1, 2):
        task = get_task("mqmtar", **params, stream=stream)
        batch = task.sample(6000, 64, seed=9, split="train")  # 8 pairs of 256 keys: stream 2 rejects
        keys = np.array([[16 * a + b for (a, b), _ in sample["pairs"]] for sample in batch.source])
        assert keys.shape == (6000, 8)
        assert all(len(set(row)) == 8 for row in keys.tolist())
        for slot in (0, 7):
            counts = np.bincount(keys[:, slot], minlength=256)
            assert chisquare(counts).pvalue > 1e-4, (stream, slot)
        assert chisquare(np.bincount(keys.ravel(), minlength=256)).pvalue > 1e-4, stream


def test_mqmtar_stream_2_is_fast_at_the_paper_key_space() -> None:
    """The reason for stream 2: a training batch of the paper's MQMTAR no longer shuffles 65,536
    keys per sample. Counted, not timed: it draws about one float per key it needs."""
    drawn = []

    class Counting(np.random.Generator):
        def random(self, size=None, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
            drawn.append(int(np.prod(size)) if size is not None else 1)
            return super().random(size, *args, **kwargs)

    for stream, most in ((1, 64 * 65536), (2, 64 * 64)):
        task = get_task("mqmtar", **PAPER_MQMTAR, stream=stream)
        drawn.clear()
        rng = Counting(np.random.PCG64(0))
        task._generate(rng, 64, 64, "train")
        assert (sum(drawn) >= most) if stream == 1 else (sum(drawn) <= most), (stream, sum(drawn))


def test_streams_are_checked() -> None:
    with pytest.raises(TaskInputError, match="no stream 3; valid streams: 1, 2"):
        get_task("mqmtar", stream=3)
    with pytest.raises(TaskInputError, match="no stream 2; valid streams: 1$"):
        get_task("copy", stream=2)
    with pytest.raises(ValidationError):
        get_task("copy", stream=0)
    assert new_task_params("mqmtar", {}) == {"stream": 2}
    assert new_task_params("mqmtar", {"stream": 1, "alphabet": 8}) == {"stream": 1, "alphabet": 8}
    assert new_task_params("copy", {"vocab_size": 4}) == {"vocab_size": 4}
