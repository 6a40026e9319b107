"""Collections: named groups of tensors, each with its own save and reduction configuration."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from smdebug.config import ReductionConfig, SaveConfig, edited, named_arguments
from smdebug.exceptions import NoSuchCollection, SMDebugTypeError


class CollectionKeys:
    DEFAULT = "default"
    ALL = "all"
    INPUTS = "inputs"
    OUTPUTS = "outputs"
    WEIGHTS = "weights"
    BIASES = "biases"
    GRADIENTS = "gradients"
    LOSSES = "losses"
    LAYERS = "layers"
    METRICS = "metrics"
    SM_METRICS = "sm_metrics"
    OPTIMIZER_VARIABLES = "optimizer_variables"
    TENSORFLOW_SUMMARIES = "tensorflow_summaries"
    # XGBoost
    HYPERPARAMETERS = "hyperparameters"
    PREDICTIONS = "predictions"
    LABELS = "labels"
    FEATURE_IMPORTANCE = "feature_importance"
    AVERAGE_SHAP = "average_shap"
    FULL_SHAP = "full_shap"
    TREES = "trees"


# Scalar-valued collections of every framework: no reductions or histograms, always saved raw (a plugin
# adds its own through BaseHook.scalar_collections).
SCALAR_COLLECTIONS = frozenset({CollectionKeys.LOSSES, CollectionKeys.METRICS, CollectionKeys.SM_METRICS})
# A layer's (module's, block's) tensors are named <layer>_input_<i> / <layer>_output_<i>, as in smdebug 1.0.
INPUT_SUFFIX = "_input_"
OUTPUT_SUFFIX = "_output_"


def layer_tensor_patterns(layer_name: str, inputs: bool, outputs: bool) -> list[str]:
    """The patterns of one layer's input and/or output tensors (``fc1_output_0``, ...)."""
    suffixes = ([INPUT_SUFFIX] if inputs else []) + ([OUTPUT_SUFFIX] if outputs else [])
    return [f"^{re.escape(layer_name + suffix)}\\d+$" for suffix in suffixes]


# Collections that only hold training-time values, skipped in EVAL and PREDICT.
TRAIN_ONLY_COLLECTIONS = frozenset({CollectionKeys.GRADIENTS, CollectionKeys.OPTIMIZER_VARIABLES})


