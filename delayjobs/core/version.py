"""The package's version, defined once: the facade (``delayjobs.__version__``), the HTTP
API's OpenAPI document and the docs read it. pyproject.toml's ``version`` must match
(tests/unit/test_version.py)."""

__version__ = "0.2.0"
