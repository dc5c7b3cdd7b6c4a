"""What the tests against PyTorch and transformers share (hf_interop_ref_test, families_ref_test):
they run under FSDP_TORCH_PYTHON (bench/setup_torch_ref.sh makes one) when it is set, else under
this interpreter, and skip, printing "skipped: ..." and exiting 0, where torch does not import
(CI does not install PyTorch)."""
import os
import subprocess
import sys


def skip(why):
    print(f"skipped: {why}")
    sys.exit(0)


def failer(name):
    """fail(why) for the test `name`: prints its FAIL line and exits 1."""
    def fail(why):
        print(f"{name}: FAIL: {why}")
        sys.exit(1)
    return fail


def under_torch_python(script, var="FSDP_TORCH_PYTHON"):
    """Re-runs `script` under the interpreter $var names (FSDP_TORCH_PYTHON; dpo_ref_test's
    FSDP_TRL_PYTHON) when that is set and is not this interpreter (a venv's python is a link to its
    base interpreter: the paths are compared, not their targets)."""
    want = os.environ.get(var)
    if want and os.path.abspath(want) != os.path.abspath(sys.executable) and not os.environ.get("FSDP_TORCH_REEXEC"):
        if not os.access(want, os.X_OK):
            skip(f"{var}={want} is not an executable interpreter")
        os.environ["FSDP_TORCH_REEXEC"] = "1"
        os.execv(want, [want, os.path.abspath(script)] + sys.argv[1:])


class Checks:
    """check(ok, what) and run(*args) of a test `name`: a failed check, or a command that exits
    non-zero (its stderr's tail), prints the FAIL line and exits 1; `passed` counts the checks."""
    def __init__(self, name, env):
        self.fail = failer(name)
        self.env = env
        self.passed = 0

    def check(self, ok, what):
        if not ok:
            self.fail(what)
        self.passed += 1

    def run(self, *args):
        p = subprocess.run(list(args), capture_output=True, text=True, env=self.env)
        if p.returncode:
            self.fail(f"{' '.join(args[:3])} ...: {(p.stderr or p.stdout).strip()[-800:]}")
        return p.stdout
