"""Child processes that live and die with their driver, and the save dir's lock.

A driver (``residual-fairseq-train``, ``-reproduce``, the fairseq-generate child of
``-evaluate``) starts fairseq in a process group of its own, so that:

- SIGTERM/SIGINT to the driver reach every child's group (:func:`forwarding_stop_signals`),
  and the driver then ends by the same signal;
- a driver killed outright takes its children with it (:func:`die_with_the_driver`:
  ``PR_SET_PDEATHSIG``);
- whatever ends the driver, no child is left running (:func:`kill_groups`).

:func:`save_dir_lock` keeps two training runs out of one save dir.
"""
import contextlib
import ctypes
import fcntl
import os
import signal
import threading
from pathlib import Path

from .errors import UserError

LOCK_NAME = ".residual-fairseq-train.lock"
# After forwarding SIGTERM/SIGINT, how long fairseq-train gets to stop before SIGKILL.
STOP_GRACE_SECONDS = 30


def die_with_the_driver():
    """``preexec_fn`` for a child: the kernel SIGKILLs it when the driver dies, even by SIGKILL."""
    driver = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the process-group forwarding still applies
        return None
    PR_SET_PDEATHSIG = 1

    def setup():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != driver:  # the driver died before prctl took effect
            os._exit(1)

    return setup


@contextlib.contextmanager
def forwarding_stop_signals(processes):
    """While the block runs, SIGTERM/SIGINT to the driver go to each child's process group;
    yields a list that receives the signal numbers received."""
    received = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def forward(signum, _frame):
        received.append(signum)
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def kill_groups(processes, signum):
    """Send ``signum`` to the process group of each child still running."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)


@contextlib.contextmanager
def save_dir_lock(save_dir):
    """Hold ``SAVE_DIR/.residual-fairseq-train.lock`` (``flock``) or refuse with one line.

    The kernel releases the lock when the last process holding it ends, however it
    ends (SIGKILL included); the fairseq-train children hold it too, so the save dir
    stays locked until they are gone. Yields the lock's file descriptor.
    """
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    path = save_dir / LOCK_NAME
    # O_NOFOLLOW: a link planted under the lock's name is refused (train's refuse_links_in_save_dir)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise UserError(f"{save_dir} is in use by another training run (pid {holder or '?'} holds {path}): "
                            "wait for it to end, or choose another --save-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)
