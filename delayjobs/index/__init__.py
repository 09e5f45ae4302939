"""The Redis timing index: the only owner of Redis key names (``keys``) and Lua scripts
(``store``), the shared client (``client``), and the hand-off of committed jobs
(``handoff``), and loading the window (``window``). Imports the state machine
(``delayjobs.transitions``), the definitions (job types, lanes) and the foundation; never
the API, the engine or contrib.
"""
