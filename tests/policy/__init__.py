"""Tests of dpproxy.policy, one module per part of the package."""
