"""The Redis timing index: the only owner of Redis key names (``keys``) and Lua scripts
(``store``), the shared client (``client``), and the hand-off of committed jobs
(``handoff``). Layer 3: imports the foundation (``delayjobs.core``, conf, models), the job
types and ``delayjobs.transitions``; never the API, the engine or contrib.
"""
