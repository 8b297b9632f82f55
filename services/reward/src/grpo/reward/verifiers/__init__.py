"""Verifiers: small pure functions that judge one completion (math, format, language, ...)."""
