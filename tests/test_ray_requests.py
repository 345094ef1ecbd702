"""Requests on a Ray cluster, whose own accounting is the ledger: `gpus_per_rank` as Ray's num_gpus=N on one
node, `gpu_memory` as a fraction of a GPU (num_gpus=0.25), and what a cluster can never grant refused up
front. The pool's logic here; tests/ray/test_ray_gpu_gang.py runs them on a real cluster."""
from __future__ import annotations

from torchherd.engine.config.load import parse_config
from torchherd.engine.config.schema import DevicesConfig
from torchherd.engine.hardware.grants import Request, request_of
from torchherd.engine.preflight.plan import gang_problems
from torchherd.engine.launch.ray.placement import cluster_inventory, plan_cluster_slots, read_nodes
from torchherd.engine.supervise.scheduler import Scheduler

NODES = [  # a head without GPUs and two nodes of 2 GPUs each, as ray.nodes() says it
    {"NodeID": "aa" * 14, "Alive": True, "NodeManagerHostname": "head", "Resources": {"CPU": 4.0}},
    {"NodeID": "bb" * 14, "Alive": True, "NodeManagerHostname": "gpu1", "Resources": {"CPU": 2.0, "GPU": 2.0}},
    {"NodeID": "cc" * 14, "Alive": True, "NodeManagerHostname": "gpu2", "Resources": {"CPU": 2.0, "GPU": 2.0}},
]
RAY = {"cluster": {"backend": "ray", "address": "10.0.0.5:6379"}}


def gpu_slots():
    slots, problems = plan_cluster_slots(DevicesConfig(placement="auto"), cluster_inventory(read_nodes(NODES)))
    assert problems == [] and len(slots) == 4
    return slots


def problems_of(*pipelines: dict) -> dict[str, str]:
    config = parse_config({"pipelines": [{"task": "regression", **p} for p in pipelines], **RAY}, "c.toml")
    return {p.key: p.message for p in gang_problems(config, gpu_slots())}


def test_a_cluster_request_is_a_count_of_gpus_or_a_fraction_of_one():
    config = parse_config({"pipelines": [{"name": "wide", "task": "regression", "gpus_per_rank": 2},
                                         {"name": "tiny", "task": "regression", "gpu_memory": 0.25}], **RAY}, "c")
    wide, tiny = (request_of(p, gpu_slots()) for p in config.pipelines)
    assert wide == Request(ranks=1, gpus=2) and tiny == Request(ranks=1, gpus=1, share=0.25)
    assert tiny.label(True) == "0.25 of a GPU"


def test_what_a_cluster_can_never_grant_is_refused_naming_the_key():
    said = problems_of({"name": "bytes", "gpu_memory": "6GiB"})
    assert "fraction" in said["pipelines[0].gpu_memory"] and "num_gpus" in said["pipelines[0].gpu_memory"]
    said = problems_of({"name": "wide", "gpus_per_rank": 3})
    assert "on one node" in said["pipelines[0].gpus_per_rank"]
    said = problems_of({"name": "gang", "ranks": 5, "gpu_memory": 0.5})
    assert "a GPU of its own" in said["pipelines[0].ranks"]
    assert problems_of({"name": "ok", "gpus_per_rank": 2, "ranks": 2}, {"name": "share", "gpu_memory": 0.5}) == {}


def test_a_rank_of_two_gpus_takes_both_from_one_node_and_gives_both_back():
    sched = Scheduler(gpu_slots())
    sched.enqueue("solo", 0, 0, Request(ranks=1, gpus=2))
    sched.enqueue("gang", 0, 1, Request(ranks=2, gpus=2))
    [(_, [solo])] = sched.allocate()
    assert len(solo.gpus) == 2 and solo.node == "bb" * 14 and len(sched.free) == 2
    assert sched.allocate() == [] and sched.waits == {}  # the gang waits for 4 GPUs, behind nobody else's
    sched.release([solo], "solo")
    assert len(sched.free) == 4
    [(_, gang)] = sched.allocate()
    assert [(len(s.gpus), s.node[:2]) for s in gang] == [(2, "bb"), (2, "cc")] and sched.free == []
    sched.release(gang, "gang")
    assert len(sched.free) == 4


def test_fractions_pack_on_one_gpu_and_it_is_whole_again_when_the_last_share_ends():
    sched = Scheduler(gpu_slots())
    for i in range(4):
        sched.enqueue(f"s{i}", 0, i, Request(share=0.5))
    granted = dict(sched.allocate())
    assert [s.share for [s] in granted.values()] == [0.5] * 4
    on = [s.gpu.index for [s] in granted.values()]
    assert on[0] == on[1] and on[2] == on[3] and on[0] != on[2]  # two to a GPU: two GPUs stay whole
    assert len(sched.free) == 2
    sched.release(granted["s0"], "s0")
    assert len(sched.free) == 2  # s1 still shares that GPU
    sched.release(granted["s1"], "s1")
    assert len(sched.free) == 3
    sched.release(granted["s2"], "s2")  # s3's GPU is half free: room for both ranks below, were they allowed
    sched.enqueue("gang", 0, 9, Request(ranks=2, share=0.25))
    [(_, gang)] = sched.allocate()
    assert gang[0].gpu.index == on[3] and len({s.gpu.index for s in gang}) == 2  # never two ranks on one GPU


def test_a_rank_of_two_gpus_on_a_node_that_left_moves_whole_to_another():
    slots = gpu_slots()
    sched = Scheduler(slots)
    sched.enqueue("solo", 0, 0, Request(ranks=1, gpus=2))
    [(_, [solo])] = sched.allocate()
    sched.resize([s for s in slots if s.node == "cc" * 14])  # gpu1's node left
    [moved] = sched.refit([solo])
    assert moved.node == "cc" * 14 and len(moved.gpus) == 2 and sched.free == []
