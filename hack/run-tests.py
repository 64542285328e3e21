#!/usr/bin/env python3
"""Runs the workspace's tests in parallel lanes, one test per process.

`cargo test` runs one test binary after another. Most of the suite's time is spent waiting on
real processes (Valkey failovers, an API server starting, a kubelet pulling nothing), so the
suite runs `--jobs` tests at once (default 2, the same two at a time libtest already runs within
one binary), longest first, each in its own process (`<binary> --exact <test>`). Every test is
listed, so nothing is skipped; a test's output is printed when it ends, whole, and again at the
end if it failed.

Durations are kept in `target/test-durations.tsv` to order the next run; without them,
`hack/test-durations.tsv` (committed) orders it, and without either the slow tiers (`e2e_*`,
`cluster_*` binaries) go first.

`--meanwhile CMD` starts CMD (a shell command: the Go-built tools) at once, beside the Rust
build; the tests that need what it makes (the `e2e_*` binaries and testenv's own, which start a
control plane) wait for it, while every other test runs meanwhile. A failing CMD fails those
tests, said once. `--background CMD` starts CMD beside everything and waits for nobody (a cache
a test would otherwise fill itself, such as the previous release's operator).

Usage: hack/run-tests.py [--jobs N] [--meanwhile CMD] [--background CMD] -- <cargo test args>
"""

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

DURATIONS = "test-durations.tsv"
COMMITTED_DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), DURATIONS)
SLOW_TIERS = ("e2e_", "cluster_")


def needs_tools(binary):
    """Whether a binary's tests need the control plane's tools (what `--meanwhile` builds)."""
    return binary.name.startswith("e2e_") or os.path.basename(binary.package_dir) == "testenv"


class Meanwhile:
    """A shell command started at once; `wait` blocks until it ended and says whether it passed."""

    def __init__(self, command):
        self.command = command
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, shell=True) if command else None
        self.lock = threading.Lock()
        self.outcome = None

    def wait(self):
        with self.lock:
            if self.outcome is None:
                code = self.process.wait() if self.process else 0
                self.outcome = code == 0
                if self.process:
                    seconds = time.monotonic() - self.started
                    verdict = "done" if self.outcome else f"FAILED (exit {code})"
                    print(f"run-tests: `{self.command}` {verdict} after {seconds:.0f}s", flush=True)
            return self.outcome


@dataclass
class Binary:
    name: str  # the target's name: `e2e_heal`, `valkey_operator` (lib), ...
    kind: str  # lib, bin, test
    executable: str
    package_dir: str


@dataclass(order=True)
class Test:
    order: tuple
    binary: Binary = field(compare=False)
    name: str = field(compare=False)

    @property
    def key(self) -> str:
        return f"{self.binary.kind}:{self.binary.name}::{self.name}"


