import numpy as np
import pytest
import xgboost as xgb

ALL_XGB = [
    "metrics",
    "hyperparameters",
    "predictions",
    "labels",
    "feature_importance",
    "full_shap",
    "average_shap",
    "trees",
]


def make_data(n=160, features=5, seed=0, task="binary"):
    """Small generated data: the label depends on the first two features (plus noise)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, features))
    score = X[:, 0] + 0.6 * X[:, 1] + 0.3 * rng.normal(size=n)
    if task == "binary":
        y = (score > 0).astype(np.float64)
    elif task == "multiclass":
        y = np.digitize(score, [-0.5, 0.5]).astype(np.float64)
    else:
        y = score
    return X, y


@pytest.fixture
def binary():
    """(dtrain, dvalid, X_train, y_train, X_valid, y_valid) of a small binary task."""
    X, y = make_data()
    return (
        xgb.DMatrix(X[:120], label=y[:120]),
        xgb.DMatrix(X[120:], label=y[120:]),
        X[:120],
        y[:120],
        X[120:],
        y[120:],
    )
