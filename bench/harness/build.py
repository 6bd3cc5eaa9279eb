"""Build sluice (cargo build --release) and find out which serve options the binary has."""

import os
import pwd
import re
import shutil
import subprocess

# serve options the benchmarks vary; a binary without one gets the variants that need it skipped
OPTIONAL_FLAGS = ("--data-path", "--chunk", "--metrics", "--busy-poll")
# --data-path values, in table order; splice-direct only where the help text names it
DATA_PATHS = ("copy", "direct", "splice")
LATER_DATA_PATHS = ("splice-direct",)
# the paths that bypass the page cache, for the cold runs
UNCACHED_DATA_PATHS = ("direct", "splice-direct")


class BuildError(Exception):
    pass


def build(repo: str, report) -> str:
    """cargo build --release in the repository; returns the binary's path.

    Under sudo the build runs as the invoking user, with that user's cargo, so target/ does
    not fill up with root-owned files."""
    binary = os.path.join(repo, "target", "release", "sluice")
    command = _cargo_command()
    if command is None:
        raise BuildError("cargo not found (install Rust with rustup), or build sluice yourself "
                         "and rerun with --no-build")
    report.say(f"building sluice: {' '.join(command)} (in {repo}) ...")
    proc = subprocess.run(command, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise BuildError("cargo build --release failed; rerun with --no-build to measure the "
                         "binary already in target/release:\n" + proc.stdout[-3000:])
    if not os.access(binary, os.X_OK):
        raise BuildError(f"{binary} missing after the build")
    return binary


def _cargo_command():
    sudo_user = os.environ.get("SUDO_USER")
    if os.geteuid() == 0 and sudo_user and sudo_user != "root":
        home = pwd.getpwnam(sudo_user).pw_dir
        cargo = os.path.join(home, ".cargo", "bin", "cargo")
        if not os.access(cargo, os.X_OK):
            cargo = shutil.which("cargo")
        if cargo:
            path = f"{os.path.dirname(cargo)}:/usr/local/bin:/usr/bin:/bin"
            return ["sudo", "-u", sudo_user, "-H", "env", f"PATH={path}",
                    cargo, "build", "--release"]
    cargo = shutil.which("cargo") or _home_cargo()
    return [cargo, "build", "--release"] if cargo else None


def _home_cargo():
    cargo = os.path.expanduser("~/.cargo/bin/cargo")
    return cargo if os.access(cargo, os.X_OK) else None


def features(binary: str) -> set:
    """The OPTIONAL_FLAGS that `sluice serve --help` defines (an option line starts with the
    flag; an example further down may name a flag that the parser does not take yet)."""
    text = _serve_help(binary)
    return {flag for flag in OPTIONAL_FLAGS if _defines(text, flag)}


def _defines(text: str, flag: str) -> bool:
    return re.search(rf"^\s*(?:-\w,\s*)?{re.escape(flag)}(?:[\s=<]|$)", text, re.MULTILINE) is not None


def data_paths(binary: str) -> tuple:
    """The --data-path values to measure: () without the option. A value the binary turns
    down after all makes that server fail to start, and the experiment skips it."""
    text = _serve_help(binary)
    if not _defines(text, "--data-path"):
        return ()
    return DATA_PATHS + tuple(p for p in LATER_DATA_PATHS if p in text)


def defaults(binary: str) -> dict:
    """{flag: default} for the OPTIONAL_FLAGS whose help entry says 'Default: X' (the chunk
    size and data path sluice uses when the harness does not set them), e.g.
    {'--data-path': 'splice', '--chunk': '1M'}."""
    text = _serve_help(binary)
    out = {}
    for flag in OPTIONAL_FLAGS:
        # the flag's entry runs from its line to the next option line
        entry = re.search(rf"^\s*(?:-\w,\s*)?{re.escape(flag)}(?:[\s=<]|$).*?(?=^\s*-|\Z)",
                          text, re.MULTILINE | re.DOTALL)
        found = entry and re.search(r"Default:\s*([^\s.,;]+)", entry.group(0))
        if found:
            out[flag] = found.group(1)
    return out


def _serve_help(binary: str) -> str:
    try:
        return subprocess.run([binary, "serve", "--help"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def git_description(repo: str) -> str:
    # safe.directory: under sudo, root reads a work tree that another user owns.
    git = ["git", "-c", "safe.directory=*", "-C", repo]
    try:
        commit = subprocess.run(git + ["rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if not commit:
        return "unknown"
    return commit + (" (with uncommitted changes)" if dirty else "")
