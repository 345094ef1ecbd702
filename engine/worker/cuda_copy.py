"""The hand-off on CUDA: training waits for one on-device copy; the trip to shared memory runs beside it.

`CudaCopy.start` copies the weights into a device staging buffer (allocated once) on the current stream;
a side stream that waits for that copy moves the buffer into the slot, whose pages are registered with
CUDA (cudaHostRegister) so the move is an asynchronous DMA, and an event recorded after it says when it landed.

Without staging (`validation.handoff_staging = false`, for a full GPU) the weights go straight from the live
tensors into the page-locked slot on the current stream: no extra device memory, but the kernels training
queues next wait for the copy over the bus. If CUDA refuses to page-lock the slots, the user is told once and
the copy goes to pageable memory: with staging, the publisher thread makes that blocking copy itself, off the
training thread; without, training waits for it, as every hand-off did before.
"""
from __future__ import annotations

import torch

from .copy_engine import DIRECT, LANDED, STAGED, Copy

REGISTER_DEFAULT = 0  # cudaHostRegisterDefault: with unified addressing, pinned for every context and mapped


class EventCopy:
    """An asynchronous copy; `event` was recorded after it on the stream that runs it."""

    def __init__(self, event: torch.cuda.Event, keep: tuple[torch.Tensor, ...]):
        self.event = event
        self.keep = keep  # the buffers the copy reads and writes, alive at least until it has landed

    def done(self) -> bool:
        return self.event.query()

    def wait(self) -> None:
        self.event.synchronize()  # a blocking-sync event: the waiting thread sleeps, the GIL released


class PageableCopy:
    """Staged weights bound for pageable memory: `wait` runs the blocking copy, so whoever calls it waits."""

    def __init__(self, engine: CudaCopy, slot: int):
        self.engine, self.slot = engine, slot
        self.landed = False

    def done(self) -> bool:
        return self.landed

    def wait(self) -> None:
        e = self.engine
        with torch.cuda.device(e.device), torch.cuda.stream(e.side):
            e.side.wait_event(e.staged)
            assert e.staging is not None, "a pageable copy is a staged one"
            e.slots[self.slot].copy_(e.staging)  # to pageable memory: returns once the bytes are there
        self.landed = True


def page_lock(buf: torch.Tensor) -> str | None:
    """Register `buf`'s host pages with CUDA so device-to-host copies into it are asynchronous DMA; None when
    done, else CUDA's reason for refusing."""
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(buf.data_ptr(), buf.numel() * buf.element_size(), REGISTER_DEFAULT)
    if int(err) == 0:
        return None
    return f"{cudart.cudaGetErrorString(err)} (CUDA error {int(err)})"


def page_unlock(buf: torch.Tensor) -> str | None:
    """Undo `page_lock`; None when done, else CUDA's reason."""
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostUnregister(buf.data_ptr())
    return None if int(err) == 0 else f"{cudart.cudaGetErrorString(err)} (CUDA error {int(err)})"


def forget_cuda_error(device: torch.device) -> None:
    """Clear the error a refused cudaHostRegister leaves as this thread's last CUDA error: torch reads that
    after each kernel launch and would blame the next kernel of training for it."""
    try:
        torch.empty(1, device=device).fill_(1.0)  # a kernel launch, so torch reads (and clears) the last error
    except RuntimeError:
        pass


class CudaCopy:
    """The copy engine for weights that all live on one CUDA device (see the module docstring)."""

    def __init__(self, tensors: list[torch.Tensor], slots: list[torch.Tensor], views: list[list[torch.Tensor]],
                 staging: bool):
        self.tensors, self.slots, self.views = tensors, slots, views
        self.device = tensors[0].device
        self.name = STAGED if staging else DIRECT
        self.notices: list[str] = []
        with torch.cuda.device(self.device):
            self.pinned = self._page_lock_all()
            self.side = torch.cuda.Stream(self.device)
            self.landed = torch.cuda.Event(blocking=True)  # one is enough: never two copies in flight
            self.staged = torch.cuda.Event()  # the staging copy is over (pageable path)
            self.staging: torch.Tensor | None = None
            self.staging_views: list[torch.Tensor] = []
            if staging:
                self.staging = torch.empty(slots[0].numel(), dtype=torch.uint8, device=self.device)
                # Read on the side stream: if it is ever freed, the allocator must wait for that stream too.
                self.staging.record_stream(self.side)
                self.staging_views = [self.staging[off:off + n].view(t.dtype).view(t.shape)
                                      for (off, n), t in zip(_spans(slots[0], views[0]), tensors)]
        self.staging_bytes = self.staging.numel() if self.staging is not None else 0

    def _page_lock_all(self) -> list[torch.Tensor]:
        """Page-lock every slot, or none: the slots pinned (all of them), or [] after one notice saying why not."""
        done: list[torch.Tensor] = []
        for buf in self.slots:
            why = page_lock(buf)
            if why is None:
                done.append(buf)
                continue
            forget_cuda_error(self.device)
            for pinned in done:
                page_unlock(pinned)
            self.notices.append(
                f"the snapshot slots could not be page-locked for CUDA ({why}): each hand-off copies to pageable "
                f"memory, at pageable speed" + ("" if self.name == STAGED else ", and training waits for it"))
            return []
        return done

    def start(self, slot: int) -> Copy:
        with torch.cuda.device(self.device):
            main = torch.cuda.current_stream(self.device)
            if self.staging is None:
                return self._direct(slot, main)
            torch._foreach_copy_(self.staging_views, self.tensors)  # on the current stream: all training waits for
            if not self.pinned:
                self.staged.record(main)
                return PageableCopy(self, slot)
            self.side.wait_stream(main)  # the side stream reads the staging buffer only once it is written
            with torch.cuda.stream(self.side):
                self.slots[slot].copy_(self.staging, non_blocking=True)
            self.landed.record(self.side)
            return EventCopy(self.landed, (self.staging, self.slots[slot]))

    def _direct(self, slot: int, main: torch.cuda.Stream) -> Copy:
        """No staging: copy the live weights on the current stream, so the optimizer's next kernels run after it."""
        if not self.pinned:
            for view, t in zip(self.views[slot], self.tensors):
                view.copy_(t)
            return LANDED
        for view, t in zip(self.views[slot], self.tensors):
            view.copy_(t, non_blocking=True)
        self.landed.record(main)
        return EventCopy(self.landed, (self.slots[slot], *self.tensors))

    def close(self) -> None:
        with torch.cuda.device(self.device):
            for buf in self.pinned:
                if page_unlock(buf) is not None:
                    forget_cuda_error(self.device)
        self.pinned = []
        self.staging = None
        self.staging_views = []


def _spans(slot: torch.Tensor, views: list[torch.Tensor]) -> list[tuple[int, int]]:
    """(byte offset, byte count) of each typed view within its slot buffer."""
    base = slot.data_ptr()
    return [(v.data_ptr() - base, v.numel() * v.element_size()) for v in views]
