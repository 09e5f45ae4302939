"""Celery: the executor that publishes claimed jobs, the broker checks, and the worker side
that runs them. The tasks themselves are ``delayjobs.tasks``, where Celery's autodiscovery
looks for them. Only these modules and ``delayjobs.tasks`` import Celery; none imports
``delayjobs.contrib.tasks``.
"""
