"""The ``train_data`` / ``validation_data`` arguments: a DMatrix, or (file path, content type)."""

from __future__ import annotations

import csv
import os
import re

import numpy as np
import scipy.sparse
import xgboost as xgb

from smdebug.plugin import ConfigError

CONTENT_TYPES = {
    "csv": "csv",
    "text/csv": "csv",
    "libsvm": "libsvm",
    "text/libsvm": "libsvm",
    "text/x-libsvm": "libsvm",
}
XGBOOST_ERROR_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ")


def load_data(argument: str, data) -> xgb.DMatrix | None:
    """The DMatrix the argument stands for (a file's label is its first column, as SageMaker's)."""
    if data is None or isinstance(data, xgb.DMatrix):
        return data
    if not (
        isinstance(data, tuple)
        and len(data) == 2
        and isinstance(data[0], (str, os.PathLike))
        and isinstance(data[1], str)
    ):
        got = (
            f"({', '.join(type(x).__name__ for x in data)})"
            if isinstance(data, tuple)
            else type(data).__name__
        )
        raise ConfigError(
            f"{argument}: expected an xgboost.DMatrix or a tuple (file path, content type), got {got}"
        )
    path, content_type = os.path.expanduser(os.fspath(data[0])), data[1]
    kind = CONTENT_TYPES.get(content_type.strip().lower())
    if kind is None:
        raise ConfigError(
            f"{argument}: content type {content_type!r} is not one of {', '.join(sorted(CONTENT_TYPES))}"
        )
    if not os.path.isfile(path):
        raise ConfigError(f"{argument}: {path!r} is not a local file")
    try:
        matrix = _read_csv(path) if kind == "csv" else _read_libsvm(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{argument}: cannot read {path!r} as {kind}: {one_line(exc)}") from None
    if matrix.num_row() == 0:
        raise ConfigError(f"{argument}: {path!r} holds no rows")
    return matrix


def one_line(exc: Exception) -> str:
    """An xgboost error in one line: its first, without the time and source file it starts with (the
    native stack trace follows it)."""
    first = XGBOOST_ERROR_PREFIX.sub("", (str(exc).strip().splitlines() or [""])[0])
    if first.startswith("Check failed: "):  # "Check failed: <C++ condition>: <what it means>"
        first = first.rsplit(": ", 1)[1].strip() or first
    return f"{type(exc).__name__}: {' '.join(first.split())}"


def _read_csv(path: str) -> xgb.DMatrix:
    """Rows of numbers, the label first (SageMaker's XGBoost layout); the delimiter is sniffed. An empty
    field is a missing value, as xgboost's own CSV reader takes it."""
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    try:
        delimiter = csv.Sniffer().sniff(first, delimiters=",;\t |").delimiter
    except csv.Error:
        delimiter = ","
    table = np.loadtxt(path, delimiter=delimiter, ndmin=2, dtype=np.float64, converters=_number_or_missing)
    return xgb.DMatrix(table[:, 1:], label=table[:, 0])


def _number_or_missing(field: str) -> float:
    return float(field) if field.strip() else np.nan


def _read_libsvm(path: str) -> xgb.DMatrix:
    """``<label>[:<weight>] [qid:<query>] <index>:<value> ...`` lines; indices are column numbers as
    written."""
    labels, weights, queries, rows, cols, values = [], [], [], [], [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            parts = line.split("#", 1)[0].split()
            if not parts:
                continue
            label, _, weight = parts[0].partition(":")
            labels.append(float(label))
            weights.append(float(weight) if weight else 1.0)
            for item in parts[1:]:
                index, sep, value = item.partition(":")
                if not sep:
                    raise ValueError(f"line {number}: {item!r} is not <index>:<value>")
                if index == "qid":  # a ranking file's query id
                    queries.append(int(value))
                    continue
                rows.append(len(labels) - 1)
                cols.append(int(index))
                values.append(float(value))
    shape = (len(labels), max(cols) + 1 if cols else 0)
    matrix = scipy.sparse.csr_matrix((values, (rows, cols)), shape=shape)
    has_weights = any(w != 1.0 for w in weights)
    return xgb.DMatrix(
        matrix,
        label=np.array(labels),
        weight=np.array(weights) if has_weights else None,
        qid=np.array(queries) if queries and len(queries) == len(labels) else None,
    )
