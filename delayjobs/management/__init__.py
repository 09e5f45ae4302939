"""The management commands (layer 7, interfaces): ``commands/`` holds them, ``base`` what
they share (option validators, logging set-up). They act through ``delayjobs.api`` and
run the engine; they never import the admin, nor ``http`` beyond ``http.keys``.
"""
