# The fake API server serves PriorityClasses as every real one does (see priority_classes).
from tests.kubernetes import priority_classes as _priority_classes  # noqa: F401
