"""smdebug for XGBoost, also importable as ``smdebug.xgboost``.

import smdebug.xgboost as smd
hook = smd.Hook(out_dir="/tmp/run", include_collections=["metrics", "feature_importance"])
xgboost.train(params, dtrain, evals=[(dval, "validation")], callbacks=[hook])
"""

from smdebug.plugin import exports

# Hook, SaveConfig, create_trial, ... resolve on first use: importing this package stays cheap.
__getattr__, __dir__, get_hook, __all__ = exports(__name__, "smdebug_xgb.hook")
