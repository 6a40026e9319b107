"""Entry-point module of the XGBoost plugin: hook implementations only, xgboost is not imported here."""

from __future__ import annotations

from smdebug.plugin import Framework, hookimpl


@hookimpl
def smdebug_framework():
    return Framework(
        alias="xgboost",
        package="smdebug_xgb",
        import_names=("xgboost",),
        distributions=("xgboost", "xgboost-cpu"),  # xgboost-cpu is the CPU-only build of the same package
        supported=">=2.0",
    )


@hookimpl
def smdebug_activate(framework, module):
    from smdebug_xgb.activation import activate

    return activate()


@hookimpl
def smdebug_rules():
    from smdebug_xgb.rules import RULES

    return dict(RULES)
