"""The seccomp filter every execution runs under, compiled here with libseccomp (`pyseccomp`) and
installed by the zygote's child as a raw BPF program (the sandboxed interpreter cannot import
`pyseccomp`: it sees the standard library only).

Default allow, then deny what reaches outside the sandbox or defeats its other layers. Denials
return an errno (EACCES for sockets, EPERM for the rest) rather than killing, so ordinary code
that merely probes (e.g. `socket.getaddrinfo`) fails like on a machine without a network and the
result still says "violation".
"""

from __future__ import annotations

import errno
import tempfile

AF_UNIX = 1
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80)

# setsid/setpgid: a process that leaves its group escapes the wall-time killpg. The rest: kernel
# attack surface, other processes' memory, namespaces and mounts, or ways around the other layers.
DENIED = (
    "setsid setpgid ptrace process_vm_readv process_vm_writev pidfd_getfd kcmp bpf perf_event_open "
    "userfaultfd io_uring_setup io_uring_enter io_uring_register keyctl add_key request_key mount "
    "umount2 pivot_root chroot unshare setns fsopen fsconfig fsmount fspick move_mount open_tree "
    "mount_setattr open_by_handle_at name_to_handle_at kexec_load kexec_file_load init_module "
    "finit_module delete_module reboot swapon swapoff acct syslog quotactl lookup_dcookie fanotify_init "
    "personality vhangup iopl ioperm modify_ldt"
).split()


class SeccompUnavailable(RuntimeError):
    """pyseccomp or libseccomp is missing; the message says how to install them."""


def build_filter() -> bytes:
    """The BPF program (an array of `struct sock_filter`, native byte order)."""
    try:
        import pyseccomp as seccomp  # type: ignore[import-untyped]
    except (ImportError, RuntimeError) as exc:  # RuntimeError: pyseccomp found no libseccomp
        raise SeccompUnavailable(
            f"seccomp bindings are missing ({exc}): pip install pyseccomp (and apt-get install libseccomp2)"
        ) from exc

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    rules.add_rule(seccomp.ERRNO(errno.EACCES), "socket", seccomp.Arg(0, seccomp.NE, AF_UNIX))
    for name in DENIED:
        try:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except OSError:
            pass  # a syscall this architecture does not have (iopl on arm64, ...)
    for flag in CLONE_NAMESPACE_FLAGS:
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory, out of a filter's reach: make libc fall back to clone.
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as handle:
        rules.export_bpf(handle)
        handle.seek(0)
        return handle.read()
