"""RequiredTensors: the tensors (and steps) a rule declares it needs before it is evaluated at a step.

A rule fills ``self.req_tensors`` in ``set_required_tensors(step)``; ``Rule.invoke`` then waits for those
steps and reads those values before ``invoke_at_step``, so a value that is not there skips the step
(``invoke_rule`` moves on) instead of failing half-way through the rule.
"""

from __future__ import annotations

from smdebug.exceptions import TensorUnavailable


class RequiredTensorsForTrial:
    """What a rule needs from one trial: tensor name -> steps."""

    def __init__(self, trial):
        self.trial = trial
        self._steps: dict[str, list[int]] = {}
        self._tensors: dict = {}

    def add(self, name: str, steps, should_match_regex: bool = False) -> None:
        names = self.trial.tensor_names(regex=[name]) if should_match_regex else [name]
        for tname in names:
            if not should_match_regex and not self.trial.has_tensor(tname):
                raise TensorUnavailable(tname)
            self._steps.setdefault(tname, []).extend(int(s) for s in steps)
            self._tensors.setdefault(tname, self.trial.tensor(tname))

    def get_tensor_steps(self, name: str) -> list[int]:
        return self._steps[name]

    def get_names(self):
        return self._steps.keys()

    def get(self):
        return self._tensors.values()

    def clear(self) -> None:
        self._steps.clear()
        self._tensors.clear()

    def fetch(self) -> None:
        """Wait for the steps, then read each value once (StepUnavailable & co. when one is missing)."""
        steps = sorted({s for wanted in self._steps.values() for s in wanted})
        if steps:
            self.trial.wait_for_steps(steps)
        for name, wanted in self._steps.items():
            tensor = self._tensors[name]
            for step in wanted:
                tensor.value(step)


class RequiredTensors:
    """The tensors a rule needs, per trial (the base trial unless ``trial=`` says otherwise)."""

    def __init__(self, base_trial, other_trials=None):
        self.base_trial = base_trial
        self._per_trial = {id(t): RequiredTensorsForTrial(t) for t in [base_trial, *(other_trials or [])]}

    def _for(self, trial) -> RequiredTensorsForTrial:
        trial = self.base_trial if trial is None else trial
        if id(trial) not in self._per_trial:
            self._per_trial[id(trial)] = RequiredTensorsForTrial(trial)
        return self._per_trial[id(trial)]

    def add(self, name: str, steps, trial=None, should_match_regex: bool = False) -> None:
        self._for(trial).add(name, steps, should_match_regex=should_match_regex)

    def get_tensor_steps(self, name: str, trial=None) -> list[int]:
        return self._for(trial).get_tensor_steps(name)

    def get_names(self, trial=None):
        return self._for(trial).get_names()

    def get(self, trial=None):
        return self._for(trial).get()

    def clear(self) -> None:
        for required in self._per_trial.values():
            required.clear()

    def fetch(self) -> None:
        for required in self._per_trial.values():
            required.fetch()
