"""Celery (layer 6): the executor that publishes claimed jobs, the broker checks, the
worker side that runs them, and the tasks (``delayjobs.tasks.*`` by name). Only modules
here import Celery. Imports layers 0-5; never ``delayjobs.contrib.tasks``.
"""
