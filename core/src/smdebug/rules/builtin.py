"""The built-in rules by name, and ``create_rule``: a rule from a name plus (string) parameters.

The core's rules are the classes of ``smdebug.rules.generic``, contributed through the ``smdebug_rules``
hook (``smdebug.defaults``) as plugins contribute theirs (the XGBoost plugin adds ``tree_depth`` and ``feature_importance_overweight``).
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import os

from smdebug.exceptions import SMDebugTypeError, SMDebugValueError
from smdebug.rules import generic
from smdebug.rules.rule import Rule

CORE_RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (getattr(generic, n) for n in generic.__all__)}

# Keys of a SageMaker rule configuration's RuleParameters that are not parameters of the rule.
_NOT_PARAMETERS = ("rule_to_invoke",)


def builtin_rules() -> dict[str, type[Rule]]:
    """Every built-in rule, the core's and the installed plugins', by configuration name, sorted."""
    from smdebug import plugins

    found = {n: c for n, c in plugins.rules().items() if isinstance(c, type) and issubclass(c, Rule)}
    return dict(sorted(found.items()))


def find_rule(name: str) -> type[Rule]:
    """The rule class of a configuration name (``vanishing_gradient``), a class name
    (``VanishingGradient``) or a custom rule's source file and class (``rules/my_rule.py:MyRule``, what a
    SageMaker custom rule names as its ``source`` and ``rule_to_invoke``); an error otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise SMDebugValueError(f"rule name {name!r} is not a rule name")
    key = name.strip()
    source, _, class_name = key.rpartition(":")
    if source.endswith(".py"):
        return rule_from_source(source, class_name)
    rules = builtin_rules()
    by_key = {}
    for config_name, cls in rules.items():
        for alias in (config_name, cls.__name__):
            by_key.setdefault(alias.lower(), cls)
            by_key.setdefault(alias.lower().replace("_", ""), cls)
    cls = by_key.get(key.lower()) or by_key.get(key.lower().replace("_", ""))
    if cls is None:
        close = difflib.get_close_matches(key, list(rules), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SMDebugValueError(f"unknown rule {name!r}{hint} (built-in rules: {', '.join(rules)})")
    return cls


_SOURCES: dict = {}  # realpath -> module: a source file is imported once per process
CUSTOM_RULE_MODULE = "smdebug_custom_rule_"  # the prefix of such modules' names


def rule_from_source(path: str, class_name: str) -> type[Rule]:
    """The Rule subclass ``class_name`` of the Python file ``path`` (the file is imported, once)."""
    if not os.path.isfile(path):
        raise SMDebugValueError(f"custom rule source {path!r}: no such file")
    full = os.path.realpath(path)
    module = _SOURCES.get(full)
    if module is None:
        spec = importlib.util.spec_from_file_location(f"{CUSTOM_RULE_MODULE}{len(_SOURCES)}", full)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the user's file: one line naming it and what went wrong
            raise SMDebugValueError(
                f"custom rule source {path!r} failed to import: {type(exc).__name__}: {exc}"
            ) from None
        _SOURCES[full] = module
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        found = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, Rule) and v is not Rule
        )
        raise SMDebugValueError(
            f"custom rule source {path!r} has no Rule subclass {class_name!r} (it has: {', '.join(found) or 'none'})"
        )
    return cls


def rule_parameters(cls: type[Rule]) -> dict[str, object]:
    """A rule's parameters and their defaults (``inspect.Parameter.empty`` when required)."""
    sig = inspect.signature(cls.__init__)
    return {
        n: prm.default
        for n, prm in list(sig.parameters.items())[2:]  # self, base_trial
        if prm.kind in (prm.POSITIONAL_OR_KEYWORD, prm.KEYWORD_ONLY)
    }


def create_rule(name, base_trial, other_trials=None, action_str: str = "", **params) -> Rule:
    """Build a built-in rule from its name (or a ``rule_configs`` configuration) and its parameters,
    given as strings the way configurations pass them: ``create_rule("vanishing_gradient", trial,
    threshold="1e-7")``."""
    if isinstance(name, dict):  # a rule_configs.<name>() configuration, maybe with RuleParameters
        section = name.get("DebugRuleConfiguration", name)
        given = dict(section.get("RuleParameters") or {})
        name = given.get("rule_to_invoke") or section.get("RuleConfigurationName")
        params = {**given, **params}
    cls = find_rule(name)
    params = {k: v for k, v in params.items() if k not in _NOT_PARAMETERS}
    accepted = rule_parameters(cls)
    takes_any = any(
        prm.kind == prm.VAR_KEYWORD for prm in inspect.signature(cls.__init__).parameters.values()
    )
    if not takes_any:
        for key in params:
            if key not in accepted:
                close = difflib.get_close_matches(key, list(accepted), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise SMDebugValueError(
                    f"{cls.__name__}: unknown parameter {key}={params[key]!r}{hint} "
                    f"(parameters: {', '.join(accepted) or 'none'})"
                )
    try:
        rule = construct(cls, base_trial, params, other_trials)
    except TypeError as exc:  # e.g. a missing required parameter of a plugin's rule
        raise SMDebugTypeError(f"{cls.__name__}: {exc}") from None
    if action_str:
        rule.action_str = action_str
    return rule


def construct(cls: type[Rule], base_trial, params: dict, other_trials=None) -> Rule:
    """``cls(base_trial, **params)``, the other trials given to the parameter that takes them; a class
    written as the walkthrough writes it, ``(base_trial, other_trials, ...)``, gets None without any."""
    accepted = inspect.signature(cls.__init__).parameters
    params = dict(params)
    if other_trials:
        if "other_trials" in accepted:
            params.setdefault("other_trials", list(other_trials))
        elif "other_trial" in accepted:
            params.setdefault("other_trial", list(other_trials)[0])
    takes_others = accepted.get("other_trials")
    if takes_others is not None and takes_others.default is takes_others.empty:
        params.setdefault("other_trials", None)
    return cls(base_trial, **params)
