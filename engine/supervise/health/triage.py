"""Where each rank of a stuck pipeline is, read from the Python stacks it wrote (faulthandler's dump), and
the verdict that names the odd rank first: "rank 1 is in `time.sleep(60)` (train.py:33); rank 0 waits in
all_reduce". Pure text work: the stacks come in as the text each rank's log gained."""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from pathlib import Path

HEADER = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\s*$")
FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
# torch.distributed's calls that wait for every rank (the innermost of them names what a rank waits in)
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list", "send", "recv",
    "isend", "irecv", "batch_isend_irecv", "init_process_group", "new_group", "destroy_process_group"})
MAIN_OUTERMOST = ("<module>", "_run_module_as_main")  # a process's main thread starts in one of these
LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python", "<frozen ")
ENGINE = str(Path(__file__).resolve().parent.parent)  # torchherd's own engine: its frames are no training code


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str


@dataclass(frozen=True)
class Place:
    """Where one rank's training thread is: in a collective (`waiting`) or in code of its own."""

    waiting: bool
    text: str  # "all_reduce", or "`time.sleep(60)` (train.py:33)"


def threads_of(text: str) -> list[list[Frame]]:
    """Every thread's frames (innermost first) in a faulthandler dump (several processes' dumps may follow
    one another: a script's worker and the script itself write to the same log)."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if HEADER.match(line):
            threads.append([])
        elif threads and (m := FRAME.match(line)):
            threads[-1].append(Frame(m["file"], int(m["line"]), m["func"]))
    return [t for t in threads if t]


def training_thread(threads: list[list[Frame]]) -> list[Frame] | None:
    """The main thread of the user's code if the dump has one (a script's), else torchherd's worker's."""
    mains = [t for t in threads if t[-1].func in MAIN_OUTERMOST]
    own = [t for t in mains if not any(f.file.startswith(ENGINE) for f in t)]
    found = own or mains
    return found[-1] if found else None


def place_of(frames: list[Frame]) -> Place:
    """Where a training thread is: the collective it waits in, else the innermost line of training code."""
    for f in frames:
        if f.func in COLLECTIVES and "/torch/distributed/" in f.file:
            return Place(True, f.func)
        if f.func in ("backward", "_engine_run_backward") and "/torch/" in f.file:
            return Place(True, "backward (DDP's gradient all_reduce)")
    for f in frames:
        if not f.file.startswith(ENGINE) and not any(part in f.file for part in LIBRARY):
            code = linecache.getline(f.file, f.line).strip()
            return Place(False, f"`{code}` ({Path(f.file).name}:{f.line})" if code else
                         f"{f.func} ({Path(f.file).name}:{f.line})")
    f = frames[0]
    return Place(False, f"{f.func} ({Path(f.file).name}:{f.line})")


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def verdict(places: list[Place | None]) -> str:
    """One line, the odd rank first: the ranks not in a collective (or, if all or none are, the fewest at one
    place), then the rest, then the ranks whose stacks were not found."""
    groups: dict[Place, list[int]] = {}
    for rank, place in enumerate(places):
        if place is not None:
            groups.setdefault(place, []).append(rank)
    order = sorted(groups, key=lambda p: (p.waiting, len(groups[p]), groups[p][0]))
    if len(order) == 1 and len(places) > 1 and None not in places:
        p = order[0]
        return f"every rank {'waits in' if p.waiting else 'is in'} {p.text}"
    parts = [f"{_ranks(groups[p])} {'wait' if len(groups[p]) > 1 else 'waits'} in {p.text}" if p.waiting
             else f"{_ranks(groups[p])} {'are' if len(groups[p]) > 1 else 'is'} in {p.text}" for p in order]
    missing = [r for r, p in enumerate(places) if p is None]
    if missing:
        parts.append(f"{_ranks(missing)}: no stack found")
    return "; ".join(parts)


def read_places(dumps: list[str]) -> list[Place | None]:
    """Each rank's place from the text its log gained since the stacks were asked for."""
    out: list[Place | None] = []
    for text in dumps:
        thread = training_thread(threads_of(text))
        out.append(place_of(thread) if thread is not None else None)
    return out
