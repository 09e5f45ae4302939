"""A name module: ``UnstorableResult`` is defined here because its class path is data.

``delayjobs.execution.UnstorableResult`` is written into task results
(``TaskError.exception_class_path``, docs/howto/django-tasks.md) and old rows hold it, so
the class never moves. Running a claimed job is ``delayjobs.engine.execution``.
"""


class UnstorableResult(TypeError):
    """``execute`` returned a value a JSON column cannot hold: the job fails, unretried."""
