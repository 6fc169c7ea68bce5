"""Helpers shared by the tests of several targets (import as ``helpers.<module>``)."""
