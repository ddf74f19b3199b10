"""The demo pipeline (``longmoe demo``): the whole system on a CPU in minutes, ending in ``report.md``.

``config.DemoConfig`` in → ``run.run_demo`` → ``result.DemoResult`` out → ``report`` renders it.
"""

from longmoe.pipelines.demo.config import DemoConfig
from longmoe.pipelines.demo.result import DemoResult
from longmoe.pipelines.demo.run import run_demo

__all__ = ["DemoConfig", "DemoResult", "run_demo"]
