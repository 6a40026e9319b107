"""XGBoost's built-in collections and the patterns of the tensor names the hook gives them."""

from __future__ import annotations

from smdebug.plugin import CollectionKeys

# Tensors of one collection share a prefix (``feature_importance/gain/f0``); metrics are
# ``<eval name>-<metric>`` (``validation-logloss``), as smdebug 1.0 names them.
HYPERPARAMETERS_PREFIX = "hyperparameters/"
FEATURE_IMPORTANCE_PREFIX = "feature_importance/"
FULL_SHAP_PREFIX = "full_shap/"
AVERAGE_SHAP_PREFIX = "average_shap/"
TREES_PREFIX = "trees/"
PREDICTIONS = "predictions"
LABELS = "labels"
BIAS = "bias"  # the SHAP column of the expected value, outside the shap collections as in smdebug 1.0

# Metrics that grow as the model improves are no losses (also as "ndcg@3", and "ndcg-", which scores an
# empty query list 0).
INCREASING_METRICS = ("auc", "aucpr", "map", "ndcg", "pre", "interval-regression-accuracy")

LOSS_METRIC = "(?!(?:" + "|".join(INCREASING_METRICS) + ")(?:@|-|$))[^/]+"

BUILTIN_PATTERNS = {
    CollectionKeys.METRICS: "^[^/]+-[^/]+$",
    # an eval name holds no "-" (xgboost refuses it): the metric is all after the first one (the hook adds
    # the metrics of an eval name with "/" in it by name)
    CollectionKeys.LOSSES: "^[^/-]+-" + LOSS_METRIC + "$",
    CollectionKeys.HYPERPARAMETERS: "^hyperparameters/",
    CollectionKeys.PREDICTIONS: "^predictions$",
    CollectionKeys.LABELS: "^labels$",
    CollectionKeys.FEATURE_IMPORTANCE: "^feature_importance/",
    CollectionKeys.AVERAGE_SHAP: "^average_shap/(?!bias$)",
    CollectionKeys.FULL_SHAP: "^full_shap/(?!bias$)",
    CollectionKeys.TREES: "^trees/",
}

XGBOOST_COLLECTIONS = (CollectionKeys.ALL, CollectionKeys.DEFAULT, *BUILTIN_PATTERNS)

IMPORTANCE_TYPES = ("weight", "gain", "cover", "total_gain", "total_cover")
# The columns of Booster.trees_to_dataframe(), saved as trees/<column>.
TREE_COLUMNS = ("Tree", "Node", "ID", "Feature", "Split", "Yes", "No", "Missing", "Gain", "Cover", "Category")
