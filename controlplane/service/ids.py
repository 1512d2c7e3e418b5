"""Unpredictable identifiers (ids are never guessable, see OWASP API1)."""

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(10)}"
