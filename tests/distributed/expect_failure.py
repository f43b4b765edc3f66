#!/usr/bin/env python3
"""Runs a command that must fail: expect_failure.py [--timeout S] [--expect TEXT]... -- COMMAND...

Succeeds when COMMAND exits non-zero within S seconds (default 60) and its output (stdout and stderr)
contains every TEXT; a command that hangs is killed and counts as a failure. Standard library only.
"""
import subprocess
import sys

args = sys.argv[1:]
split = args.index("--")
options, command = args[:split], args[split + 1:]
timeout, expected = 60.0, []
i = 0
while i < len(options):
    if options[i] == "--timeout":
        timeout = float(options[i + 1])
    elif options[i] == "--expect":
        expected.append(options[i + 1])
    else:
        sys.exit(f"expect_failure.py: unknown option {options[i]}")
    i += 2
try:
    p = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
except subprocess.TimeoutExpired as e:
    print(f"FAIL: still running after {timeout} s (a hang): {' '.join(command)}")
    print((e.stdout or b"")[-3000:], (e.stderr or b"")[-3000:])
    sys.exit(1)
output = p.stdout + p.stderr
failures = []
if p.returncode == 0:
    failures.append("exit code 0, expected non-zero")
for text in expected:
    if text not in output:
        failures.append(f"output lacks {text!r}")
if failures:
    print("FAIL:", "; ".join(failures), f"\ncommand: {' '.join(command)}\noutput:\n{output[-4000:]}")
    sys.exit(1)
print(f"ok: exit code {p.returncode}, output names {expected}")
