#!/usr/bin/env python3
"""readme_test: the shell commands of the README and of every guide in docs/, run as written.

Every ```sh block carries one of three tags after `sh` in its fence (the convention is written at
the top of the README):
  test              run it, block after block, in order, as one bash script (set -eo pipefail);
  gpu               run it where a GPU is (nvidia-smi lists one), else report it skipped;
  no-test: REASON   never run; the reason is required.
A command inside a runnable block whose trailing comment says `no-test: REASON` is skipped alone.
A `# writes: PATH...` line in a runnable block promises files: each must exist, non-empty, after
the block. A `# expect: REGEX` line promises a line of the block's output that the regular
expression matches. A sh block without a tag, or `no-test` without a reason, fails the test, so
every command of the documentation is either run or says why not.

The files run in the order given, in one scratch root made like a clone of the checkout (so a
guide may use what an earlier file's commands wrote): its folders are links to the repository's
(read only), its `build/` a real folder whose examples/, tests/ and bench/ are links to the build
dir under test. scripts/build.sh and scripts/install-deps.sh are stand-ins there that build and
install nothing (the build under test is already built): a missing target fails. Whatever a
command writes lands under build/ of the scratch root (fresh each run); a command that writes
anything else into the root fails the test. Every docs/*.md of the repository must be among the
files (a guide nobody runs fails), so a command anywhere in the documentation is checked.

  readme_test.py [--scratch DIR] BUILD_DIR README.md [docs/GUIDE.md ...]
"""
import os
import shlex
import re
import shutil
import subprocess
import sys
import time

FENCE = re.compile(r"^```(\S*)\s*(.*)$")


def blocks(readme):
    """(line of the fence, language, tag, [(line, text)]) for each fenced block."""
    out, cur = [], None
    with open(readme) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            m = FENCE.match(line)
            if cur is None and m:
                cur = (n, m.group(1), m.group(2).strip(), [])
            elif cur is not None and line.startswith("```"):
                out.append(cur)
                cur = None
            elif cur is not None:
                cur[3].append((n, line))
    if cur is not None:
        sys.exit(f"readme_test: {readme}:{cur[0]}: a code block that is never closed")
    return out


def commands(lines):
    """[(first line number, text)] of each command: continuation lines joined, comments and
    blank lines left out."""
    cmds, cur = [], None
    for n, text in lines:
        if cur is None:
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            cur = (n, text)
        else:
            cur = (cur[0], cur[1] + "\n" + text)
        if not text.rstrip().endswith("\\"):
            cmds.append(cur)
            cur = None
    if cur is not None:
        cmds.append(cur)
    return cmds


def has_gpu():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return r.returncode == 0 and "GPU" in r.stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


def make_root(repo, build, root):
    """A clone-like scratch root: links to the repository's entries, a fresh build/ with links to
    the built binaries, and stand-ins for the scripts that would build or install."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    for e in os.listdir(repo):
        if e in (".git", "scripts") or e.startswith("build"):
            continue
        os.symlink(os.path.join(repo, e), os.path.join(root, e))
    os.makedirs(os.path.join(root, "scripts"))
    for e in os.listdir(os.path.join(repo, "scripts")):
        if e not in ("build.sh", "install-deps.sh"):
            os.symlink(os.path.join(repo, "scripts", e), os.path.join(root, "scripts", e))
    stub = os.path.join(root, "scripts", "build.sh")
    with open(stub, "w") as f:
        f.write(f"""#!/usr/bin/env bash
# readme_test's stand-in: the build dir under test ({build}) is already built; check the targets.
build=${{FSDP_BUILD_DIR:-build}}
for t in "$@"; do
  f=$(find -L "$build/examples" "$build/tests" "$build/bench" -maxdepth 1 -name "$t" -type f 2> /dev/null | head -1)
  [ -n "$f" ] || {{ echo "readme_test: the build under test has no target $t" >&2; exit 1; }}
