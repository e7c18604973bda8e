"""Peak memory of one measurement, on CPU or CUDA.

CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` is exact
per measurement. CPU has no allocator statistics, so the peak resident set size is
used: Linux's high-water mark (VmHWM) is reset to the current RSS by writing 5 to
``/proc/self/clear_refs``. RSS also depends on what the allocator kept from earlier
work in the same process, which is why the speed benchmark runs every measurement in
a fresh child process, with glibc's mmap threshold fixed at 64 KiB (CPU_CHILD_ENV):
by default glibc raises that threshold as memory is freed and then serves tensors
from its heap, whose retained, fragmented pages made the same model's peak RSS
differ by ~100 MiB with nothing but the order of allocations changed (Post-LN
1188 vs ResiDual 1288 MiB at iwslt_de_en 6+6 layers; 929 vs 933 MiB with the
threshold fixed, where freed tensors go back to the OS at once). Library code paged in on first use (``RssFile``) is not
memory the model uses, so its growth is subtracted; PyTorch's own one-time buffers
(thread pools, kernel caches: ~100 MiB here) are anonymous memory and stay in.
"""
import torch

# Environment of a CPU measurement process (read by glibc at process start).
CPU_CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}


def _proc_status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


class PeakMemory:
    """``start()`` sets the baseline; ``peak_mib()`` is the growth of the peak above it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.method = None
        self._baseline = 0
        self._file_baseline = 0

    def start(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device)
            self.method = "torch.cuda.max_memory_allocated"
            return
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
        except OSError as err:
            raise RuntimeError(f"cannot reset the peak RSS (/proc/self/clear_refs): {err}") from err
        self._baseline = _proc_status_kib("VmRSS") * 1024
        self._file_baseline = _proc_status_kib("RssFile") * 1024
        self.method = "peak RSS growth (VmHWM after clear_refs, less RssFile growth) in a fresh process"

    def peak_mib(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            paged_in = max(0, _proc_status_kib("RssFile") * 1024 - self._file_baseline)
            peak = _proc_status_kib("VmHWM") * 1024 - paged_in
        return (peak - self._baseline) / 2**20
