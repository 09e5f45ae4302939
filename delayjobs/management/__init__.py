"""The management commands (interfaces): ``commands/`` holds them, ``base`` what they share
(option validators, logging set-up). They act through the public API (``delayjobs.api``,
``pauses``, ``recurring.definitions``, ``api_keys``) and run the engine; they never import
the admin or the HTTP API.
"""