done
""")
    with open(os.path.join(root, "scripts", "install-deps.sh"), "w") as f:
        f.write("#!/usr/bin/env bash\n# readme_test's stand-in: the build under test has its dependencies.\n")
    for s in ("build.sh", "install-deps.sh"):
        os.chmod(os.path.join(root, "scripts", s), 0o755)
    os.makedirs(os.path.join(root, "build"))
    for d in ("examples", "tests", "bench"):
        if os.path.isdir(os.path.join(build, d)):
            os.symlink(os.path.join(build, d), os.path.join(root, "build", d))


def parse(path, name):
    """(errors, plan) of one markdown file: plan is [(line, tag, lines)] of its runnable blocks."""
    errors, plan = [], []
    for n, lang, tag, lines in blocks(path):
        if lang not in ("sh", "bash", "shell", "console"):
            continue
        if lang != "sh":
            errors.append(f"{name}:{n}: shell block fenced as '{lang}': write ```sh with a tag")
            continue
        if tag == "test" or tag == "gpu":
            plan.append((n, tag, lines))
        elif tag.startswith("no-test"):
            if not re.match(r"^no-test:\s*\S", tag):
                errors.append(f"{name}:{n}: 'no-test' without a reason: write ```sh no-test: REASON")
        else:
            errors.append(f"{name}:{n}: a sh block tagged '{tag}': expected 'test', 'gpu' or "
                          "'no-test: REASON'")
    for n, tag, lines in plan:
        for c, text in commands(lines):
            m = re.search(r"#.*\bno-test\b(:?)\s*(.*)$", text)
            if m and not (m.group(1) and m.group(2).strip()):
                errors.append(f"{name}:{c}: 'no-test' without a reason: write # no-test: REASON")
        for c, text in lines:
            m = re.match(r"^\s*#\s*expect:\s*(.*)$", text)
            if m:
                try:
                    re.compile(m.group(1).strip())
                except re.error as e:
                    errors.append(f"{name}:{c}: '# expect:' is no regular expression: {e}")
    return errors, plan


def run_block(name, n, tag, lines, root, env, log_dir, gpu):
    """Runs one block; returns (commands run, commands skipped, [failures])."""
    if tag == "gpu" and not gpu:
        print(f"skipped {name}:{n}: a GPU block, and this machine has no GPU", flush=True)
        return 0, 1, []
    script, promised, expected, ran, skipped = ["set -eo pipefail"], [], [], 0, 0
    for c, text in commands(lines):
        m = re.search(r"#.*\bno-test:\s*(.*)$", text)
        if m:
            print(f"skipped {name}:{c}: {m.group(1).strip()}", flush=True)
            skipped += 1
            continue
        script.append(f"echo {shlex.quote(f'readme_test: {name}:{c}: ' + text.splitlines()[0])} >&2")
        script.append(text)
        ran += 1
    for _, text in lines:
        m = re.match(r"^\s*#\s*writes:\s*(.+)$", text)
        if m:
            promised += m.group(1).split()
        m = re.match(r"^\s*#\s*expect:\s*(.+)$", text)
        if m:
            expected.append(m.group(1).strip())
    log = os.path.join(log_dir, f"{name.replace('/', '_')}_{n}.log")
    t = time.time()
    with open(log, "w") as out:
        r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=root, env=env, stdout=out,
                           stderr=subprocess.STDOUT)
    took = time.time() - t
    with open(log, errors="replace") as f:  # generated text is not always UTF-8
        text = f.read()
    where = [ln for ln in text.splitlines() if ln.startswith(f"readme_test: {name}:")]
    if r.returncode != 0:
        at = where[-1].split(": ", 2)[1] if where else f"{name}:{n}"
        print(f"FAIL {at}: exit {r.returncode} ({took:.0f} s); the block's output ends:")
        print("\n".join("    " + ln for ln in text.splitlines()[-30:]), flush=True)
        return ran, skipped, [at]
    failed = []
    for p in promised:
        if not os.path.isfile(os.path.join(root, p)) or not os.path.getsize(os.path.join(root, p)):
            print(f"FAIL {name}:{n}: the block promises '{p}' (# writes:), which it did not write")
            failed.append(f"{name}:{n}")
    for e in expected:
        if not any(re.search(e, ln) for ln in text.splitlines()):
            print(f"FAIL {name}:{n}: no line of the block's output matches '{e}' (# expect:); "
                  f"it ends:")
            print("\n".join("    " + ln for ln in text.splitlines()[-15:]), flush=True)
            failed.append(f"{name}:{n}")
    if not failed:
        print(f"ok {name}:{n}: {len(where)} command(s), {len(promised)} promised file(s), "
              f"{len(expected)} expected line(s), {took:.0f} s", flush=True)
    return ran, skipped, failed


def main():
    args = sys.argv[1:]
    scratch = None
    if args[:1] == ["--scratch"] and len(args) > 1:
        scratch, args = args[1], args[2:]
    if len(args) < 2:
        sys.exit("usage: readme_test.py [--scratch DIR] BUILD_DIR README.md [docs/GUIDE.md ...]")
    build = os.path.abspath(args[0])
    files = [os.path.abspath(f) for f in args[1:]]
    repo = os.path.dirname(files[0])
    root = os.path.abspath(scratch or os.path.join(build, "readme_test"))
    if not os.path.isfile(os.path.join(build, "examples", "fsdp-train")):
        sys.exit(f"readme_test: {build} has no examples/fsdp-train: build first (scripts/build.sh)")

    errors, plans = [], []
    docs = os.path.join(repo, "docs")
    for g in sorted(os.listdir(docs)) if os.path.isdir(docs) else []:
        if g.endswith(".md") and os.path.join(docs, g) not in files:
            errors.append(f"docs/{g}: a guide readme_test is not given (add it to readme_test's "
                          "list in tests/CMakeLists.txt)")
    for f in files:
        name = os.path.relpath(f, repo)
        e, plan = parse(f, name)
        errors += e
        plans.append((name, plan))
    if errors:
        print("\n".join(f"FAIL {e}" for e in errors))
        return 1

    make_root(repo, build, root)
    before = set(os.listdir(root))
    gpu = has_gpu()
    env = dict(os.environ)
    env.pop("FSDP_BUILD_DIR", None)  # the scripts' build dir is the scratch root's build/
    # As the README says for root and for few cores: mpirun's own switches, set the environment way.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_WAIT_POLICY="PASSIVE")
    log_dir = os.path.join(build, "readme_test.logs")
    shutil.rmtree(log_dir, ignore_errors=True)
    os.makedirs(log_dir)
    failed, ran, skipped = [], 0, 0
    t_all = time.time()
    for name, plan in plans:
        for n, tag, lines in plan:
            r, s, f = run_block(name, n, tag, lines, root, env, log_dir, gpu)
            ran, skipped, failed = ran + r, skipped + s, failed + f
    stray = sorted(set(os.listdir(root)) - before)
    for e in stray:
        print(f"FAIL a command wrote '{e}' into the repository root: write under build/ instead")
        failed.append(e)
    print(f"readme_test: {len(files)} file(s), {ran} command(s) run, {skipped} skipped, "
          f"{len(failed)} failure(s), {time.time() - t_all:.0f} s (logs: {log_dir})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
