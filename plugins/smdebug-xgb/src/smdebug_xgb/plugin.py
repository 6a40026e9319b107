"""Entry-point module of the XGBoost plugin: hook implementations only, xgboost is not imported here."""

from __future__ import annotations

from importlib import metadata

from smdebug.hookspecs import hookimpl
from smdebug.plugins import Framework

# xgboost's CPU-only build is published as "xgboost-cpu"; either one provides the xgboost package.
DISTRIBUTIONS = ("xgboost", "xgboost-cpu")


def _installed_distribution() -> str:
    for name in DISTRIBUTIONS:
        try:
            metadata.version(name)
            return name
        except metadata.PackageNotFoundError:
            continue
    return DISTRIBUTIONS[0]


@hookimpl
def smdebug_framework():
    return Framework(
        alias="xgboost",
        package="smdebug_xgb",
        import_names=("xgboost",),
        distribution=_installed_distribution(),
        supported=">=2.0",
    )


@hookimpl
def smdebug_activate(framework, module):
    if framework.alias != "xgboost":
        return None
    from smdebug_xgb.activation import activate

    return activate()


@hookimpl
def smdebug_rules():
    from smdebug_xgb.rules import RULES

    return dict(RULES)
