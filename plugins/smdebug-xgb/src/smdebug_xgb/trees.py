"""The columns of ``Booster.trees_to_dataframe()`` for some of a booster's trees, without pandas.

Values are read from the JSON dump and follow trees_to_dataframe: rows sorted by tree then node,
``ID``/``Yes``/``No``/``Missing`` as ``"<tree>-<node>"``, ``Feature`` "Leaf" and ``Gain`` the leaf value
on leaves. Missing entries of the string columns are ``"nan"`` (smdebug 1.0 stores them so);
``Category`` holds the categories of a categorical split joined by commas. An indicator feature's split
(feature_types "i") has neither threshold nor missing branch: ``Split`` NaN, ``Missing`` ``"nan"``.
"""

from __future__ import annotations

import json
import math

import numpy as np

NAN = "nan"


def tree_columns(dumps: list[str], first_tree: int) -> dict[str, np.ndarray]:
    """Columns of the trees in ``dumps`` (JSON dumps with stats), numbered from ``first_tree``."""
    rows: list[tuple] = []
    for offset, dump in enumerate(dumps):
        tree = first_tree + offset
        stack = [json.loads(dump)]
        while stack:
            node = stack.pop()
            stack.extend(node.get("children", ()))
            rows.append(_row(tree, node))
    rows.sort(key=lambda r: (r[0], r[1]))
    columns = list(zip(*rows)) if rows else [()] * 11
    tree_ids, node_ids, ids, features, splits, yes, no, missing, gains, covers, categories = columns
    return {
        "Tree": np.array(tree_ids, dtype=np.int64),
        "Node": np.array(node_ids, dtype=np.int64),
        "ID": np.array(ids, dtype=str),
        "Feature": np.array(features, dtype=str),
        "Split": np.array(splits, dtype=np.float64),
        "Yes": np.array(yes, dtype=str),
        "No": np.array(no, dtype=str),
        "Missing": np.array(missing, dtype=str),
        "Gain": np.array(gains, dtype=np.float64),
        "Cover": np.array(covers, dtype=np.float64),
        "Category": np.array(categories, dtype=str),
    }


def _row(tree: int, node: dict) -> tuple:
    nid = int(node["nodeid"])
    ident = f"{tree}-{nid}"
    cover = float(node.get("cover", math.nan))
    if "leaf" in node:
        return (tree, nid, ident, "Leaf", math.nan, NAN, NAN, NAN, float(node["leaf"]), cover, NAN)
    condition = node.get("split_condition")
    if isinstance(condition, list):  # a categorical split: the categories that go left
        split, category = math.nan, ",".join(str(c) for c in condition)
    elif condition is None:  # an indicator feature's split (feature_types "i"): no threshold
        split, category = math.nan, NAN
    else:
        split, category = float(condition), NAN
    missing = node.get("missing")  # (an indicator split has no missing branch)
    return (
        tree,
        nid,
        ident,
        str(node["split"]),
        split,
        f"{tree}-{node['yes']}",
        f"{tree}-{node['no']}",
        NAN if missing is None else f"{tree}-{missing}",
        float(node.get("gain", math.nan)),
        cover,
        category,
    )


def tree_depths(ids: np.ndarray, yes: np.ndarray, no: np.ndarray, trees: np.ndarray) -> dict[int, int]:
    """The depth of every tree (a lone leaf has depth 0), from the ``ID``/``Yes``/``No`` columns."""
    children: dict[str, tuple[str, str]] = {}
    for ident, left, right in zip(ids.tolist(), yes.tolist(), no.tolist()):
        if left != NAN:
            children[ident] = (left, right)
    depths: dict[int, int] = {}
    for tree in sorted(set(np.asarray(trees).tolist())):
        deepest, frontier = 0, [(f"{tree}-0", 0)]
        while frontier:
            ident, depth = frontier.pop()
            deepest = max(deepest, depth)
            frontier.extend((child, depth + 1) for child in children.get(ident, ()))
        depths[int(tree)] = deepest
    return depths
