"""What a job is and what is valid: job types and their registry (``jobtypes``), the job
spec and every argument check (``validation``), payloads as they are stored (``payload``).

Layer 1: imports the foundation only (models, exceptions, conf, core). This ``__init__``
imports nothing, so that ``spec.jobtypes`` loads before Django's app registry is ready.
"""
