"""pytest imports test files by basename (rootdir, no packages): two test files with one name stop the whole run
at collection, so every test file of every suite has a name of its own."""
import collections
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITES = ["tests", os.path.join("trainer", "tests")]


def test_every_test_file_name_is_unique_across_the_suites():
    seen = collections.defaultdict(list)
    for suite in SUITES:
        for folder, _dirs, files in os.walk(os.path.join(ROOT, suite)):
            for name in files:
                if name.startswith("test_") and name.endswith(".py"):
                    seen[name].append(os.path.relpath(os.path.join(folder, name), ROOT))
    twins = dict((name, paths) for name, paths in seen.items() if len(paths) > 1)
    assert not twins, twins
