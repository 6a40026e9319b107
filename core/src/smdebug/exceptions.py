"""Exceptions raised by hooks, trials and rules (the names and arguments smdebug 1.0 users catch)."""

from smdebug.modes import ModeKeys


class SMDebugError(Exception):
    """Base class of every smdebug error."""


class SMDebugTypeError(SMDebugError, TypeError):
    pass


class SMDebugValueError(SMDebugError, ValueError):
    pass


class SMDebugRuntimeError(SMDebugError, RuntimeError):
    pass


class SMDebugNotImplementedError(SMDebugError, NotImplementedError):
    pass


class SMDebugCustomerError(SMDebugError):
    """A mistake of the user's (smdebug 1.0's name, kept for code that catches it)."""


class ConfigError(SMDebugValueError):
    """A hook configuration (arguments or JSON file) is invalid; the message names the field."""


class ConfigTypeError(ConfigError, SMDebugTypeError):
    """A configuration value of the wrong type; a ConfigError, and the SMDebugTypeError smdebug 1.0 raised for
    it (``coll.save_config = 5``)."""


class OutDirExistsError(ConfigError, SMDebugRuntimeError):
    """out_dir already holds a run; a ConfigError, and the SMDebugRuntimeError smdebug 1.0 raised for it."""


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """A hook configuration file named by create_from_json_file's argument or SMDEBUG_CONFIG_FILE_PATH is
    missing; a ConfigError, and the FileNotFoundError smdebug 1.0 raised for it."""


class CorruptRunError(SMDebugError):
    """A file of a saved run cannot be parsed; the message names the file (and offset)."""


class NoSuchCollection(SMDebugError, KeyError):
    """``get_collection(name, create=False)`` for a collection that does not exist (smdebug 1.0 raises
    SMDebugError there; a KeyError is what a mapping raises)."""

    def __str__(self):
        return str(self.args[0])


class InvalidCollectionConfiguration(SMDebugError):
    def __init__(self, c_name):
        super().__init__(c_name)
        self.c_name = c_name

    def __str__(self):
        return f"Collection {self.c_name} has not been configured; configure it before the first step"


class StepNotYetAvailable(SMDebugError):
    def __init__(self, step, mode):
        super().__init__(step, mode)
        self.step, self.mode = step, mode

    def __str__(self):
        return f"Step {self.step} of mode {_name(self.mode)} not yet available"


class StepUnavailable(SMDebugError):
    def __init__(self, step, mode):
        super().__init__(step, mode)
        self.step, self.mode = step, mode

    def __str__(self):
        return f"Step {self.step} of mode {_name(self.mode)} is not available as it was not saved"


class MissingCollectionFiles(SMDebugError):
    def __str__(self):
        return "Training job has ended. All the collection files could not be loaded"


class IndexReaderException(SMDebugError):
    def __init__(self, message):
        super().__init__(message)
        self.message = message

    def __str__(self):
        return self.message


class TensorUnavailableForStep(SMDebugError):
    def __init__(self, tname, step, mode=ModeKeys.GLOBAL, has_reductions=False):
        super().__init__(tname, step, mode, has_reductions)
        self.tname, self.step, self.mode, self.has_reductions = tname, step, mode, has_reductions

    def __str__(self):
        msg = f"Value for tensor {self.tname} is not available for step {self.step} with mode {_name(self.mode)}"
        if self.has_reductions:
            msg += " as it was saved as reductions only; use reduction_value()"
        return msg


class CorruptTensorRecord(TensorUnavailableForStep, CorruptRunError):
    """A saved value's record is damaged (truncated, or fails its checksum): that value is skipped.

    It is a TensorUnavailableForStep, so rules pass over it, and a CorruptRunError.
    """

    def __init__(self, tname, step, mode, reason):
        super().__init__(tname, step, mode)
        self.reason = reason  # names the file and the offset

    def __str__(self):
        return f"Value for tensor {self.tname} at step {self.step} with mode {_name(self.mode)} is unreadable: {self.reason}"


class ShapeUnavailableForStep(TensorUnavailableForStep):
    """Neither the shape nor the value was saved: a TensorUnavailableForStep, which smdebug's analysis
    documentation says ``shape()`` raises then (and rules pass over)."""

    def __init__(self, tname, step, mode=ModeKeys.GLOBAL):
        super().__init__(tname, step, mode)

    def __str__(self):
        return f"Shape for tensor {self.tname} is not available for step {self.step} with mode {_name(self.mode)}"

    def __reduce__(self):  # (pickled, e.g. a Dask worker's error: its arguments are not its parent's)
        return type(self), (self.tname, self.step, self.mode)


class TensorUnavailable(SMDebugError):
    def __init__(self, tname, saved=()):
        super().__init__(tname)
        self.tname = tname
        self.saved = saved  # the names that were saved (not copied): the message names the closest

    def __str__(self):
        return f"Tensor {self.tname} was not saved{did_you_mean(self.tname, self.saved) or '.'}"

    def __reduce__(self):  # pickled (a Dask worker's error) with its message: only the closest name goes
        import difflib

        return (
            type(self),
            (self.tname, difflib.get_close_matches(str(self.tname), list(map(str, self.saved)), n=1)),
        )


class InvalidWorker(SMDebugError):
    def __init__(self, worker):
        super().__init__(worker)
        self.worker = worker

    def __str__(self):
        return f"Invalid Worker: {self.worker}"


class NoMoreData(SMDebugError):
    def __init__(self, step, mode, last_step):
        super().__init__(step, mode, last_step)
        self.step, self.mode, self.last_step = step, mode, last_step
        self.msg = (
            f"Looking for step {step} of mode {_name(mode)} and reached end of training. "
            f"Max step available is {last_step}"
        )

    def __str__(self):
        return self.msg


class RuleEvaluationConditionMet(SMDebugError):
    def __init__(self, rule_name, step, end_of_rule=False):
        super().__init__(rule_name, step, end_of_rule)
        self.rule_name, self.step, self.end_of_rule = rule_name, step, end_of_rule

    def __str__(self):
        return (
            f"Evaluation of the rule {self.rule_name} at step {self.step} resulted in the condition being met"
        )


class NoMoreProfilerData(SMDebugError):
    """smdebug 1.0's end of a profiler rule's data: a rule raising it ends ``invoke_rule``, as in 1.0."""

    def __init__(self, timestamp):
        super().__init__(timestamp)
        self.timestamp = timestamp

    def __str__(self):
        return f"Looking for timestamp {self.timestamp} and reached end of training."


class InsufficientInformationForRuleInvocation(SMDebugError):
    def __init__(self, rule_name, message):
        super().__init__(rule_name, message)
        self.rule_name, self.message = rule_name, message

    def __str__(self):
        return f"Insufficient information to invoke rule {self.rule_name}: {self.message}"


def _name(mode):
    return getattr(mode, "name", mode)


class StopTraining(RuleEvaluationConditionMet):
    """A rule asked training to stop (in-process, or through the stop signal ``smdebug rules --watch``
    leaves); the PyTorch hook raises it from the next forward call."""

    def __init__(self, rule_name, step, reason=""):
        super().__init__(rule_name, step)
        self.reason = reason
        self.source = "rule"  # or "signal" when it came from the run's stop signal

    def __str__(self):
        why = f": {self.reason}" if self.reason else ""
        return f"Training stopped because rule {self.rule_name} fired at step {self.step}{why}"


def did_you_mean(name: str, choices) -> str:
    """``"; did you mean 'weights'?"`` when one of ``choices`` is close to ``name``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
