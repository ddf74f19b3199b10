"""A real ``longmoe serve`` process on a free port (drain, Prometheus, load-balancer tests): started
by the test, waited on until ``/ready``, stopped by its PID. The code is ``bench/serve_proc.py``,
shared with the benchmarks that run the server as a process."""

from bench.serve_proc import HOST, START_TIMEOUT_S, ServeProcess, free_port, serve_process, wait_ready

__all__ = ["HOST", "START_TIMEOUT_S", "ServeProcess", "free_port", "serve_process", "wait_ready"]
