"""Recurring schedules: when a schedule ticks (``rules``: ``Every``, ``Cron``, the misfire
policies), what a schedule is and what it did (``definitions``: the rows of code schedules,
pause and resume, restarting ticks), and the pre-loader's step that makes ticks into jobs
(``ticks``).

This ``__init__`` imports nothing: ``rules`` loads with the job types, before Django's app
registry is ready, and the other two need the models.
"""
