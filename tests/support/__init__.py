"""Helpers shared by the test tiers, imported one way: `from tests.support.<module> import <name>`.

Fixtures stay in the conftest.py files; the processes are started by grpo.local's launcher.
"""