def _as_list(value, field: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    try:
        items = list(value)
    except TypeError:
        items = None
    if items is None or not all(isinstance(v, str) for v in items):
        raise SMDebugTypeError(f"{field}: expected a string or a list of strings, got {value!r}")
    return items


class Collection:
    """A group of tensors chosen by name or regex, with optional save/reduction configs of its own."""

    @named_arguments
    def __init__(
        self,
        name: str,
        include_regex: Iterable[str] | str | None = None,
        tensor_names: Iterable[str] | None = None,
        reduction_config: ReductionConfig | None = None,
        save_config: SaveConfig | None = None,
        save_histogram: bool = True,
    ):
        if not isinstance(name, str) or not name:
            raise SMDebugTypeError(f"collection name must be a non-empty string, got {name!r}")
        self.name = name
        self._include_regex: list[str] = []
        self._compiled: re.Pattern | None = None
        self.include(_as_list(include_regex, "include_regex"))
        self._tensor_names: set[str] = set(_as_list(tensor_names, "tensor_names"))
        self.reduction_config = reduction_config
        self.save_config = save_config
        self.save_histogram = save_histogram

    # -- properties from the reference -------------------------------------------------------------
    @property
    def include_regex(self) -> list[str]:
        return self._include_regex

    @include_regex.setter
    def include_regex(self, patterns) -> None:
        self._include_regex = []
        self._compiled = None
        self.include(_as_list(patterns, "include_regex"))

    @property
    def tensor_names(self) -> set[str]:
        return self._tensor_names

    @tensor_names.setter
    def tensor_names(self, names) -> None:
        self._tensor_names = set(_as_list(names, "tensor_names"))

    @property
    def reduction_config(self) -> ReductionConfig | None:
        return self._reduction_config

    @reduction_config.setter
    def reduction_config(self, value) -> None:
        if value is not None and not isinstance(value, ReductionConfig):
            raise SMDebugTypeError(f"reduction_config of collection {self.name!r} must be a ReductionConfig")
        self._reduction_config = value

    @property
    def save_config(self) -> SaveConfig | None:
        return self._save_config

    @save_config.setter
    def save_config(self, value) -> None:
        # Never None: every mode starts "not set" and takes the hook's configuration when training starts,
        # so `coll.save_config.end_step = 0` works on a fresh collection (reference, default collections).
        self._save_config = SaveConfig(mode_save_configs={}) if value is None else SaveConfig.parse(value)
        edited()

    # -- methods ------------------------------------------------------------------------------------
    def include(self, regex) -> None:
        for pattern in _as_list(regex, "include_regex"):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SMDebugTypeError(
                    f"invalid include_regex {pattern!r} for collection {self.name!r}: {exc}"
                ) from None
            if pattern not in self._include_regex:
                self._include_regex.append(pattern)
        self._compiled = None

    def add_tensor_name(self, name: str) -> None:
        self._tensor_names.add(name)

    def remove_tensor_name(self, name: str) -> None:
        self._tensor_names.discard(name)

    def has_tensor_name(self, name: str) -> bool:
        return name in self._tensor_names

    def matches(self, name: str) -> bool:
        """Whether a tensor belongs to this collection: by name, or a regex found anywhere in the name
        (``re.search``, as smdebug 1.0 matches)."""
        if name in self._tensor_names:
            return True
        if not self._include_regex:
            return False
        if self._compiled is None:
            self._compiled = re.compile("|".join(f"(?:{p})" for p in self._include_regex))
        return self._compiled.search(name) is not None

    # -- serialisation in smdebug's collections-file form --------------------------------------------
    def to_json_dict(self) -> dict:
        return {
            "name": self.name,
            "include_regex": list(self._include_regex),
            "tensor_names": sorted(self._tensor_names),
            "reduction_config": self.reduction_config.to_json_dict() if self.reduction_config else None,
            "save_config": self.save_config.to_json_dict(),
            "save_histogram": self.save_histogram,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_dict(cls, params: dict) -> Collection:
        if not isinstance(params, dict) or "name" not in params:
            raise SMDebugTypeError(f"a collection must be a JSON object with a name, got {params!r}")
        rc, sc = params.get("reduction_config"), params.get("save_config")
        return cls(
            params["name"],
            include_regex=params.get("include_regex") or None,
            tensor_names=params.get("tensor_names") or None,
            reduction_config=ReductionConfig.from_dict(rc) if rc else None,
            save_config=SaveConfig.from_dict(sc) if sc else None,
            save_histogram=params.get("save_histogram", True),
        )

    @classmethod
    def from_json(cls, text: str) -> Collection:
        return cls.from_dict(json.loads(text))

    def __eq__(self, other):
        if not isinstance(other, Collection):
            return NotImplemented
        return self.to_json_dict() == other.to_json_dict()

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return f"<Collection {self.name!r}: include_regex={self._include_regex}, tensors={len(self._tensor_names)}>"


class CollectionManager:
    """The collections of one hook or one run (smdebug's collections JSON: collections plus _meta)."""

    def __init__(self, collections: dict[str, Collection] | None = None, num_workers: int = 1):
        self.collections: dict[str, Collection] = dict(collections or {})
        self.meta = {"num_workers": num_workers}

    def get(self, name: str, create: bool = True, cls=Collection) -> Collection:
        if name not in self.collections:
            if not create:
                raise NoSuchCollection(f"collection {name!r} does not exist")
            self.collections[name] = cls(name)
        return self.collections[name]

    def add(self, collection: Collection | str, cls=Collection) -> None:
        if isinstance(collection, str):
            self.get(collection, cls=cls)
        elif isinstance(collection, Collection):
            self.collections[collection.name] = collection
            edited()
        else:
            raise SMDebugTypeError(f"expected a Collection, got {type(collection).__name__}")

    def to_json_dict(self) -> dict:
        return {
            "collections": {n: c.to_json_dict() for n, c in self.collections.items()},
            "_meta": dict(self.meta),
        }

    @classmethod
    def from_json(cls, text: str, source: str = "<collections>") -> CollectionManager:
        from smdebug.exceptions import CorruptRunError

        try:
            from smdebug.layout import load_json

            data = load_json(text)
            manager = cls(num_workers=int(data.get("_meta", {}).get("num_workers", 1)))
            for name, params in data["collections"].items():
                manager.collections[name] = Collection.from_dict(params)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptRunError(
                f"{source}: malformed collections file: {type(exc).__name__}: {exc}"
            ) from None
        manager.meta.update({k: v for k, v in data.get("_meta", {}).items() if k != "num_workers"})
        return manager
