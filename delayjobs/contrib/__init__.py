"""Optional integrations, layer 6: ``contrib.celery`` (the Celery executor and its tasks)
and ``contrib.tasks`` (the Django Tasks backend).

Each may import layers 0-5 (foundation, spec, transitions, index, api, engine); neither
sub-package imports the other, and nothing below layer 6 imports either.
"""
