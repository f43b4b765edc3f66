#!/usr/bin/env python3
"""Runs a command with its own Open MPI session directory: mpi_session.py COMMAND...

Every mpiexec of a user keeps its session files under one shared directory, $TMPDIR/ompi.<host>.<uid>
(Open MPI 4.1), which the last mpiexec to finish removes. An mpiexec that creates it at that moment finds
it gone after mkdir said "File exists" and stops with "A call to mkdir was unable to create the desired
directory" (open-mpi/ompi#8510). scripts/test.sh runs two builds' tests side by side, each with several
at once, so each MPI test runs under a fresh private directory: orte_tmpdir_base for Open MPI and TMPDIR
for PMIx and the ranks' own temporary files. The directory is short (under /tmp), because PMIx puts its
Unix sockets there and a socket's path is limited to 107 bytes. It is removed when the command ends, and
the command's exit code is this script's. Standard library only.
"""
import os
import signal
import subprocess
import sys
import tempfile

if len(sys.argv) < 2:
    sys.exit(__doc__)
base = os.environ.get("TMPDIR", "/tmp")
if len(base) > 40:  # a long TMPDIR would leave too little of a socket path for PMIx
    base = "/tmp"
with tempfile.TemporaryDirectory(prefix="remat-mpi.", dir=base) as session:
    env = dict(os.environ, TMPDIR=session, OMPI_MCA_orte_tmpdir_base=session)
    child = subprocess.Popen(sys.argv[1:], env=env)

    def forward(signum, _frame):
        child.send_signal(signum)

    # ctest ends a test that outlives its timeout with a signal: pass it on, then clean up.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    status = child.wait()
sys.exit(status if status >= 0 else 128 - status)
