"""Start a long host command detached, as its user: the host scripts' one job runner.

Stdlib only (Python >= 3.8), uploaded beside the scripts that import it by bare name
(weights_fetch.py, sglang_bench.py). The job runs in its own session (a deploy's
disconnect, a SIGHUP or the caller's process group ending leave it running), with
stdin from /dev/null, its output where the caller says, and, when ``user`` is given,
as that user (root calls this; the group, the supplementary groups, then the uid are
dropped before exec). Its pid goes to ``<run_dir>/<pid_name>``; its exit status is the
job's own to write to ``<run_dir>/rc``, the same run directory contract as the shell
jobs of roles/base/progress.py (docs/architecture.md, "Host jobs").
"""

import os
import pwd
import subprocess


def drop_to(user):
    """A ``preexec_fn`` that makes the child ``user`` (group, groups, then uid)."""
    entry = pwd.getpwnam(user)

    def drop():
        os.setgid(entry.pw_gid)
        os.initgroups(user, entry.pw_gid)
        os.setuid(entry.pw_uid)

    return drop


def detach(argv, run_dir, pid_name="pid", user=None, env=None, cwd=None, out=os.devnull):
    """Start ``argv`` detached (own session, no controlling terminal, stdin /dev/null,
    stdout and stderr to ``out``), as ``user`` when given; record and return its pid."""
    with open(os.devnull, "rb") as null_in, open(out, "ab") as sink:
        proc = subprocess.Popen(argv, stdin=null_in, stdout=sink, stderr=sink, env=env,
                                cwd=cwd, start_new_session=True, close_fds=True,
                                preexec_fn=drop_to(user) if user else None)
    tmp = os.path.join(run_dir, pid_name + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(proc.pid))
    os.replace(tmp, os.path.join(run_dir, pid_name))
    return proc.pid
