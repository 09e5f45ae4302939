"""One module per command, found by Django by this path (docs/_ext reads it too)."""
