"""Training: small learned pieces on top of a frozen target (prompt tokens, ...)."""
