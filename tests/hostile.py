"""Helpers for the tests of untrusted result folders: rows relabelled consistently (so they pass
the reader and reach the outputs), forged results, a payload plugin file that leaves a mark when
imported, and a result folder from rows. (The tiny run they tamper with is a fixture of
conftest.py.)"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd

from lengthgen.config import RunConfig, config_hash_of
from lengthgen.harness.storage.identity import run_id_of
from lengthgen.harness.storage.schema import wilson_interval

#: Strings an adversarial result folder might carry.
SCRIPT = 'x"><img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
TRAVERSAL = "../../../../tmp/x/PWNED"
FORMULAS = ('=HYPERLINK("http://x","y")', '=cmd|"/c calc"!A1', "+1+1", "@SUM(1)", "-2+3")

def relabel(rows: pd.DataFrame, **fields: Any) -> pd.DataFrame:
    """``rows`` with config fields (``task``, ``attn``, ``pos``, ``preset``) changed in their
    config_json and everywhere a row names them (columns, config_hash, run_id), as a folder
    written by someone else could hold them."""
    out = rows.copy()
    for i, text in enumerate(rows["config_json"]):
        config = {**json.loads(text), **fields}
        canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
        digest = config_hash_of(canonical)
        out.loc[out.index[i], ["config_json", "config_hash", "run_id"]] = [
            canonical, digest, run_id_of(RunConfig.model_validate(config), digest)]
        for name, value in fields.items():
            if name in out.columns:
                out.loc[out.index[i], name] = value
    return out


def forged(rows: pd.DataFrame, where: pd.Series, hits: int | None = None) -> pd.DataFrame:
    """``rows`` with the exact match of the ``where`` rows set to ``hits`` of their samples (default:
    one sample more, or one fewer when every one was right) and the interval to match: an edit the
    reader cannot tell from an honest row (only ``lengthgen verify`` can, by training the run again)."""
    out = rows.copy()
    for i in out.index[where]:
        n = int(out.at[i, "n_samples"])
        k = round(float(out.at[i, "exact_match"]) * n)
        k = hits if hits is not None else k + 1 if k < n else k - 1
        out.loc[i, ["exact_match", "exact_match_lo", "exact_match_hi"]] = [k / n, *wilson_interval(k, n)]
    return out


def payload_plugin(folder: Path, marker: Path) -> str:
    """A backend file that writes ``marker`` when imported (a softmax otherwise); its spec."""
    path = folder / "payload.py"
    path.write_text(textwrap.dedent(f"""
        from pathlib import Path
        Path({str(marker)!r}).write_text("imported")
        from lengthgen.attention.softmax_family import Softmax

        class Payload(Softmax):
            name = "payload"
            description = "softmax that marks its import"
        """))
    return f"{path}:Payload"


def result_folder(root: Path, name: str, rows: pd.DataFrame, source: str | None = None) -> Path:
    """A result folder ``root/name`` with one data file per run, and ``source.toml`` when given."""
    from lengthgen.harness.storage.results import write_parquet_atomic

    path = root / name
    (path / "data").mkdir(parents=True)
    for run_id, group in rows.groupby("run_id"):
        write_parquet_atomic(group, path / "data" / f"{run_id}.parquet")
    if source is not None:
        (path / "source.toml").write_text(source, encoding="utf-8")
    return path
