"""This machine's devices (NVIDIA GPUs through NVML, CPU cores) and the slots a run places its pipelines on."""
