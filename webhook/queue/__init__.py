"""Queue mode: GPU pods that do not fit now are created and wait, and start by themselves.

Admission charges quota and writes what the pod asks (``entry``); the pod waits Pending for
a second kube-scheduler that calls fracgpu's extender (``extender``), which picks the GPUs
with the same placement code at bind time (``binder``), in queue order (``order``), and says
where each pod stands (``status``). docs/architecture.md, "Queue mode", has the data flow.
"""