def build(cargo_args):
    """Builds every test binary; returns them, as cargo reports them."""
    command = ["cargo", "test", *cargo_args, "--no-run", "--message-format=json-render-diagnostics"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    binaries = []
    for line in process.stdout:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            sys.stdout.write(line)
            continue
        if message.get("reason") != "compiler-artifact":
            continue
        if not message.get("profile", {}).get("test") or not message.get("executable"):
            continue
        target = message["target"]
        binaries.append(
            Binary(
                name=target["name"],
                kind=target["kind"][0],
                executable=message["executable"],
                package_dir=os.path.dirname(message["manifest_path"]),
            )
        )
    if process.wait() != 0:
        sys.exit(f"run-tests: `{' '.join(command)}` failed")
    return binaries


def listed(binary):
    """The tests a binary holds (`--list`), benchmarks left out."""
    out = subprocess.run(
        [binary.executable, "--list", "--format", "terse"],
        cwd=binary.package_dir,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line[: -len(": test")] for line in out.splitlines() if line.endswith(": test")]


def load_durations(path):
    durations = {}
    try:
        with open(path) as file:
            for line in file:
                key, _, seconds = line.rstrip("\n").rpartition("\t")
                durations[key] = float(seconds)
    except (FileNotFoundError, ValueError):
        pass
    return durations


def save_durations(path, durations):
    with open(path + ".partial", "w") as file:
        for key, seconds in sorted(durations.items()):
            file.write(f"{key}\t{seconds:.2f}\n")
    os.replace(path + ".partial", path)


def order(binary, name, durations):
    """The tests that need no tools first (they run while the tools are built), then longest
    first: the last run's duration, else the slow tiers before the rest."""
    waits = 1 if needs_tools(binary) else 0
    known = durations.get(f"{binary.kind}:{binary.name}::{name}")
    if known is not None:
        return (waits, 0, -known)
    slow = binary.name.startswith(SLOW_TIERS)
    return (waits, 1, 0 if slow else 1, binary.name, name)


def environment(binary):
    """What `cargo test` gives a test process: its package's manifest dir."""
    env = dict(os.environ)
    env["CARGO_MANIFEST_DIR"] = binary.package_dir
    return env


class Runner:
    def __init__(self, jobs, tools):
        self.jobs = jobs
        self.tools = tools
        self.lock = threading.Lock()
        self.children = set()
        self.failed = []
        self.durations = {}
        self.passed = 0
        self.stopping = False

    def run_one(self, test):
        if needs_tools(test.binary) and not self.tools.wait():
            with self.lock:
                label = f"{test.binary.name}::{test.name}"
                self.failed.append((label, f"not run: `{self.tools.command}` failed"))
                print(f"FAILED    0.0s  {label} (its tools were not built)", flush=True)
            return
        started = time.monotonic()
        child = subprocess.Popen(
            [test.binary.executable, "--exact", test.name, "--test-threads=1"],
            cwd=test.binary.package_dir,
            env=environment(test.binary),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        with self.lock:
            self.children.add(child)
        output, _ = child.communicate()
        seconds = time.monotonic() - started
        with self.lock:
            self.children.discard(child)
            self.durations[test.key] = seconds
            label = f"{test.binary.name}::{test.name}"
            # `--exact` that matches nothing passes: a test that cannot fail. It must have run.
            ran = "1 passed" in output or "1 ignored" in output
            if child.returncode == 0 and not ran:
                output += "\nrun-tests: the binary ran no test by this name\n"
            if child.returncode == 0 and ran:
                self.passed += 1
                print(f"ok     {seconds:7.1f}s  {label}", flush=True)
            else:
                self.failed.append((label, output))
                print(f"FAILED {seconds:7.1f}s  {label}\n{output}", flush=True)

    def worker(self, tests):
        while not self.stopping:
            try:
                test = tests.get_nowait()
            except queue.Empty:
                return
            self.run_one(test)

    def run(self, tests):
        pending = queue.Queue()
        for test in sorted(tests):
            pending.put(test)
        workers = [threading.Thread(target=self.worker, args=(pending,)) for _ in range(self.jobs)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def stop(self):
        """Stops every running test with SIGTERM to its process group (its drop guards run)."""
        self.stopping = True
        with self.lock:
            for child in self.children:
                try:
                    os.killpg(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("TEST_JOBS", "2")))
    parser.add_argument("--meanwhile", default="", help="builds what the e2e tests need")
    parser.add_argument("--background", default="", help="runs beside, waited for by nobody")
    parser.add_argument("cargo_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cargo_args = [a for a in args.cargo_args if a != "--"]
    if args.jobs < 1:
        sys.exit("run-tests: --jobs must be at least 1")

    started = time.monotonic()
    tools = Meanwhile(args.meanwhile)
    background = Meanwhile(args.background)
    binaries = build(cargo_args)
    print(f"run-tests: the test binaries built in {time.monotonic() - started:.0f}s", flush=True)
    target_dir = os.environ.get("CARGO_TARGET_DIR", "target")
    durations_path = os.path.join(target_dir, DURATIONS)
    durations = load_durations(COMMITTED_DURATIONS)
    durations.update(load_durations(durations_path))
    tests = [
        Test(order(binary, name, durations), binary, name)
        for binary in binaries
        for name in listed(binary)
    ]
    print(f"run-tests: {len(tests)} tests in {len(binaries)} binaries, {args.jobs} at a time", flush=True)

    runner = Runner(args.jobs, tools)
    signal.signal(signal.SIGTERM, lambda *_: runner.stop())
    try:
        runner.run(tests)
    except KeyboardInterrupt:
        runner.stop()
        raise
    durations.update(runner.durations)
    save_durations(durations_path, durations)
    tools.wait()
    if background.process and background.process.poll() is None:
        print(f"run-tests: waiting for `{background.command}`", flush=True)
    background.wait()

    longest = sorted(runner.durations.items(), key=lambda item: -item[1])[:10]
    print("\nrun-tests: the longest tests:")
    for key, seconds in longest:
        print(f"  {seconds:7.1f}s  {key}")
    for label, output in runner.failed:
        print(f"\n---- {label} ----\n{output}")
    elapsed = time.monotonic() - started
    print(
        f"\nrun-tests: {runner.passed} passed, {len(runner.failed)} failed"
        f" of {len(tests)} in {elapsed:.0f}s ({args.jobs} at a time)"
    )
    if runner.failed:
        print("failed: " + ", ".join(label for label, _ in runner.failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
