"""Optional integrations: ``contrib.celery`` (the Celery executor; its tasks are
``delayjobs.tasks``) and ``contrib.tasks`` (the Django Tasks backend).

Each may import the engine and every layer below it; neither sub-package imports the
other, and only ``delayjobs.apps`` and ``delayjobs.tasks`` import them (the engine names
executors by dotted path).
"""
