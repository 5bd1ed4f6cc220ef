"""Bearer tokens with scopes (read < operate < admin): ``models`` (the tokens table),
``service`` (create, authenticate, authorize), ``schemas`` and ``routes`` (/tokens)."""
