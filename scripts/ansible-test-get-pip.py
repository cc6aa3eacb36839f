"""Stand-in for get-pip.py, for `ansible-test --venv --requirements` where ci-files.testing.ansible.com cannot be
reached (only PyPI can). ansible-test bootstraps pip in each virtual environment it creates by running the script
cached at ~/.ansible/test/cache/get_pip_<version>.py with pip's install arguments (e.g. `pip==24.2 --no-setuptools
--no-wheel`); scripts/gates puts this file there when it is missing. It does the same from PyPI: the stdlib's
ensurepip gives a pip, which then installs the requested packages."""
import subprocess
import sys

# In a child: ensurepip sets PIP_CONFIG_FILE=/dev/null in its own process, which would hide the machine's pip
# configuration (index, certificates) from the install below.
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet"] + args)
if "--no-setuptools" in sys.argv[1:]:  # as get-pip.py would have left it (ensurepip of 3.11 brings setuptools)
    subprocess.check_call([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "setuptools"])
