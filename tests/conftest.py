"""Shared test setup: import the collection from this checkout (as ansible.cfg does)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, ".collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
TESTS = os.path.join(ROOT, "tests")  # `import harness` (shared helpers such as harness.waiting) from every suite
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
