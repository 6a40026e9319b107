"""An entry-point module that cannot be imported (its framework is not installed)."""

import toybroken_framework_not_installed  # noqa: F401
