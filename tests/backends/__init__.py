"""Tests of dpproxy.backends: the contract both engines keep, and each engine's own guarantees."""
