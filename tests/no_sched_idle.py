"""Run a command where sched_setscheduler fails with EPERM, as a container's seccomp profile may
make it: `python tests/no_sched_idle.py PROGRAM ARGS...` installs a seccomp filter (inherited across
exec) and execs PROGRAM. x86_64 only; elsewhere, or where no filter can be installed, it exits 77
(the caller skips)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
AUDIT_ARCH_X86_64 = 0xC000003E
NR_SCHED_SETSCHEDULER = 144  # x86_64
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
LD_ABS_W, JEQ_K, RET_K = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K


def _filter() -> bytes:
    prog = [
        (LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (JEQ_K, 0, 3, AUDIT_ARCH_X86_64),  # another ABI: allow
        (LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
        (JEQ_K, 0, 1, NR_SCHED_SETSCHEDULER),
        (RET_K, 0, 0, RET_ERRNO | errno.EPERM),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def main() -> None:
    if platform.machine() != "x86_64":
        sys.exit(77)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    code = _filter()
    insns = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("@HP", len(code) // 8, ctypes.addressof(insns))  # struct sock_fprog, native alignment
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fbuf), 0, 0) != 0:
        print(f"seccomp: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        sys.exit(77)  # no filter here: the caller skips
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
